"""Atomic file writes: a crash mid-write never leaves a truncated file that a later run trusts;
and the storage's refusals (disk full, quota, read-only) told apart from the program's bugs."""
from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Callable


def probe_writable(directory: str | os.PathLike) -> None:
    """Create `directory` (and parents) and write and remove a probe file in it: an unusable
    output directory fails here, before any work, with the OSError that says why."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    probe = d / f".write-test-{os.getpid()}"
    probe.write_text("ok")
    probe.unlink()


def shared_subfolder(root: str | os.PathLike, name: str) -> Path:
    """root/name, created if missing. When `root` is shared as /tmp is (sticky and
    world-writable: a lab's cache on a group disk), the folder is made shared the same way, so
    that another user of the cache can add entries beside this user's without touching them
    (what git's core.sharedRepository does for a repository's folders)."""
    root = Path(root)
    folder = root / name
    if folder.is_dir():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    mode = root.stat().st_mode
    if mode & stat.S_ISVTX and mode & stat.S_IWOTH:
        try:
            os.chmod(folder, stat.S_IMODE(mode))
        except PermissionError:  # another user made it first: theirs to share
            pass
    return folder


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Call write(tmp) on a temp file next to `path`, then rename it into place.

    A crash mid-write leaves only a *.tmp file that nothing ever reads. A failed write is an
    OSError naming `path` (a full cache disk is blamed on the cache, not the run).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    except OSError as e:  # named by the file it was for, not the temp name it drew
        raise OSError(e.errno, e.strerror, str(path)) from None
    os.close(fd)
    try:
        try:
            write(Path(tmp))
        except OSError as e:  # named by the file it was for, not unnamed or by its temp name
            if not e.filename or str(e.filename) == tmp:
                e.filename = str(path)
            raise
        except Exception as e:  # a Rust or C++ writer (tokenizers) keeps only "os error N"
            errno = re.search(r"os error (\d+)", str(e))
            if errno is None:
                raise
            n = int(errno.group(1))
            raise OSError(n, os.strerror(n), str(path)) from e
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; caches and runs may be shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


# errno values that mean "the storage refused the write", not "the program is wrong".
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES,
                  errno.EPERM, errno.EFBIG}
_TEXT_ERRNO = {os.strerror(n): n for n in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO,
                                           errno.EACCES, errno.EFBIG)}
_STORAGE_TEXT = re.compile("|".join(map(re.escape, _TEXT_ERRNO)))


_FIX = {errno.ENOSPC: "free space on its disk", errno.EDQUOT: "free space within your quota",
        errno.EFBIG: "free space, or use a filesystem that takes larger files",
        errno.EROFS: "make its filesystem writable", errno.EACCES: "fix its permissions",
        errno.EPERM: "fix its permissions", errno.EIO: "check the disk"}


def storage_fix(e: OSError) -> str:
    """What the user does about the storage refusing `e`: a full disk is not a permission."""
    return _FIX.get(e.errno, "free space or fix its permissions")


def storage_oserror(exc: BaseException) -> OSError | None:
    """The storage refusing a write, as an OSError, if that is what `exc` is: Orbax and
    TensorStore wrap the OSError, or keep only its text, so the chain and the text are read."""
    found, seen, e = [], set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        m = _STORAGE_TEXT.search(str(e))
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            found.append(e)
        elif m and not isinstance(e, (KeyboardInterrupt, SystemExit)):
            path = re.search(r"""["'](/[^"']+)["']""", str(e))
            found.append(OSError(_TEXT_ERRNO[m.group(0)], m.group(0),
                                 path.group(1) if path else None))
        e = e.__cause__ or e.__context__
    # a failed close() after the real failure hides it: prefer an error that names its file
    return next((f for f in found if f.filename), found[0] if found else None)
