"""Every error and stop a user sees as one line, in one hierarchy at the bottom of the package.

Each message says what is wrong and what to do, so the CLI and the sweep's worker print it
without a traceback: they catch `CgptError` (and `ValueError`, which the config readers
raise) and the two stops. The built-in base each error also has is the one its callers have
always caught (`ValueError` for bad input, `RuntimeError` for a run that cannot go on), so a
new class changes no `except`. `import cgpt` exposes them without JAX.
"""
from __future__ import annotations

import signal

import yaml


class CgptError(Exception):
    """An error whose message names the file, key or flag at fault and the fix."""


class LoadError(CgptError):
    """A checkpoint could not be loaded; the message names the file, the key and the fix."""


class ExportError(CgptError, ValueError):
    """A model cannot be written where asked (a folder save_hf did not write, a read-only or
    full disk); the message names the path and the fix."""


class TrainError(CgptError, RuntimeError):
    """A run cannot start or continue as configured; the message says why and what to do."""


class RunDirError(CgptError, RuntimeError):
    """The run directory is busy or its storage failed; the message says what was kept."""


class BranchError(CgptError, ValueError):
    """A cooldown branch cannot be made as asked; the message says why and what to do."""


class DataError(CgptError, ValueError):
    """The data cannot be prepared as configured; the message says what to change."""


class DistributedError(CgptError, RuntimeError):
    """The processes of a job disagree or one of them failed; the message says which."""


class AllocationError(CgptError, ValueError):
    """The devices JAX sees differ from what the scheduler allocated; the message says how."""


class Preempted(CgptError):
    """Training checkpointed and stopped on a signal; rerun with --resume to continue."""

    def __init__(self, signum: int, step: int, out: object):
        self.signum, self.step = signum, step
        super().__init__(f"stopped by {signal.Signals(signum).name} after checkpointing step "
                         f"{step} in {out}; rerun with --resume to continue")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention for "ended by this signal"


class Stopped(BaseException):
    """A command (not a training loop) stopped by a scheduler's signal. A BaseException, as
    KeyboardInterrupt: raised anywhere, it must pass every library's `except Exception`."""

    def __init__(self, signum: int, command: str = ""):
        self.signum, self.step = signum, 0
        super().__init__(f"stopped by {signal.Signals(signum).name}; rerun the same command to "
                         "continue" + (" (finished shards are kept)" if command == "data" else ""))

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


# a run stopped before its first step: its launch removed what it made, and a rerun of the
# same command starts it (or resumes the run that was there: the default)
NOTHING_WRITTEN = "before the first training step: nothing of the run was written; rerun the " \
    "same command"


class NotStarted(Stopped):
    """A scheduler's signal before the first training step: stopped, nothing to checkpoint."""

    def __init__(self, signum: int):
        self.signum, self.step = signum, 0
        BaseException.__init__(self, f"stopped by {signal.Signals(signum).name} "
                               f"{NOTHING_WRITTEN}")


class CheckpointsChanged(Exception):
    """A checkpoint vanished while it was read (a run training into the directory replaced
    it): the reader lists the checkpoints again; never shown to a user."""


class DuplicateKeyError(CgptError, yaml.YAMLError):
    """A mapping names one key twice (YAML forbids it; PyYAML would keep the last silently).
    A YAMLError too, so every reader that reports a file that does not parse reports this."""
