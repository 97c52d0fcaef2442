"""analysis.critical_batch against closed-form and simulated truth: the trade-off fit recovers
S_min, E_min and B_crit = E_min / S_min (and matches scipy's least squares), its intervals cover
on simulated studies unlike the sweep it was built for, a synthetic sweep whose steps-to-target
follow the trade-off exactly is measured back through its curves, and the power law in N and D
recovers known exponents with calibrated intervals."""
import json

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import least_squares

from analysis import batch_tradeoff as cb
from analysis.gns import fit_bcrit_scaling
from analysis.plots import plot_batch_tradeoff
from cgpt.results_schema import REQUIRED

SEQ = 128


def test_smoothing_and_crossing_are_exact_on_a_straight_line():
    steps = np.arange(1, 201, dtype=float)
    loss = 5.0 - 0.01 * steps                       # a centred mean keeps a straight line
    smooth = cb.smooth_loss(steps, loss, width=0.1)
    assert np.allclose(smooth[20:180], loss[20:180])
    assert cb.steps_to_loss(steps, smooth, 4.0) == pytest.approx(100.0)
    assert cb.steps_to_loss(steps, loss, 4.005) == pytest.approx(99.5)   # interpolated
    assert np.isnan(cb.steps_to_loss(steps, loss, 2.0))                   # never reached
    with pytest.raises(ValueError, match="width=1"):
        cb.smooth_loss(steps, loss, width=1.0)


def test_tradeoff_recovers_closed_form_and_matches_scipy():
    batch = np.array([4, 8, 16, 32, 64, 128.])
    exact = cb.fit_tradeoff(batch, 80 + 1600 / batch, n_boot=50)
    assert (exact.s_min, exact.e_min, exact.b_crit) == pytest.approx((80, 1600, 20), rel=1e-8)
    assert exact.bracketed
    # (S/S_min - 1)(E/E_min - 1) = 1 on the fitted curve
    s = exact.predict(batch)
    assert np.allclose((s / exact.s_min - 1) * (s * batch / exact.e_min - 1), 1)
    rng = np.random.default_rng(3)
    steps = (80 + 1600 / batch) * np.exp(0.08 * rng.standard_normal(batch.size))
    fit = cb.fit_tradeoff(batch, steps, n_boot=200)
    ref = least_squares(lambda t: np.log(steps) - np.log(np.exp(t[0]) + np.exp(t[1]) / batch),
                        [np.log(50), np.log(1000)], xtol=1e-14, ftol=1e-14)
    assert (fit.s_min, fit.e_min) == pytest.approx(tuple(np.exp(ref.x)), rel=1e-6)
    lo, hi = fit.ci["b_crit"]
    assert lo < fit.b_crit < hi


def test_tradeoff_bias_and_coverage_on_simulated_sweeps():
    """Studies unlike the committed sweep (7 batch sizes from 2 to 505, B_crit 50 sequences
    near the middle, 8% scatter in log S): the median log-bias of B_crit is small and the 95%
    intervals cover the truth in >= 88% of 200 studies (measured: 0.95, bias -0.008)."""
    batch = 2.0 ** np.arange(1, 10, 1.33)
    s_min, e_min = 300.0, 15000.0
    rng = np.random.default_rng(0)
    hits, bias = 0, []
    for i in range(200):
        steps = (s_min + e_min / batch) * np.exp(0.08 * rng.standard_normal(batch.size))
        fit = cb.fit_tradeoff(batch, steps, n_boot=200, seed=i)
        lo, hi = fit.ci["b_crit"]
        hits += lo <= 50 <= hi
        bias.append(np.log(fit.b_crit / 50))
    assert abs(np.median(bias)) < 0.03
    assert hits / 200 >= 0.88


def test_tradeoff_needs_three_batch_sizes():
    with pytest.raises(ValueError, match=">= 3 distinct batch sizes"):
        cb.fit_tradeoff([4, 8, 16], [100, np.nan, 30])
    with pytest.raises(ValueError, match="level=95"):
        cb.fit_tradeoff([4, 8, 16], [100, 60, 30], level=95)


# A synthetic sweep: S(L, B) = S_min(L) + E_min(L) / B exactly, with S_min = 50 u and
# E_min = 1000 u^2, u = (4 / L)^4, so B_crit(L) = 20 u; the logged noise estimates give
# B_simple = B_crit / RATIO. Each batch size has a good LR (these curves) and two worse ones
# (1.3x and 1.6x the steps).
RATIO = 1.5


