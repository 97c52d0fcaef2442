"""`cgpt sweep --executor slurm` against a real one-node SLURM cluster on localhost.

The cluster comes from scripts/slurm_cluster.sh (it installs slurm-wlm + munge with apt when
missing, as root). Run with `python -m pytest -m slurm` (`.ci/run` does). A requeued job
waits ~2 minutes (SLURM's BeginTime) before it starts again, so the time-limit and the
preemption cases share one sweep and one wait.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cgpt import sweep as sw
from tests.sweep_helpers import write_corpus

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm_cluster.sh"


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("slurm")
    env = dict(os.environ, CGPT_SLURMCTLD_PORT=str(_free_port()), CGPT_SLURMD_PORT=str(_free_port()))
    p = subprocess.run(["bash", str(SCRIPT), "start", str(d)], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=900, env=env)
    if p.returncode != 0:
        pytest.fail(f"could not start the test SLURM cluster:\n{p.stderr[-3000:]}")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(d / "slurm.conf")
    yield d
    subprocess.run(["bash", str(SCRIPT), "stop", str(d)], capture_output=True, timeout=60)
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


def _spec(tmp: Path, name: str, tokens: int, **extra) -> Path:
    base = {"model": {"vocab_size": 300},
            "data": {"source": str(write_corpus(tmp / "corpus")), "vocab_size": 300, "seq_len": 32,
                     "val_sequences": 4, "cache_dir": str(tmp / "cache")},
            "train": {"batch_size": 8, "tokens": tokens, "log_every": 10, "ckpt_every": 100,
                      "eval_every": 100_000}}
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "base": base, **extra}, sort_keys=False))
    return p


def _losses(run_dir: Path) -> dict:
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").open())}


def test_sweep_submits_an_array_job(cluster, tmp_path):
    """Two seeds of one shape fuse into one group (one array task); a second shape is the
    array's other task. Every run's log names the job that trained it."""
    spec = _spec(tmp_path, "arr", 20_000, grid={"model": ["tiny-17k", "tiny-45k"], "seed": [0, 1]},
                 slurm={"timeout_min": 20, "cpus_per_task": 1})
    out = tmp_path / "out"
    assert sw.launch(sw.load_sweep(spec), out, executor="slurm", poll_s=1) == 0
    rows = {r.run_id: r for r in sw.load_sweep(spec).runs}
    tasks = {}
    for rid in rows:
        log = (out / rid / "train.log").read_text()
        m = re.search(r"\[SLURM job (\d+)_(\d+), restart 0\]", log)
        assert m, log[:2000]
        tasks[rid] = m.groups()
        assert json.loads((out / rid / "summary.json").read_text())["steps"] == 78
    assert len({job for job, _ in tasks.values()}) == 1  # one array job
    by_model = {}
    for rid, (_, task) in tasks.items():
        by_model.setdefault(rows[rid].model, set()).add(task)
    assert all(len(t) == 1 for t in by_model.values()), tasks  # seeds of a shape: one task
    assert len(set.union(*by_model.values())) == 2, tasks  # the two shapes: two tasks
    import csv
    with open(out / "results.csv", newline="") as f:
        assert {r["run_id"]: r["status"] for r in csv.DictReader(f)} == dict.fromkeys(rows, "done")
    assert list((out / ".submitit").glob("*_0_log.out"))  # submitit's per-task logs


def _steps_lasting(tmp: Path, seconds: float) -> int:
    """Steps of the tiny-17k run below that take at least `seconds` on this machine now: its
    throughput measured by a short local run of the same shape (a quiet machine trains 15,000
    of them in about a minute, a loaded one in several)."""
    spec = _spec(tmp, "calibrate", 8 * 32 * 1500, grid={"model": ["tiny-17k"], "seed": [0]})
    out = tmp / "calibrate"
    assert sw.launch(sw.load_sweep(spec), out) == 0
    run = out / sw.load_sweep(spec).runs[0].run_id
    tokens_per_s = json.loads((run / "summary.json").read_text())["tokens_per_s"]
    return max(15000, int(seconds * tokens_per_s / (8 * 32)))


def test_time_limit_and_preemption_requeue_and_resume(cluster, tmp_path):
    """Run A outlives its 2-minute time limit: SIGUSR2, checkpoint, requeue, resume. Run B is
    `scontrol requeue`d mid-run (preemption): SIGTERM, checkpoint, requeue, resume. Both end
    with the losses of an uninterrupted run.

    Whatever the machine's speed: A's steps take 1.5x the time to its signal (80 s) at the
    throughput just measured alone (A shares the cores with B), so it cannot finish first; once stopped, its time limit is raised
    while it waits to be requeued, so the resumed run is not stopped again."""
    steps = _steps_lasting(tmp_path, 120)
    spec = _spec(tmp_path, "rq", 8 * 32 * steps, grid={"model": ["tiny-17k"], "seed": [0, 1]},
                 slurm={"timeout_min": 20, "cpus_per_task": 1, "signal_delay_s": 40})
    # two sweeps side by side (one run each): A with a 2-minute time limit, B without
    out = tmp_path / "out"
    env = dict(os.environ, CGPT_REQUEUE_WAIT_S="120")
    cmd = [sys.executable, "-m", "cgpt", "sweep", str(spec), "--out"]
    # their output to files: minutes of a progress bar would fill a pipe nobody reads
    pa = subprocess.Popen([*cmd, str(out / "a"), "--only", "_s0", "--executor", "slurm",
                           "--set", "slurm.timeout_min=2"], env=env,
                          stdout=(tmp_path / "sweep_A.out").open("w"), stderr=subprocess.STDOUT)
    pb = subprocess.Popen([*cmd, str(out / "b"), "--only", "_s1", "--executor", "slurm"],
                          env=env, stdout=(tmp_path / "sweep_B.out").open("w"),
                          stderr=subprocess.STDOUT)
    run_a = out / "a" / f"tiny-17k_d{sw.spec.fmt_count(8 * 32 * steps)}_s0"
    assert sw.load_sweep(spec).runs[0].steps == steps
    run_b = out / "b" / f"tiny-17k_d{sw.spec.fmt_count(8 * 32 * steps)}_s1"
    # preempt B once it has trained a while
    deadline = time.time() + 300
    while time.time() < deadline:
        m = run_b / "metrics.jsonl"
        if m.exists() and len(m.read_text().splitlines()) >= 30:
            break
        time.sleep(0.5)
    else:
        pytest.fail("run B did not start training:\n" + (run_b / "train.log").read_text()[-2000:])
    job_b = re.search(r"\[SLURM job (\S+), restart", (run_b / "train.log").read_text()).group(1)
    subprocess.run(["scontrol", "requeue", job_b], check=True, timeout=60)
    # meanwhile the uninterrupted references
    refs = []
    for run in (run_a, run_b):
        ref = tmp_path / "ref" / run.name
        refs.append(subprocess.Popen(
            [sys.executable, "-m", "cgpt", "train", "--config", str(run / "run.yaml"),
             "--out", str(ref), "--no-progress"], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL))
    # A stopped by its time limit: raise the limit while it waits to be requeued
    deadline = time.time() + 600
    while time.time() < deadline:
        log_a = (run_a / "train.log").read_text() if (run_a / "train.log").exists() else ""
        if re.search("stopped by SIGUSR[12] after checkpointing step", log_a):
            break
        assert (run_a / "summary.json").exists() is False, "run A finished before its limit"
        time.sleep(0.5)
    else:
        pytest.fail("run A was not stopped by its time limit:\n" + log_a[-2000:])
    job_a = re.search(r"\[SLURM job (\S+), restart", log_a).group(1)
    subprocess.run(["scontrol", "update", f"JobId={job_a}", "TimeLimit=20"], check=True,
                   timeout=60)
    for p in refs:  # generous: on a loaded machine four runs share two cores
        assert p.wait(timeout=1800) == 0
    for p, name in ((pa, "A"), (pb, "B")):
        try:
            p.wait(timeout=1800)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        text = (tmp_path / f"sweep_{name}.out").read_text()
        assert p.returncode == 0, f"sweep {name}:\n{text[-3000:]}"
    for run, why in ((run_a, "SIGUSR[12]"), (run_b, "SIGTERM")):
        log = (run / "train.log").read_text()
        assert "restart 1]" in log and re.search(f"stopped by {why} after checkpointing step", log), log
        summary = json.loads((run / "summary.json").read_text())
        assert 0 < summary["resumed_from_step"] < steps
        assert _losses(run) == _losses(tmp_path / "ref" / run.name)  # as if never stopped


def test_multi_task_job_is_one_jax_job_and_resumes_after_requeue(cluster, tmp_path):
    """A run on 2 SLURM tasks (the shape of a 2-node job: one JAX process per task, joined by
    SLURM's environment, gloo collectives) is `scontrol requeue`d mid-run: both processes
    checkpoint the same step, the requeued job resumes, every step is logged once, and the
    losses equal the same run in one process on 2 devices."""
    steps = 2500  # requeued after ~300: the rest is well over the few seconds a requeue takes
    spec = _spec(tmp_path, "mt", 8 * 32 * steps, grid={"model": ["tiny-17k"], "seed": [0]},
                 slurm={"timeout_min": 20, "cpus_per_task": 1, "tasks_per_node": 2})
    raw = yaml.safe_load(spec.read_text())
    # Adam's eps raised as in test_multihost.py: gloo's and XLA's reduction orders differ in
    # rounding, which a near-zero gradient over eps=1e-8 would turn into lr-sized flips
    raw["base"]["train"].update(mode="data_parallel", mesh="data=2", peak_lr=3e-3, adam_eps=1e-3)
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    out = tmp_path / "out"
    env = dict(os.environ, CGPT_REQUEUE_WAIT_S="120")
    p = subprocess.Popen([sys.executable, "-m", "cgpt", "sweep", str(spec), "--out", str(out),
                          "--executor", "slurm"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    run = out / sw.load_sweep(spec).runs[0].run_id
    deadline = time.time() + 400
    while time.time() < deadline and p.poll() is None:
        m = run / "metrics.jsonl"
        if m.exists() and len(m.read_text().splitlines()) >= 30:
            break
        time.sleep(0.5)
    else:
        log = (run / "train.log").read_text() if (run / "train.log").exists() else "no log"
        p.kill()
        pytest.fail("the 2-task run did not start training:\n" + log[-3000:]
                    + (p.communicate()[0] or "")[-2000:])
    job = re.search(r"\[SLURM job (\S+), restart", (run / "train.log").read_text()).group(1)
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=60)
    ref = tmp_path / "ref"
    r = subprocess.run([sys.executable, "-m", "cgpt", "train", "--config", str(run / "run.yaml"),
                        "--out", str(ref), "--no-progress"], capture_output=True, text=True,
                       timeout=900, env={**os.environ, "XLA_FLAGS": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    try:
        text, _ = p.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the sweep did not finish:\n" + p.communicate()[0][-3000:])
    assert p.returncode == 0, text[-3000:]
    log = (run / "train.log").read_text()
    assert "restart 1]" in log and re.search(r"stopped by SIGTERM after checkpointing step", log), log
    assert (run / "train.rank1.log").exists()  # the second task ran its own process
    summary = json.loads((run / "summary.json").read_text())
    assert summary["placement"]["mesh"] == {"data": 2}
    assert 0 < summary["resumed_from_step"] < steps
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len({r["step"] for r in rows}) == len(rows)  # one writer: every step once
    got, want = _losses(run), _losses(ref)
    assert got.keys() == want.keys()
    assert max(abs(got[s] - want[s]) for s in got) <= 1e-5
