"""Prepare a token store: tokenize a corpus once, in parallel on all cores, resumably.

    python -m cgpt data prepare SOURCE --tokenizer TOK --out DIR

The corpus is cut into units (`cgpt.data.sources.plan_units`); a pool of processes tokenizes
them, each unit streamed in ~4 MiB batches into its own shard file, so memory stays bounded
whatever the corpus size (one document must fit in memory). Every shard is written
atomically and then recorded beside it; a prepare that is interrupted (Ctrl-C, a crash, a
killed job) and started again with the same arguments keeps the finished shards and does
only the rest. The manifest is written last, so a store is either complete or not trusted.

Why processes over units and not `datasets.map(num_proc=...)`: `datasets` first converts the
whole corpus to Arrow (a second copy as large as the text), cannot split a single large file
between workers, and a killed `map` restarts from scratch.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import fcntl
import hashlib
import json
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

import numpy as np
from tokenizers import Tokenizer
from tqdm.auto import tqdm

from cgpt import stop
from cgpt.data import sources
from cgpt.fileio import atomic_write, atomic_write_text
from cgpt.paths import check_utf8
from cgpt.data.sources import DataError, Unit
from cgpt.data.store import (FORMAT, MANIFEST, PLAN, TokenStore, discard_stale, shard_name,
                             token_dtype, write_manifest)
from cgpt.data.tokenizer import (EOT, TOKENIZER_FILE, load_tokenizer, sha256 as tokenizer_sha256,
                                 train_tokenizer, with_eot)

RECIPE = "cgpt-data-v2"  # bump whenever tokenization changes the tokens
MIN_UNIT, MAX_UNIT = 1 << 20, 1 << 28  # bytes of source per unit (shard)
LOCK_FILE = ".prepare.lock"  # in --out: one prepare per store directory
_held: set[Path] = set()  # store directories whose lock this process holds


@contextlib.contextmanager
def store_lock(out: Path) -> Iterator[None]:
    """Hold OUT/.prepare.lock (flock: released by the kernel even on SIGKILL) while writing a
    store; a second prepare of the same directory stops with one line naming the holder."""
    out = out.resolve()
    if out in _held:  # cmd_prepare holds it already around prepare()
        yield
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        f = open(out / LOCK_FILE, "a+")
    except OSError as e:
        raise DataError(f"--out {out}: cannot write there ({e.strerror or e}); choose another "
                        "--out") from None
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            raise DataError(f"another data prepare (pid {f.read().strip() or '?'}) is writing "
                            f"--out {out}; wait for it to finish (or stop it) and rerun") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        _held.add(out)
        try:
            yield
        finally:
            _held.discard(out)
    finally:
        f.close()


# -------------------------------------------------------------------------------- corpus

class Corpus:
    """A source resolved to its files (or a Hugging Face dataset) and its identity."""

    def __init__(self, source: str, text_column: str = "text", split: str = "train",
                 hf_cache: str | None = None):
        self.source, self.text_column, self.split = source, text_column, split
        self.files: list[Path] = []
        self.hf = None
        if source.startswith("hf:"):
            name, _, config = source[3:].partition(":")
            self.hf = _load_hub(name, config or None, split, hf_cache)
            if text_column not in self.hf.column_names:
                raise DataError(
                    f"dataset {name!r} has no column {text_column!r}; its columns are "
                    f"{self.hf.column_names}. Set DataConfig.text_column to the one that "
                    "holds the text.")
            self.identity = {
                "hf": name, "config": config or None, "split": split, "column": text_column,
                "fingerprint": getattr(self.hf, "_fingerprint", None)
            }
        else:
            if split != "train":
                raise DataError(
                    f"DataConfig.split={split!r} applies to hf: sources only; a local file or "
                    "folder is read whole (split 'train'): select the files instead")
            self.files = sources.list_files(Path(source).expanduser())
            self.identity = {
                "files": [sources.file_identity(p) for p in self.files], "column": text_column
            }

    def units(self, unit_bytes: int) -> list[Unit]:
        if self.hf is not None:
            rows = max(1, unit_bytes // 2048)  # ~2 KiB per row: a guess, used only to size units
            n = len(self.hf)
            return [Unit("hf", (), a, min(a + rows, n))
                    for a in range(0, n, rows)] or [Unit("hf", ())]
        return sources.plan_units(self.files, unit_bytes)

    def num_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files) if self.hf is None else self.hf.data.nbytes

    def texts(self) -> Iterator[list[str]]:
        """Every document's text, in order, in batches (for tokenizer training)."""
        for unit in self.units(MAX_UNIT):
            for texts, _ in sources.read_unit(unit, self.files, self.text_column,
                                              hf_dataset=self.hf):
                if texts:
                    yield texts


