"""One launch of `train` into a run directory (`cgpt.rundir`): take its lock, then commit or
leave nothing; storage errors reported as one line that says what was kept.

A launch that fails before it commits (its state restored, training about to begin) removes
what it created, so the next launch finds nothing half-made to reuse; nothing it did not
create is removed.
"""
from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from cgpt import rundir
from cgpt.errors import RunDirError
from cgpt.fileio import atomic_write_text, storage_fix, storage_oserror


# ---- a launch: lock, then commit or leave nothing -------------------------------------------
def first_missing(path: Path) -> Path | None:
    """The outermost directory of `path` that does not exist yet (what a mkdir -p creates)."""
    path = Path(path).absolute()
    missing = None
    while not path.exists():
        missing, path = path, path.parent
    return missing


class Launch:
    """Holds the run directory's lock for one `train` call.

    Until `commit()` (training begins: the run can be resumed), a failure removes
    what the launch created (`created` files, the lock file, the directories it made), so the
    next launch finds nothing half-made to reuse. Storage errors become one `RunDirError`.
    """

    def __init__(self, out: Path, new_dirs: Path | None, lock: bool = True):
        self.out, self.new_dirs = Path(out), new_dirs
        self.created: list[Path] = []
        self.committed = False
        self.lock = rundir.RunLock(self.out)  # `lock=False`: not the run's writer
        self._lock_existed = self.lock.path.exists()
        self._locking = lock

    def __enter__(self) -> "Launch":
        try:
            if self._locking:
                rundir.check_kinds(self.out)
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
            raise RunDirError(f"{err[0]}; {kept(self.out, err[1])}") from exc
        return False

    def _clean(self, lock_too: bool) -> None:
        for p in self.created:  # a directory only if empty: never anything of the user's
            if p.is_dir() and not p.is_symlink():
                with contextlib.suppress(OSError):
                    p.rmdir()
            else:
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
def storage_error(exc: BaseException) -> tuple[str, str] | None:
    """('cannot write PATH: REASON', the fix) when `exc` is the storage refusing a write; an
    EIO, which may have been a read, as 'the storage failed on PATH: ...'. Else None."""
    e = storage_oserror(exc)
    if e is None:
        return None
    what = "the storage failed on" if e.errno == errno.EIO else "cannot write"
    return f"{what} {e.filename or 'the run directory'}: {e.strerror}", storage_fix(e)


def kept(out: Path, fix: str) -> str:
    """What a stopped run leaves usable: its complete checkpoints, and how to continue."""
    d = Path(out) / rundir.CKPT_DIR
    steps = sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []
    if not steps:
        return f"no checkpoint was written yet; {fix} and rerun"
    what = (f"checkpoint {steps[0]} is kept" if len(steps) == 1 else
            f"checkpoints {', '.join(map(str, steps))} are kept")
    return f"{what} in {d}; {fix} and rerun with --resume to continue"


# ---- what a launch may do with a directory ----------------------------------------------
def check_launch(out: Path, resume: bool) -> bool:
    """Whether launching into `out` starts a fresh run; refuses what would lose results.

    A directory is a run by any of several files (`recognise`), not by config.yaml alone: if
    config.yaml is gone while results remain (checkpoints, log, summary), neither a fresh
    launch (it would cut metrics.jsonl and delete the old checkpoints) nor --resume (the flags
    can no longer be checked) is safe. A sweep's identity.json alone is a run not started yet."""
    out = Path(out)
    rundir.check_kinds(out)
    found = rundir.recognise(out)
    if (out / rundir.CONFIG_FILE).exists():  # a run to go on with: its log, changes must read
        rundir.read_metrics(out / rundir.METRICS_FILE)
        rundir.read_changes(out / rundir.CHANGES_FILE)
        return False
    found = [f for f in found if f != rundir.IDENTITY_FILE]  # a sweep writes it before launch 1
    if found:
        raise RunDirError(
            f"{out} holds a run ({', '.join(found)}) but its {rundir.CONFIG_FILE} is missing, "
            + ("so --resume cannot check the flags against the run's" if resume else
               "so a fresh launch would overwrite its log and checkpoints")
            + f"; restore {out / rundir.CONFIG_FILE} (a copy of the run's config) and rerun "
            "with --resume, or choose a new --out")
    return True


def resume_log(path: str | os.PathLike, start: int, total_steps: int) -> None:
    """Cut metrics.jsonl back to step `start` (the restored checkpoint), refusing a log that
    could not give the summary's train_loss, rather than averaging the wrong steps."""
    path = Path(path)
    rows = rundir.read_metrics(path, start, raw=True)
    first = total_steps - rundir.train_loss_window(total_steps) + 1  # steps first..total
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
            f"{path} lacks step(s) {rundir.step_ranges(missing)}, which the summary's train_loss "
            f"(the mean loss of steps {first}-{total_steps}) needs, and the run resumes after "
            f"them (from checkpoint {start}); restore the file, or resume from an earlier "
            "checkpoint with --from-step, or start over in a new --out")
    if path.exists():
        atomic_write_text(path, "".join(line + "\n" for line, _ in rows))


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
