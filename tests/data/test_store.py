"""Token stores: `cgpt data prepare` (formats, parallel, resume, manifest), training from a
store without its sources, per-process batch rows, GPT-2 BPE files, one preparer at a time.

Every test makes its own corpus and tokenizer files in a tmp dir; nothing is downloaded.
"""

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cgpt.data import prepare as prepare_mod
from cgpt.cli import main as cli_main
from cgpt.data.batches import EOT, DataError, load_data
from cgpt.config.data import DataConfig
from cgpt.data.store import ShardedTokens, TokenStore
from cgpt.data.tokenizer import load_tokenizer, train_tokenizer, with_eot

REPO = Path(__file__).resolve().parents[2]
WORDS = "tokens shard store manifest worker parallel resume the a of model loss scale data".split()


def doc(rng, n=120) -> str:
    return " ".join(rng.choice(WORDS, size=n)).capitalize() + ".\n"


@pytest.fixture
def texts():
    rng = np.random.default_rng(0)
    return [doc(rng, int(rng.integers(20, 200))) for _ in range(60)]


@pytest.fixture
def tokfile(tmp_path, texts):
    tok = train_tokenizer([texts], 300)
    path = tmp_path / "tok.json"
    tok.save(str(path))
    return path


def expected_tokens(tok_path, docs) -> np.ndarray:
    tok = with_eot(load_tokenizer(tok_path), str(tok_path))
    tok.encode_special_tokens = True
    eot = tok.token_to_id(EOT)
    return np.array([i for t in docs for i in tok.encode(t, add_special_tokens=False).ids + [eot]])


