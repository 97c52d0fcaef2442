"""Source documents on disk: which files a source names, how they split into work units, and
reading the documents of one unit with errors that name the file and line.

A *unit* is the piece of the corpus one worker tokenizes into one shard of the token store:
a newline-aligned byte range of an uncompressed JSONL file, one whole compressed file
(``.jsonl.zst``/``.jsonl.gz`` cannot be split without decompressing), a range of Parquet row
groups, a run of consecutive text files (one document per file), or a range of rows of a
Hugging Face dataset. Units are cut in corpus order, so concatenating their tokens in unit
order gives the same stream whatever the unit size or the number of workers.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import io
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from cgpt.errors import DataError

# Suffix -> how documents are laid out. "text": one document per file; "jsonl": one JSON object
# per line (a ".json" file may instead hold one JSON array of objects); "parquet": one per row.
FORMATS = {
    ".txt": "text", ".md": "text", ".py": "text",
    ".jsonl": "jsonl", ".json": "jsonl", ".jsonl.zst": "jsonl", ".jsonl.gz": "jsonl",
    ".json.zst": "jsonl", ".json.gz": "jsonl",
    ".parquet": "parquet",
}
BATCH_BYTES = 1 << 22  # documents are handed to the tokenizer in batches of about 4 MiB
# Bounds on what is held whole: a document goes to the tokenizer in one piece (its memory
# grows many times the text's size), and a JSON value is parsed whole. Larger inputs are
# refused before they are read, with the advice to split them.
MAX_DOCUMENT_BYTES = 1 << 26  # 64 MiB: one text file, or one JSONL line
MAX_JSON_ARRAY_BYTES = 1 << 28  # 256 MiB: a .json file holding one array of objects


HF_EXTRA = "pip install -r requirements-hf.txt (or pip install 'cgpt[hf]')"


def optional(module: str, what: str):
    """Import `module`, an optional dependency (README command 1 installs without it); missing,
    one DataError saying what needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DataError(f"{what} needs the optional package {module.split('.')[0]!r}, which is "
                        f"not installed: {HF_EXTRA}") from None


def suffix_of(path: Path) -> str:
    """The supported suffix of `path` ('.jsonl.zst' counts as one), or its last suffix."""
    name = path.name.lower()
    for s in sorted(FORMATS, key=len, reverse=True):
        if name.endswith(s):
            return s
    return path.suffix.lower()


def list_files(path: Path) -> list[Path]:
    """`path` itself, or every supported file under the folder (recursive, sorted, no hidden
    ones)."""
    supported = ", ".join(FORMATS)
    if not path.exists():
        raise DataError(
            f"data source {str(path)!r} does not exist; set DataConfig.source to an existing "
            f"file or folder ({supported}), a prepared token store, 'default', or "
            "'hf:<dataset>[:<config>]'")
    if path.is_file():
        if suffix_of(path) not in FORMATS:
            raise DataError(
                f"data source {str(path)!r} has unsupported extension {path.suffix!r}; "
                f"use one of {supported} (or convert the file to JSONL with a 'text' field)")
        return [path]
    files = sorted(p for p in path.rglob("*")
                   if p.is_file() and suffix_of(p) in FORMATS
                   and not any(part.startswith(".") for part in p.relative_to(path).parts))
    if not files:
        raise DataError(
            f"data folder {str(path)!r} holds no {supported} files; put documents there "
            "or point DataConfig.source at a file")
    return files


@dataclass(frozen=True)
class Unit:
    """One worker's piece of the corpus. `files` are indices into the source file list; `start`
    and `stop` are bytes (uncompressed JSONL), row groups (Parquet), rows (hf) or unused (0, 0)."""

    kind: str  # "text" | "jsonl" | "jsonl-compressed" | "parquet" | "hf"
    files: tuple[int, ...]
    start: int = 0
    stop: int = 0


