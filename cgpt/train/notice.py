"""What a run's start-up says while it waits. A line for a wait that turns out long
(compiling candidate steps, preparing data): printed once the wait passes `after` seconds and
again every `every` seconds while it lasts, never for one that ends sooner, so that a start-up
served from the compilation cache stays as quiet as before while a cold one says what it waits
for instead of printing nothing for minutes; and the fit's candidates with their results."""
from __future__ import annotations

import sys
import threading
import time

from tqdm.auto import tqdm

from cgpt.config.units import fmt_bytes

AFTER_S = 5.0  # a wait longer than this is announced (with the imports before it: ~10 s)
EVERY_S = 20.0  # and said again this often while it lasts
TICK_S = 5.0  # a bar's clock: seconds between redraws while nothing updates it


class BarClock:
    """Redraws a tqdm bar every TICK_S seconds until `stop()` (or the end of a `with`), so its
    elapsed time moves while one item takes long (a sweep's run, a compile) and the terminal
    shows the work going on. A disabled or closed bar is left alone."""

    def __init__(self, bar: tqdm):
        self.bar, self._stop = bar, threading.Event()
        if not bar.disable:
            threading.Thread(target=self._tick, name="bar-clock", daemon=True).start()

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S) and not self.bar.disable:  # closed: disabled
            self.bar.refresh()

    def stop(self) -> None:
        self._stop.set()

    def __enter__(self) -> "BarClock":
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False


class Notice:
    """`with Notice("tiny-240k: compiling ..."):` prints the line (with the seconds waited so
    far) if the block is still running after `after` seconds, then every `every` seconds;
    `enabled` False: never."""

    def __init__(self, line: str, after: float = AFTER_S, every: float = EVERY_S,
                 enabled: bool = True):
        self.line, self.after, self.every, self.enabled = line, after, every, enabled
        self.said = 0  # lines printed
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._t0 = 0.0

    def _schedule(self, delay: float) -> None:
        self._timer = threading.Timer(delay, self._say)
        self._timer.daemon = True  # never keeps a stopping process alive
        self._timer.start()

    def _say(self) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self.said += 1
            # through tqdm: a data-preparation bar on screen is cleared and redrawn, not cut
            tqdm.write(f"{self.line} ({time.perf_counter() - self._t0:.0f} s so far)",
                       file=sys.stderr)
            self._schedule(self.every)

    def __enter__(self) -> "Notice":
        self._t0 = time.perf_counter()
        if self.enabled:
            self._schedule(self.after)
        return self

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self._t0

    def __exit__(self, *exc) -> bool:
        with self._lock:
            self._done.set()
            if self._timer is not None:
                self._timer.cancel()
        return False


def candidates(name: str, choice) -> str:
    """The fit's compiled candidates and whether each fits (`cgpt.train.fit.Choice.tried`, in
    compile order): the results behind the one line that names the chosen step."""
    return f"{name}: candidates (micro-batch/remat: bytes per device) " + ", ".join(
        f"{c.micro_batch}/{c.remat}: {fmt_bytes(c.bytes['total'])} "
        + ("fits" if c.bytes["total"] <= choice.usable else "too big") for c in choice.tried)
