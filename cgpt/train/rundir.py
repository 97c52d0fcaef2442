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

import numpy as np

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
                check_kinds(self.out)
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


# ---- what a run directory holds ---------------------------------------------------------
CONFIG_FILE = "config.yaml"  # = cgpt.train.checkpoint.CONFIG_FILE
METRICS_FILE = "metrics.jsonl"
# what each name in a run directory must be: "file" or "dir"
KINDS = {CONFIG_FILE: "file", METRICS_FILE: "file", "summary.json": "file", "tokenizer.json": "file",
         "config_changes.json": "file", "identity.json": "file", "branch.json": "file",
         LOCK_FILE: "file", CKPT_DIR: "dir", "events": "dir", "discarded_checkpoints": "dir",
         "corrupt_checkpoints": "dir"}


def recognise(out: str | os.PathLike) -> list[str]:
    """What makes `out` hold a run, beyond an empty folder: its config.yaml, a sweep's
    identity.json, a non-empty checkpoints/, a non-empty metrics.jsonl or a summary.json."""
    out = Path(out)
    found = []
    for name in (CONFIG_FILE, "identity.json", "summary.json"):
        if (out / name).exists():
            found.append(name)
    c = out / CKPT_DIR
    if c.exists() and not (c.is_dir() and not any(c.iterdir())):
        found.append(CKPT_DIR + "/")
    m = out / METRICS_FILE
    if m.exists() and not (m.is_file() and m.stat().st_size == 0):
        found.append(METRICS_FILE)
    return found


def check_kinds(out: Path) -> None:
    """Every name cgpt keeps in a run directory is of the kind it writes (a file where a file
    goes, a directory where one goes); otherwise one error naming the path and the fix."""
    for name, kind in KINDS.items():
        p = Path(out) / name
        if p.exists() or p.is_symlink():
            is_dir = p.is_dir()
            if not p.exists():  # a dangling symlink
                raise RunDirError(f"{p} is a broken symbolic link; remove it (cgpt keeps a "
                                  f"{'directory' if kind == 'dir' else 'file'} there)")
            if is_dir != (kind == "dir"):
                raise RunDirError(
                    f"{p} is a {'directory' if is_dir else 'file'}, but cgpt keeps a "
                    f"{'directory' if kind == 'dir' else 'file'} there; move it away (or choose "
                    "another --out)")


def check_launch(out: Path, resume: bool) -> bool:
    """Whether launching into `out` starts a fresh run; refuses what would lose results.

    A directory is a run by any of several files (`recognise`), not by config.yaml alone: if
    config.yaml is gone while results remain (checkpoints, log, summary), neither a fresh
    launch (it would cut metrics.jsonl and delete the old checkpoints) nor --resume (the flags
    can no longer be checked) is safe. A sweep's identity.json alone is a run not started yet."""
    out = Path(out)
    check_kinds(out)
    found = recognise(out)
    if (out / CONFIG_FILE).exists():  # a run to go on with: its log and changes must read
        read_metrics(out / METRICS_FILE)
        read_changes(out / "config_changes.json")
        return False
    found = [f for f in found if f != "identity.json"]  # a sweep writes it before launch 1
    if found:
        raise RunDirError(
            f"{out} holds a run ({', '.join(found)}) but its {CONFIG_FILE} is missing, so "
            + ("--resume cannot check the flags against the run's" if resume else
               "a fresh launch would overwrite its log and checkpoints")
            + f"; restore {out / CONFIG_FILE} (a copy of the run's config) and rerun with "
            "--resume, or choose a new --out")
    return True


# ---- the log ----------------------------------------------------------------------------
def _bad_constant(c: str):
    raise ValueError(f"{c} is not JSON (cgpt writes null for non-finite numbers)")


