"""Multi-controller runs with real processes: 2 JAX processes x 4 emulated CPU devices.

Each launch starts `python -m cgpt train` twice on localhost (JAX_COORDINATOR_ADDRESS on a
free port, gloo collectives) and compares with the same run in one process on 8 devices
(this test process, `conftest.py`). Kept small: tiny-17k, 10 steps of 8 x 16 tokens. Adam's
eps is raised to 1e-3 (as in test_sharding.py) so that rounding differences between the
two reduction orders (gloo across processes vs XLA within one) in a near-zero gradient do not
become lr-sized sign flips. Only data_parallel runs in the default suite; the other modes and
the whole-job kill are `slow`.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cgpt.sharding import distributed
from cgpt.config.model import get_config
from cgpt.config.data import DataConfig
from cgpt.config.run import RunConfig, TrainConfig
from cgpt.train.loop import train

REPO = Path(__file__).resolve().parents[2]
STEPS, BATCH, SEQ = 10, 8, 16
PEER_TIMEOUT = 10  # seconds; the survivors must be gone well within PEER_TIMEOUT + GRACE
GRACE = 60
MESHES = {"data_parallel": "data=8", "weight_streaming": "data=2,fsdp=4",
          "layer_pipelined": "stage=2,data=4"}
MODES = [pytest.param("data_parallel"),
         pytest.param("weight_streaming", marks=pytest.mark.slow),
         pytest.param("layer_pipelined", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """A persistent compilation cache shared by the launches (saves recompiling per launch)."""
    return tmp_path_factory.mktemp("jax_cache")


def _run(corpus, cache: Path, mode: str) -> RunConfig:
    return RunConfig(
        preset="tiny-17k", model=get_config("tiny-17k"),
        data=DataConfig(source=str(corpus), vocab_size=512, seq_len=SEQ, val_sequences=16,
                        cache_dir=str(cache)),
        train=TrainConfig(tokens=STEPS * BATCH * SEQ, batch_size=BATCH, log_every=1,
                          eval_every=10, ckpt_every=5, keep_checkpoints=5, peak_lr=3e-3,
                          adam_eps=1e-3, mode=mode, mesh=MESHES[mode]))


def _flags(corpus, cache: Path, out: Path, mode: str) -> list[str]:
    return ["--model", "tiny-17k", "--data", str(corpus), "--out", str(out), "--no-progress",
            f"--tokens={STEPS * BATCH * SEQ}", "--mode", mode, "--mesh", MESHES[mode],
            "--peer-timeout", str(PEER_TIMEOUT), f"train.batch_size={BATCH}",
            "train.log_every=1", "train.eval_every=10", "train.ckpt_every=5",
            "train.keep_checkpoints=5", "train.peak_lr=3e-3", "train.adam_eps=1e-3",
            "data.vocab_size=512", f"data.seq_len={SEQ}", "data.val_sequences=16",
            f"data.cache_dir={cache}"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """`python -m cgpt train FLAGS` as 2 processes of one JAX job on localhost."""

    def __init__(self, flags: list[str], logs: Path, jax_cache: Path, n: int = 2,
                 extra_env: dict[int, dict] | None = None):
        port = _free_port()
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)
        self.procs = []
        for i in range(n):
            env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu",
                   "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": str(n),
                   "JAX_PROCESS_ID": str(i), "JAX_COMPILATION_CACHE_DIR": str(jax_cache),
                   "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                   **(extra_env or {}).get(i, {})}
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "cgpt", "train", *flags], cwd=REPO, env=env,
                stdout=open(logs / f"{i}.out", "w"), stderr=open(logs / f"{i}.err", "w")))

    def wait(self, timeout: float = 600) -> list[int]:
        deadline = time.time() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(1.0, deadline - time.time())))
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"job did not end within {timeout} s:\n{self.output()}")
        return codes

    def kill(self, which=None) -> None:
        for i, p in enumerate(self.procs):
            if which is None or i == which:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                    p.wait()

    def err(self, i: int) -> str:
        return (self.logs / f"{i}.err").read_text()

    def out(self, i: int) -> str:
        return (self.logs / f"{i}.out").read_text()

    def output(self) -> str:
        return "\n".join(f"--- process {i} stderr:\n{self.err(i)[-3000:]}"
                         for i in range(len(self.procs)))


def _log(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _wait_past_checkpoint(job: Job, out: Path, timeout: float = 600) -> list[dict]:
    """Wait until a step 2-3 past a checkpoint (every 5 steps) is logged; return the log."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(p.poll() is not None for p in job.procs):
            pytest.fail(f"a process ended before it could be killed:\n{job.output()}")
        try:
            log = _log(out)
        except (OSError, json.JSONDecodeError):  # not there yet, or a line half-written
            log = []
        # ... and that checkpoint committed: saves are asynchronous (cgpt.train.checkpoint)
        if (log and 5 < log[-1]["step"] < STEPS and log[-1]["step"] % 5 in (2, 3)
                and (out / "checkpoints" / str(log[-1]["step"] // 5 * 5)).is_dir()):
            return log
        time.sleep(0.02)
    job.kill()
    pytest.fail(f"no step past a checkpoint within {timeout} s:\n{job.output()}")


def _check_resumed(out: Path, before: list[dict], reference: dict[tuple, float]) -> None:
    after = _log(out)
    steps = [r["step"] for r in after]
    assert steps == list(range(1, STEPS + 1)), steps  # every logged step exactly once
    def same(r: dict) -> dict:  # everything but the timings
        return {k: v for k, v in r.items() if k not in ("tokens_per_s", "mfu")}

    got = {r["step"]: same(r) for r in after}
    # the steps recomputed after the restore are bit-identical to the ones logged before
    summary = json.loads((out / "summary.json").read_text())
    redone = [r for r in before if r["step"] > summary["resumed_from_step"]]
    assert summary["resumed_from_step"] >= 5 and redone
    # the job's layout as launched: one host, 2 processes of 4 devices (cgpt.sharding.allocation)
    assert {k: summary["placement"][k] for k in ("nodes", "processes", "devices_per_process",
                                                 "devices_total")} == {
        "nodes": 1, "processes": 2, "devices_per_process": 4, "devices_total": 8}
    assert all(got[r["step"]] == same(r) for r in redone), (redone, got)
    # ... and the whole series (train and validation losses) equals the 1-process, 8-device run
    vals = {(r["step"], k): r[k] for r in after for k in ("loss", "val_loss") if k in r}
    assert vals.keys() == reference.keys() and (STEPS, "val_loss") in vals
    diffs = {k: abs(vals[k] - reference[k]) for k in reference}
    assert max(diffs.values()) <= 1e-6, diffs


def _reference(corpus, tmp_path, mode) -> dict[tuple, float]:
    """{(step, "loss" | "val_loss"): value} of the run in this one process on 8 devices."""
    ref = tmp_path / "ref"
    train(_run(corpus, tmp_path / "ref_cache", mode), ref, progress=False)
    return {(r["step"], k): r[k] for r in _log(ref) for k in ("loss", "val_loss") if k in r}


# ---- pieces that need no second process ----------------------------------------------------
class _FakeSharding:
    """Stands in for a sharding whose process holds `slices` of the rows axis."""

    def __init__(self, slices, ndim):
        self.slices, self.ndim = slices, ndim

    def addressable_devices_indices_map(self, shape):
        pre = (slice(None),) * (self.ndim - 2)
        return {d: pre + (slice(a, b), slice(None)) for d, (a, b) in enumerate(self.slices)}


def test_process_rows_select_this_process_share():
    # rows 8..12 and 24..28 of a 32-row batch (JAX's own example), devices listed out of order
    two = _FakeSharding([(24, 28), (8, 12), (8, 12)], ndim=2)
    assert distributed.process_rows(two, (32, 17)).tolist() == [*range(8, 12), *range(24, 28)]
    # [accum=3, rows=8, T+1]: this process holds rows 4..8 of every accumulation slice
    three = _FakeSharding([(4, 6), (6, 8)], ndim=3)
    assert distributed.process_rows(three, (3, 8, 17)).tolist() == \
        [*range(4, 8), *range(12, 16), *range(20, 24)]
    # one process, a real mesh: every row
    from cgpt.sharding import make_strategy
    s = make_strategy("data_parallel", "data=8", get_config("tiny-17k"))
    assert distributed.process_rows(s.batch_sharding(3), (2, 8, 17)).tolist() == list(range(16))


def test_rows_are_the_global_batch_rows(corpus, tmp_path):
    from cgpt.data.batches import load_data
    data = load_data(_run(corpus, tmp_path, "data_parallel").data)
    rows = np.array([1, 5, 6])
    assert np.array_equal(data.train_batch(3, 8, rows=rows), data.train_batch(3, 8)[rows])
    full = list(data.val_batches(8, drop_last=True))
    part = list(data.val_batches(8, drop_last=True, rows=slice(4, 8)))
    assert len(full) == len(part) and all(np.array_equal(f[4:8], p) for f, p in zip(full, part))


def test_job_size_from_the_environment(monkeypatch):
    env = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "4", "SLURM_NTASKS": "2"}
    assert distributed.job_processes(env) == 4
    assert distributed.job_processes({"SLURM_NTASKS": "2"}) == 2
    assert distributed.job_processes({}) == 1
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    assert distributed.devices_per_process(8) == 4
    with pytest.raises(ValueError, match="--mesh asks for 7 devices"):
        distributed.devices_per_process(7)
    with pytest.raises(ValueError, match="--peer-timeout 0"):
        distributed.initialize(0)
    # one process: barriers and `first` are plain calls
    distributed.barrier("x")
    assert distributed.first("x", lambda: 3) == 3


# ---- real processes ------------------------------------------------------------------------
@pytest.mark.slow(reason=(
    "2 processes killed and resumed (~75 s); real 2-process jobs run by default "
    "(test_failed_job_exits_cleanly_when_one_process_is_slow_to_fail), and resume (test_train's"
    " sigkill test) and the modes' equality (test_sharding)"))
@pytest.mark.parametrize("mode", MODES)
def test_killed_process_ends_the_job_and_resume_continues(corpus, tmp_path, compile_cache, mode):
    """2 x 4 devices: process 1 is SIGKILLed mid-run, process 0 stops with JAX's error within
    the peer timeout, and `--resume` finishes with the one-process losses; only process 0
    wrote the run directory and prepared the data."""
    reference = _reference(corpus, tmp_path, mode)
    out, cache = tmp_path / "run", tmp_path / "cache"
    flags = _flags(corpus, cache, out, mode)
    job = Job(flags, tmp_path / "logs1", compile_cache)
    before = _wait_past_checkpoint(job, out)
    job.kill(1)
    t_kill = time.time()
    code = job.procs[0].wait(PEER_TIMEOUT + GRACE)
    took = time.time() - t_kill
    assert code != 0
    err = job.err(0)
    # Usually JAX's coordination service ends it; when the peer died in the middle of a
    # collective, gloo's TCP transport can abort first (seen under load): both end the job.
    assert ("JAX distributed service detected fatal errors" in err and "another task died" in err
            ) or "gloo" in err, err[-3000:]
    assert took < PEER_TIMEOUT + GRACE
    assert not (out / "summary.json").exists()
    # data preparation and tokenizer training happened once, in process 0
    assert "tokenizing" in err and "tokenizing" not in job.err(1)

    job = Job(flags + ["--resume"], tmp_path / "logs2", compile_cache)
    assert job.wait() == [0, 0], job.output()
    _check_resumed(out, before, reference)
    # one writer: the summary printed once, one TensorBoard event file per launch
    assert '"train_loss"' in job.out(0) and "train_loss" not in job.out(1)
    assert len(list((out / "events").iterdir())) == 2
    assert sorted(int(p.name) for p in (out / "checkpoints").iterdir()
                  if p.name.isdigit())[-1] == STEPS


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["data_parallel", "weight_streaming", "layer_pipelined"])
def test_sigkill_of_the_whole_job_then_resume_is_bit_identical(corpus, tmp_path, compile_cache,
                                                               mode):
    reference = _reference(corpus, tmp_path, mode)
    out = tmp_path / "run"
    flags = _flags(corpus, tmp_path / "cache", out, mode)
    job = Job(flags, tmp_path / "logs1", compile_cache)
    before = _wait_past_checkpoint(job, out)
    job.kill()
    job = Job(flags + ["--resume"], tmp_path / "logs2", compile_cache)
    assert job.wait() == [0, 0], job.output()
    _check_resumed(out, before, reference)


@pytest.mark.slow
def test_killed_coordinator_ends_the_job(corpus, tmp_path, compile_cache):
    out = tmp_path / "run"
    job = Job(_flags(corpus, tmp_path / "cache", out, "data_parallel"), tmp_path / "logs",
              compile_cache)
    _wait_past_checkpoint(job, out)
    job.kill(0)
    t_kill = time.time()
    assert job.procs[1].wait(PEER_TIMEOUT + GRACE) != 0
    assert time.time() - t_kill < PEER_TIMEOUT + GRACE
    assert "JAX distributed service detected fatal errors" in job.err(1)


@pytest.mark.slow
def test_single_mode_refuses_a_job_of_several_processes(corpus, tmp_path, compile_cache):
    flags = _flags(corpus, tmp_path / "cache", tmp_path / "run", "data_parallel")
    i = flags.index("--mode")
    flags[i + 1:i + 4] = ["single"]  # drop --mesh too
    job = Job(flags, tmp_path / "logs", compile_cache)
    assert job.wait() == [2, 2]
    assert "--mode single runs on one device, but this job has 2 processes" in job.err(0)


@pytest.mark.slow(reason=(
    "a failing 2-process job: test_failed_job_exits_cleanly_when_one_process_is_slow_to_fail"))
def test_failed_data_preparation_stops_every_process(tmp_path, compile_cache):
    """Process 0 prepares the data alone; when that fails the others stop with its error
    rather than waiting or preparing it themselves."""
    missing = tmp_path / "no_such_corpus"
    flags = _flags(missing, tmp_path / "cache", tmp_path / "run", "data_parallel")
    # JAX's default peer timeout, not the tests' 10 s: no process is killed here, and on a
    # loaded machine a heartbeat late by 10 s ended the job with the service's error instead
    flags[flags.index("--peer-timeout") + 1] = "100"
    job = Job(flags, tmp_path / "logs", compile_cache)
    assert job.wait(600) == [2, 2], job.output()
    assert "does not exist" in job.err(0)
    assert "process 0 failed during data preparation, so process 1 stops too: DataError" \
        in job.err(1)


# A `sitecustomize` (Python imports it at startup from PYTHONPATH) that makes this process slow to fail (DistributedError takes SLOW_S to raise) without touching
# cgpt, as a loaded machine does.
_SLOW_SITE = """
import builtins, sys, time
_import = builtins.__import__
def _slow_import(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    d = sys.modules.get("cgpt.sharding.distributedNone")
    if getattr(d, "DistributedError", None) is not None and not getattr(d, "_test_slowed", False):
        d._test_slowed = True
        init = d.DistributedError.__init__
        def slow_init(self, *a):
            time.sleep(%(slow)s)
            init(self, *a)
        d.DistributedError.__init__ = slow_init
    return module
builtins.__import__ = _slow_import
"""


def test_failed_job_exits_cleanly_when_one_process_is_slow_to_fail(tmp_path, compile_cache):
    """Issue #23: process 1 reaches the exit more than the peer timeout after process 0 (a
    loaded machine). JAX's exit barrier timed out and both processes died with SIGABRT and a
    C++ stack; each must exit 2 with its one error line."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SLOW_SITE % {"slow": 2 * PEER_TIMEOUT})
    missing = tmp_path / "no_such_corpus"
    slow = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", str(REPO))])}
    job = Job(_flags(missing, tmp_path / "cache", tmp_path / "run", "data_parallel"),
              tmp_path / "logs", compile_cache, extra_env={1: slow})
    try:
        codes = job.wait(300)
    finally:
        job.kill()
    assert codes == [2, 2], job.output()
    for i in (0, 1):
        err = job.err(i)
        assert "Barrier timed out" not in err and "Terminating process" not in err, err
        lines = [x for x in err.splitlines() if x.startswith("cgpt train: error:")]
        assert len(lines) == 1, err
    assert "does not exist" in job.err(0)
    assert "process 0 failed during data preparation" in job.err(1)


# ---- preemption agreed without a per-step collective (cgpt.sharding.distributed.StepAgreement) -
# A `sitecustomize` that records every process_allgather call (one line each) in $ALLGATHER_LOG.
_COUNT_SITE = '''
import builtins, os, sys
_real_import = builtins.__import__
def _counting_import(name, *args, **kwargs):
    m = _real_import(name, *args, **kwargs)
    mu = sys.modules.get("jax.experimental.multihost_utils")
    if (mu is not None and hasattr(mu, "process_allgather")
            and not getattr(mu, "_test_counted", False)):
        mu._test_counted = True
        real = mu.process_allgather
        def counted(*a, **k):
            with open(os.environ["ALLGATHER_LOG"], "a") as f:
                f.write(sys._getframe(1).f_code.co_filename + "\\n")  # the caller
            return real(*a, **k)
        mu.process_allgather = counted
    return m
builtins.__import__ = _counting_import
'''


@pytest.mark.slow
def test_signal_to_one_process_stops_the_job_at_one_step_without_per_step_collectives(
        corpus, tmp_path, compile_cache):
    """SIGUSR1 reaches process 1 only: both processes checkpoint the same step and stop with
    the same message, and the whole run made only its few start-up process_allgather calls
    (the old per-step preemption check made one per step)."""
    steps = 400
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_COUNT_SITE)
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", str(REPO))])
    env = {i: {"PYTHONPATH": path, "ALLGATHER_LOG": str(tmp_path / f"allgather{i}")}
           for i in range(2)}
    out = tmp_path / "run"
    flags = _flags(corpus, tmp_path / "cache", out, "data_parallel")
    flags[flags.index(f"--tokens={STEPS * BATCH * SEQ}")] = f"--tokens={steps * BATCH * SEQ}"
    flags[flags.index("train.eval_every=10")] = "train.eval_every=1000"
    flags[flags.index("train.ckpt_every=5")] = "train.ckpt_every=1000"
    job = Job(flags, tmp_path / "logs", compile_cache, extra_env=env)
    deadline = time.time() + 600
    while time.time() < deadline:
        assert all(p.poll() is None for p in job.procs), job.output()
        try:
            if len(_log(out)) >= 30:
                break
        except (OSError, json.JSONDecodeError):
            pass
        time.sleep(0.05)
    job.procs[1].send_signal(signal.SIGUSR1)
    assert job.wait() == [128 + signal.SIGUSR1] * 2, job.output()
    stopped = [int(m) for i in range(2) for m in __import__("re").findall(
        r"stopped by SIGUSR1 after checkpointing step (\d+)", job.err(i))]
    assert len(stopped) == 2 and stopped[0] == stopped[1], job.output()
    assert 30 <= stopped[0] < steps
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == [
        str(stopped[0])]
    assert [r["step"] for r in _log(out)] == list(range(1, stopped[0] + 1))
    for i in range(2):  # start-up (hosts, device memory) and Orbax's own, none from the loop
        callers = (tmp_path / f"allgather{i}").read_text().splitlines()
        assert len(callers) < stopped[0] // 2, callers
        assert not [c for c in callers if c.endswith(("preempt.py", "loop.py"))], callers
