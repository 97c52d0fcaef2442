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

import time

from cgpt.stop import GUARD, received_line


class CheckpointTriggers:
    """Handlers for SIGTERM/SIGUSR1/SIGUSR2 plus a wall-clock timer; `poll` once per step."""

    def __init__(self, minutes: float | None = None):
        self.interval_s = minutes * 60 if minutes else None
        self.signum = 0
        self.last = time.monotonic()
        self._old: dict = {}
        self._agree = None  # a multi-process job's agreement, made at the first poll

    def _handle(self, signum, frame) -> None:
        if not self.signum:  # said at arrival by the process's watchdog (`cgpt.stop`); where
            # there is none (a sweep's worker), here: on fd 2 (a print inside a print that the
            # signal interrupted would raise "reentrant call")
            GUARD.say(received_line(signum), now=True)
        self.signum = self.signum or signum

    def install(self) -> "CheckpointTriggers":
        """The scheduler's signals checkpoint from here on (the process's handlers are
        `cgpt.stop`'s: it installs this one for the loop)."""
        self._old = GUARD.hand_over(self._handle)
        return self

    def uninstall(self) -> None:
        GUARD.restore(self._old)
        self._old = {}

    def poll(self, step: int | None = None) -> tuple[bool, int]:
        """(checkpoint now, the stop signal or 0) after `step`, the same answer in every process.

        With one process the local state answers at once. In a multi-process job (`step`
        required) the processes agree on a step a little later through the coordination
        service (`cgpt.sharding.distributed.StepAgreement`), never by a device collective."""
        due = self.interval_s is not None and time.monotonic() - self.last >= self.interval_s
        signum = self.signum
        if self._agree is None:
            import jax  # loads JAX: only when this runs

            if jax.process_count() == 1:
                return due or bool(signum), signum
            from cgpt.sharding.distributed import StepAgreement  # loads JAX: only when this runs

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