def read_metrics(path: str | os.PathLike, upto_step: int | None = None,
                 raw: bool = False) -> list:
    """The records of metrics.jsonl (with step <= `upto_step`), checked line by line.

    Only a torn last line (no newline: a kill mid-write) is dropped; any other line that is not
    a JSON object with an increasing integer `step` is an error naming the file and line, never
    a silent cut. `raw`: (line text, record) pairs. A missing file reads as no records."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        text = path.read_bytes().decode()
    except IsADirectoryError:
        raise RunDirError(f"{path} is a directory, but cgpt keeps the run's log there; move it "
                          "away") from None
    except UnicodeDecodeError as e:
        raise RunDirError(f"{path}: not UTF-8 text (byte {e.start}); restore the file, or cut "
                          "it back to its last good line") from None
    lines = text.split("\n")
    torn = lines.pop()  # "" when the file ends with a newline
    out, last = [], 0
    for i, line in enumerate(lines, 1):
        where = f"{path}, line {i}"
        try:
            rec = json.loads(line, parse_constant=_bad_constant)
        except ValueError as e:
            raise RunDirError(f"{where}: not a JSON object ({e}); fix or delete that line "
                              "(every line is one logged step), then rerun") from None
        if not isinstance(rec, dict):
            raise RunDirError(f"{where}: expected a JSON object, got {type(rec).__name__}; "
                              "fix or delete that line, then rerun")
        step = rec.get("step")
        if type(step) is not int or step <= last:
            raise RunDirError(f"{where}: 'step' must be an integer above the previous line's "
                              f"{last}, got {step!r}; fix or delete that line, then rerun")
        last = step
        if upto_step is None or step <= upto_step:
            out.append((line, rec) if raw else rec)
    del torn  # a kill mid-write: the step is redone on --resume
    return out


def train_loss_window(total_steps: int) -> int:
    """The summary's train_loss averages the last this-many steps (each of them logged)."""
    return max(1, min(50, total_steps // 20))


def resume_log(path: str | os.PathLike, start: int, total_steps: int) -> None:
    """Cut metrics.jsonl back to step `start` (the restored checkpoint), refusing a log that
    could not give the summary's train_loss, rather than averaging the wrong steps."""
    path = Path(path)
    rows = read_metrics(path, start, raw=True)
    first = total_steps - train_loss_window(total_steps) + 1  # the window: steps first..total
    if start > 0 and not path.exists():
        fix = (f"or, to continue without the curve of steps 1-{start}, create an empty one "
               f"(touch {path}) and rerun" if start < first else
               "or start over in a new --out (the summary's train_loss needs those steps)")
        raise RunDirError(f"{path} is missing, but the run resumes from checkpoint {start}: the "
                          f"log of steps 1-{start} would be lost; restore the file, {fix}")
    need = set(range(first, start + 1))
    missing = sorted(need - {rec["step"] for _, rec in rows})
    if missing:
        raise RunDirError(
            f"{path} lacks step(s) {_ranges(missing)}, which the summary's train_loss (the mean "
            f"loss of steps {first}-{total_steps}) needs, and the run resumes after them (from "
            f"checkpoint {start}); restore the file, or resume from an earlier checkpoint with "
            "--from-step, or start over in a new --out")
    from cgpt.fileio import atomic_write_text
    if path.exists():
        atomic_write_text(path, "".join(line + "\n" for line, _ in rows))


def train_loss(path: str | os.PathLike, total_steps: int) -> float:
    """The summary's train_loss: the mean logged loss of the last `train_loss_window` steps."""
    first = total_steps - train_loss_window(total_steps) + 1
    got = {r["step"]: r.get("loss") for r in read_metrics(path) if r["step"] >= first}
    missing = [s for s in range(first, total_steps + 1) if not isinstance(got.get(s), (int, float))]
    if missing:
        raise RunDirError(f"{path}: no logged loss for step(s) {_ranges(missing)}, which the "
                          f"summary's train_loss (the mean of steps {first}-{total_steps}) needs")
    return float(np.mean([got[s] for s in range(first, total_steps + 1)]))


def _ranges(steps: list[int]) -> str:
    shown = ", ".join(map(str, steps[:5]))
    return shown + (f", ... ({len(steps)} in all)" if len(steps) > 5 else "")


def read_json(path: str | os.PathLike, kind: type, fix: str):
    """A JSON file of the run directory, which must hold a `kind` (dict or list)."""
    path = Path(path)
    try:
        got = json.loads(path.read_bytes().decode(), parse_constant=_bad_constant)
    except IsADirectoryError:
        raise RunDirError(f"{path} is a directory; move it away") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise RunDirError(f"{path}: not valid JSON ({e}); {fix}") from None
    if not isinstance(got, kind):
        raise RunDirError(f"{path}: expected a JSON {'object' if kind is dict else 'list'}, "
                          f"got {type(got).__name__}; {fix}")
    return got


def read_changes(path: str | os.PathLike) -> list[dict]:
    """config_changes.json: a list of {"step": int, "train.<key>": [old, new], ...}."""
    path = Path(path)
    if not path.exists():
        return []
    fix = "restore it, or delete it (it only records train.* values changed on a resume)"
    log = read_json(path, list, fix)
    for i, c in enumerate(log):
        if not (isinstance(c, dict) and type(c.get("step")) is int):
            raise RunDirError(f"{path}: entry {i} is not an object with an integer 'step'; {fix}")
    return log


def close_all(*closers) -> None:
    """Run every closer even when a full disk fails several of them; the first error wins."""
    first = None
    for close in closers:
        try:
            close()
        except Exception as e:  # noqa: BLE001 - re-raised below
            first = first or e
    if first is not None:
        raise first