def _loss_curve(steps: np.ndarray, batch: int, slow: float) -> np.ndarray:
    s = steps / slow
    u = (-50 + np.sqrt(2500 + 4000 * s / batch)) / (2000 / batch)
    return 4.0 / u ** 0.25


def _sweep(tmp_path, batches=(4, 8, 16, 32, 64, 128), lrs=(1e-3, 2e-3, 4e-3)):
    rows = []
    for b in batches:
        for lr, slow in zip(lrs, (1.3, 1.0, 1.6)):
            rid = f"b{b}_lr{lr:g}"
            d = tmp_path / rid
            d.mkdir()
            u = (4 / 3.2) ** 4                      # the lowest target, reached by the good LR
            steps = np.arange(1, int(1.1 * (50 * u + 1000 * u ** 2 / b)))
            loss = _loss_curve(steps.astype(float), b, slow)
            u = (4.0 / loss) ** 4
            with open(d / "metrics.jsonl", "w") as f:
                for s, l, ui in zip(steps, loss, u):
                    f.write(json.dumps({"step": int(s), "tokens": int(s) * b * SEQ,
                                        "loss": float(l), "gns_g2": 2.0,
                                        "gns_trace": 2.0 * 20 * ui / RATIO}) + "\n")
            (d / "summary.json").write_text(json.dumps({"seq_len": SEQ, "batch_size": b}))
            rows.append({c: np.nan for c in REQUIRED} | {
                "run_id": rid, "model": "m", "seed": 0, "status": "done", "error": "",
                "n_params": 25000, "n_params_nonembed": 10000, "tokens": steps[-1] * b * SEQ,
                "flops": 1e11, "flops_6nd": 1e11, "val_loss": float(loss[-1]), "mup": False,
                "run_dir": str(d), "peak_lr": lr})
    pd.DataFrame(rows).to_csv(tmp_path / "results.csv", index=False)


def test_a_sweep_on_the_tradeoff_is_measured_back(tmp_path):
    _sweep(tmp_path)
    targets = [3.6, 3.4, 3.2]
    table = cb.crossings(tmp_path, targets, width=0.05)
    assert len(table) == 18 * 3 and set(table["target"]) == set(targets)
    best = cb.best_lr(table)
    assert (best["peak_lr"] == 2e-3).all() and not best["lr_at_edge"].any()
    res, fits = cb.measure_critical_batch(table, n_boot=200)
    u = (4.0 / res["target"].to_numpy()) ** 4
    assert np.allclose(res["s_min"], 50 * u, rtol=0.03)
    assert np.allclose(res["e_min"], 1000 * u ** 2, rtol=0.03)
    assert np.allclose(res["b_crit"], 20 * u, rtol=0.03)
    assert np.allclose(res["b_simple"], 20 * u / RATIO, rtol=0.05)
    assert np.allclose(res["ratio"], RATIO, rtol=0.06) and res["within_2x"].all()
    assert ((res["b_crit_lo"] <= res["b_crit"]) & (res["b_crit"] <= res["b_crit_hi"])).all()
    assert np.allclose(res["D"], res["e_min"] * SEQ)
    # B_crit ~ u ~ L^-4 exactly: the loss law is recovered from the measured points
    law = fit_bcrit_scaling(res, on=("target",))
    assert law.exponents["target"] == pytest.approx(-4.0, abs=0.15)
    assert set(fits) == {(25000.0, t) for t in targets}
    fig = plot_batch_tradeoff(res, fits, path=tmp_path / "tradeoff.png")
    assert len(fig.axes) == 2 and (tmp_path / "tradeoff.png").stat().st_size > 5000


def test_bad_input_is_one_clear_error(tmp_path):
    _sweep(tmp_path, batches=(4, 16, 64))
    with pytest.raises(ValueError, match="give one or more positive target losses"):
        cb.crossings(tmp_path, [])
    res = pd.read_csv(tmp_path / "results.csv").drop(columns="peak_lr")
    res.to_csv(tmp_path / "results.csv", index=False)
    with pytest.raises(ValueError, match="column 'peak_lr'"):
        cb.crossings(tmp_path, [3.4])


def test_best_lr_at_the_grids_edge_is_flagged(tmp_path):
    _sweep(tmp_path, batches=(4, 16, 64), lrs=(2e-3, 1e-3, 4e-3))   # the fast curve is the smallest
    best = cb.best_lr(cb.crossings(tmp_path, [3.4]))
    assert (best["peak_lr"] == 1e-3).all() and best["lr_at_edge"].all()