def mixed_folder(root: Path, texts) -> tuple[Path, list[str]]:
    """Every supported format; returns the folder and its documents in corpus (sorted path) order."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    root.mkdir()
    lines = lambda ts: "".join(json.dumps({"text": t, "id": 1}) + "\n" for t in ts).encode()  # noqa: E731
    (root / "a.jsonl").write_bytes(lines(texts[0:20]))
    (root / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines(texts[20:30])))
    (root / "c.jsonl.gz").write_bytes(gzip.compress(lines(texts[30:40])))
    pq.write_table(pa.table({"text": texts[40:55]}), root / "d.parquet", row_group_size=4)
    for i, t in enumerate(texts[55:60]):
        (root / f"e{i}.txt").write_text(t)
    return root, texts


def prepare_cli(source, tok, out, *extra) -> int:
    return cli_main(["data", "prepare", str(source), "--tokenizer", str(tok), "--out", str(out),
                     "--no-progress", *extra])


# -------------------------------------------------------------------------------- prepare

def test_prepare_every_format_into_a_verified_manifest(tmp_path, texts, tokfile, capsys):
    folder, docs = mixed_folder(tmp_path / "src", texts)
    out = tmp_path / "store"
    assert prepare_cli(folder, tokfile, out, "--num-proc", "1") == 0
    assert "data.source=" in capsys.readouterr().out
    store = TokenStore(out)
    m = store.manifest
    np.testing.assert_array_equal(np.asarray(store.tokens()), expected_tokens(tokfile, docs))
    assert m["num_documents"] == 60 and m["num_tokens"] == len(expected_tokens(tokfile, docs))
    assert m["dtype"] == "uint16" and m["vocab_size"] == 300
    assert [Path(s["path"]).name for s in m["sources"]["files"]] == \
        ["a.jsonl", "b.jsonl.zst", "c.jsonl.gz", "d.parquet"] + [f"e{i}.txt" for i in range(5)]
    assert sum(s["num_tokens"] for s in m["shards"]) == m["num_tokens"]
    jsonl = [s for s in m["shards"] if s["unit"]["kind"] == "jsonl"]
    assert jsonl[0]["unit"]["start"] == 0 and jsonl[-1]["unit"]["stop"] == (folder / "a.jsonl").stat().st_size
    import hashlib
    zst = next(s for s in m["shards"] if s["unit"]["kind"] == "jsonl-compressed")
    assert zst["source_sha256"] == hashlib.sha256((folder / "b.jsonl.zst").read_bytes()).hexdigest()
    store.verify()  # every shard's sha256 matches
    with open(out / m["shards"][0]["file"], "r+b") as f:
        f.write(b"\xff\xff")
    with pytest.raises(DataError, match="sha256"):
        store.verify()


def test_parallel_prepare_gives_the_same_stream_whatever_the_units(tmp_path, texts, tokfile):
    folder, docs = mixed_folder(tmp_path / "src", texts)
    one = prepare_mod.prepare(str(folder), load_tokenizer(tokfile), tmp_path / "one", num_proc=1, progress=False)
    many = prepare_mod.prepare(str(folder), load_tokenizer(tokfile), tmp_path / "many", num_proc=2,
                               unit_bytes=700, progress=False)
    assert len(many.manifest["shards"]) > len(one.manifest["shards"]) + 5
    assert isinstance(many.tokens(), ShardedTokens)
    np.testing.assert_array_equal(np.asarray(many.tokens()), np.asarray(one.tokens()))
    np.testing.assert_array_equal(np.asarray(one.tokens()), expected_tokens(tokfile, docs))


def test_prepare_refuses_another_corpus_in_the_same_dir(tmp_path, texts, tokfile):
    folder, _ = mixed_folder(tmp_path / "src", texts)
    out = tmp_path / "store"
    assert prepare_cli(folder, tokfile, out, "--num-proc", "1") == 0
    assert prepare_cli(folder, tokfile, out, "--num-proc", "1") == 0  # complete already: nothing to do
    (folder / "e0.txt").write_text("changed")
    assert prepare_cli(folder, tokfile, out, "--num-proc", "1") == 2  # sources differ: refused, not mixed
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.md").write_text("mine")
    assert prepare_cli(folder, tokfile, tmp_path / "other", "--num-proc", "1") == 2


def test_prepare_can_train_its_tokenizer(tmp_path, texts):
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert prepare_cli(src, "train", tmp_path / "s", "--vocab-size", "290", "--num-proc", "1") == 0
    store = TokenStore(tmp_path / "s")
    assert store.manifest["vocab_size"] == 290
    tok = train_tokenizer([texts], 290)
    np.testing.assert_array_equal(np.asarray(store.tokens()),
                                  expected_tokens(tmp_path / "s" / "tokenizer.json", texts))
    assert store.tokenizer().to_str() == with_eot(tok, "t").to_str()  # the same BPE, trained deterministically


def test_malformed_jsonl_names_the_file_and_line(tmp_path):
    rng = np.random.default_rng(1)
    rows = [json.dumps({"text": doc(rng)}) for _ in range(30)]
    rows[22] = '{"text": "cut off'
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(rows) + "\n")
    cfg = DataConfig(source=str(path), vocab_size=300, seq_len=16, val_sequences=4, cache_dir=str(tmp_path / "c"))
    with pytest.raises(DataError, match=r"bad\.jsonl, line 23: not valid JSON"):
        load_data(cfg)
    # also when the bad line sits in a later unit (a byte range that does not start the file)
    tok = train_tokenizer([[doc(rng) for _ in range(20)]], 300)
    with pytest.raises(DataError, match=r"bad\.jsonl, line 23: not valid JSON"):
        prepare_mod.prepare(str(path), with_eot(tok, "t"), tmp_path / "s", num_proc=1, unit_bytes=200,
                            progress=False)
    rows[22] = json.dumps({"body": "x"})
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl, line 23: no column 'text'.*\['body'\]"):
        load_data(cfg)


def test_hf_dataset_source(tmp_path, monkeypatch, texts, tokfile):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset",
                        lambda name, config, split, cache_dir: datasets.Dataset.from_dict({"body": texts}))
    store = prepare_mod.prepare("hf:me/corpus", load_tokenizer(tokfile), tmp_path / "s", text_column="body",
                                unit_bytes=2048 * 7, num_proc=1, progress=False)
    assert len(store.manifest["shards"]) == 9  # 60 rows, 7 per unit
    np.testing.assert_array_equal(np.asarray(store.tokens()), expected_tokens(tokfile, texts))


# ------------------------------------------------------------------------- reading a store

def test_training_data_from_a_store_never_touches_the_sources(tmp_path, texts, tokfile, monkeypatch):
    folder, docs = mixed_folder(tmp_path / "src", texts)
    out = tmp_path / "store"
    prepare_mod.prepare(str(folder), load_tokenizer(tokfile), out, num_proc=1, unit_bytes=1000, progress=False)
    for p in folder.iterdir():
        p.unlink()  # gone: a store needs only itself
    monkeypatch.setattr(prepare_mod, "prepare", lambda *a, **k: pytest.fail("re-prepared"))
    run = tmp_path / "run"
    d = load_data(DataConfig(source=str(out), seq_len=16, val_sequences=4, vocab_size=50257), run)
    assert d.vocab_size == 300 and d.info["store_sha256"] == TokenStore(out).sha256
    assert load_tokenizer(run / "tokenizer.json").to_str() == load_tokenizer(out / "tokenizer.json").to_str()
    np.testing.assert_array_equal(np.asarray(d.tokens), expected_tokens(tokfile, docs))
    assert d.train_batch(3, 8).shape == (8, 17)
    # a resumed run with another tokenizer, or a text_column the store was not made with: refused
    other = train_tokenizer([texts[:10]], 280)
    other.save(str(run / "tokenizer.json"))
    with pytest.raises(DataError, match="differs from the one the store"):
        load_data(DataConfig(source=str(out), seq_len=16, val_sequences=4), run)
    with pytest.raises(DataError, match="text_column"):
        load_data(DataConfig(source=str(out), seq_len=16, val_sequences=4, text_column="body"))
    (out / "manifest.json").unlink()
    with pytest.raises(DataError, match="unfinished prepare"):
        load_data(DataConfig(source=str(out), seq_len=16, val_sequences=4))


def test_batch_rows_read_only_their_share(tmp_path, texts, tokfile):
    folder, _ = mixed_folder(tmp_path / "src", texts)
    out = tmp_path / "store"
    prepare_mod.prepare(str(folder), load_tokenizer(tokfile), out, num_proc=1, unit_bytes=300, progress=False)
    d = load_data(DataConfig(source=str(out), seq_len=8, val_sequences=4, seed=3))
    flat = np.asarray(d.tokens)
    assert isinstance(d.tokens, ShardedTokens) and len(d.tokens.arrays) > 10
    n = d.num_train_sequences + d.num_val_sequences
    # windows that straddle shard boundaries read correctly
    np.testing.assert_array_equal(d._windows(np.arange(n)), flat[np.arange(n)[:, None] * 8 + np.arange(9)])
    B = 12
    step = d.num_train_sequences // B  # a batch that straddles an epoch boundary
    full = d.train_batch(step, B)
    read = []
    real = d.tokens.windows
    d.tokens.windows = lambda starts, length: read.append(np.asarray(starts).copy()) or real(starts, length)
    for lo, hi in ((0, 4), (4, 8), (8, 12)):
        read.clear()
        np.testing.assert_array_equal(d.train_batch(step, B, rows=slice(lo, hi)), full[lo:hi])
        np.testing.assert_array_equal(read[0], d.train_indices(step, B)[lo:hi] * 8)  # only those rows
    # an index array (a process's rows under gradient accumulation) reads only those rows too
    read.clear()
    idx = np.array([1, 2, 7])
    np.testing.assert_array_equal(d.train_batch(step, B, rows=idx), full[idx])
    np.testing.assert_array_equal(read[0], d.train_indices(step, B)[idx] * 8)


# --------------------------------------------------------------------------- GPT-2 BPE files

def _bytes_to_unicode() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def gpt2_files(folder: Path, texts) -> Path:
    """vocab.json + merges.txt shaped like GPT-2's: 256 bytes, 50,000 merges, <|endoftext|> = 50256."""
    learned = train_tokenizer([texts], 600)
    merges = [tuple(m) if isinstance(m, (list, tuple)) else tuple(m.split(" "))
              for m in json.loads(learned.to_str())["model"]["merges"]]
    vocab = {c: i for i, c in enumerate(_bytes_to_unicode())}
    kept = []
    for a, b in merges:
        if a in vocab and b in vocab and a + b not in vocab:
            vocab[a + b] = len(vocab)
            kept.append((a, b))
    chars = _bytes_to_unicode()
    for a in chars:  # filler merges of two byte symbols up to GPT-2's size
        for b in chars:
            if len(vocab) == 50256:
                break
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                kept.append((a, b))
    vocab[EOT] = 50256
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in kept))
    return folder


