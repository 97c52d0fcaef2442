"""Training data: load a corpus, tokenize it once, pack it, cache it, serve batches.

The pipeline, in order:

1. Source -> `datasets.Dataset` of documents: the embedded stdlib corpus (`cgpt.corpus`),
   local text/JSONL/JSON/Parquet files or a folder of them, or ``hf:<name>[:<config>]``.
2. Tokenizer: reuse ``run_dir/tokenizer.json`` (resumed run), else train a byte-level BPE
   on the corpus (cached), else load one from a directory (``tokenizer.json`` or GPT-2
   ``vocab.json`` + ``merges.txt``).
3. Tokenize once, appending ``<|endoftext|>`` after every document, into one flat token
   file in the cache (uint16 when the vocabulary fits, else uint32), written atomically
   and memory-mapped afterwards. Its key hashes the corpus content, the tokenizer and the
   recipe, so anything that changes the tokens changes the file.
4. Pack without padding: sequence ``i`` is the window ``tokens[i*L : i*L + L + 1]`` (``L`` =
   seq_len); input = ``w[:-1]``, target = ``w[1:]``, so every token after the first is a
   target exactly once (the < L leftover tokens at the very end are dropped).
5. Split: ``val_sequences`` windows spread evenly over the whole stream (window
   ``floor(k * n / val_sequences)``) are the validation set (fixed, seed-free), so it samples
   the corpus rather than its last few files; the rest are shuffled per epoch by ``default_rng([seed, epoch])``, and the batch at
   step ``s`` is the examples ``s*B .. s*B+B-1`` of that endless shuffled stream, so it is
   a pure function of (seed, s, B): resuming at any step is exact.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from itertools import chain
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from tqdm.auto import tqdm

from cgpt import corpus
from cgpt.fileio import atomic_write

EOT = "<|endoftext|>"
# Extension -> `datasets` packaged builder. Text-like files are one document per file.
EXTENSIONS = {
    ".txt": "text", ".md": "text", ".py": "text",
    ".jsonl": "json", ".json": "json",
    ".parquet": "parquet",
}
RECIPE = "cgpt-data-v1"  # bump whenever tokenization or tokenizer training changes
_TOKENIZE_BATCH = 256  # documents per encode_batch call


class DataError(ValueError):
    """The data cannot be prepared as configured; the message says what to change."""


@dataclass(frozen=True)
class DataConfig:
    """What to train on and how to cut it into sequences.

    source: "default" (the embedded Python-stdlib corpus), a local file or folder
        (.txt/.md/.py = one document per file; .jsonl/.json/.parquet = one document per
        row, text in `text_column`), or "hf:<dataset>[:<config>]" (needs the network).
    split: the `datasets` split to read (slicing such as "train[:10%]" works too).
    tokenizer: "train" (byte-level BPE trained on the corpus at `vocab_size`) or a path to
        a tokenizer.json file or a directory with tokenizer.json or vocab.json+merges.txt.
    val_sequences: how many sequences, spread evenly over the token stream, are held out.
    cache_dir: where prepared data lives; None = $CGPT_CACHE or ~/.cache/cgpt.
    """

    source: str = "default"
    split: str = "train"
    text_column: str = "text"
    tokenizer: str = "train"
    vocab_size: int = 4096
    seq_len: int = 256
    val_sequences: int = 128
    seed: int = 0
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("source", "split", "text_column", "tokenizer"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"DataConfig.{name} must be a non-empty string (got {value!r})")
        if self.source.startswith("hf:") and not self.source[3:].partition(":")[0]:
            raise ValueError(f"DataConfig.source {self.source!r} has no dataset name; use 'hf:<name>[:<config>]'")
        _check_int("vocab_size", self.vocab_size, 257, "at least 256 byte tokens + <|endoftext|>")
        if self.vocab_size > 2**32:
            raise ValueError(f"DataConfig.vocab_size must be <= 2**32 (got {self.vocab_size})")
        _check_int("seq_len", self.seq_len, 1, "tokens per training sequence")
        _check_int("val_sequences", self.val_sequences, 1, "held-out sequences for validation")
        _check_int("seed", self.seed, 0, "it seeds numpy's default_rng")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise ValueError(f"DataConfig.cache_dir must be a path or None (got {self.cache_dir!r})")


def _check_int(name: str, value: object, minimum: int, why: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"DataConfig.{name} must be an int >= {minimum} ({why}); got {value!r}")


def cache_root(cfg: DataConfig) -> Path:
    """The cache directory: cfg.cache_dir, else $CGPT_CACHE, else ~/.cache/cgpt."""
    root = cfg.cache_dir or os.environ.get("CGPT_CACHE") or Path.home() / ".cache" / "cgpt"
    return Path(root).expanduser()


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- sources

@dataclass(frozen=True)
class _Source:
    identity: dict  # JSON-able; changes whenever the documents could change
    load: Callable[[], "datasets.Dataset"]  # noqa: F821  -- documents in column "text"


def _resolve_source(cfg: DataConfig, root: Path) -> _Source:
    hf_cache = str(root / "datasets")
    if cfg.source == "default":
        def load():
            path = corpus.materialize(root)
            return _load_files(cfg, [(path, "json")], hf_cache)
        return _Source({"corpus": corpus.identity(), "split": cfg.split, "column": cfg.text_column}, load)
    if cfg.source.startswith("hf:"):
        name, _, config = cfg.source[3:].partition(":")
        return _Source({"hf": name, "config": config or None, "split": cfg.split, "column": cfg.text_column},
                       lambda: _load_hub(cfg, name, config or None, hf_cache))
    files = _local_files(Path(cfg.source).expanduser())
    identity = {
        "files": [{"path": str(p.resolve()), "size": p.stat().st_size, "sha256": _file_sha256(p)} for p, _ in files],
        "split": cfg.split, "column": cfg.text_column,
    }
    return _Source(identity, lambda: _load_files(cfg, files, hf_cache))


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _local_files(path: Path) -> list[tuple[Path, str]]:
    """(file, datasets builder) for a file or every supported file under a folder, sorted."""
    supported = ", ".join(EXTENSIONS)
    if not path.exists():
        raise DataError(f"data source {str(path)!r} does not exist; set DataConfig.source to an existing "
                        f"file or folder ({supported}), 'default', or 'hf:<dataset>[:<config>]'")
    if path.is_file():
        if path.suffix.lower() not in EXTENSIONS:
            raise DataError(f"data source {str(path)!r} has unsupported extension {path.suffix!r}; "
                            f"use one of {supported} (or convert the file to JSONL with a 'text' field)")
        return [(path, EXTENSIONS[path.suffix.lower()])]
    files = sorted(p for p in path.rglob("*")
                   if p.is_file() and p.suffix.lower() in EXTENSIONS
                   and not any(part.startswith(".") for part in p.relative_to(path).parts))
    if not files:
        raise DataError(f"data folder {str(path)!r} holds no {supported} files; put documents there "
                        "or point DataConfig.source at a file")
    return [(p, EXTENSIONS[p.suffix.lower()]) for p in files]


def _load_files(cfg: DataConfig, files: list[tuple[Path, str]], hf_cache: str):
    """One `datasets` load per builder kind; documents end up in column "text"."""
    import datasets

    files = [(p, b) for p, b in files if _has_rows(p, b)]  # `datasets` fails obscurely on empty files
    if not files:
        raise DataError(f"data source {cfg.source!r} has no documents (its files are empty); "
                        "point DataConfig.source at files with text")
    parts = []
    for builder in ("text", "json", "parquet"):
        group = [str(p) for p, b in files if b == builder]
        if not group:
            continue
        kwargs = {"sample_by": "document"} if builder == "text" else {}
        where = group[0] if len(group) == 1 else f"{len(group)} {builder} files under {os.path.commonpath(group)!r}"
        try:
            ds = datasets.load_dataset(builder, data_files=group, split=cfg.split, cache_dir=hf_cache, **kwargs)
        except Exception as e:  # malformed JSON, bad split name, ...: say which files
            raise DataError(f"could not load {where} with datasets ({builder!r}): {e}") from e
        column = "text" if builder == "text" else cfg.text_column
        parts.append(_text_only(ds, column, where))
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _has_rows(path: Path, builder: str) -> bool:
    if builder == "parquet":
        import pyarrow.parquet as pq
        return pq.read_metadata(path).num_rows > 0
    if builder == "json":
        with open(path, "rb") as f:
            return bool(f.read(1 << 16).strip())  # a JSON file that starts with 64 KiB of blanks is not one
    return True  # a text file is one document even when empty (then it has no tokens)


def _load_hub(cfg: DataConfig, name: str, config: str | None, hf_cache: str):
    import datasets

    try:
        ds = datasets.load_dataset(name, config, split=cfg.split, cache_dir=hf_cache)
    except Exception as e:
        offline = [v for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE") if os.environ.get(v, "0") not in ("", "0")]
        raise DataError(
            f"could not load Hugging Face dataset {name!r} (config {config!r}, split {cfg.split!r}): {e}. "
            f"A named dataset needs network access to the Hugging Face Hub"
            + (f" ({', '.join(offline)} is set)" if offline else "")
            + ". Without network, save the text as local files and set DataConfig.source to their path "
              "(.txt/.md/.py file or folder, or .jsonl/.json/.parquet with a 'text' column), or use 'default'."
        ) from e
    return _text_only(ds, cfg.text_column, f"dataset {name!r}")


def _text_only(ds, column: str, where: str):
    import datasets

    if column not in ds.column_names:
        raise DataError(f"{where} has no column {column!r}; its columns are {ds.column_names}. "
                        "Set DataConfig.text_column to the one that holds the text.")
    feature = ds.features[column]
    if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
        raise DataError(f"column {column!r} of {where} holds {feature}, not text; set DataConfig.text_column "
                        f"to a string column (columns: {ds.column_names})")
    ds = ds.select_columns([column])
    return ds.rename_column(column, "text") if column != "text" else ds


def _texts(ds) -> Iterator[list[str]]:
    """Documents in batches, empty/None rows dropped (they would only add stray <|endoftext|>s)."""
    for batch in ds.iter(batch_size=_TOKENIZE_BATCH):
        yield [t for t in batch["text"] if t]


# -------------------------------------------------------------------------- tokenizer

def train_tokenizer(ds, vocab_size: int) -> "tokenizers.Tokenizer":  # noqa: F821
    """Byte-level BPE (GPT-2 style: any byte string encodes, no <unk>) with <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=sys.stderr.isatty())
    tok.train_from_iterator(_texts(ds), trainer, length=-(-len(ds) // _TOKENIZE_BATCH))
    return tok


def load_tokenizer(path: str | os.PathLike) -> "tokenizers.Tokenizer":  # noqa: F821
    """A tokenizer.json file, or a directory with tokenizer.json or GPT-2 vocab.json + merges.txt."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    path = Path(path).expanduser()
    if path.is_file():
        return Tokenizer.from_file(str(path))
    if (path / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(path / "tokenizer.json"))
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        tok = Tokenizer(models.BPE.from_file(str(path / "vocab.json"), str(path / "merges.txt")))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        return tok
    raise DataError(f"tokenizer {str(path)!r} is not a tokenizer.json file nor a directory with tokenizer.json "
                    "or vocab.json + merges.txt; set DataConfig.tokenizer to such a path or to 'train'")


def _resolve_tokenizer(cfg: DataConfig, run_dir: Path | None, root: Path, source: _Source, get_ds):
    """(tokenizer, where it came from). A run's own tokenizer.json always wins (resume)."""
    if run_dir is not None and (run_dir / "tokenizer.json").is_file():
        tok, origin = load_tokenizer(run_dir / "tokenizer.json"), str(run_dir / "tokenizer.json")
    elif cfg.tokenizer == "train":
        path = root / "tokenizers" / f"bpe{cfg.vocab_size}-{_digest([RECIPE, source.identity])[:20]}.json"
        if not path.is_file():
            tok = train_tokenizer(get_ds(), cfg.vocab_size)
            atomic_write(path, lambda tmp: tok.save(str(tmp)))
        tok, origin = load_tokenizer(path), str(path)
    else:
        tok, origin = load_tokenizer(cfg.tokenizer), cfg.tokenizer
    if tok.token_to_id(EOT) is None:
        raise DataError(f"tokenizer {origin!r} has no {EOT!r} token, which separates documents; "
                        "use a tokenizer that has it, or DataConfig.tokenizer='train'")
    tok.add_special_tokens([EOT])  # already in the vocabulary: marks it special, keeps its id
    return tok, origin


def _save_tokenizer(tok, run_dir: Path) -> Path:
    path = Path(run_dir) / "tokenizer.json"
    atomic_write(path, lambda tmp: tok.save(str(tmp)))
    return path


# ------------------------------------------------------------------------ tokenization

def _token_dtype(vocab_size: int) -> type:
    return np.uint16 if vocab_size <= 65535 else np.uint32


def _tokenize_to_file(ds, tok, eot_id: int, dtype, path: Path) -> int:
    """Tokenize every document once, <|endoftext|> after each, streamed to a flat binary file."""
    n_tokens = 0

    def write(tmp: Path) -> None:
        nonlocal n_tokens
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
        tok.encode_special_tokens = True  # a literal "<|endoftext|>" in the text is just text
        try:
            with open(tmp, "wb") as f, tqdm(total=len(ds), unit="doc", desc="tokenizing", mininterval=1) as bar:
                for batch in ds.iter(batch_size=_TOKENIZE_BATCH):
                    encodings = encode([t for t in batch["text"] if t], add_special_tokens=False)
                    ids = np.fromiter(chain.from_iterable(chain(e.ids, (eot_id,)) for e in encodings), dtype=dtype)
                    ids.tofile(f)
                    n_tokens += ids.size
                    bar.update(len(batch["text"]))
        finally:
            tok.encode_special_tokens = False
        if n_tokens == 0:
            raise DataError("the corpus has no text: every document is empty; point DataConfig.source at "
                            "documents with text (or set DataConfig.text_column to the column that has it)")

    atomic_write(path, write)
    return n_tokens


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
                f"the corpus has {len(tokens)} tokens = {num_sequences} sequences of seq_len={seq_len}, not more "
                f"than val_sequences={val_sequences}, leaving nothing to train on; use more text, or lower "
                "DataConfig.seq_len / DataConfig.val_sequences")
        self.num_val_sequences: int = val_sequences
        self.num_train_sequences: int = num_sequences - val_sequences
        # Evenly spaced held-out windows: distinct because num_sequences > val_sequences.
        self.val_index = np.arange(val_sequences, dtype=np.int64) * num_sequences // val_sequences
        self.train_index = np.setdiff1d(np.arange(num_sequences, dtype=np.int64), self.val_index)
        self.num_train_tokens: int = self.num_train_sequences * seq_len  # target tokens per epoch
        self.info = dict(info or {})
        self._perms: dict[int, np.ndarray] = {}
        self._unigram_entropy: float | None = None

    # -- batches
    def _windows(self, seq_idx: np.ndarray) -> np.ndarray:
        starts = np.asarray(seq_idx, dtype=np.int64)[:, None] * self.seq_len
        return np.array(self.tokens[starts + np.arange(self.seq_len + 1)], dtype=np.int32)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # a batch spans at most two epochs; keep memory flat
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.num_train_sequences)
        return self._perms[epoch]

    def train_indices(self, step: int, batch_size: int) -> np.ndarray:
        """Sequence indices of the global batch at `step`: a pure function of (seed, step, batch_size)."""
        if step < 0 or batch_size < 1:
            raise ValueError(f"need step >= 0 and batch_size >= 1 (got step={step}, batch_size={batch_size})")
        example = step * batch_size + np.arange(batch_size, dtype=np.int64)
        epoch, position = np.divmod(example, self.num_train_sequences)
        out = np.empty(batch_size, dtype=np.int64)
        for e in np.unique(epoch):
            sel = epoch == e
            out[sel] = self.train_index[self._permutation(int(e))[position[sel]]]
        return out

    def train_batch(self, step: int, batch_size: int, rows=slice(None)) -> np.ndarray:
        """int32 [batch_size, seq_len+1]; inputs = [:, :-1], targets = [:, 1:]. `rows` (a slice
        or index array) keeps only those rows of the global batch: one process's share."""
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
            for i in range(0, len(self.train_index), 1 << 14):  # chunks keep memory flat
                chunk = self._windows(self.train_index[i:i + (1 << 14)])[:, 1:]
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
            "vocab_size": self.vocab_size, "eot_id": self.eot_id, "seq_len": self.seq_len, "seed": self.seed,
            "num_tokens": int(len(self.tokens)), "num_train_sequences": self.num_train_sequences,
            "num_train_tokens": self.num_train_tokens, "num_val_sequences": self.num_val_sequences,
        }

    def __repr__(self) -> str:
        return (f"TokenData({len(self.tokens):,} tokens, vocab {self.vocab_size}, seq_len {self.seq_len}, "
                f"{self.num_train_sequences:,} train / {self.num_val_sequences:,} val sequences)")


