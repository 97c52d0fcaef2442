"""The one per-run life cycle both training loops use (`cgpt.train.lifecycle`): its launch
leaves nothing when it fails before commit, and its cadence, record and guard are the ones
the solo loop and every fused member follow (their outputs: tests/fused/test_fused.py)."""
from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest

from cgpt import rundir
from cgpt.config.run import from_dict
from cgpt.errors import TrainError
from cgpt.train.lifecycle import Lifecycle


def _run():
    return from_dict({"preset": "tiny-17k", "data": {"vocab_size": 512, "seq_len": 32},
                      "train": {"tokens": 20000, "log_every": 10}})


def _life(tmp_path, total=100, **train):
    life = Lifecycle(_run(), tmp_path / "run", resuming=False)
    t = SimpleNamespace(eval_every=None, ckpt_every=None, log_every=10, **train)
    life.res = SimpleNamespace(total_steps=total, run=SimpleNamespace(train=t),
                               tokens_per_step=64, batch_size=2)
    return life


def test_a_launch_that_fails_before_commit_leaves_nothing(tmp_path):
    life = Lifecycle(_run(), tmp_path / "a" / "run", resuming=False)
    with pytest.raises(RuntimeError, match="before commit"):
        with contextlib.ExitStack() as stack:
            life.open(stack)
            life.check(platform="cpu")
            assert life.fresh and life.saved.model.compute_dtype != "auto"
            raise RuntimeError("before commit")
    assert not (tmp_path / "a").exists()


def test_the_cadence_is_the_runs(tmp_path):
    life = _life(tmp_path)
    assert (life.eval_every, life.ckpt_every) == (10, 10)
    window = rundir.train_loss_window(100)  # 5: the summary's train_loss needs each of them
    assert [d for d in range(81, 101) if life.logged(d)] == [90, 96, 97, 98, 99, 100]
    assert window == 5
    assert not life.logged(91) and life.logged(30) and life.evaluates(100)
    assert life.saves(20) and not life.saves(21) and life.saves(21, save_now=True)
    life.res.run.train.eval_every = 7
    assert life.evaluates(7) and life.logged(7) and not life.evaluates(10)


def test_record_and_guard(tmp_path):
    life = _life(tmp_path)
    written = []
    life.log = SimpleNamespace(write=written.append, close=lambda: None)
    life.data = SimpleNamespace(epoch_at=lambda done, bs: done / 50)
    life.ckpt = SimpleNamespace(steps=lambda: [10, 20])
    speed = SimpleNamespace(tokens_per_s=5.0, mfu=lambda: 0.25)
    life.record(30, {"loss": 2.5, "grad_norm": 0.5}, 1e-3, speed, val_loss=2.75)
    assert written == [{"step": 30, "loss": 2.5, "grad_norm": 0.5, "lr": 1e-3, "tokens": 1920,
                        "epoch": 0.6, "tokens_per_s": 5.0, "mfu": 0.25, "val_loss": 2.75}]
    assert life.val_loss == 2.75
    err = life.nonfinite(30, float("nan"), 1.0)
    assert isinstance(err, TrainError) and "loss is nan at step 31" in str(err)
    assert "last good checkpoint (step 20" in str(err)
    assert "grad_norm is inf" in str(life.nonfinite(30, 2.0, float("inf")))
    (tmp_path / "run").mkdir()
    life.fail(err)
    assert life.result is err and life.log is None
    assert json.loads((tmp_path / "run" / rundir.FAILED_FILE).read_text())["error"] == str(err)
