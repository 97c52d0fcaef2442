"""analysis.transfer: each width's best LR with an interval, and the μP vs SP drift."""
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import COLUMNS
from analysis.transfer import (lr_drift, lr_drift_ci, lr_optimum, lr_sweep, plot_lr_transfer,
                               seed_optimum, transfer_table)

LRS = [1.25e-3, 2.5e-3, 5e-3, 1e-2, 2e-2, 4e-2]
WIDTHS = [16, 32, 64, 128]


def _curve(best, lrs=LRS, noise=0.0, seed=0):
    x = np.log(np.asarray(lrs) / best)
    return 4.0 + 0.05 * x ** 2 + noise * np.random.default_rng(seed).standard_normal(len(lrs))


def test_optimum_recovers_the_vertex_with_an_interval():
    o = lr_optimum(LRS, _curve(7e-3))
    assert o.edge == "" and o.lr == pytest.approx(7e-3, rel=1e-6)
    assert o.lo < 7e-3 < o.hi and o.hi / o.lo < 2  # 0.35% noise floor: a narrow interval
    noisy = [lr_optimum(LRS, _curve(7e-3, noise=0.03, seed=s)) for s in range(40)]
    covered = np.mean([n.lo <= 7e-3 <= n.hi for n in noisy])
    assert covered >= 0.8, covered
    assert np.median([n.hi / n.lo for n in noisy]) > o.hi / o.lo  # noise widens it


def test_optimum_on_the_grid_edge_is_open_on_that_side():
    hi = lr_optimum(LRS, _curve(1.0))
    assert hi.edge == "high" and hi.lr == LRS[-1] and hi.lo == LRS[-2] and math.isinf(hi.hi)
    lo = lr_optimum(LRS, _curve(1e-5))
    assert lo.edge == "low" and lo.lr == LRS[0] and lo.lo == 0 and lo.hi == LRS[1]
    assert "grid high edge" in str(hi)
    with pytest.raises(ValueError, match=">= 3 distinct LRs"):
        lr_optimum([1e-3, 2e-3, 2e-3], [1.0, 0.9, np.nan])


def _write_sweep(root):
    """An LR x width sweep directory: μP's optimum fixed at 8e-3, SP's ~ 1/width."""
    rows = []
    for mup in (True, False):
        for w in WIDTHS:
            best = 8e-3 if mup else 8e-3 * 32 / w
            for lr, loss in zip(LRS, _curve(best) - 0.1 * math.log(w)):
                rid = f"w{w}-{'mup' if mup else 'sp'}_lr{lr}"
                (root / rid).mkdir(parents=True)
                (root / rid / "config.yaml").write_text(yaml.safe_dump(
                    {"model": {"d_model": w, "mup": mup}, "train": {"peak_lr": lr}}))
                row = dict.fromkeys(COLUMNS, 0)
                n, d = 12 * 2 * w * w, 20 * 12 * 2 * w * w  # a finished run's counts: > 0
                row.update(run_id=rid, model=rid, status="done", val_loss=loss, mup=mup,
                           train_loss=loss, n_params=n, n_params_nonembed=n, tokens=d,
                           flops=6 * n * d, flops_6nd=6 * n * d,
                           run_dir=f"elsewhere/{rid}", error="")
                rows.append(row)
    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(root / "results.csv", index=False)
    return root


def test_sweep_table_drift_and_plot(tmp_path):
    sweep = lr_sweep(_write_sweep(tmp_path / "sweep"))
    assert len(sweep) == 2 * len(WIDTHS) * len(LRS)
    assert set(sweep["param"]) == {"μP", "SP"}
    table = transfer_table(sweep)
    mup = table[table["param"] == "μP"]
    np.testing.assert_allclose(mup["lr_opt"], 8e-3, rtol=1e-6)
    drift = lr_drift(table)
    assert abs(drift["μP"]) < 1e-6 and drift["SP"] == pytest.approx(-1.0, abs=0.05)
    out = tmp_path / "lr.png"
    plot_lr_transfer(sweep, table, path=out)
    assert out.stat().st_size > 10_000


def test_sweep_without_peak_lr_is_an_error(tmp_path):
    root = _write_sweep(tmp_path / "sweep")
    f = next(root.glob("*/config.yaml"))
    f.write_text(yaml.safe_dump({"model": {"d_model": 16, "mup": True}, "train": {}}))
    with pytest.raises(ValueError, match="train.peak_lr is unset"):
        lr_sweep(root)
    f.unlink()
    with pytest.raises(FileNotFoundError, match="no config.yaml for run"):
        lr_sweep(root)


# --- several seeds per point: the interval is the seed variance ------------------------------

GRID = 3.125e-4 * 2.0 ** np.arange(11)  # sweeps/mup_transfer.yaml's LR grid


def _seeded(rng, best, seeds=3, noise=0.01, offset=0.02, lrs=GRID):
    """One simulated study: loss = quadratic in log LR with its minimum at `best`, plus a
    per-seed offset (moves no optimum) and independent per-run noise (moves each seed's)."""
    lr, loss, sd = [], [], []
    for s in range(seeds):
        y = (4.0 + 0.05 * np.log(lrs / best) ** 2 + offset * rng.standard_normal()
             + noise * rng.standard_normal(len(lrs)))
        lr += list(lrs)
        loss += list(y)
        sd += [s] * len(lrs)
    return lr, loss, sd