@pytest.mark.parametrize("form", ["vocab+merges", "tokenizer.json"])
def test_gpt2_bpe_end_to_end(tmp_path, texts, form):
    gpt2 = gpt2_files(tmp_path / "gpt2", texts)
    tok = load_tokenizer(gpt2)
    assert tok.get_vocab_size() == 50257 and tok.token_to_id(EOT) == 50256
    if form == "tokenizer.json":
        tok.save(str(tmp_path / "tokenizer.json"))
        (gpt2 / "vocab.json").unlink()
        gpt2 = tmp_path / "tokenizer.json"
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    store = tmp_path / "store"
    assert prepare_cli(src, gpt2, store) == 0
    m = TokenStore(store).manifest
    assert (m["dtype"], m["vocab_size"], m["eot_id"]) == ("uint16", 50257, 50256)
    d = load_data(DataConfig(source=str(store), seq_len=16, val_sequences=4))
    first = np.asarray(d.tokens[: int(np.flatnonzero(np.asarray(d.tokens) == 50256)[0])])
    assert d.tokenizer.decode(first.tolist()) == texts[0]
    assert len(first) < len(texts[0].encode()) // 2  # the merges are used, not just bytes
    if form == "tokenizer.json":
        return
    # and a model of GPT-2's vocabulary trains on it
    out = tmp_path / "run"
    rc = cli_main(["train", "--model", "tiny-17k", "--data", str(store), "--tokens", "512", "--out", str(out),
                   "--no-progress", "model.vocab_size=50257", "data.seq_len=16", "data.val_sequences=4",
                   "train.batch_size=8", "train.eval_every=2"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["store_sha256"] == TokenStore(store).sha256 and np.isfinite(summary["train_loss"])
    assert load_tokenizer(out / "tokenizer.json").to_str() == load_tokenizer(store / "tokenizer.json").to_str()


# ---------------------------------------------------------------------- one preparer at a time

def test_one_process_prepares_the_others_wait_and_reuse(tmp_path, texts):
    import fcntl

    from cgpt.data import batches as data_mod

    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = DataConfig(source=str(src), vocab_size=300, seq_len=16, val_sequences=4, cache_dir=str(tmp_path / "cache"))
    root = data_mod.cache_root(cfg)
    key = data_mod._digest([prepare_mod.RECIPE, data_mod._resolve_source(cfg, root).identity])[:24]
    lock = root / "locks" / f"{key}.lock"
    lock.parent.mkdir(parents=True)
    code = ("import json, sys; from cgpt.data.batches import DataConfig, load_data; "
            "d = load_data(DataConfig(**json.loads(sys.argv[1]))); print(d.info['store'])")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as if a third process were preparing
        procs = [subprocess.Popen([sys.executable, "-c", code, json.dumps(cfg.__dict__)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
        for p in procs:
            p.seen = b""
            os.set_blocking(p.stderr.fileno(), False)
        deadline = time.time() + 120
        while time.time() < deadline and not all(_waiting(p) for p in procs):
            time.sleep(0.2)
        fcntl.flock(held, fcntl.LOCK_UN)
    for p in procs:
        os.set_blocking(p.stderr.fileno(), True)
    outs = [(out.decode(), (p.seen + err).decode()) for p in procs for out, err in [p.communicate(timeout=300)]]
    assert all(p.returncode == 0 for p in procs), outs
    assert outs[0][0] == outs[1][0]  # the same store
    assert all("waiting for another process" in err for _, err in outs)
    assert sum("tokenizing" in err for _, err in outs) == 1  # prepared once


def _waiting(p) -> bool:
    """Whether the child has said it waits for the lock (keeps what it read in p.seen)."""
    try:
        p.seen += os.read(p.stderr.fileno(), 1 << 16)
    except BlockingIOError:
        pass
    return b"waiting for another process" in p.seen


@pytest.mark.parametrize("num_proc", [1, 2])
def test_the_prepare_bar_says_its_size_and_ends_full(tmp_path, texts, tokfile, capsys,
                                                      num_proc):
    """The bar's size is the source bytes to tokenize, advanced as they are read, with the
    tokens written beside it; it ends full, every token counted. Before: a count of tokens
    with no total ("5.2ktok"), so a newcomer could not tell how long it would take."""
    import re

    folder, docs = mixed_folder(tmp_path / "src", texts)
    size = sum(p.stat().st_size for p in folder.iterdir())
    store = prepare_mod.prepare(str(folder), load_tokenizer(tokfile), tmp_path / "s",
                                num_proc=num_proc, unit_bytes=700, progress=True)
    err = capsys.readouterr().err
    shards = len(store.manifest["shards"])
    assert f"tokenizing {size / 1000:.1f} kB: 0/{shards} shards:   0%" in err, err
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert re.search(fr"{shards}/{shards} shards: 100%.*\| ([\d.]+k)/\1 .*"
                     fr"{store.manifest['num_tokens']:,} tokens\]", last), last


def test_training_the_tokenizer_is_said_before_it_runs(tmp_path, texts, capsys):
    """`--tokenizer train` reads the whole corpus before the bar starts: a line says so, with
    the corpus's size, and one how long it took (before: nothing, however long it ran)."""
    folder, _ = mixed_folder(tmp_path / "src", texts)
    size = sum(p.stat().st_size for p in folder.iterdir())
    assert prepare_cli(folder, "train", tmp_path / "s", "--vocab-size", "300") == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"training a byte-level BPE tokenizer of 300 tokens on {folder} "
                      f"({size / 1000:.1f} kB)..."), err
    assert err[1].startswith("trained the tokenizer in "), err


def test_a_long_silent_phase_says_it_still_runs(capsys):
    """Training the BPE on a large corpus ran for 13 s without a word where no terminal showed
    the tokenizers library's own bar (a log, a pipe): a line every few seconds says it runs."""
    t0 = time.perf_counter()
    with prepare_mod._heartbeat("training the tokenizer", t0, every_s=0.05):
        time.sleep(0.5)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 2 and all(x.startswith("training the tokenizer: ") for x in lines), lines
