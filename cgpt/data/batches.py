"""Training data: resolve a source to a prepared token store, serve batches from it.

The pipeline, in order:

1. Source: a token store prepared by ``python -m cgpt data prepare`` (`cgpt.data.prepare`), used
   as is; or the embedded stdlib corpus (`cgpt.data.corpus`), local .txt/.jsonl(.zst/.gz)/.parquet
   files or a folder of them, or ``hf:<name>[:<config>]``, which are prepared into a store in
   the cache on first use (one process prepares; the others wait for it).
2. Tokenizer: reuse ``run_dir/tokenizer.json`` (resumed run), else the store's, else train a
   byte-level BPE on the corpus (cached), else load one from a directory (``tokenizer.json``
   or GPT-2 ``vocab.json`` + ``merges.txt``).
3. Tokens: every document once, ``<|endoftext|>`` after each, in shards of uint16 (uint32 for
   vocabularies over 65535) memory-mapped as one stream. A cached store's key hashes the
   corpus content, the tokenizer and the recipe, so anything that changes the tokens changes it.
4. Pack without padding: sequence ``i`` is the window ``tokens[i*L : i*L + L + 1]`` (``L`` =
   seq_len); input = ``w[:-1]``, target = ``w[1:]``, so every token after the first is a
   target exactly once (the < L leftover tokens at the very end are dropped).
5. Split: ``val_sequences`` windows spread evenly over the whole stream (window
   ``floor(k * n / val_sequences)``) are the validation set (fixed, seed-free), so it samples
   the corpus rather than its last few files; the rest are shuffled per epoch by
   ``default_rng([seed, epoch])``, and the batch at step ``s`` is the examples ``s*B .. s*B+B-1``
   of that endless shuffled stream, so it is a pure function of (seed, s, B): resuming at any
   step is exact, and each process of a multi-host run can read only its own rows of it
   (``train_batch(s, B, rows=slice(lo, hi))``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from cgpt.config import backend
from cgpt.config.data import DataConfig
from cgpt.data import corpus
from cgpt.fileio import atomic_write, shared_subfolder
from cgpt.data.prepare import RECIPE, Corpus, prepare
from cgpt.data.sources import DataError, file_sha256, list_files
from cgpt.data.store import (MANIFEST, TokenStore, is_store, read_windows,
                             token_dtype as _token_dtype)
from cgpt.data.tokenizer import (EOT, load_tokenizer, sha256 as tokenizer_sha256, train_tokenizer,
                                 with_eot)
from cgpt.rundir import TOKENIZER_FILE

__all__ = [
    "DataConfig", "DataError", "EOT", "TokenData", "load_data", "load_tokenizer", "train_tokenizer"
]


def cache_root(cfg: DataConfig) -> Path:
    """The cache directory: cfg.cache_dir, else $CGPT_CACHE, else ~/.cache/cgpt (one that is
    a file: a ValueError naming the key or variable)."""
    if not cfg.cache_dir:
        return backend.cache_home()
    return backend.cache_folder(Path(cfg.cache_dir).expanduser(),
                                f"data.cache_dir={cfg.cache_dir}",
                                "give data.cache_dir a directory (made if missing)")


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- sources

@dataclass(frozen=True)
class _Source:
    """A raw source (not yet a store): its identity (JSON-able; changes whenever the documents
    could change) and how to read it, resolved lazily (an hf: name may need the network)."""

    identity: dict
    corpus: Callable[[], Corpus]


def _resolve_source(cfg: DataConfig, root: Path) -> _Source:
    column = cfg.text_column
    if cfg.source == "default":
        return _Source({"corpus": corpus.identity(cfg.fraction), "column": column},
                       cache(lambda: Corpus(str(corpus.materialize(root, cfg.fraction)), column,
                                            cfg.split)))
    if cfg.source.startswith("hf:"):
        name, _, config = cfg.source[3:].partition(":")
        return _Source({"hf": name, "config": config or None, "split": cfg.split, "column": column},
                       cache(lambda: Corpus(cfg.source, column, cfg.split,
                                            str(shared_subfolder(root, "datasets")))))
    files = list_files(Path(cfg.source).expanduser())
    # The content hash keeps a cached store honest when a file changes; a prepared store
    # (`cgpt data prepare`) is never re-hashed.
    identity = {
        "files": [{"path": str(p.resolve()), "size": p.stat().st_size, "sha256": file_sha256(p)}
                  for p in files], "split": cfg.split, "column": column
    }
    return _Source(identity, cache(lambda: Corpus(cfg.source, column, cfg.split)))


def _lock_file(path: Path):
    """The lock file, opened for flock: another user's lock in a shared cache (mode 0644 under
    umask 022) is opened read-only, which is all flock needs, so that user can train on the
    stores it can read."""
    try:
        return open(path, "a")
    except PermissionError:
        if path.is_file():
            return open(path)
        raise


@contextlib.contextmanager
def _one_preparer(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path`: of all processes (of every host sharing the cache
    directory) preparing the same source, one works and the others wait, then reuse its store."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock_file(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"cgpt.data.batches: waiting for another process preparing the same data ({path})",
                file=sys.stderr)
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError as e:  # a filesystem without locks: say so, and prepare uncoordinated
            print(
                f"cgpt.data.batches: cannot lock {path} ({e}); if several processes prepare "
                "this data at once, "
                "prepare it first with `python -m cgpt data prepare`", file=sys.stderr)
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -------------------------------------------------------------------------- tokenizer

def _resolve_tokenizer(cfg: DataConfig, run_dir: Path | None, root: Path, source: _Source):
    """(tokenizer, where it came from). A run's own tokenizer.json always wins (resume)."""
    if run_dir is not None and (run_dir / TOKENIZER_FILE).is_file():
        tok, origin = load_tokenizer(run_dir / TOKENIZER_FILE), str(run_dir / TOKENIZER_FILE)
    elif cfg.tokenizer == "train":
        digest = _digest([RECIPE, source.identity])[:20]
        path = shared_subfolder(root, "tokenizers") / f"bpe{cfg.vocab_size}-{digest}.json"
        if not path.is_file():
            tok = train_tokenizer(source.corpus().texts(), cfg.vocab_size)
            atomic_write(path, lambda tmp: tok.save(str(tmp)))
        tok, origin = load_tokenizer(path), str(path)
    else:
        tok, origin = load_tokenizer(cfg.tokenizer), cfg.tokenizer
    return with_eot(tok, origin), origin