def test_seed_interval_covers_the_optimum_at_the_nominal_rate():
    rng = np.random.default_rng(0)
    hits, widths = [], []
    for _ in range(400):
        best = float(np.exp(rng.uniform(np.log(2e-3), np.log(5e-2))))
        o = seed_optimum(*_seeded(rng, best))
        assert o.edge == "" and len(o.seed_lrs) == 3 and o.lo < o.lr < o.hi
        hits.append(o.lo <= best <= o.hi)
        widths.append(o.hi / o.lo)
    # 400 studies: 95% nominal, binomial sd 1.1%; measured 95.3% over 2000 studies
    assert 0.91 <= np.mean(hits) <= 0.985, np.mean(hits)
    quiet = [seed_optimum(*_seeded(rng, 1e-2, noise=0.002)) for _ in range(50)]
    assert np.median([q.hi / q.lo for q in quiet]) < np.median(widths)  # less seed noise: narrower
    # the interval is the spread of the per-seed optima with the t factor (3 seeds: 4.30)
    v = np.log(quiet[0].seed_lrs)
    half = 4.3027 * v.std(ddof=1) / np.sqrt(3)
    assert quiet[0].lr == pytest.approx(np.exp(v.mean()), rel=1e-9)
    assert quiet[0].hi == pytest.approx(np.exp(v.mean() + half), rel=1e-4)


def test_seed_optimum_on_the_grid_edge_is_flagged_and_open():
    rng = np.random.default_rng(1)
    o = seed_optimum(*_seeded(rng, 2.0, noise=0.002))  # optimum far above 0.32
    assert o.edge == "high" and o.lr == GRID[-1] and math.isinf(o.hi) and o.seed_edges == 3
    low = seed_optimum(*_seeded(rng, 1e-5, noise=0.002))
    assert low.edge == "low" and low.lo == 0 and low.hi == GRID[1]
    inside = seed_optimum(*_seeded(rng, 1e-2, noise=0.002))
    assert inside.edge == "" and inside.seed_edges == 0


def test_seed_optimum_bad_input():
    lr, loss, sd = _seeded(np.random.default_rng(2), 1e-2)
    with pytest.raises(ValueError, match=">= 2 seeds"):
        seed_optimum(lr[:11], loss[:11], sd[:11])
    with pytest.raises(ValueError, match="level=1.5"):
        seed_optimum(lr, loss, sd, level=1.5)
    loss = np.array(loss)
    near = np.isin(np.asarray(lr), GRID[4:7]) & (np.asarray(sd) == 1)  # seed 1's runs near 1e-2
    loss[near] = np.nan
    with pytest.raises(ValueError, match="seed 1: finite losses at only 2 of the LRs"):
        seed_optimum(lr, loss, sd)


def _seeded_sweep(rng, k_sp=-1.0, seeds=3, noise=0.01):
    rows = []
    for param, k in (("μP", 0.0), ("SP", k_sp)):
        for w in WIDTHS:
            lr, loss, sd = _seeded(rng, 1e-2 * (w / 32) ** k, seeds=seeds, noise=noise)
            rows += [{"param": param, "width": w, "peak_lr": a, "seed": s, "loss": b}
                     for a, b, s in zip(lr, loss, sd)]
    return pd.DataFrame(rows)


def test_drift_interval_from_the_seeds_covers_the_true_exponent():
    rng = np.random.default_rng(3)
    hits = {"μP": [], "SP": []}
    for _ in range(60):
        table = transfer_table(_seeded_sweep(rng))
        assert (table["seeds"] == 3).all() and (table["edge"] == "").all()
        ci = lr_drift_ci(table)
        point = lr_drift(table)
        for param, truth in (("μP", 0.0), ("SP", -1.0)):
            k, lo, hi = ci[param]
            assert k == pytest.approx(point[param], abs=1e-9)  # the mean of the per-seed slopes
            hits[param].append(lo <= truth <= hi)
    for param, h in hits.items():
        assert 0.88 <= np.mean(h) <= 1.0, (param, np.mean(h))


def test_drift_interval_refuses_edges_and_single_seeds(tmp_path):
    rng = np.random.default_rng(4)
    table = transfer_table(_seeded_sweep(rng, k_sp=-8.0, noise=0.002))  # SP at 128: off the grid
    assert set(table.loc[table["edge"] != "", "param"]) == {"SP"}
    with pytest.raises(ValueError, match="grid edge, so the drift is only a bound"):
        lr_drift_ci(table)
    one = transfer_table(lr_sweep(_write_sweep(tmp_path / "sweep")))  # one seed per point
    assert (one["seeds"] == 1).all()
    with pytest.raises(ValueError, match="same number \\(>= 2\\) of seeds"):
        lr_drift_ci(one)
    out = tmp_path / "seeded.png"
    plot_lr_transfer(_seeded_sweep(rng), path=out)
    assert out.stat().st_size > 10_000
