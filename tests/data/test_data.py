"""Data pipeline: sources, tokenizer, packing, cache, splits, shuffling, resume, errors.

Every test builds its own small corpus in a tmp dir and uses a tmp cache_dir; nothing
is downloaded.
"""

import json
import math
import os

import numpy as np
import pytest

from cgpt.data import corpus
from cgpt.data import batches as data_mod
from cgpt.data import prepare as prepare_mod
from cgpt.data.batches import EOT, DataError, load_data
from cgpt.data.tokenizer import train_tokenizer
from cgpt.config.data import DataConfig

WORDS = ("the model reads tokens and predicts the next one while loss falls with scale "
         "data compute params optimizer warmup decay batch sequence layer head attention").split()


def make_doc(rng: np.random.Generator, n_words: int) -> str:
    lines = []
    for _ in range(max(1, n_words // 8)):
        lines.append(" ".join(rng.choice(WORDS, size=8)).capitalize() + ".")
    return "\n".join(lines) + "\n"


@pytest.fixture
def docs(tmp_path):
    """A folder of 12 .txt documents (one document per file) and their texts in sorted order."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "docs"
    folder.mkdir()
    texts = []
    for i in range(12):
        text = make_doc(rng, 200 + 40 * i)
        (folder / f"doc{i:02d}.txt").write_text(text)
        texts.append(text)
    return folder, texts


def cfg_for(source, tmp_path, **kw) -> DataConfig:
    base = dict(source=str(source), vocab_size=300, seq_len=16, val_sequences=4, cache_dir=str(tmp_path / "cache"))
    base.update(kw)
    return DataConfig(**base)


# ------------------------------------------------------------------------------ config

@pytest.mark.parametrize("field,value,message", [
    ("vocab_size", 100, "vocab_size must be an int >= 257"), ("vocab_size", 2.5, "vocab_size"),
    ("seq_len", 0, "seq_len must be an int >= 1"), ("seq_len", True, "seq_len"),
    ("val_sequences", 0, "val_sequences"), ("seed", -1, "seed"),
    ("source", "", "source must be a non-empty string"), ("source", "hf:", "no dataset name"),
    ("text_column", "", "text_column"), ("tokenizer", " ", "tokenizer"),
])
def test_config_rejects_bad_values_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        DataConfig(**{field: value})


def test_config_defaults_and_cache_dir_from_env(monkeypatch, tmp_path):
    cfg = DataConfig()
    assert (cfg.source, cfg.tokenizer, cfg.vocab_size, cfg.seq_len) == ("default", "train", 4096, 256)
    monkeypatch.setenv("CGPT_CACHE", str(tmp_path / "c"))
    assert data_mod.cache_root(cfg) == tmp_path / "c"
    assert data_mod.cache_root(DataConfig(cache_dir=str(tmp_path / "d"))) == tmp_path / "d"


# ----------------------------------------------------------------------------- packing

def test_packing_has_no_padding_and_every_token_is_a_target_once(docs, tmp_path):
    folder, _ = docs
    d = load_data(cfg_for(folder, tmp_path))
    L = d.seq_len
    n = d.num_train_sequences + d.num_val_sequences
    assert n == (len(d.tokens) - 1) // L and len(d.tokens) - 1 - n * L < L  # only a < L tail is dropped
    windows = d._windows(np.arange(n))
    assert windows.dtype == np.int32 and windows.shape == (n, L + 1)
    np.testing.assert_array_equal(windows[:, 1:].reshape(-1), d.tokens[1 : n * L + 1])  # each target once
    np.testing.assert_array_equal(windows[1:, 0], windows[:-1, -1])  # windows overlap by exactly one token
    # one epoch of training batches covers each training sequence exactly once
    b = 5
    steps = math.ceil(d.num_train_sequences / b)
    seen = np.concatenate([d.train_indices(s, b) for s in range(steps)])[: d.num_train_sequences]
    assert sorted(seen.tolist()) == d.train_index.tolist()
    assert d.num_train_tokens == d.num_train_sequences * L


def test_documents_are_separated_by_endoftext(docs, tmp_path):
    folder, texts = docs
    d = load_data(cfg_for(folder, tmp_path))
    assert d.tokenizer.id_to_token(d.eot_id) == EOT
    tokens = np.asarray(d.tokens)
    eots = np.flatnonzero(tokens == d.eot_id)
    assert len(eots) == len(texts) and eots[-1] == len(tokens) - 1  # one after every document
    segments = np.split(tokens, eots + 1)[:-1]
    decoded = [d.tokenizer.decode(seg[:-1].tolist()) for seg in segments]
    assert decoded == texts  # sorted file order, exact byte-level round trip


def test_literal_endoftext_in_text_is_not_a_separator(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "c.jsonl"
    rows = [{"text": make_doc(rng, 300) + (" <|endoftext|> inside" if i == 0 else "")} for i in range(6)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    d = load_data(cfg_for(path, tmp_path))
    assert int((np.asarray(d.tokens) == d.eot_id).sum()) == len(rows)


# ------------------------------------------------------------------------------- cache

def test_cache_is_reused_and_memory_mapped(docs, tmp_path, monkeypatch):
    folder, _ = docs
    cfg = cfg_for(folder, tmp_path)
    first = load_data(cfg)
    store = first.info["store"]
    shard = os.path.join(store, "shards", "000000.bin")
    mtime = os.stat(shard).st_mtime_ns

    def fail(*a, **k):
        raise AssertionError("cache miss: this should not run on a second load")

    monkeypatch.setattr(data_mod, "train_tokenizer", fail)
    monkeypatch.setattr(data_mod, "prepare", fail)
    monkeypatch.setattr(data_mod, "Corpus", fail)
    import datasets
    monkeypatch.setattr(datasets, "load_dataset", fail)
    second = load_data(cfg)
    assert isinstance(second.tokens, np.memmap) and second.tokens.dtype == np.uint16
    assert os.stat(shard).st_mtime_ns == mtime
    np.testing.assert_array_equal(first.tokens, second.tokens)
    assert second.tokenizer.to_str() == first.tokenizer.to_str()
    # seq_len does not change the tokens: the same store serves another packing
    assert load_data(cfg_for(folder, tmp_path, seq_len=32)).info["store"] == store


def test_cache_key_follows_file_content(docs, tmp_path):
    folder, texts = docs
    cfg = cfg_for(folder, tmp_path)
    before = load_data(cfg)
    (folder / "doc00.txt").write_text(texts[0] + "One more line.\n")
    after = load_data(cfg)
    assert after.info["store"] != before.info["store"]
    assert len(after.tokens) > len(before.tokens)


def test_interrupted_preparation_leaves_no_trusted_cache_and_resumes(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": make_doc(rng, 300)}) + "\n" for _ in range(40)))
    cfg = cfg_for(path, tmp_path)
    monkeypatch.setattr(prepare_mod.sources, "cpu_count", lambda: 1)  # in-process: a deterministic crash point
    monkeypatch.setattr(prepare_mod, "MIN_UNIT", 1)
    monkeypatch.setattr(prepare_mod, "MAX_UNIT", path.stat().st_size // 4)  # about 4 shards
    calls = []

    class Crash(prepare_mod.tqdm):
        def update(self, n=1):
            super().update(n)
            calls.append(n)
            if len(calls) == 2:
                raise KeyboardInterrupt("simulated crash while the second shard is being written")

    monkeypatch.setattr(prepare_mod, "tqdm", Crash)
    with pytest.raises(KeyboardInterrupt):
        load_data(cfg)
    (store,) = (tmp_path / "cache" / "tokens").iterdir()
    assert not (store / "manifest.json").exists()  # not trusted
    assert sorted(p.name for p in (store / "shards").iterdir()) == ["000000.bin", "000000.json"]
    kept = os.stat(store / "shards" / "000000.bin").st_mtime_ns
    monkeypatch.setattr(prepare_mod, "tqdm", prepare_mod.tqdm.__mro__[1])
    d = load_data(cfg)
    assert os.stat(store / "shards" / "000000.bin").st_mtime_ns == kept  # the finished shard was kept
    assert len(json.loads((store / "manifest.json").read_text())["shards"]) >= 3
    assert int((np.asarray(d.tokens) == d.eot_id).sum()) == 40  # complete, nothing twice
    fresh = load_data(cfg_for(path, tmp_path / "fresh"))
    np.testing.assert_array_equal(np.asarray(d.tokens), np.asarray(fresh.tokens))


# ----------------------------------------------------------------- splits and ordering

def test_val_split_is_fixed_disjoint_and_seed_independent(docs, tmp_path):
    folder, _ = docs
    a = load_data(cfg_for(folder, tmp_path, seed=0))
    b = load_data(cfg_for(folder, tmp_path, seed=1))
    val_a, val_b = list(a.val_batches(3)), list(b.val_batches(3))
    assert [len(v) for v in val_a] == [3, 1]  # covers all 4, last batch partial
    assert [len(v) for v in a.val_batches(3, drop_last=True)] == [3]
    for x, y in zip(val_a, val_b):
        np.testing.assert_array_equal(x, y)
    n = a.num_train_sequences + a.num_val_sequences
    assert a.val_index.tolist() == [k * n // 4 for k in range(4)]  # spread over the stream
    np.testing.assert_array_equal(np.concatenate(val_a), a._windows(a.val_index))
    # training never draws a validation window, under any seed, and covers all the others
    for d in (a, b):
        drawn = np.concatenate([d.train_indices(s, 7) for s in range(3 * d.num_train_sequences // 7)])
        assert not np.isin(drawn, d.val_index).any() and drawn.min() >= 0 and drawn.max() < n
        assert set(drawn.tolist()) == set(range(n)) - set(d.val_index.tolist())
    # val targets are disjoint token positions from every train target
    targets = lambda idx: (idx[:, None] * a.seq_len + np.arange(1, a.seq_len + 1)).ravel()  # noqa: E731
    assert not np.isin(targets(a.val_index), targets(a.train_index)).any()


def test_shuffle_is_deterministic_by_seed(docs, tmp_path):
    folder, _ = docs
    a1 = load_data(cfg_for(folder, tmp_path, seed=3))
    a2 = load_data(cfg_for(folder, tmp_path, seed=3))
    b = load_data(cfg_for(folder, tmp_path, seed=4))
    np.testing.assert_array_equal(a1.train_batch(5, 8), a2.train_batch(5, 8))
    order = lambda d: np.concatenate([d.train_indices(s, 8) for s in range(4)])  # noqa: E731
    assert not np.array_equal(order(a1), order(b))
    assert not np.array_equal(order(a1), np.arange(32))  # actually shuffled


def test_exact_resume_from_any_step(docs, tmp_path):
    folder, _ = docs
    cfg = cfg_for(folder, tmp_path, seed=7, seq_len=128)
    B, n_steps, k = 10, 40, 17  # spans several epochs; some batches straddle an epoch boundary
    full = load_data(cfg)
    assert n_steps * B > 2 * full.num_train_sequences and full.num_train_sequences % B != 0
    uninterrupted = [full.train_batch(s, B) for s in range(n_steps)]
    resumed = load_data(cfg)  # a fresh process after a restart at step k
    for s in range(k, n_steps):
        np.testing.assert_array_equal(resumed.train_batch(s, B), uninterrupted[s])
    # the example stream has no repeats within an epoch and no gaps across the restart
    stream = np.concatenate([full.train_indices(s, B) for s in range(n_steps)])
    n = full.num_train_sequences
    for e in range(len(stream) // n):
        assert sorted(stream[e * n : (e + 1) * n].tolist()) == full.train_index.tolist()
    assert not np.array_equal(stream[:n], stream[n : 2 * n])  # each epoch is reshuffled
    # a batch at step s depends only on (seed, s, B): querying out of order changes nothing
    np.testing.assert_array_equal(load_data(cfg).train_batch(n_steps - 1, B), uninterrupted[-1])


def test_epoch_counting(docs, tmp_path):
    folder, _ = docs
    d = load_data(cfg_for(folder, tmp_path))
    n = d.num_train_sequences
    assert d.epoch_at(0, 4) == 0.0
    assert d.epoch_at(n, 1) == pytest.approx(1.0)
    assert d.epoch_at(n, 3) == pytest.approx(3.0)
    assert d.epoch_at(1, 4) == pytest.approx(4 / n)
    assert d.epochs_for_tokens(d.num_train_tokens * 5 // 2) == pytest.approx(2.5)


def test_unigram_entropy_matches_train_target_counts(docs, tmp_path):
    folder, _ = docs
    d = load_data(cfg_for(folder, tmp_path))
    targets = d._windows(d.train_index)[:, 1:]  # the train split's targets, val excluded
    assert targets.size == d.num_train_tokens
    _, counts = np.unique(targets, return_counts=True)
    p = counts / counts.sum()
    expected = float(-(p * np.log(p)).sum())
    assert d.unigram_entropy() == pytest.approx(expected, rel=1e-12)
    assert 0 < d.unigram_entropy() < math.log(d.vocab_size)


# ---------------------------------------------------------------------------- tokenizer

def test_tokenizer_trained_saved_and_reused_from_run_dir(docs, tmp_path, monkeypatch):
    folder, _ = docs
    run_dir = tmp_path / "run"
    d = load_data(cfg_for(folder, tmp_path), run_dir=run_dir)
    assert (run_dir / "tokenizer.json").is_file()
    assert d.vocab_size == d.tokenizer.get_vocab_size() and 257 <= d.vocab_size <= 300
    saved = (run_dir / "tokenizer.json").read_text()

    monkeypatch.setattr(data_mod, "train_tokenizer", lambda *a, **k: pytest.fail("resumed run retrained"))
    # a resumed run keeps its tokenizer even if the config now asks for a different one
    resumed = load_data(cfg_for(folder, tmp_path, vocab_size=280), run_dir=run_dir)
    assert resumed.tokenizer.to_str() == d.tokenizer.to_str()
    assert (run_dir / "tokenizer.json").read_text() == saved
    np.testing.assert_array_equal(resumed.tokens, d.tokens)
    # and the saved tokenizer can be loaded as an explicit tokenizer path
    other = tmp_path / "other"
    d.save_tokenizer(other)
    explicit = load_data(cfg_for(folder, tmp_path, tokenizer=str(other)))
    np.testing.assert_array_equal(explicit.tokens, d.tokens)


def test_gpt2_style_vocab_and_merges_directory(docs, tmp_path):
    folder, texts = docs
    tok = train_tokenizer([texts], 320)
    gpt2_dir = tmp_path / "gpt2tok"
    gpt2_dir.mkdir()
    tok.model.save(str(gpt2_dir))
    assert sorted(p.name for p in gpt2_dir.iterdir()) == ["merges.txt", "vocab.json"]

    d = load_data(cfg_for(folder, tmp_path, tokenizer=str(gpt2_dir)))
    vocab = json.loads((gpt2_dir / "vocab.json").read_text())
    assert d.eot_id == vocab[EOT] and d.vocab_size == len(vocab)
    first_doc = np.asarray(d.tokens[: np.flatnonzero(np.asarray(d.tokens) == d.eot_id)[0]])
    assert d.tokenizer.decode(first_doc.tolist()) == texts[0]
    np.testing.assert_array_equal(first_doc, tok.encode(texts[0]).ids)

    # without <|endoftext|> in the vocabulary the tokenizer is refused, naming the token
    del vocab[EOT]
    vocab = {t: i for i, t in enumerate(sorted(vocab, key=vocab.get))}
    (gpt2_dir / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(DataError, match="endoftext"):
        load_data(cfg_for(folder, tmp_path, tokenizer=str(gpt2_dir)))


def test_tokenizer_training_is_deterministic(docs, tmp_path):
    folder, _ = docs
    a = load_data(cfg_for(folder, tmp_path / "a"))
    b = load_data(cfg_for(folder, tmp_path / "b"))  # separate caches: trained twice
    assert a.info["store"] != b.info["store"]
    assert a.tokenizer.to_str() == b.tokenizer.to_str()
    np.testing.assert_array_equal(a.tokens, b.tokens)


def test_token_dtype_fits_vocab():
    assert data_mod._token_dtype(65535) == np.uint16
    assert data_mod._token_dtype(65536) == np.uint32
    assert data_mod._token_dtype(50257) == np.uint16


def test_bad_tokenizer_path(docs, tmp_path):
    folder, _ = docs
    with pytest.raises(DataError, match="tokenizer.json"):
        load_data(cfg_for(folder, tmp_path, tokenizer=str(tmp_path / "nope")))


# ------------------------------------------------------------------------------ sources

def test_jsonl_source(tmp_path):
    rng = np.random.default_rng(2)
    texts = [make_doc(rng, 250) for _ in range(8)]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    d = load_data(cfg_for(path, tmp_path))
    assert int((np.asarray(d.tokens) == d.eot_id).sum()) == 8
    assert d.info["num_documents"] == 8
    assert d.train_batch(0, 4).shape == (4, 17)


def test_parquet_source_with_custom_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(3)
    texts = [make_doc(rng, 250) for _ in range(8)]
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"body": texts, "n": list(range(8))}), path)
    d = load_data(cfg_for(path, tmp_path, text_column="body"))
    tokens = np.asarray(d.tokens)
    segments = np.split(tokens, np.flatnonzero(tokens == d.eot_id) + 1)[:-1]
    assert [d.tokenizer.decode(s[:-1].tolist()) for s in segments] == texts


def test_folder_with_mixed_file_types(tmp_path):
    rng = np.random.default_rng(4)
    folder = tmp_path / "mixed"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.md").write_text(make_doc(rng, 300))
    (folder / "sub" / "b.py").write_text("def f(x):\n    return x + 1\n" * 30)
    (folder / "c.jsonl").write_text("".join(json.dumps({"text": make_doc(rng, 300)}) + "\n" for _ in range(3)))
    (folder / "ignored.csv").write_text("text\nnot loaded\n")
    (folder / ".hidden.txt").write_text("not loaded either")
    d = load_data(cfg_for(folder, tmp_path, val_sequences=2))
    assert d.info["num_documents"] == 5  # a.md, sub/b.py, 3 JSONL rows
    assert int((np.asarray(d.tokens) == d.eot_id).sum()) == 5
    assert "not loaded" not in d.tokenizer.decode(np.asarray(d.tokens).tolist())


# ------------------------------------------------------------------------------- errors

def test_missing_path(tmp_path):
    with pytest.raises(DataError, match="does not exist") as e:
        load_data(cfg_for(tmp_path / "nowhere.jsonl", tmp_path))
    assert "nowhere.jsonl" in str(e.value)


def test_unknown_extension(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("text\nhello\n")
    with pytest.raises(DataError, match=r"unsupported extension '\.csv'.*\.jsonl"):
        load_data(cfg_for(path, tmp_path))
    with pytest.raises(DataError, match="holds no"):
        load_data(cfg_for(tmp_path, tmp_path))  # a folder with no supported files


def test_missing_text_column_lists_columns(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"body": "hello world", "id": 1}) + "\n")
    with pytest.raises(DataError, match=r"no column 'text'.*\['body', 'id'\].*text_column") as e:
        load_data(cfg_for(path, tmp_path))
    assert "c.jsonl" in str(e.value)
    with pytest.raises(DataError, match="not text"):
        load_data(cfg_for(path, tmp_path, text_column="id"))


def test_empty_corpus(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / "a.txt").write_text("")
    (folder / "b.txt").write_text("")
    with pytest.raises(DataError, match="no text"):
        load_data(cfg_for(folder, tmp_path))
    assert list((tmp_path / "cache" / "tokens").rglob("manifest.json")) == []
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "rows.jsonl").write_text("\n")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "rows.parquet")
    for name in ("rows.jsonl", "rows.parquet"):
        with pytest.raises(DataError, match="no documents"):
            load_data(cfg_for(tmp_path / name, tmp_path))


def test_corpus_too_small_for_val_split(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("just a few words here")
    with pytest.raises(DataError, match="val_sequences"):
        load_data(cfg_for(path, tmp_path, val_sequences=10))


def test_hf_name_offline_says_it_needs_network(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    with pytest.raises(DataError, match=r"needs network.*DataConfig\.source") as e:
        load_data(cfg_for("hf:cgpt-test/does-not-exist:cfg", tmp_path))
    assert "cgpt-test/does-not-exist" in str(e.value)


# ------------------------------------------------------------------------ default corpus

def test_corpus_manifest_is_reproducible():
    d = corpus.describe()
    assert d["paths"] == sorted(d["paths"]) and len(d["paths"]) == d["num_documents"] > 500
    assert not any("site-packages" in p or "__pycache__" in p for p in d["paths"])
    assert all(p.endswith(".py") for p in d["paths"])
    assert len(d["sha256"]) == 64 and d["python_version"].count(".") == 2
    assert corpus.identity().endswith(d["sha256"][:16])


def test_corpus_fraction_is_spread_evenly():
    assert corpus.sampled(10, 1.0) == list(range(10))
    assert corpus.sampled(12, 0.25) == [3, 7, 11]  # one of every 4, across the whole corpus
    for n, f in ((1758, 0.25), (1000, 0.1), (7, 0.5)):
        take = corpus.sampled(n, f)
        assert len(take) == int(n * f) and max(np.diff(take), default=0) <= math.ceil(1 / f)
    whole, part = corpus.describe(), corpus.describe(0.25)
    assert part["paths"] == [whole["paths"][i] for i in corpus.sampled(len(whole["paths"]), 0.25)]
    assert part["num_documents"] == len(part["paths"]) and part["sha256"] == whole["sha256"]
    assert corpus.identity(0.25) != corpus.identity() and corpus.identity(1.0) == corpus.identity()


@pytest.mark.parametrize("kw,message", [
    (dict(fraction=0), r"fraction must be a number in \(0, 1\]"),
    (dict(fraction=1.5), r"fraction must be a number in \(0, 1\]"),
    (dict(fraction=True), r"fraction must be a number"),
    (dict(fraction=0.5, source="some/dir"), r"samples the default corpus only.*select the files"),
])
def test_fraction_is_checked(kw, message):
    with pytest.raises(ValueError, match=message):
        DataConfig(**kw)


def test_a_fraction_of_the_default_corpus_is_prepared_alone(tmp_path):
    """Only the sampled documents are tokenized (the BPE too is trained on them): a store of
    its own, each document once."""
    d = load_data(DataConfig(fraction=0.02, vocab_size=300, seq_len=16, val_sequences=4,
                             cache_dir=str(tmp_path)))
    manifest = corpus.describe(0.02)
    whole = len(corpus.describe()["paths"])
    assert d.info["num_documents"] == manifest["num_documents"] == int(0.02 * whole)
    assert d.info["corpus"]["fraction"] == 0.02
    assert int((np.asarray(d.tokens) == d.eot_id).sum()) == manifest["num_documents"]
    assert [p.name for p in (tmp_path / "corpus").iterdir()] == [f"{corpus.identity(0.02)}.jsonl"]


@pytest.fixture(scope="module")
def default_data(tmp_path_factory):
    return load_data(DataConfig(cache_dir=str(tmp_path_factory.mktemp("cgpt-cache"))))


@pytest.mark.slow(reason=(
    "the whole default corpus (~60 s); its 2% sample takes the same path by default: "
    "test_a_fraction_of_the_default_corpus_is_prepared_alone"))
def test_default_corpus_has_at_least_5m_tokens(default_data):
    d = default_data
    assert d.vocab_size == 4096 and d.tokens.dtype == np.uint16
    assert len(d.tokens) >= 5_000_000
    manifest = corpus.describe()
    assert d.info["corpus"]["sha256"] == manifest["sha256"]
    assert d.info["num_documents"] == manifest["num_documents"]
    assert int((np.asarray(d.tokens) == d.eot_id).sum()) == manifest["num_documents"]
    assert d.num_val_sequences == 128 and d.train_batch(0, 2).shape == (2, 257)
    assert 3.0 < d.unigram_entropy() < math.log(4096)  # real text: far from uniform


def test_train_index_is_the_complement_of_the_val_windows(tmp_path):
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.BPE(vocab={EOT: 0, "a": 1}, merges=[]))
    for n, v in ((10, 2), (11, 3), (257, 16), (1000, 999)):
        d = data_mod.TokenData(np.zeros(n * 4 + 1, np.uint16), tok, seq_len=4, val_sequences=v, seed=0)
        want = np.setdiff1d(np.arange(n), d.val_index)
        np.testing.assert_array_equal(d.train_index, want)
        np.testing.assert_array_equal(np.sort(d.train_indices(0, d.num_train_sequences)), want)
