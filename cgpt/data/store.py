"""The token store: a directory of token shards plus the manifest that identifies them.

Layout of a store directory::

    manifest.json      written last, atomically: the store is complete iff it exists
    tokenizer.json     the tokenizer that produced the tokens
    plan.json          the work units (written first; a resumed prepare must match it)
    shards/000000.bin  raw uint16 (vocabulary <= 65535) or uint32 tokens, <|endoftext|> after
                       each document
    shards/000000.json the shard's record (written after its .bin): unit, counts, checksums

The token stream is the shards concatenated in order. Readers need only the manifest: the
store's identity is the hash of manifest.json (sources, byte ranges, token counts, sha256 of
every shard), so training never re-reads or re-hashes the sources.

Opening a store checks it against itself without reading the tokens (`TokenStore.check`):
every shard file relative and inside the store, its size its token count, the counts adding up
to `num_tokens`, and `tokenizer.json` the one of `tokenizer_sha256`, of `vocab_size` tokens,
with `eot_id` its <|endoftext|>: a copied or edited store is one error naming the field, never
a model trained with a tokenizer its tokens were not made by. The shards' sha256 are checked
only by `verify()` (it reads everything); a token id outside the vocabulary is named by the
batch that reads it (`TokenData`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
from pathlib import Path

import numpy as np

from cgpt.fileio import atomic_write_text
from cgpt.data.sources import DataError
from cgpt.data.tokenizer import EOT, load_tokenizer, sha256, with_eot
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


def discard_stale(root: Path, identity: dict) -> bool:
    """Remove an unfinished store in `root` (a killed prepare's plan.json, tokenizer.json and
    shards, no manifest) whose plan is of other data than `identity` (plan keys -> values), so
    that a new prepare starts there instead of being refused. Only the store's own files go
    (anything else stays, and the prepare then refuses the folder). True when one was removed."""
    if (root / MANIFEST).exists() or not (root / PLAN).is_file():
        return False
    try:
        plan = json.loads((root / PLAN).read_bytes())
    except (OSError, ValueError, RecursionError):
        return False  # a damaged plan.json: the prepare names it
    diff = [k for k, v in identity.items() if not isinstance(plan, dict) or plan.get(k) != v]
    if not diff:
        return False
    print(f"note: {root} held an unfinished prepare of other data ({', '.join(diff)} differ); "
          "starting over", file=sys.stderr)
    for p in sorted((root / "shards").glob("*")) if (root / "shards").is_dir() else ():
        if re.fullmatch(r"\d{6}\.(bin|json)(\..*\.tmp)?", p.name) and p.is_file():
            p.unlink()
    for p in (root / TOKENIZER_FILE, root / PLAN):
        p.unlink(missing_ok=True)
    try:
        (root / "shards").rmdir()
    except OSError:
        pass  # not empty (not only ours) or absent
    return True


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
        """[len(starts), length]: row i = tokens[starts[i] : starts[i] + length] (reads only
        those)."""
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
            hint = (
                " It holds an unfinished prepare: rerun `python -m cgpt data prepare` with the "
                "same arguments to finish it." if (self.root / PLAN).is_file() else "")
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
        if not (isinstance(shards, list) and all(
                isinstance(s, dict) and isinstance(s.get("file"), str) and
                isinstance(s.get("num_tokens"), int) for s in shards) and
                isinstance(m.get("num_tokens"), int) and m.get("dtype") in ("uint16", "uint32")):
            raise DataError(f"{path} is damaged (its dtype, num_tokens or shards list is "
                            "missing or malformed); prepare the store again")
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.dtype = np.dtype(self.manifest["dtype"])
        self._tokens = None
        self._tokenizer = None
        self.check()

    def check(self) -> None:
        """The manifest against the files beside it (see the module's docstring); one
        DataError naming the field and the fix. Reads sizes and tokenizer.json, no tokens."""
        path, m, again = self.root / MANIFEST, self.manifest, "prepare the store again"
        root, dirs = os.path.realpath(self.root), {}  # each shard directory resolved once
        total = 0
        for i, shard in enumerate(m["shards"]):
            f, n = shard["file"], shard["num_tokens"]
            full = os.path.join(self.root, f)
            parent = os.path.dirname(full)
            if parent not in dirs:
                dirs[parent] = os.path.realpath(parent)
            try:
                st = os.lstat(full)
            except OSError:
                st = None
            real = (os.path.realpath(full) if st is not None and stat.S_ISLNK(st.st_mode)
                    else os.path.join(dirs[parent], os.path.basename(full)))
            if os.path.isabs(f) or not real.startswith(root + os.sep) or os.path.basename(
                    os.path.normpath(full)) != os.path.basename(full):
                raise DataError(f"{path}: shards[{i}].file {f!r} is not a file inside the store "
                                f"(it resolves to {real}); a store reads only its own shards: "
                                f"{again}")
            if n < 0:
                raise DataError(f"{path}: shards[{i}].num_tokens is {n}; {again}")
            if st is not None and stat.S_ISLNK(st.st_mode):
                st = os.stat(real) if os.path.exists(real) else None
            size = st.st_size if st is not None and stat.S_ISREG(st.st_mode) else -1
            if size != n * self.dtype.itemsize:
                raise DataError(f"{full}: shards[{i}].num_tokens is {n} "
                                f"({n * self.dtype.itemsize} bytes of {self.dtype.name}), found "
                                f"{'no file' if size < 0 else f'{size} bytes'}; the store is "
                                f"damaged, {again}")
            total += n
        if total != m["num_tokens"]:
            raise DataError(f"{path}: num_tokens is {m['num_tokens']} but its shards hold "
                            f"{total}; the manifest is damaged, {again}")
        vocab, eot, want = m.get("vocab_size"), m.get("eot_id"), m.get("tokenizer_sha256")
        if not (isinstance(vocab, int) and isinstance(eot, int) and isinstance(want, str)):
            raise DataError(f"{path}: vocab_size, eot_id or tokenizer_sha256 is missing or "
                            f"malformed; {again}")
        if np.dtype(token_dtype(vocab)) != self.dtype:
            raise DataError(f"{path}: dtype {self.dtype.name} cannot be that of vocab_size "
                            f"{vocab} ({np.dtype(token_dtype(vocab)).name}); {again}")

        tok_path = self.root / TOKENIZER_FILE
        if not tok_path.is_file():
            raise DataError(f"{tok_path}: missing; a store's tokens are read with its own "
                            f"tokenizer: restore it, or {again}")
        tok = with_eot(load_tokenizer(tok_path), str(tok_path))
        if sha256(tok) != want:
            raise DataError(f"{tok_path}: not the tokenizer the store was prepared with "
                            f"(manifest tokenizer_sha256 {want[:12]}..., this file "
                            f"{sha256(tok)[:12]}...): restore the store's own tokenizer.json, or "
                            f"{again} with this one")
        if tok.get_vocab_size(with_added_tokens=True) != vocab or tok.token_to_id(EOT) != eot:
            raise DataError(f"{path}: vocab_size {vocab} / eot_id {eot} differ from "
                            f"{tok_path}'s {tok.get_vocab_size(with_added_tokens=True)} / "
                            f"{tok.token_to_id(EOT)}; the manifest is damaged, {again}")
        self._tokenizer = tok

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["num_tokens"])

    def tokenizer(self):
        """The store's tokenizer, as checked at open (<|endoftext|> marked special)."""
        return self._tokenizer

    def tokens(self) -> np.ndarray | ShardedTokens:
        """The token stream: the shard's np.memmap when there is one shard, else a ShardedTokens."""
        if self._tokens is None:
            arrays = []
            for shard in self.manifest["shards"]:
                if shard["num_tokens"] == 0:
                    continue
                arrays.append(np.memmap(self.root / shard["file"], dtype=self.dtype, mode="r"))
            if not arrays:
                raise DataError(f"{self.root}: the store holds no tokens")
            self._tokens = arrays[0] if len(arrays) == 1 else ShardedTokens(arrays)
        return self._tokens

    def verify(self) -> None:
        """Re-hash every shard against the manifest (slow: reads the whole store)."""
        for shard in self.manifest["shards"]:  # each file inside the store (`check`)
            path = self.root / shard["file"]
            with open(path, "rb") as f:
                got = hashlib.file_digest(f, "sha256").hexdigest()
            if got != shard["sha256"]:
                raise DataError(
                    f"{path}: sha256 {got} differs from the manifest's {shard['sha256']}; "
                    "the shard is damaged, prepare the store again")


def read_windows(tokens, starts: np.ndarray, length: int) -> np.ndarray:
    """int32 [len(starts), length] windows of a flat token array or a ShardedTokens."""
    starts = np.asarray(starts, dtype=np.int64)
    if isinstance(tokens, ShardedTokens):
        return tokens.windows(starts, length).astype(np.int32)
    return np.array(tokens[starts[:, None] + np.arange(length)], dtype=np.int32)
