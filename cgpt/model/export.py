"""The folder `cgpt.save_hf` writes: built beside its destination, swapped in whole, and only
ever replaced or removed when an earlier save_hf wrote it.

An export is built in a temp folder `.NAME.cgpt-tmp-*` next to NAME, its first file the marker
`.cgpt-export`, then exchanged with NAME in one rename (Linux `renameat2(RENAME_EXCHANGE)`; two
renames where the filesystem lacks it), so a reader sees the old export or the new one. A
folder counts as an export only if it holds the marker: a user's folder (or a file, or a link)
at the path is refused with one line, never deleted, and so is a folder merely named like a
leftover. The leftovers of a killed save (a marked or empty `.NAME.cgpt-tmp-*`) are removed by
the next save to NAME; a running save holds a flock on its temp folder, so a concurrent one
leaves it alone. Files and folders get the caller's umask (mkdtemp and safetensors make them
owner-only).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import glob
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from cgpt.errors import ExportError
from cgpt.fileio import storage_oserror

MARKER = ".cgpt-export"
_TMP = ".cgpt-tmp-"


def is_export(d: Path) -> bool:
    """A real folder holding the marker save_hf writes first (never through a link)."""
    m = Path(d) / MARKER
    return (Path(d).is_dir() and not Path(d).is_symlink() and m.is_file()
            and not m.is_symlink())


def _check_destination(out: Path) -> None:
    fix = "choose a new path, or remove it yourself if it is to be replaced"
    if out.is_symlink():
        raise ExportError(f"cgpt.save_hf: {out} is a symbolic link; save_hf replaces only a "
                          f"folder it wrote itself: {fix}")
    if out.exists() and not out.is_dir():
        raise ExportError(f"cgpt.save_hf: {out} exists and is not a folder; save_hf replaces "
                          f"only a folder it wrote itself: {fix}")
    if out.is_dir() and not is_export(out) and any(out.iterdir()):
        raise ExportError(f"cgpt.save_hf: {out} is a folder save_hf did not write (no "
                          f"{MARKER} in it) and would be replaced: {fix}")


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # not thread-safe: only where /proc does not say
    os.umask(mask)
    return mask


def _apply_umask(root: Path) -> None:
    mask = _umask()
    os.chmod(root, 0o777 & ~mask)
    for d, dirs, files in os.walk(root):
        for n in dirs:
            os.chmod(os.path.join(d, n), 0o777 & ~mask)
        for n in files:
            os.chmod(os.path.join(d, n), 0o666 & ~mask)


def _lock(d: Path, blocking: bool) -> int | None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _remove_leftovers(out: Path) -> None:
    """The temp folders of earlier saves to `out` that no live save holds: marked, or empty
    (a save killed before its marker). Anything else named so is someone else's."""
    for p in map(Path, glob.glob(glob.escape(str(out.parent / f".{out.name}{_TMP}")) + "*")):
        if p.is_symlink() or not p.is_dir():
            continue
        try:
            fd = _lock(p, blocking=False)
        except OSError:
            continue
        if fd is None:  # a save in progress
            continue
        try:
            if is_export(p):
                shutil.rmtree(p, ignore_errors=True)
            elif not any(p.iterdir()):
                p.rmdir()
        except OSError:
            pass
        finally:
            os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    n = ctypes.get_errno()
    if n in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(n, os.strerror(n), str(b))


def _refused(out: Path, e: OSError) -> ExportError:
    return ExportError(f"cgpt.save_hf: cannot write {out}: {e.strerror or e} "
                       f"({e.filename or out.parent}); choose a writable folder with free space")


def write_export(out: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call write(tmp) on a new marked temp folder beside `out`, then make it `out`, replacing
    an earlier export there (and only that)."""
    out = Path(out)
    _check_destination(out)
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}{_TMP}", dir=out.parent))
        fd = _lock(tmp, blocking=True)
        try:
            (tmp / MARKER).write_text(json.dumps({"written_by": "cgpt.save_hf"}) + "\n")
            write(tmp)
            _apply_umask(tmp)
            _check_destination(out)  # again: the path may have changed while this one wrote
            if is_export(out) and _exchange(tmp, out):
                shutil.rmtree(tmp, ignore_errors=True)  # now the old export
            elif is_export(out):  # two renames: `out` is missing between them
                old = Path(tempfile.mkdtemp(prefix=f".{out.name}{_TMP}", dir=out.parent))
                os.replace(out, old)
                os.replace(tmp, out)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, out)  # onto nothing, or an empty folder
        finally:
            os.close(fd)
    except BaseException as e:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, ExportError):
            raise
        if isinstance(e, OSError) and e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise ExportError(f"cgpt.save_hf: {out} was filled by something else while the "
                              "export was written; choose a new path") from e
        bad = storage_oserror(e) if isinstance(e, Exception) else None
        if bad is not None:
            raise _refused(out, bad) from e
        raise
    return out
