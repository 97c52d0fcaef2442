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

REPO = Path(__file__).resolve().parents[1]
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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2])
def test_signal_checkpoints_stops_and_resumes_identically(corpus, tmp_path, sig):
    ref = tmp_path / "ref"
    assert cli_main(["train", *_flags(corpus, tmp_path, ref)]) == 0
    out = tmp_path / "sig"
    proc = subprocess.Popen([sys.executable, "-m", "cgpt", "train", *_flags(corpus, tmp_path, out)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    log = out / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= 10:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "run ended before the signal: " + proc.stderr.read()
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
