"""How a command ends when it is stopped or fails: the one place that turns a signal, a stop or
an error into one line on stderr and an exit status.

Two parts, both without JAX (the process entry, `cgpt.cli.entry`, imports this before
anything else). The one module that installs signal handlers (a structure test keeps it so):

* `StopGuard`, the process's signal state (`GUARD`, one per process: signal handlers belong
  to the process). Ctrl-C anywhere, or a scheduler's signal before the training loop, stops
  the command with one line and exit 128+N, never a traceback, a lost interrupt or a
  segfault; once a run's loop starts, its `cgpt.train.preempt.CheckpointTriggers` take the
  scheduler's signals over through it (`hand_over`: checkpoint, then `Preempted`). A sweep's
  worker runs under a quiet guard (the sweep says the stop's line), a helper process ignores
  the stops its command acts on (`ignore_stops`, `ignore_checkpoint_requests`).
* `status`, which says how a command ended on an exception, and `edge`, which runs a command
  under it. They are called once at the edge of the process (`cgpt.cli.main`, which
  `cgpt.cli.entry` runs) and once per job of a sweep's worker (`cgpt.sweep.worker`), never in
  between: the code under them raises.
"""
from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
import traceback
from typing import Callable, Iterator, NoReturn

from cgpt.errors import NOTHING_WRITTEN, CgptError, NotStarted, Preempted, Stopped

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
# the commands that run for minutes answer every stop; the others Ctrl-C only
STOPS = {c: (signal.SIGINT, *SIGNALS) for c in ("train", "data", "sweep", "plan", "eval")}
GRACE_S = 2.0  # a signal the main thread did not act on by then (stuck in C): the watchdog
CLEANUP_S = 60.0  # a stop's whole cleanup (logs closed, a save in flight): then the watchdog


def stop_line(signum: int, command: str) -> str:
    """The one line of a stop on `signum` (before the loop, or Ctrl-C anywhere). A run stopped
    before its loop began left nothing (`cgpt.train.launch.Launch` removes what it made)."""
    if signum == signal.SIGINT:
        how = {"train": "; rerun the same command to continue from its last checkpoint"
                        if GUARD.loop_started else
               f" {NOTHING_WRITTEN}",
               "data": "; rerun the same command to continue (finished shards are kept)"}
        return f"cgpt {command}: interrupted{how.get(command, '')}"
    stop = NotStarted(signum) if command == "train" else Stopped(signum, command)
    return f"cgpt {command}: {stop}"


def received_line(signum: int, command: str = "train") -> str:
    """The line said the moment a scheduler's signal reaches a run's training loop, before the
    checkpoint it starts: a SIGKILL that follows (SLURM's KillWait, a test harness 0.1 s later)
    can leave no other."""
    return (f"cgpt {command or 'train'}: {signal.Signals(signum).name} received: saving a "
            "checkpoint after the current step, then stopping; rerun with --resume to continue")


def status(e: BaseException, command: str, job: bool = False) -> int | None:
    """Print the one line `command` ends with on `e` and return its exit status: a stop 128+N
    (Ctrl-C 130), an error of the user's (a config reader's ValueError, a `CgptError`, a file
    that cannot be used) 2. At the process's edge a closed stdout (`cgpt list | head`) is no
    error: 0. None for anything else (SystemExit, a bug), which the caller decides on.
    `job`: a sweep worker's job, whose output is its train.log: a broken pipe is an error."""
    if GUARD.pending and isinstance(e, (ValueError, CgptError, OSError)):
        # stopped while failing (the signal came inside an import, the error before it was
        # acted on): the stop was asked first, and it ends the command, with its one line
        GUARD.say(stop_line(GUARD.pending, command))
        return 128 + GUARD.pending
    if isinstance(e, (Preempted, Stopped)):  # checkpointed and stopped, or before the loop
        GUARD.say(f"cgpt {command}: {e}")  # not again if said when the signal arrived
        return e.exit_code
    if isinstance(e, (ValueError, CgptError)):
        print(f"cgpt {command}: error: {e}", file=sys.stderr)
        return 2
    if isinstance(e, KeyboardInterrupt):
        GUARD.say(stop_line(signal.SIGINT, command))
        return 130
    if isinstance(e, BrokenPipeError) and not job:  # the reader stopped; nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush
        return 0
    if isinstance(e, OSError):  # a file or directory that cannot be used: name it
        what = f"{e.filename}: " if e.filename else ""
        print(f"cgpt {command}: error: {what}{e.strerror or e}; fix or remove it and rerun",
              file=sys.stderr)
        return 2
    return None


