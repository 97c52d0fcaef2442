"""The embedded default corpus: the running Python's standard-library sources.

Why this corpus: every machine that can run cgpt already has it, offline, with no
download and no third-party text in the repository. It is real, human-written text
(code, comments, docstrings), big enough for small scaling-law runs, and exactly
reproducible from a manifest (Python version + sorted file list + content hash).

What is in it: every ``.py`` file under ``sysconfig.get_paths()["stdlib"]`` in sorted
relative-path order, one file = one document, excluding ``site-packages`` (third-party
code that differs between machines), ``__pycache__``, files that are empty, and files
that are not valid UTF-8 (a handful of deliberately mis-encoded test fixtures). Only
``.py`` files are taken, so icons and other binary files never enter.

The standard library's own test suites (``test/``, ``*/tests/``, ``idlelib/idle_test``)
are included (``INCLUDE_TESTS``): without them the corpus is ~730 files / 12.1M
characters / ~3.5M tokens with the default 4096-entry BPE, below the 5M tokens that
small scaling-law runs need; the stdlib's non-code text (``.txt``/``.rst``/``.html``)
adds only ~0.24M characters. With the tests it is ~1760 files / 31.5M characters /
~9.4M tokens (Python 3.11.7). A distribution that strips the test suite gives a smaller
corpus; ``describe()`` records exactly what a run used.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sysconfig
from pathlib import Path
from typing import Iterator

from cgpt.fileio import atomic_write

NAME = "python-stdlib"
INCLUDE_TESTS = True  # see module docstring: needed to reach >= 5M tokens
TEST_DIRS = frozenset({"test", "tests", "idle_test"})
EXCLUDED_DIRS = frozenset({"site-packages", "__pycache__"})


def stdlib_root() -> Path:
    """Directory of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _candidates(root: Path) -> list[Path]:
    files = []
    for path in root.rglob("*.py"):
        dirs = path.relative_to(root).parts[:-1]
        if EXCLUDED_DIRS.intersection(dirs):
            continue
        if not INCLUDE_TESTS and TEST_DIRS.intersection(dirs):
            continue
        if path.is_file():
            files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _read(path: Path) -> str | None:
    """The file's text, or None when it is not a usable document (empty / not UTF-8)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text or None


@functools.lru_cache(maxsize=1)
def _scan() -> tuple[tuple[str, ...], str, int]:
    """(sorted relative paths, sha256 of the concatenated content, total characters)."""
    root = stdlib_root()
    digest, paths, chars = hashlib.sha256(), [], 0
    for path in _candidates(root):
        text = _read(path)
        if text is None:
            continue
        paths.append(path.relative_to(root).as_posix())
        digest.update(text.encode("utf-8"))
        chars += len(text)
    return tuple(paths), digest.hexdigest(), chars


def describe() -> dict:
    """The manifest a run records to state exactly which corpus it trained on."""
    paths, sha256, chars = _scan()
    return {
        "name": NAME,
        "python_version": platform.python_version(),
        "root": str(stdlib_root()),
        "include_tests": INCLUDE_TESTS,
        "num_documents": len(paths),
        "num_characters": chars,
        "sha256": sha256,
        "paths": list(paths),
    }


def documents() -> Iterator[tuple[str, str]]:
    """Yield (relative path, text) for every document, in manifest order."""
    root = stdlib_root()
    for rel in _scan()[0]:
        text = _read(root / rel)
        if text is not None:
            yield rel, text


def identity() -> str:
    """A short string that changes whenever the corpus content changes (for cache keys)."""
    return f"{NAME}-py{platform.python_version()}-{_scan()[1][:16]}"


def materialize(cache_dir: str | os.PathLike) -> Path:
    """Write the corpus once as JSONL ({"path", "text"} per line) so `datasets` can load it.

    The file name carries the content hash, so a changed stdlib gives a new file; the
    write is atomic (temp file in the same directory + os.replace), so an interrupted
    write never leaves a truncated file that a later run would trust.
    """
    out_dir = Path(cache_dir) / "corpus"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{identity()}.jsonl"
    if path.exists():
        return path
    def write(tmp: Path) -> None:
        digest = hashlib.sha256()
        with open(tmp, "w", encoding="utf-8") as f:
            for rel, text in documents():
                digest.update(text.encode("utf-8"))
                f.write(json.dumps({"path": rel, "text": text}, ensure_ascii=False) + "\n")
        if digest.hexdigest() != _scan()[1]:
            raise RuntimeError(f"stdlib files changed while writing the corpus to {path}; run again")

    atomic_write(path, write)
    return path
