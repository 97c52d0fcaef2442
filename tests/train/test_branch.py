"""WSD schedule and cooldown branches (`cgpt train --branch-from RUN@STEP --tokens D`).

A branch from a stable-phase checkpoint must end exactly where an independent WSD run of its
budget ends (same batches, same schedule up to the branch point, same state); and, the reason
to use branches for approach 1, no worse than a full run with the published schedule.
"""
import json
from pathlib import Path

import numpy as np
import pytest

from cgpt.train import optim
from cgpt.config.recipe import Recipe
from cgpt.train.branch import BranchError, parse_spec
from cgpt.cli import main as cli_main
from cgpt.config.model import get_config
from cgpt.config.data import DataConfig
from cgpt.config.run import RunConfig, TrainConfig
from cgpt.train.resolve import resolve
from cgpt.train.loop import train

TOK_PER_STEP = 8 * 16


def _run(corpus, cache, steps, **kw) -> RunConfig:
    t = dict(tokens=TOK_PER_STEP * steps, batch_size=8, log_every=5, eval_every=10 ** 6,
             ckpt_every=32, keep_checkpoints=10, peak_lr=3e-3)
    t.update(kw)
    return RunConfig(preset="tiny-17k", model=get_config("tiny-17k"),
                     data=DataConfig(source=str(corpus), vocab_size=512, seq_len=16,
                                     val_sequences=32, cache_dir=str(cache)),
                     train=TrainConfig(**t))


@pytest.mark.parametrize("decay", ["linear", "1-sqrt"])
def test_wsd_schedule_shape(decay):
    r = Recipe(peak_lr=1e-3, decay=decay, adam_eps=1e-8, batch_size=8, warmup_steps=10,
                     total_steps=110, schedule="wsd", decay_fraction=0.2)
    lrs = np.array([optim.lr_at(r, s) for s in range(111)])
    assert r.decay_start == 88 and lrs[0] == 0 and lrs[10] == pytest.approx(1e-3)
    np.testing.assert_allclose(lrs[10:89], 1e-3)                      # the stable phase
    assert lrs[110] == pytest.approx(1e-4) and np.all(np.diff(lrs[88:]) < 0)
    half = lrs[88 + 11]                                               # halfway through the decay
    want = 1e-3 - 9e-4 * (0.5 if decay == "linear" else np.sqrt(0.5))
    assert half == pytest.approx(want, rel=1e-5)
    # The stable phase does not depend on the run's length: a longer run has the same prefix.
    longer = Recipe(**{**r.__dict__, "total_steps": 400})
    np.testing.assert_allclose([optim.lr_at(longer, s) for s in range(89)], lrs[:89])


def test_wsd_config_keys():
    assert TrainConfig(schedule="wsd").decay is None
    with pytest.raises(ValueError, match="train.schedule='cos'"):
        TrainConfig(schedule="cos")
    with pytest.raises(ValueError, match="train.decay='cosine' with train.schedule=wsd"):
        TrainConfig(schedule="wsd", decay="cosine")
    with pytest.raises(ValueError, match="train.decay_fraction"):
        TrainConfig(schedule="wsd", decay_fraction=0.0)
    run = RunConfig(preset="tiny-17k", model=get_config("tiny-17k"),
                    data=DataConfig(vocab_size=512, seq_len=128),
                    train=TrainConfig(schedule="wsd", tokens=4096 * 100))
    assert resolve(run).recipe.decay == "1-sqrt"                    # the WSD default


@pytest.mark.slow(reason="no twin (the WSD schedule and branch specs are unit-tested by default)")
def test_branch_equals_independent_wsd_run(corpus, tmp_path, capsys):
    """Parent: 80 steps WSD (warmup 8 by the 10% rule). Branch at step 32 to a 40-step budget
    (decay from step 32), through the CLI; it must equal a fresh 40-step WSD run with warmup 8."""
    cache = tmp_path / "cache"
    parent = tmp_path / "parent"
    train(_run(corpus, cache, 80, schedule="wsd"), parent, progress=False)
    out = tmp_path / "b40"
    assert cli_main(["train", "--branch-from", f"{parent}@32", "--tokens",
                     str(TOK_PER_STEP * 40), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    fresh = train(_run(corpus, cache, 40, schedule="wsd", warmup_steps=8), tmp_path / "w40",
                  progress=False)
    branch = json.loads((out / "summary.json").read_text())
    assert branch["steps"] == 40 and branch["warmup_steps"] == 8
    assert branch["val_loss"] == pytest.approx(fresh["val_loss"], rel=1e-4)
    log = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in log]
    assert steps == sorted(set(steps)) and steps[0] == 5 and steps[-1] == 40   # parent's prefix
    ref = {r["step"]: r["loss"] for r in map(json.loads, (tmp_path / "w40" / "metrics.jsonl")
                                             .read_text().splitlines())}
    np.testing.assert_allclose([r["loss"] for r in log], [ref[s] for s in steps], rtol=1e-4)
    assert json.loads((out / "branch.json").read_text()) == {"parent": str(parent), "step": 32}
    # Errors name the problem.
    assert cli_main(["train", "--branch-from", f"{parent}@64", "--tokens",
                     str(TOK_PER_STEP * 40), "--out", str(tmp_path / "x")]) == 2
    assert "starts its decay at step 32, before 64" in capsys.readouterr().err
    assert cli_main(["train", "--branch-from", f"{parent}@16", "--tokens",
                     str(TOK_PER_STEP * 40), "--out", str(tmp_path / "y")]) == 2
    assert "no checkpoint at step 16" in capsys.readouterr().err
    assert cli_main(["train", "--branch-from", f"{tmp_path / 'w40'}@32", "--config",
                     str(tmp_path / "w40" / "config.yaml"), "train.schedule=published",
                     "--out", str(tmp_path / "z")]) == 2
    assert "branch differs from" in capsys.readouterr().err


def test_branch_spec_and_parent_errors(tmp_path):
    assert parse_spec("runs/a@12") == (Path("runs/a"), 12)
    with pytest.raises(BranchError, match="RUN@STEP"):
        parse_spec("runs/a")
    assert cli_main(["train", "--branch-from", f"{tmp_path}@3", "--out", str(tmp_path / "o")]) == 2


@pytest.mark.slow
def test_branches_at_three_budgets_match_full_runs(corpus, tmp_path):
    """One 200-step WSD run; cooldown branches at 50 and 100 steps (the parent is the 200-step
    budget). Each equals an independent WSD run of its budget, and is within 1% of (measured:
    0.6-2.5% below) an independent run with the published linear-decay schedule."""
    cache, parent = tmp_path / "cache", tmp_path / "parent"
    kw = dict(ckpt_every=20, warmup_steps=10)
    ends = {200: train(_run(corpus, cache, 200, schedule="wsd", **kw), parent,
                       progress=False)["val_loss"]}
    for s in (50, 100):
        ends[s] = train(_run(corpus, cache, s, schedule="wsd", **kw), tmp_path / f"b{s}",
                        progress=False, branch_from=(parent, s - round(0.2 * s)))["val_loss"]
    for s, loss in ends.items():
        wsd = train(_run(corpus, cache, s, schedule="wsd", **kw), tmp_path / f"w{s}",
                    progress=False)["val_loss"]
        pub = train(_run(corpus, cache, s, **kw), tmp_path / f"p{s}", progress=False)["val_loss"]
        assert loss == pytest.approx(wsd, rel=1e-4)
        assert loss <= 1.01 * pub, (s, loss, pub)
