"""When a training loop must checkpoint outside its step schedule: a scheduler's signal or a
wall-clock interval.

SLURM sends SIGTERM before it kills a job (preemption, `scontrol requeue`, cancel) and the
signal a job asked for before its time limit (submitit: SIGUSR2; SIGUSR1 is the common
choice elsewhere). On any of the three the loop checkpoints at the end of the current step and
stops with `Preempted`, so a requeued job resumes where it stopped. `train.checkpoint_minutes`
adds a checkpoint every so many minutes, so a crash never loses more than that. In a
multi-process job the processes agree (any of them) before acting, since Orbax saves
collectively: through the coordination service's key-value store, a couple of steps after the
trigger, with no device collective per step.
"""
from __future__ import annotations

import signal
import threading
import time

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
_loop_started = False  # once the loop's handlers were installed, late signals do not stop


def _early(signum, frame) -> None:
    if not _loop_started:
        raise NotStarted(signum)


def defer_early() -> dict:
    """Stop with one line, not the default action's silent death, on a scheduler's signal that
    arrives before the training loop (while JAX starts, the data is prepared, the step
    compiles): nothing is trained yet, so there is nothing to checkpoint. A launch stopped
    before its config is written leaves nothing behind (`rundir.Launch`). SIGTERM keeps its
    default action there (an immediate end, also inside a long compile: a sweep's orphaned
    train must end at once), which loses nothing either."""
    global _loop_started
    _loop_started = False
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, _early) for s in (signal.SIGUSR1, signal.SIGUSR2)}


def ignore_late() -> None:
    """Ignore SIGUSR1/SIGUSR2 from here on: the run has checkpointed (or finished) and exits."""
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(s, signal.SIG_IGN)


def restore(old: dict) -> None:
    """Put back the handlers `defer_early` replaced (a caller that is not the process's end)."""
    for s, h in old.items():
        signal.signal(s, h)


class Preempted(Exception):
    """Training checkpointed and stopped on a signal; rerun with --resume to continue."""

    def __init__(self, signum: int, step: int, out: object):
        self.signum, self.step = signum, step
        super().__init__(f"stopped by {signal.Signals(signum).name} after checkpointing step "
                         f"{step} in {out}; rerun with --resume to continue")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention for "ended by this signal"


class NotStarted(Preempted):
    """A scheduler's signal before the first training step: stopped, nothing to checkpoint."""

    def __init__(self, signum: int):
        self.signum, self.step = signum, 0
        Exception.__init__(self, f"stopped by {signal.Signals(signum).name} before the first "
                           "training step; rerun the same command (with --resume once the run's "
                           "config.yaml is written) to start again")


class CheckpointTriggers:
    """Handlers for SIGTERM/SIGUSR1/SIGUSR2 plus a wall-clock timer; `poll` once per step."""

    def __init__(self, minutes: float | None = None):
        self.interval_s = minutes * 60 if minutes else None
        self.signum = 0
        self.last = time.monotonic()
        self._old: dict = {}
        self._agree = None  # a multi-process job's agreement, made at the first poll

    def _handle(self, signum, frame) -> None:
        self.signum = self.signum or signum

    def install(self) -> "CheckpointTriggers":
        global _loop_started
        _loop_started = True
        if threading.current_thread() is threading.main_thread():  # handlers: main thread only
            self._old = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def uninstall(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    def poll(self, step: int | None = None) -> tuple[bool, int]:
        """(checkpoint now, the stop signal or 0) after `step`, the same answer in every process.

        With one process the local state answers at once. In a multi-process job (`step`
        required) the processes agree on a step a little later through the coordination
        service (`cgpt.sharding.distributed.StepAgreement`), never by a device collective."""
        due = self.interval_s is not None and time.monotonic() - self.last >= self.interval_s
        signum = self.signum
        if self._agree is None:
            import jax

            if jax.process_count() == 1:
                return due or bool(signum), signum
            from cgpt.sharding.distributed import StepAgreement

            self._agree = StepAgreement()
        if step is None:
            raise ValueError("CheckpointTriggers.poll: a multi-process job must pass the step")
        got = self._agree.poll(step, due, signum)
        if got is None:
            return False, 0
        due, signum = got
        return due or bool(signum), signum

    def saved(self) -> None:
        """A checkpoint was written: the interval starts again."""
        self.last = time.monotonic()
