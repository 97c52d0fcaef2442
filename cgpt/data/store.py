"""The token store: a directory of token shards plus the manifest that identifies them.

Layout of a store directory::

    manifest.json      written last, atomically: the store is complete iff it exists
    tokenizer.json     the tokenizer that produced the tokens
    plan.json          the work units (written first; a resumed prepare must match it)
    shards/000000.bin  raw uint16 (vocabulary <= 65535) or uint32 tokens, <|endoftext|> after each document
    shards/000000.json the shard's record (written after its .bin): unit, counts, checksums

The token stream is the shards concatenated in order. Readers need only the manifest: the
store's identity is the hash of manifest.json (sources, byte ranges, token counts, sha256 of
every shard), so training never re-reads or re-hashes the sources.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from cgpt.fileio import atomic_write_text
from cgpt.data.sources import DataError
from cgpt.rundir import TOKENIZER_FILE

FORMAT = "cgpt-token-store-v1"
MANIFEST = "manifest.json"
PLAN = "plan.json"  # a store `cgpt data prepare` has begun and not finished


def token_dtype(vocab_size: int) -> type:
    return np.uint16 if vocab_size <= 65535 else np.uint32


def is_store(path: str | os.PathLike) -> bool:
    """A directory with a manifest.json (a complete store), or a plan.json (an unfinished one)."""
    p = Path(path).expanduser()
    return p.is_dir() and ((p / MANIFEST).is_file() or (p / PLAN).is_file())


def shard_name(index: int) -> str:
    return f"shards/{index:06d}"


def write_manifest(root: Path, manifest: dict) -> None:
    atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=1) + "\n")


class ShardedTokens:
    """The concatenation of a store's shards as one read-only 1-D token array (memory-mapped)."""

    def __init__(self, arrays: list[np.ndarray]):
        self.arrays = arrays
        self.offsets = np.concatenate([[0], np.cumsum([len(a) for a in arrays])]).astype(np.int64)
        self.dtype = arrays[0].dtype
        self.shape = (int(self.offsets[-1]),)
        self.ndim = 1

    def __len__(self) -> int:
        return self.shape[0]

    def read(self, start: int, stop: int) -> np.ndarray:
        """tokens[start:stop], across shard boundaries."""
        start, stop = max(0, start), min(stop, len(self))
        if start >= stop:
            return np.empty(0, self.dtype)
        first = int(np.searchsorted(self.offsets, start, "right")) - 1
        parts, pos, s = [], start, first
        while pos < stop:
            lo, a = int(self.offsets[s]), self.arrays[s]
            take = a[pos - lo: min(stop - lo, len(a))]
            parts.append(take)
            pos += len(take)
            s += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """[len(starts), length]: row i = tokens[starts[i] : starts[i] + length] (reads only those)."""
        out = np.empty((len(starts), length), self.dtype)
        for i, s in enumerate(np.asarray(starts, np.int64)):
            out[i] = self.read(int(s), int(s) + length)
        return out

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            return self.read(start, stop)[::step] if step > 0 else np.asarray(self)[key]
        if isinstance(key, (int, np.integer)):
            k = int(key) + (len(self) if key < 0 else 0)
            return self.read(k, k + 1)[0]
        idx = np.asarray(key, np.int64)
        flat = idx.ravel()
        shard = np.searchsorted(self.offsets, flat, "right") - 1
        out = np.empty(flat.shape, self.dtype)
        for s in np.unique(shard):
            sel = shard == s
            out[sel] = self.arrays[s][flat[sel] - self.offsets[s]]
        return out.reshape(idx.shape)

    def __array__(self, dtype=None, copy=None):
        a = np.concatenate(self.arrays)
        return a.astype(dtype) if dtype is not None else a


class TokenStore:
    """A prepared store opened for reading: manifest, tokenizer and memory-mapped shards."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser()
        path = self.root / MANIFEST
        if not path.is_file():
            hint = (" It holds an unfinished prepare: rerun `python -m cgpt data prepare` with the same "
                    "arguments to finish it." if (self.root / PLAN).is_file() else "")
            raise DataError(f"{self.root} is not a prepared token store (no {MANIFEST}).{hint}")
        raw = path.read_bytes()
        try:
            self.manifest = json.loads(raw)
        except (ValueError, RecursionError) as e:  # bad JSON or bad UTF-8
            raise DataError(f"{path} is not valid JSON ({e}); prepare the store again") from None
        m = self.manifest if isinstance(self.manifest, dict) else {}
        if m.get("format") != FORMAT:
            raise DataError(f"{path}: format {m.get('format')!r}, expected {FORMAT!r}; "
                            "prepare the store again with this version of cgpt")
        shards = m.get("shards")
        if not (isinstance(shards, list) and all(isinstance(s, dict) and isinstance(
                s.get("file"), str) and isinstance(s.get("num_tokens"), int) for s in shards)
                and isinstance(m.get("num_tokens"), int) and m.get("dtype") in ("uint16", "uint32")):
            raise DataError(f"{path} is damaged (its dtype, num_tokens or shards list is "
                            "missing or malformed); prepare the store again")
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.dtype = np.dtype(self.manifest["dtype"])
        self._tokens = None

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["num_tokens"])

    def tokenizer(self):
        from cgpt.data.tokenizer import load_tokenizer, with_eot

        return with_eot(load_tokenizer(self.root / TOKENIZER_FILE), str(self.root / TOKENIZER_FILE))

    def tokens(self) -> np.ndarray | ShardedTokens:
        """The token stream: the shard's np.memmap when there is one shard, else a ShardedTokens."""
        if self._tokens is None:
            arrays = []
            for shard in self.manifest["shards"]:
                if shard["num_tokens"] == 0:
                    continue
                path = self.root / shard["file"]
                size = path.stat().st_size if path.is_file() else -1
                if size != shard["num_tokens"] * self.dtype.itemsize:
                    raise DataError(f"{path}: expected {shard['num_tokens']} tokens "
                                    f"({shard['num_tokens'] * self.dtype.itemsize} bytes), found "
                                    f"{'no file' if size < 0 else f'{size} bytes'}; the store is damaged, "
                                    "prepare it again")
                arrays.append(np.memmap(path, dtype=self.dtype, mode="r"))
            if not arrays:
                raise DataError(f"{self.root}: the store holds no tokens")
            self._tokens = arrays[0] if len(arrays) == 1 else ShardedTokens(arrays)
        return self._tokens

    def verify(self) -> None:
        """Re-hash every shard against the manifest (slow: reads the whole store)."""
        for shard in self.manifest["shards"]:
            path = self.root / shard["file"]
            with open(path, "rb") as f:
                got = hashlib.file_digest(f, "sha256").hexdigest()
            if got != shard["sha256"]:
                raise DataError(f"{path}: sha256 {got} differs from the manifest's {shard['sha256']}; "
                                "the shard is damaged, prepare the store again")


def read_windows(tokens, starts: np.ndarray, length: int) -> np.ndarray:
    """int32 [len(starts), length] windows of a flat token array or a ShardedTokens."""
    starts = np.asarray(starts, dtype=np.int64)
    if isinstance(tokens, ShardedTokens):
        return tokens.windows(starts, length).astype(np.int32)
    return np.array(tokens[starts[:, None] + np.arange(length)], dtype=np.int32)