def _save_tokenizer(tok, run_dir: Path) -> Path:
    path = Path(run_dir) / TOKENIZER_FILE
    atomic_write(path, lambda tmp: tok.save(str(tmp)))
    return path


def _store_tokenizer(cfg: DataConfig, store: TokenStore, run_dir: Path | None):
    """A store's tokenizer, after checking that the config and the run do not ask for another."""
    tok = store.tokenizer()
    given = [(str(run_dir / TOKENIZER_FILE), "the run's") if run_dir is not None
             and (run_dir / TOKENIZER_FILE).is_file() else None,
             (cfg.tokenizer, "DataConfig.tokenizer") if cfg.tokenizer != "train" else None]
    for path, what in filter(None, given):
        if tokenizer_sha256(with_eot(load_tokenizer(path), path)) != tokenizer_sha256(tok):
            raise DataError(
                f"{what} tokenizer {path!r} differs from the one the store {store.root} was "
                "prepared with; a store brings its own tokenizer: leave data.tokenizer unset "
                "(or start a new run directory)")
    for key, default in (("text_column", "text"), ("split", "train")):
        if getattr(cfg, key) != default and getattr(cfg, key) != store.manifest[key]:
            raise DataError(
                f"DataConfig.{key}={getattr(cfg, key)!r} but the store {store.root} was prepared "
                f"with {key}={store.manifest[key]!r}; it is fixed at prepare time: unset it")
    return tok


# ------------------------------------------------------------------------------ data

