"""Guards around a run directory: one trainer at a time, nothing left by a failed launch,
strict-JSON log lines, and storage errors reported as one line that says what was kept.

The lock is an `flock` on `<run>/.lock`: the kernel drops it when its holder dies (a SIGKILL
included), so a stale lock file never blocks the next launch. A launcher that took the lock
itself (the sweep) and exec'd `train` with the descriptor still open is recognised, so the
two never refuse each other.
"""
from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import socket
from pathlib import Path

LOCK_FILE = ".lock"
CKPT_DIR = "checkpoints"  # = cgpt.train.checkpoint.CKPT_DIR (kept import-free: no jax here)
# errno values that mean "the storage refused the write", not "the program is wrong".
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES,
                  errno.EPERM, errno.EFBIG}
_TEXT_ERRNO = {os.strerror(n): n for n in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO,
                                           errno.EACCES, errno.EFBIG)}
_STORAGE_TEXT = re.compile("|".join(map(re.escape, _TEXT_ERRNO)))


class RunDirError(RuntimeError):
    """The run directory is busy or its storage failed; the message says what was kept."""


# ---- the lock -----------------------------------------------------------------------------
def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _inherited(path: Path) -> int | None:
    """An open descriptor of this process on `path` (a lock a launcher passed down), or None."""
    fd_dir = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    try:
        fds = [int(x) for x in os.listdir(fd_dir)]
    except OSError:
        return None
    for fd in fds:
        if fd > 2 and _same_file(fd, path):
            return fd
    return None


class RunLock:
    """An exclusive lock on a run directory, held while one process trains in it."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_FILE
        self.fd: int | None = None
        self.adopted = False

    def acquire(self) -> "RunLock":
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                fd = _inherited(self.path)
                if fd is not None:
                    try:  # succeeds only if the lock is ours already (same open file)
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        self.fd, self.adopted = fd, True
                        self._write_holder()
                        return self
                    except BlockingIOError:
                        pass
                raise RunDirError(
                    f"{self.path.parent} is in use by another training process (pid {holder}, "
                    f"holding {self.path}); wait for it to finish or stop it, or choose "
                    "another --out") from None
            if _same_file(fd, self.path):  # not a file a previous holder just removed
                self.fd = fd
                self._write_holder()
                return self
            os.close(fd)

    def _write_holder(self) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}@{socket.gethostname()}\n".encode(), 0)

    def release(self, remove: bool = False) -> None:
        """Drop the lock; `remove` also deletes the lock file (a launch that left nothing)."""
        if self.fd is None:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        if not self.adopted:  # an inherited descriptor belongs to the launcher
            os.close(self.fd)
        self.fd = None


# ---- a launch: lock, then commit or leave nothing --------------------------------------------
def first_missing(path: Path) -> Path | None:
    """The outermost directory of `path` that does not exist yet (what a mkdir -p creates)."""
    path = Path(path).absolute()
    missing = None
    while not path.exists():
        missing, path = path, path.parent
    return missing


class Launch:
    """Holds the run directory's lock for one `train` call.

    Until `commit()` (the config is written and the run can be resumed), a failure removes
    what the launch created (`created` files, the lock file, the directories it made), so the
    next launch finds nothing half-made to reuse. Storage errors become one `RunDirError`.
    """

    def __init__(self, out: Path, new_dirs: Path | None, lock: bool = True):
        self.out, self.new_dirs = Path(out), new_dirs
        self.created: list[Path] = []
        self.committed = False
        self.lock = RunLock(self.out)  # `lock=False`: a process that is not the run's writer
        self._lock_existed = self.lock.path.exists()
        self._locking = lock

    def __enter__(self) -> "Launch":
        try:
            if self._locking:
                self.lock.acquire()
        except BaseException:
            self._clean(lock_too=False)
            raise
        return self

    def commit(self) -> None:
        self.committed = True

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None:
            self.lock.release()
            return False
        if not self.committed:
            self._clean(lock_too=True)
        else:
            self.lock.release()
        err = storage_error(exc)
        if err is not None:
            raise RunDirError(f"{err}; {kept(self.out)}") from exc
        return False

    def _clean(self, lock_too: bool) -> None:
        for p in self.created:
            p.unlink(missing_ok=True)
        self.lock.release(remove=lock_too and not self._lock_existed)
        if self.new_dirs is not None:  # only if empty now: never remove anything of the user's
            d = self.out.absolute()
            while True:
                try:
                    d.rmdir()
                except OSError:
                    break
                if d == self.new_dirs:
                    break
                d = d.parent


# ---- storage errors ---------------------------------------------------------------------
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


def storage_error(exc: BaseException) -> str | None:
    """'cannot write PATH: REASON' when `exc` is the storage refusing a write, else None."""
    e = storage_oserror(exc)
    if e is None:
        return None
    return f"cannot write {e.filename or 'the run directory'}: {e.strerror}"


def kept(out: Path) -> str:
    """What a stopped run leaves usable: its complete checkpoints, and how to continue."""
    d = Path(out) / CKPT_DIR
    steps = sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []
    if not steps:
        return "no checkpoint was written yet; free space (or fix the permissions) and rerun"
    what = (f"checkpoint {steps[0]} is kept" if len(steps) == 1 else
            f"checkpoints {', '.join(map(str, steps))} are kept")
    return (f"{what} in {d}; free space (or fix the permissions) and rerun with --resume "
            "to continue")


# ---- strict JSON ------------------------------------------------------------------------
def json_line(rec: dict, default=None) -> str:
    """`rec` as one strict-JSON line: non-finite numbers become null and are listed under
    `nonfinite` (Python's json would write a bare NaN, which no JSON parser accepts).
    `default` as in `json.dumps` (e.g. `str` for values JSON has no type for)."""
    bad = [k for k, v in rec.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        rec = {**{k: (None if k in bad else v) for k, v in rec.items()}, "nonfinite": bad}
    return json.dumps(rec, allow_nan=False, default=default)