def _load_hub(name: str, config: str | None, split: str, hf_cache: str | None):
    datasets = sources.optional("datasets", f"data source 'hf:{name}' (a Hugging Face dataset)")

    try:
        return datasets.load_dataset(name, config, split=split, cache_dir=hf_cache)
    except Exception as e:
        offline = [v for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
                   if os.environ.get(v, "0") not in ("", "0")]
        raise DataError(
            f"could not load Hugging Face dataset {name!r} (config {config!r}, split "
            f"{split!r}): {e}. "
            f"A named dataset needs network access to the Hugging Face Hub" +
            (f" ({', '.join(offline)} is set)" if offline else "") +
            ". Without network, save the text as local files and set DataConfig.source to their "
            "path (.txt/.md/.py file or folder, or .jsonl/.jsonl.zst/.parquet with a 'text' "
            "column), or use 'default'."
        ) from e


# -------------------------------------------------------------------------------- workers

class _Worker:
    """What one process needs to tokenize units: built once per process by `_init`."""

    def __init__(self, tok_json: str, files: list[Path], column: str, root: Path, hf, progress):
        self.tok = Tokenizer.from_str(tok_json)
        self.tok.add_special_tokens([EOT])
        self.tok.encode_special_tokens = True  # a literal "<|endoftext|>" in the text is just text
        self.eot = self.tok.token_to_id(EOT)
        self.dtype = token_dtype(self.tok.get_vocab_size(with_added_tokens=True))
        self.files, self.column, self.root = files, column, root
        self.hf, self.progress = hf, progress

    def run(self, index: int, unit: Unit) -> dict:
        """Tokenize `unit` into shard `index` (atomically), record it, return the record.
        Progress goes out per batch read: (index, tokens, source bytes read)."""
        src, out = _Counting(hashlib.sha256()), hashlib.sha256()
        counts = {"num_rows": 0, "num_documents": 0, "num_tokens": 0}
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                for texts, rows in sources.read_unit(unit, self.files, self.column, src, self.hf):
                    counts["num_rows"] += rows
                    if not texts:
                        self.progress((index, 0, src.take()))
                        continue
                    ids: list[int] = []
                    for enc in encode(texts, add_special_tokens=False):
                        ids += enc.ids
                        ids.append(self.eot)
                    data = np.array(ids, dtype=self.dtype).tobytes()
                    f.write(data)
                    out.update(data)
                    counts["num_documents"] += len(texts)
                    counts["num_tokens"] += len(ids)
                    self.progress((index, len(ids), src.take()))

        name = shard_name(index)
        atomic_write(self.root / f"{name}.bin", write)
        record = {"file": f"{name}.bin", "unit": asdict(unit), **counts, "sha256": out.hexdigest(),
                  "source_sha256": None if unit.kind in ("parquet", "hf") else
                  src.digest.hexdigest()}
        atomic_write_text(self.root / f"{name}.json", json.dumps(record))
        return record


_worker: _Worker | None = None  # this process's worker, set once by the pool's initializer


class _Counting:
    """A digest that also counts the source bytes it was given (`take`: those since the last
    take): how far a worker has read its unit, for the prepare's bar."""

    def __init__(self, digest) -> None:
        self.digest, self.n = digest, 0

    def update(self, data) -> None:
        self.digest.update(data)
        self.n += len(data)

    def take(self) -> int:
        n, self.n = self.n, 0
        return n


