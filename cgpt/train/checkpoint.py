"""Training's side of a run's Orbax checkpoints (`cgpt.model.orbax_format`: the format and
its reader): asynchronous, atomic saves, the restore of a run's newest readable checkpoint
(those that fail set aside), and a rewind. Orbax writes each checkpoint into a temporary
directory and renames it when complete, so a SIGKILL leaves either the previous checkpoints or
a finished new one, never a half-written one that is trusted.
"""
from __future__ import annotations

import logging
import math
import os
import re
import sys
import time
from pathlib import Path

from cgpt import rundir
from cgpt.fileio import storage_oserror
from cgpt.model import orbax_quiet as quiet
from cgpt.model.orbax_format import manager, restore_newest
from cgpt.sharding import distributed

log = logging.getLogger(__name__)
_ORBAX_TMP = re.compile(r"\d+\.orbax-checkpoint-tmp(-\d+)?$")  # Orbax's step.TMP_DIR_SUFFIX


def _set_aside(run_dir: Path, src: Path, aside: Path) -> Path:
    """Move a checkpoint directory out of the way (to `aside`, returned) under the path-safety
    rule (never into or out of a place outside the run); in a multi-process job process 0
    alone moves it (the others wait at a barrier before they reload)."""
    if distributed.is_writer():
        rundir.area(run_dir).move(src, aside)
    return aside