def load_data(cfg: DataConfig, run_dir: str | os.PathLike | None = None) -> TokenData:
    """Prepare (first time) or memory-map (later) the token data for `cfg`.

    With `run_dir`, the tokenizer is taken from run_dir/tokenizer.json when it exists
    (a resumed run keeps its tokenizer) and saved there otherwise.
    """
    root = cache_root(cfg)
    run_dir = Path(run_dir) if run_dir is not None else None
    source = _resolve_source(cfg, root)
    loaded = []

    def get_ds():  # loading the documents is skipped entirely when everything is cached
        if not loaded:
            ds = source.load()
            if len(ds) == 0:
                raise DataError(f"data source {cfg.source!r} (split {cfg.split!r}) has no documents; "
                                "point DataConfig.source at a non-empty corpus")
            loaded.append(ds)
        return loaded[0]

    tok, tok_origin = _resolve_tokenizer(cfg, run_dir, root, source, get_ds)
    if run_dir is not None and not (run_dir / "tokenizer.json").exists():
        _save_tokenizer(tok, run_dir)
    tok_sha = hashlib.sha256(tok.to_str().encode()).hexdigest()
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    dtype = _token_dtype(vocab_size)
    key = _digest([RECIPE, source.identity, tok_sha, np.dtype(dtype).name])[:24]
    path = root / "tokens" / f"{key}.{np.dtype(dtype).name}.bin"
    meta_path = path.with_suffix(".json")
    if not path.is_file():
        ds = get_ds()
        num_tokens = _tokenize_to_file(ds, tok, tok.token_to_id(EOT), dtype, path)
        meta = {"source": cfg.source, "split": cfg.split, "text_column": cfg.text_column,
                "num_documents": len(ds), "num_tokens": num_tokens, "dtype": np.dtype(dtype).name,
                "tokenizer": tok_origin, "tokenizer_sha256": tok_sha, "recipe": RECIPE}
        if cfg.source == "default":
            meta["corpus"] = {k: v for k, v in corpus.describe().items() if k != "paths"}
        atomic_write(meta_path, lambda tmp: tmp.write_text(json.dumps(meta, indent=1)))
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    tokens = np.memmap(path, dtype=dtype, mode="r")
    info = {**meta, "config": asdict(cfg), "cache_file": str(path), "tokenizer": tok_origin}
    return TokenData(tokens, tok, cfg.seq_len, cfg.val_sequences, cfg.seed, info)


if __name__ == "__main__":  # python -m cgpt.data: prepare the default corpus and print its figures
    import time

    t0 = time.time()
    data = load_data(DataConfig())
    summary = {k: v for k, v in data.describe().items() if k != "config"}
    summary.update(seconds=round(time.time() - t0, 1), unigram_entropy=round(data.unigram_entropy(), 4))
    print(json.dumps(summary, indent=1))
