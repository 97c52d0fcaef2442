"""Fused training (#21): members of one vmapped program equal the same runs trained alone,
non-finite members stop alone, a killed group resumes, and mismatched groups are refused."""
import json
import math

import jax
import numpy as np
import pytest

import cgpt
from cgpt.config.data import DataConfig
from cgpt.config.model import get_config
from cgpt.config.run import RunConfig, TrainConfig
from cgpt.errors import TrainError
from cgpt import rundir
from cgpt.model import orbax_format
from cgpt.train import checkpoint
from cgpt.rundir import FAILED_FILE
from cgpt.train.fused_loop import train_fused
from cgpt.train.loop import train

STEPS = 20


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _run(corpus, cache, preset="tiny-17k", data_seed=0, steps=STEPS, **train_kw) -> RunConfig:
    base = dict(tokens=8 * 16 * steps, batch_size=8, log_every=1, eval_every=5, ckpt_every=5,
                keep_checkpoints=10, peak_lr=3e-3)
    base.update(train_kw)
    return RunConfig(
        preset=preset, model=get_config(preset).replace(compute_dtype="float32"),
        data=DataConfig(source=str(corpus), vocab_size=512, seq_len=16, val_sequences=16,
                        cache_dir=str(cache), seed=data_seed),
        train=TrainConfig(**base))


def _params(out):
    return orbax_format.load_run(out)[1]


def _assert_close_params(a, b, tol=1e-6):
    """Params agree within `tol` + 1e-5 x their size, except the attention key bias: softmax ignores it, so its
    gradient is zero but for rounding, which Adam scales up, so ulp-level differences move it
    at random (by up to ~1e-4 here). It has no effect on any output (the logged val losses
    agree within `tol`); its difference must still stay small (1e-3)."""
    ka, kb = (np.asarray(p["h"]["attn"]["c_attn"]["bias"]) for p in (a, b))
    d = ka.shape[-1] // 3
    assert np.abs(ka[..., d:2 * d] - kb[..., d:2 * d]).max() < 1e-3
    for p in (a, b):
        bias = np.asarray(p["h"]["attn"]["c_attn"]["bias"])
        p["h"]["attn"]["c_attn"]["bias"] = np.concatenate([bias[..., :d], bias[..., 2 * d:]], -1)
    excess = jax.tree.map(  # |p - q| beyond tol + 1e-5 |q| (LN scales near 1: a few ulps)
        lambda p, q: float(np.max(np.abs(np.asarray(p) - q) - 1e-5 * np.abs(np.asarray(q)))),
        a, b)
    assert max(jax.tree.leaves(excess)) <= tol, excess


def _assert_same_run(fused_dir, solo_dir, tol=1e-6):
    """Every logged loss, val loss and LR, the final params and the summary's losses agree."""
    a = rundir.read_metrics(fused_dir / "metrics.jsonl")
    b = rundir.read_metrics(solo_dir / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b):
        assert abs(x["loss"] - y["loss"]) <= tol, (x, y)
        assert abs(x["grad_norm"] - y["grad_norm"]) <= 10 * tol * max(1, y["grad_norm"])
        assert ("val_loss" in x) == ("val_loss" in y)
        assert abs(x.get("val_loss", 0) - y.get("val_loss", 0)) <= tol
        assert x["lr"] == pytest.approx(y["lr"], rel=1e-6, abs=0)
    _assert_close_params(_params(fused_dir), _params(solo_dir), tol)
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (fused_dir, solo_dir))
    for k in ("train_loss", "val_loss"):
        assert abs(sa[k] - sb[k]) <= tol
    for k in ("steps", "tokens", "n_params", "peak_lr", "warmup_steps", "decay", "flops", "data"):
        assert sa[k] == sb[k], k
    assert sa["placement"]["fused"] >= 2 and "fused" not in sb["placement"]