def edge(command: str, fn: Callable[[], int], job: bool = False) -> int:
    """`fn()`'s exit status, a stop or an error ended by `status`. Anything else is re-raised
    (a bug shows its traceback), except in a sweep worker's `job`: there one job's crash fails
    that job (its traceback, status 1) and the worker goes on to the next."""
    GUARD.fresh()
    with GUARD.job() if job else contextlib.nullcontext():
        try:
            return fn()
        except BaseException as e:  # noqa: BLE001 - `status` picks what it ends
            code = status(e, command, job)
            if code is not None:
                return code
            if not job or not isinstance(e, Exception):
                raise
            traceback.print_exc()
            return 1


class StopGuard:
    """The process's stop state, behind its handlers for Ctrl-C and the scheduler's signals.

    `install` (the process entry, before the commands load) or `defer` (a caller of
    `cgpt.cli.main` in process) puts the handlers in place; `arm` lets them raise once a
    caller of ours is on the stack; a run's `CheckpointTriggers` take the scheduler's signals
    over with `hand_over`; `finish` ends the process."""

    def __init__(self) -> None:
        self.command = ""  # the process's `cgpt` command (its entry set it), for the lines
        self.kind = "train"  # the command whose handlers are installed (`defer`)
        self.installed = False
        self.armed = True  # the handler may raise: a caller of ours catches it
        self.stopping = 0  # the signal being acted on: a repeat must not interrupt the cleanup
        self.loop_started = False  # a run's loop took the scheduler's signals over
        self.handler = self._early  # one bound method: the watchdog compares handlers with it
        self._said: dict[str, object] = {}  # the stop lines printed (`say`)
        self._shield = 0  # inside `shielded` code: a stop is raised when it ends
        self._held = 0  # the signal a shielded stretch holds back
        self._deadline: float | None = None  # the end of a stop's cleanup (`_cleanup_deadline`)
        self.pending = 0  # a signal that arrived inside an import, to be acted on after it
        self.quiet = False  # a sweep's worker outside its jobs: the sweep says the stop's line

    def _early(self, signum, frame) -> None:
        """Ctrl-C anywhere, and a scheduler's signal before the loop: stop with one line. Acted
        on once: a repeat (the executor re-sends SIGUSR1 every second) must not break the
        cleanup."""
        if self.stopping or (signum != signal.SIGINT and self.loop_started):
            if signum == signal.SIGINT and self.stopping > 0:  # Ctrl-C again: the user waits
                self._hurry()
            return  # after the loop the run is finishing its summary: let it finish
        if self.armed and _importing(frame):  # raised inside an import, an extension module's
            self.pending = signum  # init can crash (jaxlib: a segfault): act once it is done
            self._trip_later(signum)
            return
        self.stopping = signum
        if not self.armed:  # no caller of ours on the stack yet (Python's module loading)
            _exit_now(stop_line(signum, self.command or self.kind), 128 + signum)
        self._cleanup_deadline(signum)
        if self._shield:  # raised when the shielded stretch ends, not inside a library's lock
            self._held = signum
            return
        raise self._stop(signum)

    def _stop(self, signum: int) -> BaseException:
        if signum == signal.SIGINT:
            return KeyboardInterrupt()
        return NotStarted(signum) if self.kind == "train" else Stopped(signum, self.kind)

    @contextlib.contextmanager
    def shielded(self) -> Iterator[None]:
        """Code an interrupt must not break: a library call that holds a lock or a queue's
        count while it runs (tensorboardX's writer: interrupted inside, its queue stays locked
        and its close waits forever). A stop that arrives inside is raised when it ends."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._shield += 1
        try:
            yield
        finally:
            self._shield -= 1
            if not self._shield and self._held:
                signum, self._held = self._held, 0
                raise self._stop(signum)

    def _cleanup_deadline(self, signum: int) -> None:
        """A stop began: the process entry's watchdog ends the process with the stop's line
        if its cleanup (closing the logs, a checkpoint save in flight) is not over within
        `CLEANUP_S`, or within `GRACE_S` of a repeated Ctrl-C: a library that waits forever
        (a writer thread that never ends) cannot keep a stopped command alive. Only under
        `install`: a library or test calling `cgpt.cli.main` in process keeps its process."""
        if not self.installed or self._deadline is not None:
            return
        self._deadline = time.monotonic() + CLEANUP_S

        def watch() -> None:
            while True:
                end = self._deadline  # None: the command ended well after all
                if end is None:
                    return
                if time.monotonic() >= end:
                    _exit_now(stop_line(signum, self.command or self.kind), 128 + signum)
                time.sleep(0.05)

        threading.Thread(target=watch, name="cgpt-stop-deadline", daemon=True).start()

    def _hurry(self) -> None:
        if self._deadline is not None:
            self._deadline = min(self._deadline, time.monotonic() + GRACE_S)

    def say(self, line: str, now: bool = False) -> None:
        """Print a stop's `line` on stderr once per process: the watchdog says it when the
        signal arrives (`now`: os.write on fd 2 at once, no Python lock: the main thread may
        hold one), and the edge (`status`) does not repeat it. dict.setdefault is atomic: of
        two threads saying it at once, one does. A quiet process (a sweep's worker outside
        its jobs) says nothing: its sweep says the line."""
        if self.quiet:
            return
        token = object()
        if self._said.setdefault(line, token) is not token:
            return
        if not now:
            print(line, file=sys.stderr, flush=True)
            return
        try:
            os.write(2, (line + "\n").encode())
        except OSError:
            pass

    def fresh(self) -> None:
        """A command starts in this process (a caller of `cgpt.cli.main`, a sweep worker's
        job): its stop lines are said again. The process entry runs one command, and its
        watchdog may have said a line already: kept."""
        if not self.installed:
            self._said.clear()

    def defer(self, command: str = "train") -> dict:
        """Stop with one line, not a traceback or the default action's silent death, on Ctrl-C
        or a scheduler's signal that arrives before the training loop (while JAX starts, the
        data is prepared, the step compiles): nothing is trained yet, so there is nothing to
        checkpoint. A launch stopped before its config is written leaves nothing behind
        (`cgpt.train.launch.Launch`). The exceptions raised (`KeyboardInterrupt`,
        `NotStarted`) are BaseExceptions, so no library's `except Exception` swallows them.
        `command` picks the signals: `STOPS`, else SIGINT only. Returns the handlers replaced
        (`restore`)."""
        self.loop_started, self.stopping, self.kind, self.armed = False, 0, command, True
        self.fresh()
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {s: signal.signal(s, self.handler) for s in STOPS.get(command, (signal.SIGINT,))}

    def restore(self, old: dict) -> None:
        """Put back the handlers `defer` replaced (a caller that is not the process's end)."""
        for s, h in old.items():
            signal.signal(s, h)

    def install(self, command: str, quiet: bool = False) -> None:
        """The process entry's guard (`cgpt.cli.entry`, before the commands are imported): the
        handlers of `defer`, plus two things that make every stop one line with exit 128+N:

        * an exception the handler raised inside a callback that cannot raise (a gc callback
          such as JAX's, a `__del__`) is reported by Python as "Exception ignored" and dropped,
          and the run went on: `sys.unraisablehook` delivers the signal again, outside it;
        * the main thread acts on a signal only between bytecodes, never inside a long XLA
          compile or device wait: a watchdog thread (woken through `signal.set_wakeup_fd`)
          ends the process with the line if the main thread has not acted within `GRACE_S`
          (what is left then is what a SIGKILL leaves, which runs and stores survive).
          The same thread says a scheduler's signal the moment it arrives (`say`, `_watch`),
          before any slow work: a SIGKILL that follows leaves that line.

        `quiet`: a sweep's worker (`cgpt.sweep.executors`' launcher), which the sweep stops
        and speaks for: outside a job (`job`) a stop ends it at once, saying nothing."""
        if self.installed:
            return
        self.installed, self.command, self.quiet = True, command, quiet
        self.defer(command)
        self.armed = False  # until `arm()`: the package and __main__ load, nothing catches
        prior_hook = sys.unraisablehook

        def unraisable(u) -> None:
            e = u.exc_value
            if self.stopping and isinstance(e, (KeyboardInterrupt, Stopped)):
                self._trip_later(getattr(e, "signum", signal.SIGINT), acted=True)
            else:
                prior_hook(u)

        sys.unraisablehook = unraisable
        try:
            r, w = os.pipe()
            os.set_blocking(w, False)
            signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (OSError, ValueError):  # no pipe, or not the main thread: the handlers alone
            return
        threading.Thread(target=self._watch, args=(r,), name="cgpt-signal-watchdog",
                         daemon=True).start()

    @contextlib.contextmanager
    def job(self) -> Iterator[None]:
        """One job of a sweep's worker (`edge`): its stops raise, so the job ends as `cgpt
        train` would, its line in its own train.log; between jobs the quiet worker ends at
        once (nothing of a run is open) and the sweep says the line."""
        prior = self.armed, self.quiet
        self.armed, self.quiet, self.loop_started = True, False, False
        self._said.clear()  # each job's log says its own lines
        try:
            yield
        finally:
            self.armed, self.quiet = prior
            self.loop_started = False  # the scheduler's signals are the guard's again

    def arm(self) -> None:
        """From here on the handler raises (the caller catches `KeyboardInterrupt` and
        `Stopped`); before, a signal ends the process at once with the line: nothing is
        written yet."""
        self.armed = True

    def hand_over(self, handler: Callable) -> dict:
        """A run's loop answers the scheduler's signals itself from here on
        (`cgpt.train.preempt.CheckpointTriggers`: checkpoint, then stop): `handler` for
        `SIGNALS`, the handlers replaced returned (`restore`). A late signal (after the loop,
        while the summary is written) no longer stops the command."""
        self.loop_started = True
        if threading.current_thread() is not threading.main_thread():  # the main thread's only
            return {}
        return {s: signal.signal(s, handler) for s in SIGNALS}

    def _trip_later(self, signum: int, acted: bool = False) -> None:
        """Trip `signum` again from another thread in a moment: the handler then runs at the
        main thread's next bytecode, out of the import or callback it was in (`acted`: after a
        stop that a callback dropped; the watchdog still ends a main thread that never gets
        there)."""
        def again() -> None:
            time.sleep(0.05)
            if acted and self.stopping != signum:  # finished meanwhile
                return
            if acted:
                self.stopping = 0
            _thread.interrupt_main(signum)

        threading.Thread(target=again, name="cgpt-signal-again", daemon=True).start()

    def _watch(self, fd: int) -> None:
        while True:
            try:
                got = os.read(fd, 64)
            except OSError:
                return
            for signum in got:
                handler = signal.getsignal(signum)
                if signum in SIGNALS and self.loop_started:
                    if callable(handler) and handler is not self.handler:  # the loop's: it
                        self.say(received_line(signum, self.command), now=True)  # saves first
                    continue  # after the loop (its summary) `_early` ignores it
                if handler is not self.handler:
                    continue
                if signum in SIGNALS and not self.stopping:  # `_early` stops with this line
                    self.say(stop_line(signum, self.command), now=True)
                deadline = time.monotonic() + GRACE_S
                while not self.stopping and time.monotonic() < deadline:
                    time.sleep(0.02)
                if not self.stopping:  # the main thread is stuck in C: end it here
                    _exit_now(stop_line(signum, self.command), 128 + signum)

    def finish(self, code: int) -> NoReturn:
        """End the process with `code`. Signals from here on change nothing (the command has
        finished, or stopped and said so). After a stop or an error the end is `os._exit`:
        the interpreter's finalization, with XLA's compile threads or an interrupted library
        still around, can crash (a segfault after an interrupted compile), and every file the
        command writes is closed by then; a success ends normally (JAX's multi-process exit
        barrier)."""
        self.stopping = self.stopping or -1  # from here on `_early` and the watchdog do nothing
        if not code:
            self._deadline = None  # a success after all: its exit barrier may take its time
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


GUARD = StopGuard()  # the process's: its signal handlers are the process's


def ignore_stops() -> None:
    """A helper process that its command ends (`cgpt data prepare`'s pool workers): a
    terminal's Ctrl-C or a job's SIGTERM reaches the whole process group, and the command
    stops with its one line and ends its helpers itself."""
    for s in (signal.SIGINT, *SIGNALS):
        signal.signal(s, signal.SIG_IGN)


def ignore_checkpoint_requests() -> None:
    """The first statement of a sweep's training process (the launcher in
    `cgpt.sweep.executors`): SIGUSR1/2, which a SLURM job's executor sends to ask for a
    checkpoint, are ignored until the process's guard is installed (an exec keeps an ignored
    signal ignored): an early one must not kill it."""
    for s in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, signal.SIG_IGN)


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _exit_now(line: str, code: int) -> None:
    try:
        GUARD.say(line, now=True)  # unless said when the signal arrived
    finally:
        os._exit(code)