class TokenData:
    """A packed token stream with fixed, evenly spread validation windows and a seeded,
    resumable train order."""

    def __init__(self, tokens: np.ndarray, tokenizer, seq_len: int, val_sequences: int, seed: int,
                 info: dict | None = None):
        self.tokens = tokens  # flat token stream (np.memmap when loaded from the cache)
        self.tokenizer = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eot_id: int = tokenizer.token_to_id(EOT)
        self.seq_len = seq_len
        self.seed = seed
        num_sequences = (len(tokens) - 1) // seq_len
        if num_sequences <= val_sequences:
            raise DataError(
                f"the corpus has {len(tokens)} tokens = {num_sequences} sequences of "
                f"seq_len={seq_len}, not more than val_sequences={val_sequences}, leaving nothing "
                "to train on; use more text, or lower "
                "DataConfig.seq_len / DataConfig.val_sequences")
        self.num_val_sequences: int = val_sequences
        self.num_train_sequences: int = num_sequences - val_sequences
        # Evenly spaced held-out windows: distinct because num_sequences > val_sequences.
        self.val_index = np.arange(val_sequences, dtype=np.int64) * num_sequences // val_sequences
        self._val_shift = self.val_index - np.arange(val_sequences)  # see _train_sequence
        self.num_train_tokens: int = self.num_train_sequences * seq_len  # target tokens per epoch
        self.info = dict(info or {})
        self._perms: dict[int, np.ndarray] = {}
        self._unigram_entropy: float | None = None

    # -- batches
    def _windows(self, seq_idx: np.ndarray) -> np.ndarray:
        starts = np.asarray(seq_idx, dtype=np.int64) * self.seq_len
        w = read_windows(self.tokens, starts, self.seq_len + 1)
        if w.size and int(w.max()) >= self.vocab_size:  # else an embedding of NaN, a NaN loss
            row, col = np.unravel_index(int(np.argmax(w >= self.vocab_size)), w.shape)
            where = self.info.get("store", "the token stream")
            raise DataError(
                f"{where}: token id {int(w[row, col])} at position {int(starts[row]) + col} is "
                f"outside the tokenizer's vocabulary (vocab_size {self.vocab_size}): the shards "
                "were not made by this tokenizer, or are damaged; prepare the store again "
                "(`TokenStore(path).verify()` checks every shard's sha256)")
        return w

    @property
    def train_index(self) -> np.ndarray:
        """Every training sequence, ascending (all sequences but the validation windows)."""
        return self._train_sequence(np.arange(self.num_train_sequences, dtype=np.int64))

    def _train_sequence(self, j: np.ndarray) -> np.ndarray:
        """The j-th training sequence, without an n-long index array (n is 1e8 at Pile scale):
        j plus the number of validation windows at or before it, i.e. with val_index[k] - k <= j."""
        return j + np.searchsorted(self._val_shift, j, side="right")

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # a batch spans at most two epochs; keep memory flat
                self._perms.pop(min(self._perms))
            rng = np.random.default_rng([self.seed, epoch])
            self._perms[epoch] = rng.permutation(self.num_train_sequences)
        return self._perms[epoch]

    def train_indices(self, step: int, batch_size: int, rows: slice | None = None) -> np.ndarray:
        """Sequence indices of the global batch at `step`: a pure function of (seed, step,
        batch_size). `rows` selects rows [lo, hi) of that global batch (one process's share
        of it)."""
        if step < 0 or batch_size < 1:
            raise ValueError(
                f"need step >= 0 and batch_size >= 1 (got step={step}, batch_size={batch_size})")
        example = step * batch_size + np.arange(batch_size, dtype=np.int64)
        if rows is not None:
            if not isinstance(rows, slice) or rows.step not in (None, 1):
                raise ValueError(f"rows must be a slice(lo, hi) of the global batch (got {rows!r})")
            example = example[rows]
        epoch, position = np.divmod(example, self.num_train_sequences)
        out = np.empty(len(example), dtype=np.int64)
        for e in np.unique(epoch):
            sel = epoch == e
            out[sel] = self._train_sequence(self._permutation(int(e))[position[sel]])
        return out

    def train_batch(self, step: int, batch_size: int, rows=slice(None)) -> np.ndarray:
        """int32 [batch_size, seq_len+1]; inputs = [:, :-1], targets = [:, 1:].

        `rows` (a slice or an index array) keeps only those rows of the global batch, reading only
        their tokens: each process of a multi-host run reads its own share. Equal to
        train_batch(step, batch_size)[rows].
        """
        return self._windows(self.train_indices(step, batch_size)[rows])

    def val_batches(self, batch_size: int, drop_last: bool = False,
                    rows=slice(None)) -> Iterator[np.ndarray]:
        """The whole validation split in fixed order, int32 [<=batch_size, seq_len+1].

        The last batch is smaller when batch_size does not divide num_val_sequences
        (drop_last=True skips it instead). Every sequence has seq_len targets, so the
        mean loss over the split is the example-weighted mean of the batch means. `rows`
        keeps only those rows of each (full) batch, as in `train_batch`.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
        for start in range(0, self.num_val_sequences, batch_size):
            stop = min(start + batch_size, self.num_val_sequences)
            if drop_last and stop - start < batch_size:
                return
            yield self._windows(self.val_index[start:stop][rows])

    # -- bookkeeping
    def epoch_at(self, step: int, batch_size: int) -> float:
        """Passes over the training split completed before `step`."""
        return step * batch_size / self.num_train_sequences

    def epochs_for_tokens(self, num_tokens: int) -> float:
        """Epochs a budget of `num_tokens` training tokens implies (> 1 means the data repeats)."""
        return num_tokens / self.num_train_tokens

    def unigram_entropy(self) -> float:
        """Entropy (nats/token) of the train targets' unigram distribution: the loss of the
        best model that ignores context, which a trained LM must beat."""
        if self._unigram_entropy is None:
            counts = np.zeros(max(self.vocab_size, int(self.eot_id) + 1), dtype=np.int64)
            for i in range(0, self.num_train_sequences, 1 << 14):  # chunks keep memory flat
                j = np.arange(i, min(i + (1 << 14), self.num_train_sequences), dtype=np.int64)
                chunk = self._windows(self._train_sequence(j))[:, 1:]
                counts += np.bincount(chunk.ravel(), minlength=counts.size)[: counts.size]
            p = counts[counts > 0] / counts.sum()
            self._unigram_entropy = float(-(p * np.log(p)).sum())
        return self._unigram_entropy

    def save_tokenizer(self, run_dir: str | os.PathLike) -> Path:
        """Write run_dir/tokenizer.json (atomically) so the run can be resumed and sampled."""
        return _save_tokenizer(self.tokenizer, Path(run_dir))

    def describe(self) -> dict:
        """Everything a run should record about its data (JSON-able)."""
        return {
            **self.info,
            "vocab_size": self.vocab_size,
            "eot_id": self.eot_id,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "num_tokens": int(len(self.tokens)),
            "num_train_sequences": self.num_train_sequences,
            "num_train_tokens": self.num_train_tokens,
            "num_val_sequences": self.num_val_sequences,
        }

    def __repr__(self) -> str:
        return (
            f"TokenData({len(self.tokens):,} tokens, vocab {self.vocab_size}, "
            f"seq_len {self.seq_len}, "
            f"{self.num_train_sequences:,} train / {self.num_val_sequences:,} val sequences)")


def load_data(cfg: DataConfig, run_dir: str | os.PathLike | None = None,
              on_lock: Callable[[], None] | None = None) -> TokenData:
    """Open the token store for `cfg`: the prepared store it names, or (any other source) the
    store in the cache, prepared there first if needed (one process at a time).

    With `run_dir`, the tokenizer is taken from run_dir/tokenizer.json when it exists
    (a resumed run keeps its tokenizer) and saved there otherwise. `on_lock()` is called once
    this process holds the preparer's lock (or needs none): from then on any other process
    loading the same data waits for this one (`cgpt.sweep.launcher.prepare_ahead`).
    """
    root = cache_root(cfg)
    run_dir = Path(run_dir) if run_dir is not None else None
    if cfg.source != "default" and not cfg.source.startswith("hf:") and is_store(cfg.source):
        if on_lock:
            on_lock()
        store = TokenStore(cfg.source)
        tok, tok_origin = _store_tokenizer(cfg, store, run_dir), str(store.root / TOKENIZER_FILE)
    else:
        source = _resolve_source(cfg, root)
        locks = shared_subfolder(root, "locks")
        with _one_preparer(locks / f"{_digest([RECIPE, source.identity])[:24]}.lock"):
            if on_lock:
                on_lock()
            tok, tok_origin = _resolve_tokenizer(cfg, run_dir, root, source)
            dtype = np.dtype(_token_dtype(tok.get_vocab_size(with_added_tokens=True))).name
            key = _digest([RECIPE, source.identity, tokenizer_sha256(tok), dtype])[:24]
            path = shared_subfolder(root, "tokens") / key
            if (path / MANIFEST).is_file():
                store = TokenStore(path)
            else:
                extra = ({"corpus": {k: v for k, v in corpus.describe(cfg.fraction).items()
                                       if k != "paths"}}
                         if cfg.source == "default" else None)
                c = source.corpus()
                store = prepare(cfg.source, tok, path, text_column=c.text_column, split=c.split,
                                corpus=c, extra=extra, progress=True)
    if run_dir is not None and not (run_dir / TOKENIZER_FILE).exists():
        _save_tokenizer(tok, run_dir)
    info = {k: v for k, v in store.manifest.items() if k not in ("shards", "sources", "format")}
    info.update(config=asdict(cfg), store=str(store.root), store_sha256=store.sha256,
                tokenizer=tok_origin)
    return TokenData(store.tokens(), tok, cfg.seq_len, cfg.val_sequences, cfg.seed, info)


# python -m cgpt.data.batches: prepare the default corpus and print its figures
if __name__ == "__main__":
    import time

    t0 = time.time()
    data = load_data(DataConfig())
    summary = {k: v for k, v in data.describe().items() if k != "config"}
    summary.update(seconds=round(time.time() - t0, 1),
                   unigram_entropy=round(data.unigram_entropy(), 4))
    print(json.dumps(summary, indent=1))