def kill_fused_at(runs, outs, step: int, monkeypatch, only=None) -> None:
    """Train `runs` fused into `outs`, killed (KeyboardInterrupt) as the save of `step` starts
    (of the member in `only` alone, if given): a crash mid-save."""
    real_save = checkpoint.Checkpointer.save

    def dying_save(self, at, params, opt_state):
        if at == step and (only is None or self.run_dir == only):
            raise KeyboardInterrupt("killed")
        real_save(self, at, params, opt_state)

    monkeypatch.setattr(checkpoint.Checkpointer, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        train_fused(runs, outs, progress=False)
    monkeypatch.undo()


def test_fused_members_equal_solo_runs(corpus, cache, tmp_path):
    """Seeds, data orders, LRs, warmup, weight decay, decay shapes and a WSD schedule."""
    runs = [_run(corpus, cache, seed=0),
            _run(corpus, cache, seed=1, data_seed=3, decay="cosine", weight_decay=0.0),
            _run(corpus, cache, seed=2, peak_lr=1e-2, warmup_steps=5, schedule="wsd",
                 clip_norm=0.5)]
    outs = [tmp_path / f"fused{i}" for i in range(len(runs))]
    results = train_fused(runs, outs, progress=False)
    assert all(isinstance(r, dict) for r in results)
    losses = [r["train_loss"] for r in results]
    assert len(set(losses)) == 3  # really different runs
    for i, run in enumerate(runs):
        train(run, tmp_path / f"solo{i}", progress=False)
        _assert_same_run(outs[i], tmp_path / f"solo{i}")
    # a member directory is an ordinary run: cgpt.load reads it, with its loss curve beside
    lm = cgpt.load(outs[1])
    assert lm.config.d_model == 16 and all((o / "loss.png").is_file() for o in outs)
    # and `cgpt eval`'s reading of its own split gives the val_loss it reported
    from cgpt.data.batches import load_data
    from cgpt.eval.split import run_split, split_loss

    split = run_split(outs[1])
    loss, _ = split_loss(lm.loss, load_data(split.data, outs[1]), split)
    assert split.exact and loss == pytest.approx(results[1]["val_loss"], abs=1e-5)


@pytest.mark.slow  # ~16 s; fused = solo is tested by default on seeds and learning rates
def test_fused_mup_members_equal_solo_runs(corpus, cache, tmp_path):
    runs = [_run(corpus, cache, "tiny-17k-mup", steps=10, peak_lr=6e-3),
            _run(corpus, cache, "tiny-17k-mup", steps=10, peak_lr=2e-2, seed=5)]
    outs = [tmp_path / "m0", tmp_path / "m1"]
    train_fused(runs, outs, progress=False)
    for i, run in enumerate(runs):
        train(run, tmp_path / f"solo{i}", progress=False)
        _assert_same_run(outs[i], tmp_path / f"solo{i}")


@pytest.mark.slow(reason="test_a_member_found_nonfinite_a_step_late_fails_there_alone")
def test_nonfinite_member_stops_alone(corpus, cache, tmp_path):
    good = _run(corpus, cache, seed=0)
    bad = _run(corpus, cache, seed=1, peak_lr=1e9, warmup_steps=8, clip_norm=1e9)
    outs = [tmp_path / "good", tmp_path / "bad"]
    results = train_fused([good, bad], outs, progress=False)
    assert isinstance(results[0], dict) and isinstance(results[1], TrainError)
    msg = str(results[1])
    assert "training stopped" in msg
    failed = json.loads((outs[1] / FAILED_FILE).read_text())
    assert failed["error"] == msg
    assert not (outs[1] / "summary.json").exists()
    log = rundir.read_metrics(outs[1] / "metrics.jsonl")
    stopped = int(msg.split(" at step ")[1].split()[0].rstrip(";"))
    assert log[-1]["step"] == stopped - 1 and all(math.isfinite(r["loss"]) for r in log)
    kept = sorted(int(p.name) for p in (outs[1] / "checkpoints").iterdir())
    if kept:  # the advice names its last verified checkpoint, which is finite
        assert f"last good checkpoint (step {kept[-1]}, verified finite)" in msg
        assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(_params(outs[1])))
    else:
        assert "No checkpoint was written yet" in msg
    # the good member went on, unchanged by its neighbour's divergence
    train(good, tmp_path / "solo", progress=False)
    _assert_same_run(outs[0], tmp_path / "solo")


