"""`--parallel K` locally: how the jobs are dealt to the K pinned workers (`split_slots`)."""
from cgpt.sweep.executors import Job
from cgpt.sweep.worker import split_slots


def _job(rid: str, parent: str = "") -> Job:
    return Job(rid, f"/runs/{rid}", False, branch_from=parent and f"/runs/{parent}@10")


def test_longest_first_each_to_the_least_loaded_worker():
    secs = {"a": 100.0, "b": 60.0, "c": 50.0, "d": 20.0, "e": 10.0}
    shares = split_slots([_job(k) for k in "edcba"], secs, 2)
    assert [[j.run_id for j in s] for s in shares] == [["a", "d"], ["b", "c", "e"]]
    assert split_slots([_job("a")], secs, 3)[1:] == [[], []]  # fewer jobs than workers


def test_every_parent_trains_before_any_branch_in_a_worker():
    """A branch waits for its parent's checkpoint: queued ahead of a parent in one worker, it
    could wait forever on a parent queued behind it in another."""
    jobs = [_job("p1"), _job("p2"), _job("b1", "p2"), _job("b2", "p1")]
    secs = {"b1": 90.0, "b2": 80.0, "p1": 10.0, "p2": 5.0}
    for share in split_slots(jobs, secs, 2):
        kinds = [bool(j.branch_from) for j in share]
        assert kinds == sorted(kinds), [j.run_id for j in share]


def test_the_sweep_prepares_the_data_before_its_workers_load_it(tmp_path, monkeypatch):
    """prepare_ahead returns once it holds the data's preparer lock: a worker's load then waits
    for the store the sweep prepares instead of preparing it on its one core. A bad source is
    left to the runs (each fails with its own error)."""
    import threading

    from cgpt.data import batches
    from cgpt.sweep import load_sweep
    from cgpt.sweep.launcher import prepare_ahead
    from tests.sweep_helpers import make_spec

    who, real = [], batches.prepare

    def prepare(*a, **k):
        who.append(threading.current_thread().name)
        return real(*a, **k)

    monkeypatch.setattr(batches, "prepare", prepare)
    runs = load_sweep(make_spec(tmp_path, "p", {"model": ["tiny-17k"]})).runs
    prepare_ahead(runs)
    data = batches.load_data(runs[0].config.data)  # waits for the sweep's thread, then reuses
    assert who == ["cgpt-prepare-data"]
    assert len(list((tmp_path / "cache" / "tokens").iterdir())) == 1
    assert data.num_val_sequences == 4

    bad = load_sweep(make_spec(tmp_path / "b", "b", {"model": ["tiny-17k"]},
                               base={"data": {"source": str(tmp_path / "none")}})).runs
    prepare_ahead(bad)  # returns; nothing raised here


def test_a_cpu_worker_keeps_its_freed_memory(monkeypatch):
    """The sweep's workers train in-process, not through `cgpt train`: glibc's options reach
    them through the environment (`backend.host_memory_env`), on a CPU only."""
    import io

    from cgpt.sweep import worker

    seen = []

    class Proc:
        def __init__(self, argv, **kw):
            seen.append(kw["env"])
            self.stdin = io.BytesIO()

    monkeypatch.setattr(worker.subprocess, "Popen", Proc)
    monkeypatch.delenv("MALLOC_MMAP_MAX_", raising=False)
    monkeypatch.delenv("CGPT_CPU_MALLOC", raising=False)
    for platform in ("cpu", "cuda"):
        monkeypatch.setenv("JAX_PLATFORMS", platform)
        worker._spawn([_job("a")], None, report=True)
    assert seen[0]["MALLOC_MMAP_MAX_"] == "0" and "MALLOC_MMAP_MAX_" not in seen[1]
