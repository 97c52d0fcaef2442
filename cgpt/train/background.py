"""One call at a time in a background thread, its result or error collected by the caller.

Used where host work overlaps training: the sweep worker's compile-ahead of the next job
(`cgpt.train.warm.Ahead`) and a fused job's start beside its step's compile
(`fused_prep.Prepare`); never checkpoint saves, which are Orbax's asynchronous ones. A daemon
thread, so a stuck call never keeps the process alive; an exception is kept and
re-raised in the caller's thread by `wait()`, where the caller decides what it means.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable


class Background:
    """`start(fn)` waits for the previous call, then runs `fn()` in a daemon thread;
    `wait()` joins it and returns `fn`'s result (None when nothing ran), or re-raises its
    exception (`outcome()` returns it instead). `seconds`: how long the last call ran."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seconds = 0.0
        self._thread: threading.Thread | None = None
        self._result: Any = None
        self._error: BaseException | None = None

    def start(self, fn: Callable[[], Any]) -> None:
        self.wait()  # the previous call's error is raised here, before the next call starts

        def body() -> None:
            t0 = time.perf_counter()
            try:
                self._result = fn()
            except BaseException as e:  # noqa: BLE001 - re-raised by wait(), in the caller
                self._error = e
            self.seconds = time.perf_counter() - t0

        self._result, self._error = None, None
        self._thread = threading.Thread(target=body, name=self.name, daemon=True)
        self._thread.start()

    def outcome(self) -> tuple[Any, BaseException | None]:
        """Join the running call: (its result, None), or (None, the exception it raised)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        got = (self._result, self._error)
        self._result, self._error = None, None
        return got

    def wait(self) -> Any:
        result, error = self.outcome()
        if error is not None:
            raise error
        return result