def test_a_member_found_nonfinite_a_step_late_fails_there_alone(corpus, cache, tmp_path,
                                                                monkeypatch):
    """Member 1's params are made NaN before step 9 (0-based 8). Its scalars are read a step
    late, after step 10 (a checkpoint step) was queued with member 1 still in it: it fails at
    step 9 (failed.json says so), is masked from step 11 on, logs nothing after step 8 and saves
    no checkpoint after step 5; member 0 is bit for bit the same run as in a clean group."""
    from cgpt.train import fused_loop

    runs = [_run(corpus, cache, seed=0), _run(corpus, cache, seed=1)]
    ref = [tmp_path / "ref0", tmp_path / "ref1"]
    train_fused(runs, ref, progress=False)
    masks, real = [], fused_loop._compiled

    def compile_poisoned(*args):
        step_fn, nbytes = real(*args)

        def step(params, opt_state, batch, hyper, active):
            masks.append(np.asarray(active).tolist())
            if len(masks) == 9:
                params = jax.tree.map(lambda x: x.at[1].set(np.nan), params)
            return step_fn(params, opt_state, batch, hyper, active)
        return step, nbytes

    monkeypatch.setattr(fused_loop, "_compiled", compile_poisoned)
    outs = [tmp_path / "a0", tmp_path / "a1"]
    results = train_fused(runs, outs, progress=False)
    monkeypatch.undo()
    assert masks[:10] == [[True, True]] * 10 and masks[10:] == [[True, False]] * (STEPS - 10)
    assert isinstance(results[0], dict) and isinstance(results[1], TrainError)
    failed = json.loads((outs[1] / FAILED_FILE).read_text())
    assert "loss is nan at step 9; training stopped before saving anything from it" in \
        failed["error"] and "last good checkpoint (step 5" in failed["error"]
    assert [r["step"] for r in rundir.read_metrics(outs[1] / "metrics.jsonl")] == \
        list(range(1, 9))
    assert sorted(p.name for p in (outs[1] / "checkpoints").iterdir()) == ["5"]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(_params(outs[1])))
    timing = ("tokens_per_s", "mfu")
    logged = lambda d: [{k: v for k, v in r.items() if k not in timing}  # noqa: E731
                        for r in rundir.read_metrics(d / "metrics.jsonl")]
    assert logged(outs[0]) == logged(ref[0])
    same = jax.tree.map(lambda p, q: bool((np.asarray(p) == np.asarray(q)).all()),
                        _params(outs[0]), _params(ref[0]))
    assert all(jax.tree.leaves(same))
    a, b = (json.loads((d / "summary.json").read_text()) for d in (outs[0], ref[0]))
    assert [a[k] for k in ("train_loss", "val_loss", "steps")] == \
        [b[k] for k in ("train_loss", "val_loss", "steps")]


def test_fused_training_refuses_a_multi_process_job(corpus, cache, tmp_path, monkeypatch):
    """One clear error, before anything is created, where the job has several processes."""
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    outs = [tmp_path / "x" / "a", tmp_path / "x" / "b"]
    with pytest.raises(TrainError, match="fused training runs in one process, but this job "
                                         "has 2 .*--no-fuse"):
        train_fused([_run(corpus, cache), _run(corpus, cache, seed=1)], outs, progress=False)
    assert not (tmp_path / "x").exists()


