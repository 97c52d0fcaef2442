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

import _thread
import os
import signal
import sys
import threading
import time
from typing import NoReturn

from cgpt.errors import NotStarted, Preempted, Stopped  # noqa: F401 - raised here

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
STOPS = {"train": (signal.SIGINT, *SIGNALS), "data": (signal.SIGINT, *SIGNALS)}  # else SIGINT
_loop_started = False  # once the loop's handlers were installed, late signals do not stop
_stopping = 0  # the signal being acted on: a repeated one must not interrupt the cleanup
_kind = "train"  # the command whose handlers are installed (`defer_early`)
_installed = False
_armed = True  # the handler may raise: a caller of ours catches it (see `install_process`)
_command = ""  # the process's `cgpt` command (its entry point set it), for the lines below
_GRACE_S = 2.0  # a signal the main thread did not act on by then (stuck in C): the watchdog


def _early(signum, frame) -> None:
    """Ctrl-C anywhere, and a scheduler's signal before the loop: stop with one line. Acted on
    once: a repeat (the executor re-sends SIGUSR1 every second) must not break the cleanup."""
    global _stopping
    if _stopping or (signum != signal.SIGINT and _loop_started):
        return  # after the loop the run is finishing its summary: let it finish
    if _armed and _importing(frame):  # raised inside an import, an extension module's init
        _trip_later(signum)  # can crash (jaxlib: a segfault): act once the import is done
        return
    _stopping = signum
    if not _armed:  # no caller of ours on the stack yet (Python's module loading): end here
        _exit_now(stop_line(signum, _command or _kind), 128 + signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise NotStarted(signum) if _kind == "train" else Stopped(signum, _kind)


def defer_early(command: str = "train") -> dict:
    """Stop with one line, not a traceback or the default action's silent death, on Ctrl-C or
    a scheduler's signal that arrives before the training loop (while JAX starts, the data is
    prepared, the step compiles): nothing is trained yet, so there is nothing to checkpoint. A
    launch stopped before its config is written leaves nothing behind
    (`cgpt.train.launch.Launch`). The exceptions raised (`KeyboardInterrupt`, `NotStarted`)
    are BaseExceptions, so no library's `except Exception` swallows them. `command` picks
    the signals: `STOPS`, else SIGINT only."""
    global _loop_started, _stopping, _kind, _armed
    _loop_started, _stopping, _kind, _armed = False, 0, command, True
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, _early) for s in STOPS.get(command, (signal.SIGINT,))}


def stop_line(signum: int, command: str) -> str:
    """The one line of a stop on `signum` (before the loop, or Ctrl-C anywhere)."""
    if signum == signal.SIGINT:
        how = {"train": "; rerun with --resume to continue",
               "data": "; rerun the same command to continue (finished shards are kept)"}
        return f"cgpt {command}: interrupted{how.get(command, '')}"
    return f"cgpt {command}: {NotStarted(signum) if command == 'train' else Stopped(signum, command)}"


def install_process(command: str) -> None:
    """The process entry's guard (`python -m cgpt`, from its first statement): the handlers of
    `defer_early`, plus two things that make every stop one line with exit 128+N:

    * an exception the handler raised inside a callback that cannot raise (a gc callback such
      as JAX's, a `__del__`) is reported by Python as "Exception ignored" and dropped, and the
      run went on: `sys.unraisablehook` delivers the signal again, outside that callback;
    * the main thread acts on a signal only between bytecodes, never inside a long XLA compile
      or device wait: a watchdog thread (woken through `signal.set_wakeup_fd`) ends the process
      with the line if the main thread has not acted within `_GRACE_S` (what is left then is
      what a SIGKILL leaves, which runs and stores are built to survive)."""
    global _command, _installed, _armed
    if _installed:
        return
    _installed, _command = True, command
    defer_early(command)
    _armed = False  # until `arm()`: the package and __main__ load, nothing catches a raise
    prior_hook = sys.unraisablehook

    def unraisable(u) -> None:
        e = u.exc_value
        if _stopping and isinstance(e, (KeyboardInterrupt, Stopped)):
            _trip_later(getattr(e, "signum", signal.SIGINT), acted=True)
        else:
            prior_hook(u)

    sys.unraisablehook = unraisable
    try:
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (OSError, ValueError):  # no pipe, or not the main thread: the handlers alone
        return
    threading.Thread(target=_watch, args=(r,), name="cgpt-signal-watchdog", daemon=True).start()


def arm() -> None:
    """From here on the handler raises (the caller catches `KeyboardInterrupt` and `Stopped`);
    before, a signal ends the process at once with the line: nothing is written yet."""
    global _armed
    _armed = True


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _trip_later(signum: int, acted: bool = False) -> None:
    """Trip `signum` again from another thread in a moment: the handler then runs at the main
    thread's next bytecode, out of the import or callback it was in (`acted`: after a stop
    that a callback dropped; the watchdog still ends a main thread that never gets there)."""
    def again() -> None:
        global _stopping
        time.sleep(0.05)
        if acted and _stopping != signum:  # finished meanwhile
            return
        if acted:
            _stopping = 0
        _thread.interrupt_main(signum)

    threading.Thread(target=again, name="cgpt-signal-again", daemon=True).start()


def _watch(fd: int) -> None:
    while True:
        try:
            got = os.read(fd, 64)
        except OSError:
            return
        for signum in got:
            if signal.getsignal(signum) is not _early or (
                    signum != signal.SIGINT and _loop_started):
                continue  # the loop's handlers, or a signal `_early` ignores
            deadline = time.monotonic() + _GRACE_S
            while not _stopping and time.monotonic() < deadline:
                time.sleep(0.02)
            if not _stopping:  # the main thread is stuck in C: end it here
                _exit_now(stop_line(signum, _command), 128 + signum)


def _exit_now(line: str, code: int) -> None:
    try:
        os.write(2, (line + "\n").encode())  # no Python lock: the main thread may hold one
    finally:
        os._exit(code)


def finish(code: int, command: str) -> NoReturn:
    """End the process with `code`. Signals from here on change nothing (the command has
    finished, or stopped and said so). After a stop or an error the end is `os._exit`: the
    interpreter's finalization, with XLA's compile threads or an interrupted library still
    around, can crash (a segfault after an interrupted compile), and every file the command
    writes is closed by then; a success ends normally (JAX's multi-process exit barrier)."""
    global _stopping
    _stopping = _stopping or -1  # from here on `_early` and the watchdog do nothing
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, *SIGNALS):
            signal.signal(s, signal.SIG_IGN)
    if code:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


def restore(old: dict) -> None:
    """Put back the handlers `defer_early` replaced (a caller that is not the process's end)."""
    for s, h in old.items():
        signal.signal(s, h)


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