class Checkpointer:
    """Save/restore {params, opt_state, step} with the last `keep` checkpoints kept.

    Saves are asynchronous (Orbax's async checkpointing): `save` returns once the state is
    copied off the devices and the files are written in the background, so training goes on
    while a 13B state (154 GB) reaches the disk. The next `save`, `steps`, and `close` wait
    for it first, and a failed write raises there, naming that checkpoint's path. Each
    checkpoint is still written to a temporary directory and renamed when complete.
    Every finished save prints one line with its measured time (`last_save_s`), and a
    warning when that exceeds the grace the SLURM executor leaves after its time-limit signal
    (CGPT_SAVE_GRACE_S, `cgpt.sweep.executors.requeue_grace`).
    """

    # A test-only hook in the writer: called by Orbax's background thread after the files
    # are written and before the rename commits them (tests slow the writer with it).
    before_commit = None

    def __init__(self, run_dir: Path, keep: int = 2):
        self.run_dir, self.keep = Path(run_dir), keep
        ckpts = self.run_dir / rundir.CKPT_DIR
        if distributed.is_writer() and ckpts.is_dir():  # a killed save's temp folders: Orbax
            for p in ckpts.iterdir():                   # warns when a save meets one
                if _ORBAX_TMP.match(p.name):
                    rundir.area(self.run_dir).remove(p)
        self.mngr = manager(self.run_dir, keep, on_written=self._written)
        self._pending: tuple[int, float, float] | None = None  # (step, started, blocking s)
        self._holds = None
        self._written_at: float | None = None
        self.last_save_s: float | None = None  # the newest finished save, start to commit
        self._warned = False

    def _written(self) -> None:
        if type(self).before_commit is not None:
            type(self).before_commit()
        self._written_at = time.monotonic()

    def steps(self) -> list[int]:
        self.wait()  # a save still writing is not a checkpoint yet
        return sorted(self.mngr.all_steps())

    def save(self, step: int, params, opt_state) -> None:
        """Start writing checkpoint `step` and return; the previous save is finished first.
        If the storage refuses (disk full, quota, read-only), the error names the
        checkpoint's path and the failure's aftermath is not printed."""
        import orbax.checkpoint as ocp  # loads JAX: only when this runs

        self.wait()
        t0 = time.monotonic()
        self._hold()
        self._written_at = None
        try:
            self.mngr.save(step, args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                opt_state=ocp.args.StandardSave(opt_state)), force=True)
        except BaseException as e:
            self._release(step, e)  # raises
        self._pending = (step, t0, time.monotonic() - t0)

    def wait(self) -> None:
        """Block until the save in flight (if any) is on disk; raise its error if it failed."""
        if self._pending is None:
            return
        step, t0, blocking = self._pending
        self._pending = None
        try:
            self.mngr.wait_until_finished()
        except BaseException as e:
            old = self._prune_error(step, e)
            if old is None:
                self._release(step, e)  # raises
            self._kept_old(step, old)
        else:
            self._release(step, None)
        self.last_save_s = (self._written_at or time.monotonic()) - t0
        if not distributed.is_writer():
            return
        grace = float(os.environ.get("CGPT_SAVE_GRACE_S") or 0)  # set by the SLURM executor
        line = (f"checkpoint {step}: saved in {self.last_save_s:.1f} s (training paused "
                f"{blocking:.1f} s of it)")
        if grace:  # under a scheduler the save time sizes the requeue grace: in the job's log
            print(line, file=sys.stderr, flush=True)
        else:
            log.info(line)
        if grace and self.last_save_s > grace and not self._warned:
            self._warned = True
            print(f"warning: checkpoint {step} took {self.last_save_s:.0f} s to save, more than "
                  f"the {grace:.0f} s the scheduler's signal leaves before the requeue: a save "
                  "on the signal would be cut off; set slurm.signal_delay_s to at least "
                  f"{math.ceil(1.25 * self.last_save_s) + 30}", file=sys.stderr, flush=True)

    def _prune_error(self, step: int, error: BaseException) -> OSError | None:
        """The OSError of `error`'s chain if it is Orbax failing to delete an older checkpoint
        (its pruning to `keep`, after checkpoint `step` was committed), else None."""
        ckpts = (self.run_dir / rundir.CKPT_DIR).absolute()
        e, seen = error, set()
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            if isinstance(e, OSError) and e.filename:
                try:
                    part = Path(os.fsdecode(e.filename)).absolute().relative_to(ckpts).parts[0]
                except (ValueError, IndexError, TypeError):
                    return None
                older = part.isdigit() and int(part) < step
                return e if older and (ckpts / str(step)).is_dir() else None
            e = e.__cause__ or e.__context__
        return None

    def _kept_old(self, step: int, old: OSError) -> None:
        """Checkpoint `step` is committed but an older one could not be deleted (EBUSY on NFS,
        a file held open): not a failed save. One line, and training goes on; the old one is
        pruned by a later save or the next resume (`_prune`). Orbax's traceback of it (held
        since the save began) is dropped, and Orbax, which forgot `step` on the failure,
        lists the directory again."""
        held, unraisable, prev_hook = self._holds
        self._holds = None
        sys.unraisablehook = prev_hook
        logging.getLogger("absl").removeFilter(held)  # its records: this failure's traceback
        for u in unraisable:
            prev_hook(u)
        self.mngr.reload()
        if distributed.is_writer():
            print(f"warning: checkpoint {step} saved, but the older {old.filename} could not be "
                  f"deleted ({old.strerror or old}); it is kept until a later save or --resume "
                  "prunes it (or delete it yourself)", file=sys.stderr, flush=True)

    def _hold(self) -> None:
        # Orbax logs a traceback per failed writer thread, and TensorStore reports writes that
        # end after Orbax closed its event loop as unraisable "Event loop is closed" errors,
        # at any time until the save is waited for: held back until then
        held, unraisable, prev_hook = quiet.HoldErrors(), [], sys.unraisablehook
        logging.getLogger("absl").addFilter(held)
        sys.unraisablehook = (lambda u: unraisable.append(u) if quiet.closed_loop(u)
                              else prev_hook(u))
        self._holds = (held, unraisable, prev_hook)

    def _release(self, step: int, error: BaseException | None) -> None:
        """End the hold of `_hold`; re-raise `error`, as an OSError naming checkpoint `step`'s
        path if the storage refused it."""
        held, unraisable, prev_hook = self._holds
        self._holds = None
        absl = logging.getLogger("absl")
        cause = (storage_oserror(error) if isinstance(error, Exception) else None)
        if cause is None:
            sys.unraisablehook = prev_hook
            absl.removeFilter(held)
            if error is None or isinstance(error, Exception):
                held.release()
                for u in unraisable:
                    prev_hook(u)
            if error is not None:
                raise error
            return
        quiet.mute_storage_aftermath(prev_hook)  # replaces the hold above in one assignment
        absl.removeFilter(held)  # its records are of the failure raised here: dropped
        raise OSError(cause.errno, cause.strerror, str(self.run_dir / rundir.CKPT_DIR / str(step))
                      ) from error

    def discard_after(self, step: int, remove: bool = False) -> list[int]:
        """Move the checkpoints newer than `step` to `discarded_checkpoints/` (a rewind), or
        delete them (`remove`: a fused group's realignment, which retrains them exactly)."""
        later = [s for s in self.steps() if s > step]
        for s in later:
            src = self.run_dir / rundir.CKPT_DIR / str(s)
            if remove and distributed.is_writer():
                rundir.area(self.run_dir).remove(src)
            elif not remove:
                _set_aside(self.run_dir, src, self.run_dir / rundir.DISCARDED_DIR / str(s))
        if later:
            distributed.barrier(f"discard-after-{step}")  # process 0 moved them; all reload
            self.mngr.reload()
        return later

    def restore_latest(self, abstract_params, abstract_opt_state):
        """(step, params, opt_state) from the newest readable checkpoint, or None if none.

        A checkpoint that fails to restore (corrupted on disk) is skipped with a warning, set
        aside (so that its step can be rewritten) and the previous one is used.
        """
        found = restore_newest(
            self.mngr, self.run_dir, {"params": abstract_params, "opt_state": abstract_opt_state},
            "move the checkpoints away to start over",
            lambda s: _set_aside(self.run_dir, self.run_dir / rundir.CKPT_DIR / str(s),
                                 self.run_dir / rundir.CORRUPT_DIR / str(s)))
        if found is None:
            return None
        step, out, bad = found
        if bad:
            distributed.barrier(f"corrupt-aside-{step}")  # process 0 moved them; all reload
            self.mngr.reload()
        self._prune(step)
        return step, out["params"], out["opt_state"]

    def _prune(self, restored: int) -> None:
        """Keep the newest `keep` checkpoints up to the one restored: Orbax prunes after a
        save, so a kill between a save's commit and its pruning leaves one too many."""
        if not self.keep or self.keep < 1:
            return
        old = sorted(s for s in self.mngr.all_steps() if s <= restored)[:-self.keep]
        for s in old:
            self.mngr.delete(s)

    def close(self) -> None:
        """Finish the save in flight, then release Orbax's threads (even if it failed)."""
        try:
            self.wait()
        finally:
            self.mngr.close()