def plan_units(files: list[Path], unit_bytes: int) -> list[Unit]:
    """Cut the files into units of about `unit_bytes` of input each, in corpus order."""
    units: list[Unit] = []
    run: list[int] = []  # consecutive text files gathered into one unit
    run_bytes = 0

    def flush() -> None:
        nonlocal run, run_bytes
        if run:
            units.append(Unit("text", tuple(run)))
        run, run_bytes = [], 0

    for i, path in enumerate(files):
        fmt, size = FORMATS[suffix_of(path)], path.stat().st_size
        if fmt == "text":
            if run and run_bytes + size > unit_bytes:
                flush()
            run.append(i)
            run_bytes += size
            continue
        flush()
        if fmt == "parquet":
            units += [Unit("parquet", (i,), a, b) for a, b in _row_group_ranges(path, unit_bytes)]
        elif suffix_of(path).endswith((".zst", ".gz")):
            units.append(Unit("jsonl-compressed", (i,)))
        elif suffix_of(path) == ".json" and _is_json_array(path):
            units.append(Unit("jsonl", (i,), 0, size))  # one JSON array: read whole
        else:
            units += [Unit("jsonl", (i,), a, b) for a, b in _line_ranges(path, size, unit_bytes)]
    flush()
    return units


def _line_ranges(path: Path, size: int, unit_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges of about `unit_bytes`, each ending just after a newline (or at the end)."""
    if size == 0:
        return [(0, 0)]
    cuts = [0]
    with open(path, "rb") as f:
        while cuts[-1] + unit_bytes < size:
            f.seek(cuts[-1] + unit_bytes)
            while (part := f.readline(1 << 20)) and not part.endswith(b"\n"):
                pass  # finish the line the cut fell into, a MiB at a time
            if f.tell() >= size:
                break
            cuts.append(f.tell())
    cuts.append(size)
    return list(zip(cuts[:-1], cuts[1:]))


def _row_group_ranges(path: Path, unit_bytes: int) -> list[tuple[int, int]]:
    pq = optional("pyarrow.parquet", f"reading {path} (Parquet)")

    try:
        meta = pq.read_metadata(path)
    except _read_errors() as e:
        raise _unreadable(path, e) from None
    ranges, start, acc = [], 0, 0
    for g in range(meta.num_row_groups):
        acc += meta.row_group(g).total_byte_size
        if acc >= unit_bytes:
            ranges.append((start, g + 1))
            start, acc = g + 1, 0
    if start < meta.num_row_groups or not ranges:
        ranges.append((start, meta.num_row_groups))
    return ranges


# ------------------------------------------------------------------------------ reading

class _Hashing(io.RawIOBase):
    """A read-through wrapper that hashes every byte read from the underlying file."""

    def __init__(self, f, digest):
        self.f, self.digest = f, digest

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.f.readinto(b)
        self.digest.update(memoryview(b)[:n])
        return n


def _open_compressed(path: Path, raw) -> io.BufferedReader:
    if path.name.lower().endswith(".zst"):
        import zstandard  # only for .zst sources: the GPU machines' image has no zstandard

        # Files written with `zstd --long` need windows over the default limit: allow up to 2 GiB.
        dctx = zstandard.ZstdDecompressor(max_window_size=1 << 31)
        reader = dctx.stream_reader(raw, read_across_frames=True)
        return io.BufferedReader(reader, buffer_size=1 << 20)
    return io.BufferedReader(gzip.GzipFile(fileobj=raw), buffer_size=1 << 20)


def read_unit(unit: Unit, files: list[Path], text_column: str, digest=None, hf_dataset=None
              ) -> Iterator[tuple[list[str], int]]:
    """(texts, rows) batches of about BATCH_BYTES. Empty or null texts are dropped from `texts`
    (they would only add stray separators) but counted in `rows`. `digest`, when given, is
    updated with the source bytes read (compressed bytes for compressed files)."""
    if unit.kind == "hf":
        yield from _read_hf(hf_dataset, unit.start, unit.stop, text_column)
        return
    try:
        if unit.kind == "text":
            yield from _read_text_files([files[i] for i in unit.files], digest)
        elif unit.kind == "parquet":
            yield from _read_parquet(files[unit.files[0]], unit.start, unit.stop, text_column)
        else:
            yield from _read_jsonl(files[unit.files[0]], unit, text_column, digest)
    except DataError:
        raise
    except _read_errors() as e:  # truncated or corrupt compressed/Parquet data, I/O errors
        path = Path(getattr(e, "filename", None) or files[unit.files[0]])
        raise _unreadable(path, e) from None


def _read_errors() -> tuple[type[BaseException], ...]:
    """What a damaged file raises while it is read: gzip/zlib, zstandard, pyarrow, the OS."""
    errors: list[type[BaseException]] = [EOFError, OSError, ValueError, zlib.error]
    try:
        import zstandard  # optional where no .zst source is read (the GPU machines' image)
        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    try:
        import pyarrow  # loads pyarrow: only when this runs
        errors.append(pyarrow.ArrowException)
    except ImportError:
        pass
    return tuple(errors)


def _unreadable(path: Path, e: BaseException) -> DataError:
    why = " ".join(str(e).split())[:300] or type(e).__name__
    return DataError(f"{path}: cannot read it ({type(e).__name__}: {why}); the file is damaged "
                     f"or not {suffix_of(path) or 'a supported'} data: restore or remove it")


def _too_big(where: str, size: str, limit: int, fix: str) -> DataError:
    return DataError(f"{where}: {size} over the limit of {limit >> 20} MiB for one "
                     f"{'JSON array' if limit == MAX_JSON_ARRAY_BYTES else 'document'} (each "
                     f"is held whole to be parsed and tokenized); {fix}")


def _read_text_files(paths: list[Path], digest) -> Iterator[tuple[list[str], int]]:
    texts, rows, size = [], 0, 0
    for path in paths:
        with open(path, "rb") as f:
            data = f.read(MAX_DOCUMENT_BYTES + 1)
        if len(data) > MAX_DOCUMENT_BYTES:
            raise _too_big(str(path), "a text file is one document, and this one is",
                           MAX_DOCUMENT_BYTES, "split it into several files")
        if digest is not None:
            digest.update(data)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(
                f"{path}: not UTF-8 text (byte {e.start}); convert it to UTF-8 or remove it "
                "from the source folder") from e
        rows += 1  # a text file is one document, even when empty
        if text:
            texts.append(text)
            size += len(data)
        if size >= BATCH_BYTES:
            yield texts, rows
            texts, rows, size = [], 0, 0
    yield texts, rows


def _row_text(row: object, column: str, where: Callable[[], str]) -> str | None:
    """The text of one JSON row; `where()` names the file and line, only computed on error."""
    if not isinstance(row, dict):
        raise DataError(f"{where()}: expected a JSON object with a {column!r} field, got "
                        f"{type(row).__name__}; write one object per line")
    if column not in row:
        raise DataError(f"{where()}: no column {column!r}; its columns are {sorted(row)}. "
                        "Set DataConfig.text_column to the one that holds the text.")
    text = row[column]
    if text is not None and not isinstance(text, str):
        raise DataError(f"{where()}: column {column!r} holds {type(text).__name__}, not text; set "
                        f"DataConfig.text_column to a string column (columns: {sorted(row)})")
    return text


def _range_lines(f, length: int, digest) -> Iterator[bytes]:
    """The lines of the next `length` bytes of `f`, hashing exactly those bytes; a line is
    read at most MAX_DOCUMENT_BYTES + 1 bytes at a time (a longer one is refused)."""
    while length > 0:
        line = f.readline(min(length, MAX_DOCUMENT_BYTES + 1))
        if not line:
            return
        length -= len(line)
        if digest is not None:
            digest.update(line)
        yield line


def _is_json_array(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(1 << 16).lstrip().startswith(b"[")


def _read_jsonl(path: Path, unit: Unit, column: str, digest) -> Iterator[tuple[list[str], int]]:
    if (unit.kind == "jsonl" and unit.start == 0 and suffix_of(path) == ".json"
            and _is_json_array(path)):
        yield from _read_json_array(path, column, digest)  # a JSON array of objects, not JSON Lines
        return
    with open(path, "rb") as raw:
        if unit.kind == "jsonl-compressed":
            src = _Hashing(raw, digest) if digest is not None else raw
            reader, first_line = _open_compressed(path, src), 1
            lines = iter(lambda: reader.readline(MAX_DOCUMENT_BYTES + 1), b"")  # bounded
        else:
            raw.seek(unit.start)
            lines, first_line = _range_lines(raw, unit.stop - unit.start, digest), None
        texts, rows, size = [], 0, 0
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = lambda: _line_where(path, unit, first_line, n)  # noqa: E731
            if len(line) > MAX_DOCUMENT_BYTES:
                raise _too_big(where(), "this line is", MAX_DOCUMENT_BYTES,
                               "split the document into several rows")
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
                raise DataError(
                    f"{where()}: not valid JSON ({e}); each line must be one JSON object "
                    f'such as {{"{column}": "..."}}') from e
            text = _row_text(row, column, where)
            if b"\\u" in line:  # only a \u escape can make a lone surrogate
                _check_unicode(text, column, where)
            rows += 1
            if text:
                texts.append(text)
                size += len(text)
            if size >= BATCH_BYTES:
                yield texts, rows
                texts, rows, size = [], 0, 0
        if unit.kind == "jsonl-compressed" and digest is not None:
            while src.read(1 << 20):  # hash the compressed file's tail too (e.g. a skippable frame)
                pass
        yield texts, rows


def _line_where(path: Path, unit: Unit, first_line: int | None, n: int) -> str:
    """'file, line N' for the n-th line of the unit (the lines before it are counted only on
    error)."""
    if first_line is None:
        first_line, left = 1, unit.start
        with open(path, "rb") as f:
            while left > 0 and (chunk := f.read(min(left, 1 << 24))):
                first_line += chunk.count(b"\n")
                left -= len(chunk)
    return f"{path}, line {first_line + n - 1}"


def _check_unicode(text: str | None, column: str, where: Callable[[], str]) -> None:
    """JSON's \\ud800 escapes decode to lone UTF-16 surrogates: not text any tokenizer reads."""
    if text is None:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(f"{where()}: column {column!r} holds a lone UTF-16 surrogate "
                        f"(\\u{ord(text[e.start]):04x} at character {e.start}), which is not "
                        "Unicode text; fix the escape or drop the row") from None


def _read_json_array(path: Path, column: str, digest) -> Iterator[tuple[list[str], int]]:
    if path.stat().st_size > MAX_JSON_ARRAY_BYTES:
        raise _too_big(str(path), f"a JSON array of {path.stat().st_size >> 20} MiB is",
                       MAX_JSON_ARRAY_BYTES, "write it as JSON Lines (.jsonl, one object a "
                       "line), which is read a line at a time")
    data = path.read_bytes()
    if digest is not None:
        digest.update(data)
    try:
        rows = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise DataError(
            f"{path}: not valid JSON ({e}); write a JSON array of objects or JSON Lines") from None
    texts = [_row_text(r, column, lambda i=i: f"{path}, item {i}") for i, r in enumerate(rows)]
    if b"\\u" in data:
        for i, t in enumerate(texts):
            _check_unicode(t, column, lambda i=i: f"{path}, item {i}")
    yield [t for t in texts if t], len(texts)


def _read_parquet(path: Path, start: int, stop: int,
                  column: str) -> Iterator[tuple[list[str], int]]:
    pa = optional("pyarrow", f"reading {path} (Parquet)")
    pq = optional("pyarrow.parquet", f"reading {path} (Parquet)")

    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    if column not in names:
        raise DataError(f"{path}: no column {column!r}; its columns are {names}. "
                        "Set DataConfig.text_column to the one that holds the text.")
    kind = pf.schema_arrow.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(
            f"{path}: column {column!r} holds {kind}, not text; set DataConfig.text_column "
            f"to a string column (columns: {names})")
    if start >= stop:
        return
    for batch in pf.iter_batches(batch_size=1024, row_groups=range(start, stop), columns=[column]):
        texts = batch.column(0).to_pylist()
        yield [t for t in texts if t], len(texts)


def _read_hf(ds, start: int, stop: int, column: str) -> Iterator[tuple[list[str], int]]:
    for i in range(start, stop, 1024):
        texts = ds[i:min(i + 1024, stop)][column]
        yield [t for t in texts if t], len(texts)


def file_identity(path: Path) -> dict:
    """What identifies a source file without reading it: path, size and modification time."""
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def cpu_count() -> int:
    """Cores this process may use (the affinity mask, not the machine's total)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
