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

from cgpt.fileio import atomic_write, shared_subfolder

NAME = "python-stdlib"
INCLUDE_TESTS = True  # see module docstring: needed to reach >= 5M tokens
TEST_DIRS = frozenset({"test", "tests", "idle_test"})
EXCLUDED_DIRS = frozenset({"site-packages", "__pycache__"})


def stdlib_root() -> Path:
    """Directory of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _candidates(root: Path) -> list[Path]:
    """Every .py file under root outside the excluded directories, which are never entered:
    the interpreter's site-packages can hold tens of thousands of files (a machine's whole
    set of installed packages), and walking them cost seconds on every fresh process."""
    skip = EXCLUDED_DIRS if INCLUDE_TESTS else EXCLUDED_DIRS | TEST_DIRS
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    return sorted((p for p in files if p.is_file()),
                  key=lambda p: p.relative_to(root).as_posix())


def _read(path: Path) -> str | None:
    """The file's text, or None when it is not a usable document (empty / not UTF-8)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text or None


@functools.lru_cache(maxsize=1)
def _scan() -> tuple[tuple[str, ...], str, tuple[str, ...], tuple[int, ...]]:
    """(sorted relative paths, sha256 of the concatenated content, each document's sha256,
    each document's characters)."""
    root = stdlib_root()
    digest, paths, docs, chars = hashlib.sha256(), [], [], []
    for path in _candidates(root):
        text = _read(path)
        if text is None:
            continue
        paths.append(path.relative_to(root).as_posix())
        data = text.encode("utf-8")
        digest.update(data)
        docs.append(hashlib.sha256(data).hexdigest())
        chars.append(len(text))
    return tuple(paths), digest.hexdigest(), tuple(docs), tuple(chars)


def sampled(n: int, fraction: float) -> list[int]:
    """The indices of `fraction` of n documents, spread evenly over them: i is taken when
    floor((i + 1) f) > floor(i f), so every stretch of 1/f documents gives one."""
    if fraction >= 1:
        return list(range(n))
    return [i for i in range(n) if int((i + 1) * fraction) > int(i * fraction)]


def describe(fraction: float = 1.0) -> dict:
    """The manifest a run records to state exactly which corpus it trained on."""
    paths, _, _, chars = _scan()
    take = sampled(len(paths), fraction)
    return {
        "name": NAME,
        "python_version": platform.python_version(),
        "root": str(stdlib_root()),
        "include_tests": INCLUDE_TESTS,
        "fraction": fraction,
        "num_documents": len(take),
        "num_characters": sum(chars[i] for i in take),
        "sha256": _scan()[1],  # of the whole corpus, of which the fraction is a pure function
        "paths": [paths[i] for i in take],
    }


def documents(fraction: float = 1.0) -> Iterator[tuple[str, str, str]]:
    """Yield (relative path, text, its expected sha256) for every document of the sample, in
    manifest order."""
    root = stdlib_root()
    paths, _, digests, _ = _scan()
    for i in sampled(len(paths), fraction):
        text = _read(root / paths[i])
        if text is not None:
            yield paths[i], text, digests[i]


def identity(fraction: float = 1.0) -> str:
    """A short string that changes whenever the corpus content (or the sample) changes."""
    whole = f"{NAME}-py{platform.python_version()}-{_scan()[1][:16]}"
    return whole if fraction >= 1 else f"{whole}-f{fraction:g}"


def materialize(cache_dir: str | os.PathLike, fraction: float = 1.0) -> Path:
    """Write the corpus (its `fraction`) once as JSONL ({"path", "text"} per line).

    The file name carries the content hash, so a changed stdlib gives a new file; the
    write is atomic (temp file in the same directory + os.replace), so an interrupted
    write never leaves a truncated file that a later run would trust.
    """
    out_dir = shared_subfolder(cache_dir, "corpus")
    path = out_dir / f"{identity(fraction)}.jsonl"
    if path.exists():
        return path
    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for rel, text, expected in documents(fraction):
                if hashlib.sha256(text.encode("utf-8")).hexdigest() != expected:
                    raise RuntimeError(f"stdlib file {rel} changed while writing the corpus to "
                                       f"{path}; run again")
                f.write(json.dumps({"path": rel, "text": text}, ensure_ascii=False) + "\n")

    atomic_write(path, write)
    return path