class _Progress:
    """The prepare's bar: its size is the source bytes to tokenize (`unit_size`), advanced as
    the workers read, with the tokens written and the shards done beside it. A Parquet or
    Hugging Face unit, whose reader hashes no bytes, counts its size when it is done."""

    def __init__(self, sizes: dict[int, int], kept: int, total: int, progress: bool) -> None:
        self.sizes, self.read = sizes, dict.fromkeys(sizes, 0)  # source bytes: to read, read
        self.counted = dict.fromkeys(sizes, 0)  # tokens said per unit
        self.done, self.total, self.tokens, self.closed = kept, total, 0, set()
        self.about = _size(sum(sizes.values()))
        self.bar = tqdm(total=sum(sizes.values()), unit="B", unit_scale=True, unit_divisor=1000,
                        disable=not progress, dynamic_ncols=True, mininterval=1,
                        desc=self._desc())

    def _desc(self) -> str:
        return f"tokenizing {self.about}: {self.done}/{self.total} shards"

    def add(self, msg: tuple[int, int, int]) -> None:
        """A worker's (unit index, tokens, source bytes read) since its last; one that arrives
        after its unit's record (`finished`) was counted there."""
        i, tokens, n = msg
        if i in self.closed:
            return
        n = max(0, min(n, self.sizes[i] - self.read[i]))
        self.read[i] += n
        self.counted[i] += tokens
        self.tokens += tokens
        self.bar.set_postfix_str(f"{self.tokens:,} tokens", refresh=False)
        self.bar.update(n)
        if not n and not self.bar.disable and time.time() - self.bar.last_print_t >= 1:
            self.bar.refresh()  # tokens but no bytes (Parquet): still said every second

    def finished(self, i: int, record: dict) -> None:
        """Unit `i` is done, its shard's `record` written: its bytes and tokens all counted."""
        self.done += 1
        self.bar.set_description(self._desc(), refresh=False)
        self.add((i, record["num_tokens"] - self.counted[i], self.sizes[i] - self.read[i]))
        self.closed.add(i)