def test_scaling_fit_recovers_exponents_with_calibrated_intervals():
    rng = np.random.default_rng(1)
    hits = {"N": 0, "D": 0}
    for i in range(400):
        n = np.repeat([1e6, 4e6, 1.6e7], 4)
        d = np.tile([2e8, 8e8, 3.2e9, 1.3e10], 3) * rng.uniform(0.8, 1.25, 12)
        b = 0.02 * n ** 0.1 * d ** 0.45 * np.exp(0.1 * rng.standard_normal(12))
        fit = fit_bcrit_scaling(pd.DataFrame({"N": n, "D": d, "b_crit": b}))
        for k, true in (("N", 0.1), ("D", 0.45)):
            lo, hi = fit.ci[k]
            hits[k] += lo <= true <= hi
    assert 0.92 <= hits["N"] / 400 <= 0.98 and 0.92 <= hits["D"] / 400 <= 0.98
    exact = fit_bcrit_scaling(pd.DataFrame({"N": n, "D": d, "b_crit": 0.02 * n ** 0.1 * d ** 0.45}))
    assert exact.exponents == pytest.approx({"N": 0.1, "D": 0.45})
    assert exact.k == pytest.approx(0.02)
    assert np.allclose(exact.predict(N=n, D=d), 0.02 * n ** 0.1 * d ** 0.45)
    assert "exponent of D: 0.450" in exact.summary()


def test_scaling_fit_refuses_what_the_data_cannot_identify():
    one_n = pd.DataFrame({"N": [1e6] * 4, "D": [1e8, 2e8, 4e8, 8e8], "b_crit": [10, 14, 20, 28]})
    with pytest.raises(ValueError, match=r"column 'N' takes one value .* on=\('D',\)"):
        fit_bcrit_scaling(one_n)
    assert fit_bcrit_scaling(one_n, on=("D",)).exponents["D"] == pytest.approx(0.5, abs=0.02)
    tied = pd.DataFrame({"N": [1e6, 2e6, 4e6, 8e6], "D": [2e7, 4e7, 8e7, 1.6e8],
                         "b_crit": [10, 14, 20, 28]})                 # D = 20 N: collinear
    with pytest.raises(ValueError, match="collinear"):
        fit_bcrit_scaling(tied)
    rounded = tied.assign(D=tied["D"] * [1.0, 1.001, 0.999, 1.0005])  # whole steps of a batch
    with pytest.raises(ValueError, match="collinear"):
        fit_bcrit_scaling(rounded)
    with pytest.raises(ValueError, match=r"no column\(s\) \['loss'\]"):
        fit_bcrit_scaling(one_n, on=("loss",))


def test_the_bundled_spec_and_the_notebooks_data_are_one_sweep():
    """sweeps/critical_batch.yaml: one model, >= 6 batch sizes, each with three peak LRs
    around the square-root rule, a constant LR, the noise scale logged every step; the data
    notebook 06 reads is a finished run of exactly that spec."""
    from pathlib import Path

    from cgpt.sweep.spec import load_sweep

    root = Path(__file__).resolve().parents[2]
    runs = load_sweep(root / "sweeps" / "critical_batch.yaml").runs
    by_batch: dict = {}
    for r in runs:
        t = r.config.train
        assert t.gns and t.log_every == 1 and t.schedule == "wsd" and t.end_lr_fraction == 1.0
        by_batch.setdefault(t.batch_size, []).append(t.peak_lr)
    assert len({r.model for r in runs}) == 1 and len(by_batch) >= 6
    for b, lrs in by_batch.items():
        assert sorted(lrs) == pytest.approx([f * 4e-3 * (b / 16) ** 0.5 for f in (0.5, 1, 2)],
                                            rel=0.01)
    data = root / "notebooks" / "data" / "critical_batch" / "batch_sweep"
    res = pd.read_csv(data / "results.csv")
    assert sorted(res["run_id"]) == sorted(r.run_id for r in runs)
    assert (res["status"] == "done").all()
    for rid in res["run_id"]:
        assert (data / rid / "metrics.jsonl").stat().st_size > 0


