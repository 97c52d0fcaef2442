"""The one rule for changing what a run or sweep directory holds: resolve an entry before it
is moved, truncated, appended to or deleted, and refuse it when it resolves outside the
directory. A symbolic link planted there (`.lock`, `train.log`, `discarded_checkpoints/`
pointing at someone else's files) must never make cgpt write or delete through it.

The storage entries of a directory (a run's `checkpoints/`, which users put on another disk
through a symlink) may resolve elsewhere: cgpt writes every entry inside them, so what they
resolve to counts as the directory's own. JAX-free: `rundir`, the sweep and `train` use it.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from cgpt.errors import RunDirError


def _inside(real: Path, root: Path) -> bool:
    return real == root or root in real.parents


@dataclass(frozen=True)
class Area:
    """A directory whose entries cgpt changes (`top`), with the names of its storage entries
    (`storage`, relative to `top`) that may resolve to another disk."""

    top: Path
    storage: tuple[str, ...] = ()
    kind: str = "directory"  # "run directory", "sweep directory": for the messages

    def roots(self) -> list[Path]:
        top = Path(os.path.realpath(self.top))
        return [top] + [Path(os.path.realpath(Path(self.top) / s)) for s in self.storage]

    def resolve(self, path: str | os.PathLike, verb: str) -> Path:
        """`path` (an entry of `top`, existing or not) with every symlink resolved; a
        RunDirError naming it and the fix when that leaves the directory."""
        path = Path(path)
        real = Path(os.path.realpath(path))
        if any(_inside(real, r) for r in self.roots()):
            return real
        link = next((p for p in (path, *path.parents) if p.is_symlink()), path)
        where = "" if link == path else f" (through {link})"
        other = (f"; only {', '.join(s + '/' for s in self.storage)} may point to another disk"
                 if self.storage else "")
        raise RunDirError(
            f"{path} resolves to {real}{where}, outside the {self.kind} {self.top}: cgpt would "
            f"{verb} it there, and it never changes files it did not create. Remove the link "
            f"(rm {link}; cgpt makes its own){other}")

    def check(self, names) -> None:
        """Refuse now, before any work, when an entry `names` holds would resolve outside."""
        for name in names:
            p = Path(self.top) / name
            if (p.exists() or p.is_symlink()) and name not in self.storage:
                self.resolve(p, "write to or delete")

    def open_fd(self, path: str | os.PathLike, flags: int, verb: str) -> int:
        """os.open(path, flags) after `resolve` (the lock: truncated, a pid written into it)."""
        return os.open(self.resolve(path, verb), flags, 0o644)

    def append(self, path: str | os.PathLike) -> TextIO:
        """`path` opened for appending text (a log), after `resolve`."""
        return open(self.resolve(path, "append to"), "a")

    def remove(self, path: str | os.PathLike) -> None:
        """Delete `path` (a file or a whole directory) after `resolve`; a symlink inside the
        directory is removed itself, never what it points to."""
        path = Path(path)
        real = self.resolve(path, "delete")
        if path.is_symlink():
            path.unlink()
        elif real.is_dir():
            shutil.rmtree(real)
        elif real.exists():
            real.unlink()

    def move(self, src: str | os.PathLike, dest: str | os.PathLike) -> None:
        """Move `src` to `dest`, replacing what `dest` held; both resolved first, so nothing is
        moved out of the directory or into (or deleted from) a place outside it."""
        src, dest = Path(src), Path(dest)
        self.resolve(src, "move")
        self.resolve(dest, "move a directory into (and delete what is there in)")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() or dest.is_symlink():
            self.remove(dest)
        shutil.move(str(src), str(dest))


def check_utf8(out: str, flag: str) -> str:
    """Refuse a path that is not UTF-8 (bytes the locale could not decode, kept as surrogates),
    the working directory included: tokenizers and TensorStore take UTF-8 paths only, and
    failed deep inside with a codec error. Returns `out`."""
    try:
        os.path.abspath(out).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{flag} {os.fsencode(os.path.abspath(out))!r}: not UTF-8 text; the "
                         "tokenizer and checkpoint libraries take UTF-8 paths only: choose a "
                         "name in UTF-8") from None
    return out


def check_destination(out: str, flag: str) -> None:
    """Refuse an output directory no run should fill (`flag`: the option that named it): a `~`
    the shell did not expand (it would make a folder named `~` here), the filesystem root,
    the home directory itself, or a path that is not UTF-8 (bytes the locale cannot decode).
    A ValueError naming what was typed and the fix. An empty or blank value (an unset shell
    variable, `--out "$OUT"`) is refused too, never read as the default."""
    text = str(out)
    if not text.strip():
        raise ValueError(f"{flag} {text!r}: empty; give a directory (is a shell variable unset?), "
                         f"or leave {flag} out for its default")
    check_utf8(text, flag)
    if text.startswith("~"):
        user, _, rest = text[1:].partition("/")
        fix = ("$HOME" + (f"/{rest}" if rest else "")) if not user else "the full path"
        raise ValueError(f"{flag} {text!r}: the shell did not expand ~; write {fix} (a quoted "
                         "~ stays a name)")
    real = Path(os.path.realpath(text))
    what = ("the filesystem root" if real == Path(real.anchor) else
            "your home directory itself" if real == Path(os.path.realpath(Path.home()))
            else None)
    if what:
        raise ValueError(f"{flag} {text!r}: {what}; cgpt would write config.yaml, checkpoints/ "
                         "and more there: choose a directory of its own (e.g. runs/<name>)")
