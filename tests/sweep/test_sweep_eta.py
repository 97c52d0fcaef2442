"""A sweep's bar gives the time left from the cost model (the dry run's estimate of each run),
scaled by the finished runs' measured over estimated seconds, not from the mean seconds per
run so far: the largest runs go first, so that mean overstates the rest."""
from pathlib import Path

from cgpt.sweep.launcher import Remaining


def test_time_left_is_the_cost_model_scaled_by_the_measured_runs():
    left = Remaining({"big": 100.0, "small1": 10.0, "small2": 10.0}, workers=2)
    assert left.seconds() == 60.0 and left.text() == "~60s left (cost model)"
    left.finished("big", 200.0)  # twice the estimate: the rest likely so too
    assert left.seconds() == 20.0 and "cost model x 2.00 measured" in left.text()
    left.finished("small1", None)  # failed before it could be timed: no longer left
    left.finished("small1", 5.0)  # reported twice: counted once
    assert left.seconds() == 10.0


def test_the_bar_ticks_between_runs(monkeypatch, capsys):
    """The bar redraws only when a run ends; its clock ticks between (a demo's first runs take
    ~40 s, which was 40 s of a still terminal), and stops when the bar closes."""
    import time
    from types import SimpleNamespace

    from cgpt.train import notice

    from cgpt.sweep import launcher as launch

    monkeypatch.setattr(notice, "TICK_S", 0.05)
    sweep = SimpleNamespace(name="s", runs=[])
    bar = launch.Progress(sweep, Path("."), (2, 0), Remaining({"a": 1.0, "b": 1.0}, 1), True)
    refreshed = []
    monkeypatch.setattr(bar.bar, "refresh", lambda *a, **k: refreshed.append(1))
    time.sleep(0.5)
    assert len(refreshed) >= 3  # no run ended, the clock moved
    monkeypatch.setattr(launch, "write_results", lambda *a: None)
    bar.close()
    time.sleep(0.2)
    n = len(refreshed)
    time.sleep(0.3)
    assert len(refreshed) == n  # closed: no more redraws


def test_an_interrupted_run_stays_left_and_unmeasured(monkeypatch):
    """A run stopped by Ctrl-C is still to do: the time left keeps it, and its few seconds
    are not taken as its measured time (which read "~9s left" with 6 runs to do)."""
    from types import SimpleNamespace

    from cgpt.sweep import launcher as launch
    monkeypatch.setattr(launch, "write_results", lambda *a: None)
    left = Remaining({"a": 100.0, "b": 100.0}, 1)
    bar = launch.Progress(SimpleNamespace(name="s", runs=[]), Path("."), (2, 0), left, False)
    bar.finished({"run_id": "a", "status": "interrupted", "seconds": 3.0})
    assert left.todo == {"a", "b"} and left.expected == 0 and left.seconds() == 200.0
    bar.finished({"run_id": "b", "status": "failed", "seconds": 2.0, "error": "x"})
    assert left.todo == {"a"} and left.expected == 0  # a failure is not a measurement
    bar.close()
