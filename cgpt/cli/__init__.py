"""`cgpt`'s edge: the process entry (`entry`, which the `cgpt` script, `python -m cgpt` and
`python -m cgpt.sweep` run) and `main`, the one place a stop or an error becomes one line and
an exit status (`cgpt.stop.status`). Light on purpose: the stop guard is in place before the
commands (`cgpt.cli.commands`, with what they import) load, so that a stop during those
imports is one line too (`StopGuard.pending`); `import cgpt` installs nothing."""
from __future__ import annotations

import os
import sys
import traceback
from typing import NoReturn

from cgpt import stop


def entry(argv: list[str] | None = None) -> NoReturn:
    """The process's entry: the signal guard from here on (`StopGuard.install`), `main`, then
    an end that no late signal or interpreter finalization turns into a traceback or a crash
    (`StopGuard.finish`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    stop.GUARD.install(command)
    if command == "train":  # before JAX starts a thread: the steps' buffers stay mapped
        _keep_host_memory()
    stop.GUARD.finish(main(argv))


def _keep_host_memory() -> None:
    """glibc keeps a CPU training process's freed memory (`cgpt.config.backend`). At the
    process's start, not in `main`: a library or test calling main keeps its own."""
    from cgpt.config import backend  # under the guard (`entry`)
    from cgpt.sharding.allocation import gpus_present  # under the guard (`entry`)

    if backend.launch_platform(os.environ, gpus_present()) == "cpu":
        backend.keep_host_memory()


def main(argv: list[str] | None = None) -> int:
    """The command line's edge (`entry` runs it; a test or library may call it): a stop or an
    error becomes one line and an exit status (`cgpt.stop.status`). Ctrl-C anywhere, a
    scheduler's signal before the loop: one line, not a traceback or a silent death. In a
    multi-process job a failed process leaves with the others, a bug's traceback printed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    old: dict = {}
    try:
        try:
            old = stop.GUARD.defer(command)
            from cgpt.cli import commands  # under the guard: a stop while it loads is one line

            code = commands.run(argv)
        except BaseException as e:  # noqa: BLE001 - `status` picks what it ends
            code = stop.status(e, command)
            if code is None:  # SystemExit (argparse, --help), a bug: as Python would end
                if _job() is None:
                    raise
                if isinstance(e, SystemExit):
                    code = e.code if isinstance(e.code, int) else 1
                else:
                    traceback.print_exc()  # unexpected: the traceback, then leave with the rest
                    code = 1
        if code and _job() is not None:
            from cgpt.sharding import distributed  # imports JAX: only once a job was joined

            distributed.leave(code)  # no JAX exit barrier on the error path (see there)
        return code
    finally:
        stop.GUARD.restore(old)


def _job() -> tuple[int, int] | None:
    """The multi-process job this process joined, if any (JAX started: never starts it)."""
    if "jax" not in sys.modules:
        return None
    from cgpt.sharding import distributed  # JAX is imported already: nothing to start

    return distributed.joined()