def _size(n: float) -> str:
    """Bytes as people read them: 20.9 MB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def unit_size(unit: Unit, corpus: "Corpus", units: list[Unit]) -> int:
    """About how many source bytes `unit` reads (the bar's size): its files' bytes, its byte
    range, or its share of a Parquet file's row groups or of a Hugging Face dataset's rows."""
    files = [corpus.files[i] for i in unit.files]
    if unit.kind == "text" or unit.kind == "jsonl-compressed":
        return sum(p.stat().st_size for p in files)
    if unit.kind == "jsonl":
        return unit.stop - unit.start
    if unit.kind == "parquet":
        groups = max(u.stop for u in units if u.kind == "parquet" and u.files == unit.files)
        return files[0].stat().st_size * (unit.stop - unit.start) // max(1, groups)
    rows = len(corpus.hf) or 1  # hf
    return corpus.num_bytes() * ((unit.stop or rows) - unit.start) // rows


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this worker when the prepare process dies (even by SIGKILL), so
    no orphan keeps writing into the store while a rerun writes it too."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pool's own checks remain
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _init(tok_json, files, column, root, hf, q, parent: int | None = None) -> None:
    global _worker
    if parent is not None:
        _die_with_parent(parent)
    stop.ignore_stops()  # the prepare process stops (one line) and kills the workers itself
    # one core per process: the pool is the parallelism
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker = _Worker(tok_json, files, column, root, hf, q.put)


def _run(index: int, unit: Unit) -> dict:
    return _worker.run(index, unit)


# ------------------------------------------------------------------------------- prepare


def prepare(source: str, tokenizer, out: str | os.PathLike, *, text_column: str = "text",
            split: str = "train", num_proc: int | None = None, unit_bytes: int | None = None,
            progress: bool = True, corpus: Corpus | None = None,
            extra: dict | None = None) -> TokenStore:
    """Tokenize `source` with `tokenizer` (a `tokenizers.Tokenizer` with <|endoftext|>) into the
    store `out`; resume an unfinished prepare there; return the opened store.

    num_proc: worker processes (default: every core this process may use).
    unit_bytes: source bytes per shard (default: ~4 shards per worker, 1 MiB .. 256 MiB).
    extra: JSON-able facts recorded in the manifest (e.g. the default corpus' description).
    """
    out = Path(out).expanduser()
    corpus = corpus or Corpus(source, text_column, split)
    if num_proc is not None and num_proc < 1:
        raise DataError(f"--num-proc {num_proc}: must be at least 1 (or leave it out: all cores)")
    num_proc = max(1, num_proc or sources.cpu_count())
    with store_lock(out):
        return _prepare(source, tokenizer, out, text_column, split, num_proc, unit_bytes,
                        progress, corpus, extra)


def _prepare(source, tokenizer, out: Path, text_column, split, num_proc, unit_bytes, progress,
             corpus: Corpus, extra) -> TokenStore:
    tok_json = tokenizer.to_str()
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = np.dtype(token_dtype(vocab_size)).name
    head = {
        "format": FORMAT, "recipe": RECIPE, "source": source, "text_column": text_column,
        "split": split, "sources": corpus.identity, "tokenizer_sha256": tokenizer_sha256(tokenizer),
        "dtype": dtype
    }
    plan_path = out / PLAN
    if plan_path.is_file():
        plan = _read_record(plan_path)
        if {k: plan.get(k) for k in head} != head:
            diff = sorted(k for k in head if plan.get(k) != head[k])
            raise DataError(f"{out} holds a prepare of different data ({', '.join(diff)} differ); "
                            "use another --out, or delete that directory to start over")
        if (out / MANIFEST).is_file():
            return TokenStore(out)
    else:
        if out.exists() and any(p.name != LOCK_FILE for p in out.iterdir()):
            raise DataError(
                f"--out {out} exists and is not a token store; choose an empty or new directory")
        if unit_bytes is None:
            unit_bytes = min(MAX_UNIT, max(MIN_UNIT, corpus.num_bytes() // (4 * num_proc)))
        plan = {
            **head, "unit_bytes": unit_bytes,
            "units": [asdict(u) for u in corpus.units(unit_bytes)]
        }
        atomic_write_text(out / TOKENIZER_FILE, tok_json)
        atomic_write_text(plan_path, json.dumps(plan) + "\n")
    try:
        units = [Unit(u["kind"], tuple(u["files"]), u["start"], u["stop"]) for u in plan["units"]]
    except (KeyError, TypeError) as e:
        raise DataError(f"{plan_path} is damaged (bad units: {type(e).__name__} {e}); delete "
                        f"{out} and prepare again") from None
    shards = out / "shards"
    shards.mkdir(exist_ok=True)
    for stale in shards.glob("*.tmp"):  # left by a killed worker; never trusted
        stale.unlink(missing_ok=True)
    todo = [(i, u) for i, u in enumerate(units) if not _shard_done(out, i)]
    bar = _Progress({i: unit_size(u, corpus, units) for i, u in todo}, len(units) - len(todo),
                    len(units), progress)
    _tokenize(todo, tok_json, corpus, out, num_proc, bar)
    return _finish(out, plan, units, corpus, vocab_size, tokenizer.token_to_id(EOT), extra)


def _tokenize(todo, tok_json, corpus, out, num_proc, bar: _Progress) -> None:
    try:
        if min(num_proc, len(todo)) <= 1:  # one unit or one core: no process to start
            worker = _Worker(tok_json, corpus.files, corpus.text_column, out, corpus.hf, bar.add)
            for i, unit in todo:
                bar.finished(i, worker.run(i, unit))
            return
        ctx = mp.get_context("spawn")  # never fork: the caller may hold threads (JAX, tokenizers)
        q = ctx.Queue()
        pool = cf.ProcessPoolExecutor(
            min(num_proc, len(todo)), mp_context=ctx, initializer=_init,
            initargs=(tok_json, corpus.files, corpus.text_column, out, corpus.hf, q, os.getpid()))
        try:
            index = {pool.submit(_run, i, u): i for i, u in todo}
            pending = set(index)
            while pending:
                ready, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_COMPLETED)
                _drain(q, bar)
                for fut in ready:
                    try:
                        record = fut.result()  # a worker's DataError (or a dead one) is here
                    except cf.process.BrokenProcessPool:
                        raise DataError(
                            f"a tokenizing worker of the prepare into {out} died (killed, or out "
                            "of memory: try fewer --num-proc); the finished shards are kept: "
                            "rerun the same command to continue") from None
                    bar.finished(index[fut], record)
            _drain(q, bar)
        except BaseException:
            for p in list(getattr(pool, "_processes", {}).values()):  # stop units in flight now
                p.kill()  # SIGKILL: the workers ignore the polite signals; their writes are atomic
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            del pool, q  # release their semaphores now: an error ends in os._exit (no gc)
    finally:
        bar.bar.close()


def _drain(q, bar: _Progress) -> None:
    while True:
        try:
            bar.add(q.get_nowait())
        except queue_mod.Empty:
            break


def _read_record(path: Path) -> dict:
    """A JSON object the prepare wrote (plan, shard record); damage is a DataError naming it."""
    try:
        rec = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        rec = e
    if not isinstance(rec, dict):
        why = f"{type(rec).__name__}: {rec}" if isinstance(rec, Exception) else "not an object"
        raise DataError(f"{path} is damaged ({str(why)[:200]}); delete {path.parent} and "
                        "prepare again")
    return rec


def _shard_done(out: Path, i: int) -> bool:
    """Shard i's record exists and parses (a damaged one is redone) with its .bin beside it."""
    path = out / f"{shard_name(i)}.json"
    try:
        rec = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(rec, dict) and isinstance(rec.get("num_tokens"), int) \
        and (out / f"{shard_name(i)}.bin").is_file()


def _finish(out: Path, plan: dict, units: list[Unit], corpus: Corpus, vocab_size: int, eot_id: int,
            extra: dict | None) -> TokenStore:
    records = [_read_record(out / f"{shard_name(i)}.json") for i in range(len(units))]
    rows = sum(r["num_rows"] for r in records)
    num_tokens = sum(r["num_tokens"] for r in records)
    if rows == 0:
        raise DataError(
            f"data source {corpus.source!r} has no documents; point it at a non-empty corpus")
    if num_tokens == 0:
        raise DataError(
            f"data source {corpus.source!r} has no text: every document is empty; point it at "
            "documents with text (or set DataConfig.text_column to the column that has it)")
    manifest = {
        k: plan[k]
        for k in ("format", "recipe", "source", "text_column", "split", "sources",
                  "tokenizer_sha256", "dtype")
    }
    manifest.update(vocab_size=vocab_size, eot_id=eot_id, num_rows=rows,
                    num_documents=sum(r["num_documents"] for r in records), num_tokens=num_tokens,
                    **(extra or {}), shards=records)
    write_manifest(out, manifest)
    return TokenStore(out)


# ----------------------------------------------------------------------------------- CLI

HEARTBEAT_S = 5.0  # a line this often during a long silent phase (training the tokenizer)

def register(subparsers) -> None:
    """Add `data prepare` to the `cgpt` CLI's subparsers (handler in `args.func`)."""
    p = subparsers.add_parser("data",
                              help="prepare token stores (tokenize a corpus once, in parallel)",
                              description="Data commands: `cgpt data prepare SOURCE --out DIR` "
                              "tokenizes a corpus once into a token store to train on.")
    sub = p.add_subparsers(dest="data_command", required=True)
    q = sub.add_parser("prepare", help="tokenize SOURCE into a sharded token store in --out",
                       description=__doc__.split("\n\n")[0] + " Train on it with data.source=DIR.")
    q.add_argument(
        "source", help="a .txt/.jsonl/.jsonl.zst/.jsonl.gz/.parquet file, a folder of them, "
        "or hf:<name>[:<config>]")
    q.add_argument(
        "--tokenizer", required=True, help="tokenizer.json, a directory with tokenizer.json or "
        "GPT-2 vocab.json + merges.txt, or 'train' (byte-level BPE of --vocab-size on SOURCE)")
    q.add_argument("--out", required=True, help="store directory (an unfinished one is resumed)")
    q.add_argument("--vocab-size", type=int, default=4096, help="with --tokenizer train")
    q.add_argument("--text-column", default="text", help="JSON/Parquet field holding the text")
    q.add_argument("--split", default="train", help="split of an hf: dataset")
    q.add_argument("--num-proc", type=int, help="worker processes (default: all cores)")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.set_defaults(func=cmd_prepare)


def cmd_prepare(args) -> int:
    t0 = time.perf_counter()
    out = Path(check_utf8(args.out, "--out")).expanduser()
    if args.vocab_size < 1:
        raise DataError(f"--vocab-size {args.vocab_size}: must be positive (e.g. 4096)")
    if args.tokenizer == "train" and args.vocab_size < 257:
        raise DataError(f"--vocab-size {args.vocab_size}: a byte-level BPE needs at least 257 "
                        "tokens (the 256 bytes and <|endoftext|>); e.g. 4096")
    corpus = Corpus(args.source, args.text_column, args.split)
    with store_lock(out):  # also around training the tokenizer, which it writes into --out
        return _cmd_prepare(args, out, corpus, t0)


def _cmd_prepare(args, out: Path, corpus: Corpus, t0: float) -> int:
    discard_stale(out, {"source": args.source, "text_column": args.text_column,
                        "split": args.split, "sources": corpus.identity})  # a killed prepare
    if args.tokenizer != "train":
        tok = load_tokenizer(args.tokenizer)
    elif (out / PLAN).is_file() and (out / TOKENIZER_FILE).is_file():
        tok = load_tokenizer(out / TOKENIZER_FILE)  # resuming: the tokenizer trained the first time
        _check_vocab(out, tok, args.vocab_size)
    else:  # a pass over the whole corpus before the bar: said, as the bar says its size
        print(f"training a byte-level BPE tokenizer of {args.vocab_size} tokens on "
              f"{args.source} ({_size(corpus.num_bytes())})...", file=sys.stderr, flush=True)
        t1 = time.perf_counter()
        with _heartbeat("training the tokenizer", t1):
            tok = train_tokenizer(corpus.texts(), args.vocab_size)
        print(f"trained the tokenizer in {time.perf_counter() - t1:.1f} s", file=sys.stderr,
              flush=True)
    tok = with_eot(tok, args.tokenizer)
    store = prepare(args.source, tok, out, text_column=args.text_column, split=args.split,
                    num_proc=args.num_proc, progress=not args.no_progress, corpus=corpus,
                    extra={"requested_vocab_size": args.vocab_size} if args.tokenizer == "train"
                    else None)
    m, dt = store.manifest, time.perf_counter() - t0
    print(json.dumps({"store": str(out), "num_tokens": m["num_tokens"],
                      "num_documents": m["num_documents"], "shards": len(m["shards"]),
                      "dtype": m["dtype"], "vocab_size": m["vocab_size"],
                      "seconds": round(dt, 1)}, indent=1))
    print(f"train on it with: data.source={out}")
    return 0


@contextlib.contextmanager
def _heartbeat(what: str, t0: float, every_s: float = HEARTBEAT_S) -> Iterator[None]:
    """A line every `every_s` while `what` runs, where no terminal shows the tokenizers
    library's own bar (a log, a pipe): no stretch of a prepare is silent for long."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every_s):
            print(f"{what}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    if not sys.stderr.isatty():
        threading.Thread(target=beat, name="cgpt-prepare-heartbeat", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _check_vocab(out: Path, tok, requested: int) -> None:
    """A store's trained tokenizer must be the one `--vocab-size` asks for, never a silent
    no-op (a small corpus may stop BPE short: a store without the request passes if smaller)."""
    have = tok.get_vocab_size(with_added_tokens=True)
    manifest = out / MANIFEST
    asked = _read_record(manifest).get("requested_vocab_size") if manifest.is_file() else None
    if requested in (have, asked) or (asked is None and have < requested):
        return
    raise DataError(f"--out {out} holds a store whose tokenizer was trained with a "
                    f"{asked or have}-token vocabulary, and --vocab-size {requested} asks for "
                    "another; use another --out, or delete that directory to start over")
