"""Keeping Orbax's and TensorStore's aftermath of a failed save or restore off the terminal.

A run that fails to write (disk full, quota, read-only) or to read a checkpoint ends with one
error line naming the path (`cgpt.train.checkpoint`, `cgpt.model.orbax_format`); what Orbax's
threads, TensorStore's late callbacks and asyncio would print after it carries no new facts.
These hooks hold such output back during the call and drop only that kind of output after a
failure.
"""
from __future__ import annotations

import logging
import sys

from cgpt.fileio import storage_oserror


class HoldErrors(logging.Filter):
    """Holds back error records (Orbax logs a traceback per failed writer thread) until
    `release()` re-emits them; records of a failure that is raised anyway are dropped."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            self.records.append(record)
            return False
        return True

    def release(self) -> None:
        records, self.records = self.records, []
        for r in records:
            logging.getLogger(r.name).handle(r)


class _DropStorageAftermath(logging.Filter):
    """Drops the log records of a save the storage refused: Orbax's writer threads log their
    tracebacks as they end (`absl`), and asyncio logs the unretrieved ENOSPC futures of
    TensorStore's pending writes when they are garbage-collected (often at exit)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "absl":
            return not (record.levelno >= logging.ERROR and "orbax" in record.pathname)
        exc = record.exc_info[1] if record.exc_info else None
        text = record.getMessage()
        return not ("never retrieved" in text and (
            (exc is not None and storage_oserror(exc) is not None)
            or storage_oserror(RuntimeError(text)) is not None))


def closed_loop(u) -> bool:
    return isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed"


def orbax_write(u) -> bool:
    """An Orbax write coroutine finalized unfinished (at interpreter exit, after a failed save)."""
    code = getattr(u.object, "cr_code", None)
    return code is not None and "orbax" in code.co_filename


def mute_storage_aftermath(hook) -> None:
    """After a save the storage refused, silence its aftermath for the rest of the process.

    The run is ending with one error line; what would follow it is noise with no new facts:
    Orbax's threads log a traceback each as they end, TensorStore's C++ threads deliver the
    remaining writes' results into the event loop Orbax already closed (each an unraisable
    "Event loop is closed" traceback), asyncio logs their unretrieved ENOSPC futures, and the
    write coroutines still pending are finalized at exit (each an unraisable ImportError).
    All arrive asynchronously, up to interpreter exit, so the hooks stay for the process's
    life; they drop nothing else. `hook`: the unraisable hook to pass everything else to."""
    if getattr(hook, "_cgpt_storage", False):
        sys.unraisablehook = hook
    else:
        def quiet(u):
            if not (closed_loop(u) or orbax_write(u)):
                hook(u)
        quiet._cgpt_storage = True
        sys.unraisablehook = quiet
    for name in ("absl", "asyncio"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropStorageAftermath) for f in log.filters):
            log.addFilter(_DropStorageAftermath())


class _DropUnretrieved(logging.Filter):
    """After a failed restore: asyncio's "exception was never retrieved" records of its reads
    (cgpt itself runs no event loop, so there are no others)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "never retrieved" not in record.getMessage()


def quiet_restore(restore):
    """restore(), with the aftermath of a failure kept off the terminal: TensorStore delivers
    late reads into the event loop Orbax closed (unraisable "Event loop is closed" errors) and
    Orbax's threads log their tracebacks, during the call and after it. The caller reports the
    failure in one line; on success anything held back is passed on."""
    held, absl = HoldErrors(), logging.getLogger("absl")
    absl.addFilter(held)
    unraisable, prev_hook = [], sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(u) if (
        closed_loop(u) or orbax_write(u)) else prev_hook(u)
    try:
        out = restore()
    except BaseException:
        mute_storage_aftermath(prev_hook)
        absl.removeFilter(held)
        aio = logging.getLogger("asyncio")  # the failed reads' futures, logged when collected
        if not any(isinstance(f, _DropUnretrieved) for f in aio.filters):
            aio.addFilter(_DropUnretrieved())
        raise
    sys.unraisablehook = prev_hook
    absl.removeFilter(held)
    held.release()
    for u in unraisable:
        prev_hook(u)
    return out
