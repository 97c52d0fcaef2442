"""Checkpoint on a scheduler's signal (SIGTERM / SIGUSR1 / SIGUSR2) and on a wall-clock
interval; the resumed run's losses equal an uninterrupted run's."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cgpt.train import preempt
from cgpt.cli import main as cli_main
from cgpt.config.model import get_config
from cgpt.config.data import DataConfig
from cgpt.config.run import RunConfig, TrainConfig
from cgpt.train.loop import train

REPO = Path(__file__).resolve().parents[2]
STEPS = 120


def _flags(corpus, tmp_path, out):
    return ["--model", "tiny-17k", "--data", str(corpus), "--out", str(out), "--no-progress",
            f"--tokens={8 * 16 * STEPS}", "train.batch_size=8", "train.log_every=1",
            "train.eval_every=1000", "train.ckpt_every=1000", "train.keep_checkpoints=3",
            "train.peak_lr=3e-3", "data.vocab_size=512", "data.seq_len=16",
            "data.val_sequences=16", f"data.cache_dir={tmp_path / 'cache'}"]


def _losses(run_dir: Path) -> dict:
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").open())}


def _ckpt_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.parametrize("sig", [signal.SIGTERM,  # SIGUSR2 (submitit's) is the same path: slow
                                 pytest.param(signal.SIGUSR2, marks=pytest.mark.slow)])
def test_signal_checkpoints_stops_and_resumes_identically(corpus, tmp_path, sig):
    ref = tmp_path / "ref"
    assert cli_main(["train", *_flags(corpus, tmp_path, ref)]) == 0
    out = tmp_path / "sig"
    proc = subprocess.Popen([sys.executable, "-m", "cgpt", "train", *_flags(corpus, tmp_path, out)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 900  # a loaded machine: the start (imports, compile) can be slow
    log = out / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= 10:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "run ended before the signal: " + proc.stderr.read()
    assert len(log.read_text().splitlines()) >= 10, "no 10 steps logged in 900 s"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name} after checkpointing step" in err
    assert not (out / "summary.json").exists()
    stopped = max(_losses(out))
    assert 10 <= stopped < STEPS and _ckpt_steps(out) == [stopped]  # saved where it stopped
    assert cli_main(["train", *_flags(corpus, tmp_path, out), "--resume"]) == 0
    assert _losses(out) == _losses(ref)  # bit-identical after the resume
    assert json.loads((out / "summary.json").read_text())["resumed_from_step"] == stopped


@pytest.mark.slow  # ~11 s end to end: slow to keep the default suite within 15 minutes
def test_checkpoint_minutes_adds_wall_clock_checkpoints(corpus, tmp_path):
    out = tmp_path / "timed"
    run = RunConfig(preset="tiny-17k", model=get_config("tiny-17k"),
                    data=DataConfig(source=str(corpus), vocab_size=512, seq_len=16,
                                    val_sequences=16, cache_dir=str(tmp_path / "cache")),
                    train=TrainConfig(tokens=8 * 16 * 40, batch_size=8, ckpt_every=1000,
                                      keep_checkpoints=100, checkpoint_minutes=1e-6))
    train(run, out, progress=False)
    assert _ckpt_steps(out) == list(range(1, 41))  # every step is past a 60 us interval
    with pytest.raises(ValueError, match="train.checkpoint_minutes must be > 0"):
        TrainConfig(checkpoint_minutes=0)


def test_triggers_interval_and_signal(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(preempt.time, "monotonic", lambda: clock[0])
    t = preempt.CheckpointTriggers(minutes=2).install()
    try:
        assert t.poll() == (False, 0)
        clock[0] += 119
        assert t.poll() == (False, 0)
        clock[0] += 2
        assert t.poll() == (True, 0)
        t.saved()
        assert t.poll() == (False, 0)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert t.poll() == (True, signal.SIGUSR1)
    finally:
        t.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


# ---- a save slower than the old fixed 60 s grace, on the SLURM executor's signal path -------
HOOK = '''import os, time
if os.environ.get("SLOW_SAVE_S"):
    from cgpt.train import checkpoint

    def _slow():
        with open(os.environ["SLOW_SAVE_MARK"], "a") as f:
            f.write("slowed\\n")
        time.sleep(float(os.environ["SLOW_SAVE_S"]))
    checkpoint.Checkpointer.before_commit = _slow
'''


@pytest.mark.slow(reason=(
    "signal, checkpoint, resume: test_signal_checkpoints_stops_and_resumes_identically"))
@pytest.mark.parametrize("delay, lead", [pytest.param(4, 15, id="4s-save"),
                                         pytest.param(65, 120, id="65s-save",
                                                      marks=pytest.mark.slow)])
def test_slow_save_on_the_signal_completes_and_the_requeued_job_resumes(
        corpus, tmp_path, monkeypatch, delay, lead):
    """The SLURM path without SLURM: `RunTask.checkpoint` (what submitit calls on the
    time-limit signal) signals train, whose checkpoint's writer is slowed by `delay` s (a
    test-only hook, sitecustomize); it waits the grace of a `lead`-second signal and hands
    back the resuming call, which finishes with the uninterrupted run's losses."""
    from cgpt.sweep import executors as ex
    from cgpt.rundir import RUN_FILE

    ref = tmp_path / "ref"
    assert cli_main(["train", *_flags(corpus, tmp_path, ref)]) == 0
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HOOK)
    out = tmp_path / "run"
    out.mkdir()
    (out / RUN_FILE).write_text((ref / "config.yaml").read_text())
    mark = tmp_path / "slowed.txt"
    grace = ex.requeue_grace({"signal_delay_s": lead})
    assert grace > delay
    slow = {"SLOW_SAVE_S": str(delay), "SLOW_SAVE_MARK": str(mark),
            "PYTHONPATH": f"{hooks}{os.pathsep}{REPO}", ex.GRACE_ENV: f"{grace:g}"}
    job = ex.Job("run", str(out), resume=False, env=slow)
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # a SLURM task: a signalled exit waits for requeue
    monkeypatch.setenv("CGPT_REQUEUE_WAIT_S", "0")
    import threading

    result = {}
    task = ex.RunTask()  # submitit calls `checkpoint` on the task running the job
    t = threading.Thread(target=lambda: result.update(task(job)))
    t.start()
    log = out / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and t.is_alive():
        if log.exists() and len(log.read_text().splitlines()) >= 10:
            break
        time.sleep(0.05)
    assert t.is_alive(), (out / "train.log").read_text()
    t0 = time.time()
    again = task.checkpoint(job)
    waited = time.time() - t0
    t.join(60)
    text = (out / "train.log").read_text()
    assert result["status"] == "interrupted" and result["returncode"] == 128 + signal.SIGUSR1, text
    assert waited >= delay and mark.read_text() == "slowed\n"  # the one save, slowed
    stopped = max(_losses(out))
    assert 10 <= stopped < STEPS and _ckpt_steps(out) == [stopped], text  # committed
    assert f"waiting up to {grace:.0f} s" in text
    assert f"checkpoint {stopped}: saved in" in text
    # submitit runs the returned call again in the requeued job: it resumes
    assert again.function is not None and again.args[0].resume
    requeued = ex.replace(again.args[0], env={})
    assert again.function(requeued)["status"] == "done", (out / "train.log").read_text()[-2000:]
    assert _losses(out) == _losses(ref)
    assert json.loads((out / "summary.json").read_text())["resumed_from_step"] == stopped