def test_killed_group_resumes_bit_identically(corpus, cache, tmp_path, monkeypatch):
    runs = [_run(corpus, cache, seed=0, ckpt_every=4), _run(corpus, cache, seed=1, ckpt_every=6)]
    timing = ("tokens_per_s", "mfu")
    logged = lambda d: [{k: v for k, v in r.items() if k not in timing}  # noqa: E731
                        for r in rundir.read_metrics(d / "metrics.jsonl")]
    ref = [tmp_path / "ref0", tmp_path / "ref1"]
    train_fused(runs, ref, progress=False)

    outs = [tmp_path / "a0", tmp_path / "a1"]
    kill_fused_at(runs, outs, 18, monkeypatch, only=outs[1])  # killed saving member 1's 18
    assert checkpoint.Checkpointer(outs[0]).steps()[-1] == 16  # member 1 kept 6 and 12
    results = train_fused(runs, outs, resume=True, progress=False)
    for i in range(2):  # restarted from step 12 (the newest step both kept) and equal exactly
        assert results[i]["resumed_from_step"] == 12
        assert logged(outs[i]) == logged(ref[i])
        same = jax.tree.map(lambda p, q: bool((np.asarray(p) == np.asarray(q)).all()),
                            _params(outs[i]), _params(ref[i]))
        assert all(jax.tree.leaves(same))
    # rewound to the common step: member 0's 16 retrained, not left in discarded_checkpoints/
    assert not (outs[0] / rundir.DISCARDED_DIR).exists()  # (issue 42)


def test_one_member_resumes_alone(corpus, cache, tmp_path, monkeypatch):
    """A fused member's checkpoints are an ordinary run's: `train --resume` continues it."""
    runs = [_run(corpus, cache, seed=0), _run(corpus, cache, seed=1)]
    outs = [tmp_path / "a0", tmp_path / "a1"]
    kill_fused_at(runs, outs, 15, monkeypatch)
    s = train(runs[1], outs[1], resume=True, progress=False)
    assert s["resumed_from_step"] == 10
    train(runs[1], tmp_path / "solo", progress=False)
    a, b = rundir.read_metrics(outs[1] / "metrics.jsonl"), rundir.read_metrics(tmp_path / "solo/metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    assert max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b)) <= 1e-6
    _assert_close_params(_params(outs[1]), _params(tmp_path / "solo"))


@pytest.mark.parametrize("change, key", [
    (dict(preset="tiny-45k"), "model.d_model"),
    (dict(steps=30), "train.tokens"),
    (dict(adam_eps=1e-6), "train.adam_eps"),
])
def test_mismatched_group_names_the_key_and_leaves_nothing(corpus, cache, tmp_path, change, key):
    runs = [_run(corpus, cache), _run(corpus, cache, **change)]
    outs = [tmp_path / "x" / "a", tmp_path / "x" / "b"]
    with pytest.raises(TrainError, match=f"must share {key}: .*train the others"):
        train_fused(runs, outs, progress=False)
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_members_spread_over_emulated_devices(corpus, cache, tmp_path):
    """The member axis beside the devices: a group of 4 on 2 emulated CPU devices (2 members
    each, no communication) logs what the same group logs on one device."""
    import pickle
    import subprocess
    import sys

    runs = [_run(corpus, cache, data_seed=k % 2, seed=k, steps=6, peak_lr=1e-3 * (k + 1))
            for k in range(4)]
    one = [tmp_path / f"one{k}" for k in range(4)]
    two = [tmp_path / f"two{k}" for k in range(4)]
    train_fused(runs, one, progress=False)
    (tmp_path / "runs.pkl").write_bytes(pickle.dumps(runs))
    code = ("import jax, pickle, sys\nfrom cgpt.train.fused_loop import train_fused\n"
            "assert len(jax.devices()) == 2, jax.devices()\n"
            f"train_fused(pickle.load(open({str(tmp_path / 'runs.pkl')!r}, 'rb')), "
            f"{[str(p) for p in two]!r}, progress=False, spread=True)\n")
    import os
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
               + " --xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for a, b in zip(two, one):
        ma, mb = (rundir.read_metrics(d / "metrics.jsonl") for d in (a, b))
        assert [r["step"] for r in ma] == [r["step"] for r in mb]
        for x, y in zip(ma, mb):
            # another compiled program (2 members per device): ulps, relative 1e-6
            assert abs(x["loss"] - y["loss"]) <= 1e-6 * y["loss"] and abs(
                x.get("val_loss", 0) - y.get("val_loss", 0)) <= 1e-6 * y["loss"]
        sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
        assert sa["placement"]["member_devices"] == 2 and sb["placement"]["member_devices"] == 1
        _assert_close_params(_params(a), _params(b))