# ---- issue 48: the critical batch by either definition, from any steps-to-target table ------
def test_overhead_definition_is_zhangs_cbs_with_calibrated_intervals():
    """Zhang et al.'s CBS: the batch where S(B) exceeds linear scaling from b_ref by 20%,
    checked against S(B) itself; on simulated studies unlike the sweep (5 batch sizes from 64
    to 4096, B_crit 2000 near the top, 5% scatter) its 95% interval covers and its bias is
    small."""
    batch = np.array([64, 128, 256, 512, 1024, 2048, 4096, 8192.])
    fit = cb.fit_tradeoff(batch, 1300 + 2.8e6 / batch, n_boot=100)
    cbs, lo, hi = fit.critical_batch("overhead", b_ref=256, overhead=0.2)
    s_ref = fit.predict(256)
    assert fit.predict(cbs) == pytest.approx(1.2 * s_ref * 256 / cbs)   # the definition itself
    assert cbs == pytest.approx(2.8e6 / 1300 / 5 + 1.2 * 256)            # Zhang's b/(5a)+1.2*256
    assert fit.critical_batch()[0] == pytest.approx(fit.b_crit) and lo <= cbs <= hi
    assert fit.b_crit / cbs > 2.5                                        # the 3-4x of the issue
    rng = np.random.default_rng(5)
    batch = np.geomspace(64, 4096, 5)
    truth = 0.2 * 2000 + 1.2 * 128
    hits, bias = 0, []
    for i in range(150):
        steps = (500 + 1e6 / batch) * np.exp(0.05 * rng.standard_normal(batch.size))
        est, lo, hi = cb.fit_tradeoff(batch, steps, n_boot=200, seed=i).critical_batch(
            "overhead", b_ref=128, overhead=0.2)
        hits += lo <= truth <= hi
        bias.append(np.log(est / truth))
    assert abs(np.median(bias)) < 0.03 and hits / 150 >= 0.88


def test_any_steps_table_is_measured_with_either_definition():
    batch = np.array([64, 128, 256, 512, 1024, 4096.])
    rows = [{"N": n, "target": 3.3, "batch_size": b, "steps": s_min + e_min / b}
            for n, s_min, e_min in ((85e6, 1300, 2.8e6), (151e6, 1750, 5.7e6)) for b in batch]
    table = pd.DataFrame(rows)
    mc, _ = cb.measure_critical_batch(table, n_boot=50)
    assert np.allclose(mc["b_crit"], [2.8e6 / 1300, 5.7e6 / 1750])
    assert mc["b_simple"].isna().all() and mc["D"].isna().all()
    zh, _ = cb.measure_critical_batch(table, n_boot=50, definition="overhead", b_ref=256,
                                      seq_len=512)
    assert np.allclose(zh["b_crit"], 0.2 * mc["b_crit"] + 1.2 * 256)
    assert (zh["definition"] == "overhead").all() and (zh["b_ref"] == 256).all()
    assert np.allclose(zh["D"], zh["e_min"] * 512)
    bare, _ = cb.measure_critical_batch(table[table["N"] == 85e6][["batch_size", "steps"]],
                                        n_boot=20)                   # one model, one target
    assert len(bare) == 1 and bare["b_crit"].iloc[0] == pytest.approx(2.8e6 / 1300)
    two_lrs = pd.concat([table.assign(peak_lr=1e-3), table.assign(peak_lr=2e-3,
                                                                  steps=table["steps"] * 1.3)])
    again, _ = cb.measure_critical_batch(two_lrs, n_boot=20)
    assert np.allclose(again["b_crit"], mc["b_crit"])
    with pytest.raises(ValueError, match="no column 'steps'.*rename"):
        cb.measure_critical_batch(table.drop(columns="steps"))
    with pytest.raises(ValueError, match="2 rows for batch size 64 .*no 'peak_lr' column"):
        cb.measure_critical_batch(pd.concat([table, table.iloc[:1]]))
    with pytest.raises(ValueError, match="b_ref=None: definition='overhead' needs"):
        cb.measure_critical_batch(table, definition="overhead")
    with pytest.raises(ValueError, match="definition='cbs'"):
        cb.measure_critical_batch(table, definition="cbs")


def test_scaling_fit_names_near_collinear_predictors():
    rng = np.random.default_rng(2)
    n = np.geomspace(1e7, 1e9, 8)
    d = 20 * n * rng.uniform(0.6, 1.6, 8)         # Chinchilla-like: D tracks N
    b = 0.02 * n ** 0.1 * d ** 0.45 * np.exp(0.05 * rng.standard_normal(8))
    with pytest.warns(UserWarning, match=r"columns 'N' and 'D' correlate r = 0\.9\d\d"):
        fit = fit_bcrit_scaling(pd.DataFrame({"N": n, "D": d, "b_crit": b}))
    assert fit.max_corr > 0.9 and "NEAR COLLINEAR" in fit.summary()
    tied = pd.DataFrame({"N": n, "D": 20 * n, "b_crit": b})
    with pytest.raises(ValueError, match=r"'N' and 'D': r = 1\.0000"):
        fit_bcrit_scaling(tied)
