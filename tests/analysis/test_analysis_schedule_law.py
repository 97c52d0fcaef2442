"""analysis.fit_schedule_law: curves simulated from each law with known parameters and noise
are recovered (parameters, and the final loss of a schedule the fit never saw); bad input is
one clear error."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis import fit_schedule_law, read_schedule_curves
from analysis.schedule_law import PARAMS, _curve, _features

PEAK, T, WARM = 2e-3, 300, 30


def lrs(kind: str, frac: float = 0.2, end: float = 0.1) -> np.ndarray:
    """cgpt's shapes: linear warmup, then constant, cosine, linear, or WSD (linear cooldown
    over the last `frac`), ending at `end` x peak."""
    s = np.arange(1, T + 1, dtype=float)
    eta = np.full(T, PEAK)
    eta[:WARM] = PEAK * s[:WARM] / WARM
    p = (s[WARM:] - WARM) / (T - WARM)
    if kind == "cosine":
        eta[WARM:] = PEAK * (end + (1 - end) * 0.5 * (1 + np.cos(np.pi * p)))
    elif kind == "linear":
        eta[WARM:] = PEAK * (1 - (1 - end) * p)
    elif kind == "wsd":
        d = round(frac * T)
        eta[T - d:] = PEAK * (1 - (1 - end) * (s[T - d:] - (T - d)) / d)
    return eta


def truth(form, params, eta):
    """The law's loss at each logged step (step 1, before any update, copies step 2's)."""
    loss = _curve(form, np.array(params, float), _features(eta / PEAK, np.arange(eta.size),
                                                           0.999))
    assert np.isnan(loss[0])
    return np.concatenate([loss[1:2], loss[1:]])


def simulate(form, params, kinds, sigma, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    out = []
    for name, eta in kinds.items():
        loss = truth(form, params, eta) + sigma * rng.standard_normal(eta.size)
        out.append(pd.DataFrame({"run_id": name, "step": np.arange(1, T + 1), "lr": eta,
                                 "loss": loss}))
    return pd.concat(out, ignore_index=True)


TISSUE = [3.0, 2.0, 0.5, 0.004]                 # L0, A, alpha, C
MULTIPOWER = [3.0, 2.0, 0.5, 0.3, 2.0, 0.6, 0.5]  # L0, A, alpha, B, C, beta, gamma


def test_tissue_recovered_from_constant_and_wsd():
    curves = simulate("tissue", TISSUE, {"constant": lrs("constant"), "wsd": lrs("wsd")}, 0.005)
    fit = fit_schedule_law(curves, "tissue", n_boot=40)
    got = fit.params
    late = fit_schedule_law(curves, "tissue", n_boot=0, start=150)
    assert late.n_points == 2 * (T - 149) and late.params["C"] == pytest.approx(0.004, rel=0.1)
    assert got["L0"] == pytest.approx(3.0, abs=0.02)
    assert got["alpha"] == pytest.approx(0.5, abs=0.05)
    assert got["C"] == pytest.approx(0.004, rel=0.05)
    for kind in ("cosine", "linear"):  # never fitted
        want = truth("tissue", TISSUE, lrs(kind))[-15:].mean()
        est, lo, hi = fit.final_loss(lrs(kind))
        assert abs(est / want - 1) < 0.005  # the issue's 0.5%
        assert lo <= want <= hi
    assert "Tissue" in fit.summary() and "C = " in fit.summary()
    assert "NOT PINNED" not in fit.summary()


def test_multipower_recovered_from_three_schedules():
    kinds = {"constant": lrs("constant"), "wsd": lrs("wsd"), "cosine": lrs("cosine")}
    curves = simulate("multipower", MULTIPOWER, kinds, 0.003)
    fit = fit_schedule_law(curves, "multipower", n_boot=20)
    got = fit.params
    assert got["L0"] == pytest.approx(3.0, abs=0.02)
    assert got["alpha"] == pytest.approx(0.5, abs=0.05)
    assert got["B"] == pytest.approx(0.3, rel=0.15)
    assert got["gamma"] == pytest.approx(0.5, abs=0.2)
    for kind, eta in {"linear": lrs("linear"), "wsd10": lrs("wsd", 0.1)}.items():
        want = truth("multipower", MULTIPOWER, eta)
        pred = fit.predict(eta)
        assert len(pred) == T and pred["loss"].isna().tolist() == [True] + [False] * (T - 1)
        assert (pred["lo"] <= pred["hi"])[1:].all()
        after = slice(WARM, None)
        assert np.max(np.abs(pred["loss"].to_numpy()[after] / want[after] - 1)) < 0.003
        est, lo, hi = fit.final_loss(eta)
        assert lo <= want[-15:].mean() <= hi


def test_the_two_laws_differ_where_they_should():
    """A multi-power curve fitted with Tissue's form: the forms are not the same law, so the
    misfit shows in the rmse (the noise is 0.001)."""
    kinds = {"constant": lrs("constant"), "wsd": lrs("wsd", 0.5)}
    curves = simulate("multipower", MULTIPOWER, kinds, 0.001)
    tissue = fit_schedule_law(curves, "tissue", n_boot=0)
    multi = fit_schedule_law(curves, "multipower", n_boot=0)
    assert multi.rmse < 0.0012 < tissue.rmse
    flat = curves.assign(loss=3.0 + 0.001 * np.random.default_rng(1).standard_normal(len(curves)))
    assert "NOT PINNED" in fit_schedule_law(flat, "tissue", n_boot=0).summary()


def test_resampling_runs(tmp_path):
    kinds = {f"wsd{f}": lrs("wsd", f) for f in (0.1, 0.2, 0.3)}
    curves = simulate("tissue", TISSUE, kinds, 0.005)
    fit = fit_schedule_law(curves, "tissue", n_boot=20, resample="runs")
    assert fit.boot.shape[1] == 4 and "runs resamples" in fit.summary()


def _write_run(d, recs):
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_reads_run_directories(tmp_path):
    curves = simulate("tissue", TISSUE, {"constant": lrs("constant"), "wsd": lrs("wsd")}, 0.005)
    dirs = []
    for name, g in curves.groupby("run_id"):
        _write_run(tmp_path / name, [{"step": int(s), "lr": float(lr), "loss": float(x),
                                      "tokens": int(s) * 4096}
                                     for s, lr, x in zip(g["step"], g["lr"], g["loss"])])
        dirs.append(tmp_path / name)
    back = read_schedule_curves(dirs)
    assert set(back["run_id"]) == {"constant", "wsd"} and len(back) == 2 * T
    fit = fit_schedule_law(dirs, "tissue", n_boot=0)
    assert fit.params["C"] == pytest.approx(0.004, rel=0.05)


def test_bad_input_is_one_clear_error(tmp_path):
    good = simulate("tissue", TISSUE, {"constant": lrs("constant"), "wsd": lrs("wsd")}, 0.005)
    with pytest.raises(ValueError, match="form='power'"):
        fit_schedule_law(good, "power")
    with pytest.raises(ValueError, match=r"no column\(s\) \['lr'\]"):
        fit_schedule_law(good.drop(columns="lr"))
    with pytest.raises(ValueError, match="no record for step 11.*log_every=1"):
        fit_schedule_law(good[good["step"] != 11])
    bad = good.copy()
    bad.loc[5, "loss"] = np.inf
    with pytest.raises(ValueError, match="run 'constant' has a loss that is not a finite"):
        fit_schedule_law(bad)
    with pytest.raises(ValueError, match="no run's LR decays after its peak"):
        fit_schedule_law(good[good["run_id"] == "constant"])
    with pytest.raises(ValueError, match="resample='runs' with 2 run"):
        fit_schedule_law(good, resample="runs")
    with pytest.raises(ValueError, match="level=95"):
        fit_schedule_law(good, level=95)
    with pytest.raises(ValueError, match="step 299; the law is fitted to those records"):
        fit_schedule_law(good, start=299)
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        fit_schedule_law([tmp_path / "nope"])
    _write_run(tmp_path / "nolr", [{"step": 1, "loss": 5.0}])
    with pytest.raises(ValueError, match="no 'lr' logged"):
        fit_schedule_law([tmp_path / "nolr"])
    fit = fit_schedule_law(good, "tissue", n_boot=0)
    with pytest.raises(ValueError, match="lrs: a sequence"):
        fit.predict([0.001, -1.0])
    with pytest.raises(ValueError, match="metric='val'"):
        fit_schedule_law(good, metric="val")
    with pytest.raises(ValueError, match=r"no column\(s\) \['val_loss'\]"):
        fit_schedule_law(good, metric="val_loss")
    with pytest.raises(ValueError, match="run 'constant' has no val_loss record.*eval_every"):
        fit_schedule_law(good.assign(val_loss=np.nan), metric="val_loss")
    inf = good.assign(val_loss=np.where(good["step"] == 100, np.inf, np.nan))
    with pytest.raises(ValueError, match="has a val_loss that is not a finite number .at step 100"):
        fit_schedule_law(inf, metric="val_loss")


# ---- the law fitted to evaluations on a fixed set (metric="val_loss") ----------------------
def tissue_after(params, eta, lam=0.999):
    """Tissue's law written out step by step, independent of the module: the loss of the
    weights after updates 1..s (the val_loss logged at step s), s = 1..T."""
    l0, a, alpha, c = params
    p = int(np.argmax(eta)) + 1                  # the peak step, 1-based
    s1 = m = s2 = 0.0
    out = []
    for s in range(1, eta.size + 1):
        s1 += eta[s - 1] / PEAK
        if s > p:
            m = lam * m + (eta[s - 2] - eta[s - 1]) / PEAK
        s2 += m
        out.append(l0 + a * s1 ** -alpha - c * s2)
    return np.array(out)


def evaluations(kinds, every, sigma, seed=0, params=TISSUE):
    """val_loss every `every` steps (and at the end), NaN elsewhere; loss noise-free."""
    rng = np.random.default_rng(seed)
    out = []
    for name, eta in kinds.items():
        after = tissue_after(params, eta)
        steps = np.arange(1, T + 1)
        val = np.where((steps % every == 0) | (steps == T),
                       after + sigma * rng.standard_normal(T), np.nan)
        out.append(pd.DataFrame({"run_id": name, "step": steps, "lr": eta,
                                 "loss": truth("tissue", params, eta), "val_loss": val}))
    return pd.concat(out, ignore_index=True)


def test_val_loss_is_the_law_after_the_steps_update():
    """Noise-free evaluations after a step drop of the LR (where one step of offset shows):
    the fit reproduces them exactly and predicts the law written out step by step; read as
    if logged before the update (the training loss's convention), the same records do not."""
    drop = lrs("constant")
    drop[200:] = PEAK / 4        # the LR falls 4x at step 201: S2 jumps there
    kinds = {"constant": lrs("constant"), "drop": drop}
    curves = evaluations(kinds, every=1, sigma=0.0)
    fit = fit_schedule_law(curves, "tissue", metric="val_loss", n_boot=0)
    assert fit.rmse < 1e-7 and fit.metric == "val_loss"
    for k, v in zip(PARAMS["tissue"], TISSUE):
        assert fit.params[k] == pytest.approx(v, rel=1e-4)
    for eta in (drop, lrs("cosine")):
        pred = fit.predict(eta)["loss"].to_numpy()
        assert np.max(np.abs(pred - tissue_after(TISSUE, eta))) < 1e-6
        assert fit.final_loss(eta)[0] == pytest.approx(tissue_after(TISSUE, eta)[-1], abs=1e-6)
    shifted = curves.assign(loss=curves["val_loss"]).drop(columns="val_loss")
    wrong = fit_schedule_law(shifted, "tissue", n_boot=0)    # the training loss's L(s - 1)
    assert wrong.rmse > 1e-4 and wrong.params["L0"] != pytest.approx(TISSUE[0], abs=5e-3)


def test_val_loss_every_ten_steps_predicts_unseen_schedules():
    """Evaluations every 10 steps (28 after the peak) at noise 0.002, on constant + WSD: the
    cosine and linear decays' last evaluation within 0.5% and inside the interval."""
    kinds = {"constant": lrs("constant"), "wsd": lrs("wsd")}
    curves = evaluations(kinds, every=10, sigma=0.002, seed=3)
    fit = fit_schedule_law(curves, "tissue", metric="val_loss", n_boot=40)
    # steps 30, 40, .., 300: the evaluation at the peak step 30 is after its update
    assert fit.n_points == 2 * 28 and "val_loss records" in fit.summary()
    assert fit.params["C"] == pytest.approx(0.004, rel=0.1)
    for kind in ("cosine", "linear"):
        want = tissue_after(TISSUE, lrs(kind))[-1]
        est, lo, hi = fit.final_loss(lrs(kind))
        assert abs(est / want - 1) < 0.005 and lo <= want <= hi


def test_reads_val_loss_from_run_directories(tmp_path):
    curves = evaluations({"constant": lrs("constant"), "wsd": lrs("wsd")}, every=10, sigma=0.0)
    dirs = []
    for name, g in curves.groupby("run_id"):
        recs = [{"step": int(s), "lr": float(lr), "loss": float(x)} |
                ({"val_loss": float(v)} if np.isfinite(v) else {})
                for s, lr, x, v in zip(g["step"], g["lr"], g["loss"], g["val_loss"])]
        _write_run(tmp_path / name, recs)
        dirs.append(tmp_path / name)
    back = read_schedule_curves(dirs)
    assert back["val_loss"].notna().sum() == 2 * 30
    fit = fit_schedule_law(dirs, "tissue", metric="val_loss", n_boot=0)
    assert fit.params["C"] == pytest.approx(0.004, rel=1e-3)


# ---- at the papers' scale: chosen steps, a loss logged every k steps, the papers' units ------
def luo_mpl(params, eta, at):
    """Luo et al.'s eq. 5 written out in the LRs as given (no rescaling), the drops after the
    peak only: the loss after `at` updates (areas over eta[:at])."""
    l0, a, alpha, b, c, beta, gamma = params
    p = int(np.argmax(eta))
    cs = np.concatenate([[0.0], np.cumsum(eta)])
    out = []
    for t in at:
        ld = sum((eta[k - 1] - eta[k]) * (1 - (c * eta[k] ** -gamma * (cs[t] - cs[k]) + 1) ** -beta)
                 for k in range(p + 1, t))
        out.append(l0 + a * cs[t] ** -alpha - b * ld)
    return np.array(out)


@pytest.fixture(scope="module")
def mp_fit():
    """The multi-power law fitted to three schedules (shared: one fit)."""
    kinds = {"constant": lrs("constant"), "wsd": lrs("wsd"), "cosine": lrs("cosine")}
    return fit_schedule_law(simulate("multipower", MULTIPOWER, kinds, 0.003), n_boot=8,
                            max_points=100)


def test_predict_at_chosen_steps_matches_every_step_and_binned_sum_is_exact(monkeypatch,
                                                                             mp_fit):
    fit = mp_fit
    every = fit.predict(lrs("linear"))
    some = fit.predict(lrs("linear"), steps=[300, 2, 150])
    assert some["step"].tolist() == [300, 2, 150]
    for col in ("loss", "lo", "hi", "lr"):
        assert np.allclose(some[col], every.set_index("step").loc[[300, 2, 150], col])
    # a 40k-step cosine: the drops summed in bins agree with the sum term by term
    from analysis import schedule_law as sl
    long = np.concatenate([np.linspace(1e-3, 1, 400), 0.1 + 0.45 * (1 + np.cos(
        np.pi * np.arange(39600) / 39600))])
    f = _features(long, np.arange(500, 40001, 997), 0.999)
    assert f.at.size * f.k.size > sl._EXACT_UP_TO          # the binned path
    binned = sl._loss_drop(f, 0.2, 0.6, 0.6)
    monkeypatch.setattr(sl, "_EXACT_UP_TO", 1 << 40)
    exact = sl._loss_drop(f, 0.2, 0.6, 0.6)
    assert np.max(np.abs(binned - exact)) < 1e-5 * exact.max()


def test_predict_far_schedule_in_little_memory(mp_fit):
    """The issue's 72k-step cosine at its last step: one row, no (steps x drops) matrix."""
    import tracemalloc
    fit = mp_fit
    eta = PEAK * (0.1 + 0.45 * (1 + np.cos(np.pi * np.arange(72000) / 72000)))
    tracemalloc.start()
    with pytest.warns(UserWarning, match=r"step 72000 is 240\.0x the last fitted step \(300\)"):
        out = fit.predict(eta, steps=[72000])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(out) == 1 and np.isfinite(out["loss"]).all()
    assert peak < 200e6        # the full matrix would be 72000^2 x 8 B = 41 GB


def test_a_prediction_far_past_the_fitted_steps_says_its_interval_is_the_laws(mp_fit):
    """The bootstrap resamples the fitted curves' residuals: it carries no extrapolation
    error, which on Luo et al.'s 72k cosine (3x the fitted steps) was the whole miss."""
    import warnings
    assert "to step 300" in mp_fit.summary()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mp_fit.predict(lrs("cosine"))                       # the fitted horizon: silent
        mp_fit.final_loss(np.r_[lrs("cosine"), np.full(100, PEAK / 10)])   # 1.33x: silent
    with pytest.warns(UserWarning, match="does not carry the error of extrapolating"):
        mp_fit.final_loss(np.r_[lrs("cosine"), np.full(300, PEAK / 10)])   # 2x


def subsampled(form, params, kinds, every, sigma, seed=0):
    """The training loss logged every `every` steps only (step 1 and the multiples), without
    the LRs of the other steps: what a paper releases."""
    full = simulate(form, params, kinds, sigma, seed)
    return full[(full["step"] % every == 0) | (full["step"] == 1)].reset_index(drop=True)


def test_training_loss_logged_every_k_steps_fits_with_its_schedule():
    drop = lrs("constant")
    drop[200:] = PEAK / 4            # a step drop at step 201: one step of offset shows there
    kinds = {"constant": lrs("constant"), "drop": drop}
    curves = subsampled("tissue", TISSUE, kinds, every=7, sigma=0.0)
    with pytest.raises(ValueError, match="no record for step 2.*schedules="):
        fit_schedule_law(curves, "tissue")
    fit = fit_schedule_law(curves, "tissue", n_boot=0, schedules=kinds)
    assert fit.rmse < 1e-7 and fit.metric == "loss"   # the documented L(s - 1), exactly
    for k, v in zip(PARAMS["tissue"], TISSUE):
        assert fit.params[k] == pytest.approx(v, rel=1e-4)
    shifted = {k: np.concatenate([v[1:], v[-1:]]) for k, v in kinds.items()}
    off = fit_schedule_law(curves.drop(columns="lr"), "tissue", n_boot=0, schedules=shifted)
    assert off.rmse > 1e-4                             # a schedule one step off misfits
    with pytest.raises(ValueError, match="logs lr .* at step 1 where schedules.'constant'.*"
                                         "step i . 1's LR"):
        fit_schedule_law(curves, "tissue", n_boot=0, schedules={"constant": np.r_[
            kinds["constant"][1:], PEAK], "drop": drop})
    # multi-power from a loss every 10 steps with noise: the held-out final losses
    kinds = {"constant": lrs("constant"), "wsd": lrs("wsd"), "cosine": lrs("cosine")}
    fit = fit_schedule_law(subsampled("multipower", MULTIPOWER, kinds, 10, 0.002, seed=4),
                           n_boot=20, schedules=kinds)
    assert fit.n_points == 3 * 27       # steps 40, 50, .., 300: after the peak update (31)
    for eta in (lrs("linear"), lrs("wsd", 0.1)):
        est, lo, hi = fit.final_loss(eta)
        want = truth("multipower", MULTIPOWER, eta)[-15:].mean()
        assert abs(est / want - 1) < 0.003 and lo <= want <= hi


def test_params_in_the_papers_units_give_the_papers_curve(mp_fit):
    """params_in('lr') put into eq. 5 written out in the LRs as logged (no rescaling)
    reproduce the fit's own predictions; 'peak' are the fitted values."""
    kinds = {"constant": lrs("constant"), "wsd": lrs("wsd"), "cosine": lrs("cosine")}
    fit = mp_fit
    t = fit.params_in("lr")
    assert list(t.columns) == ["value", "lo", "hi"] and (t["lo"] <= t["hi"]).all()
    assert t.loc["B", "value"] == pytest.approx(fit.params["B"] / PEAK)
    assert fit.params_in("peak")["value"].to_dict() == pytest.approx(fit.params)
    eta = lrs("linear")
    mine = fit.predict(eta, steps=[40, 120, 300])["loss"].to_numpy()
    assert np.allclose(luo_mpl(t["value"].to_numpy(), eta, [39, 119, 299]), mine, atol=1e-9)
    tfit = fit_schedule_law(simulate("tissue", TISSUE, kinds, 0.003), "tissue", n_boot=0)
    tt = tfit.params_in("lr")["value"]
    assert tt["C"] == pytest.approx(tfit.params["C"] / PEAK)
    assert tt["A"] == pytest.approx(tfit.params["A"] * PEAK ** tfit.params["alpha"])
    with pytest.raises(ValueError, match="units='paper'.*'peak'.*'lr'"):
        fit.params_in("paper")


@pytest.mark.slow
def test_restarts_from_a_better_optimum_and_flags_weak_parameters():
    from analysis.schedule_law import _better_optimum, _features as feat_of, _rss
    kinds = {"constant": lrs("constant"), "wsd": lrs("wsd"), "cosine": lrs("cosine")}
    curves = simulate("multipower", MULTIPOWER, kinds, 0.003)
    feats = [feat_of(eta / PEAK, np.arange(WARM, T), 0.999) for eta in kinds.values()]
    ys = [g["loss"].to_numpy()[WARM:] for _, g in curves.groupby("run_id", sort=False)]
    stuck = np.array([3.2, 1.0, 2.0, 0.0, 1e-4, 9.0, 2.9])     # a poor point
    better = _better_optimum("multipower", stuck, np.array([MULTIPOWER]), feats, ys)
    assert better is not None and better[0] == pytest.approx(3.0, abs=0.02)
    assert _rss("multipower", better, feats, ys) < 0.5 * _rss("multipower", stuck, feats, ys)
    assert _better_optimum("multipower", better, np.array([stuck]), feats, ys) is None
    fit = fit_schedule_law(curves, n_boot=20)
    t = fit.params_in("peak")
    assert ((t["lo"] <= t["value"]) & (t["value"] <= t["hi"])).all()   # inside its interval
    # two schedules, much noise: gamma and C are not pinned, and the summary says so
    noisy = simulate("multipower", MULTIPOWER, {"constant": lrs("constant"),
                                                "wsd": lrs("wsd")}, 0.02, seed=2)
    weak = fit_schedule_law(noisy, n_boot=20)
    assert weak.weak and "WEAKLY IDENTIFIED" in weak.summary()
    assert "WEAKLY" not in fit_schedule_law(simulate("tissue", TISSUE, kinds, 0.002), "tissue",
                                            n_boot=20).summary()


def test_bad_schedules_and_steps_are_one_clear_error():
    kinds = {"constant": lrs("constant"), "wsd": lrs("wsd")}
    curves = subsampled("tissue", TISSUE, kinds, every=10, sigma=0.0)
    with pytest.raises(ValueError, match=r"schedules\['wsd'\]: 250 steps, shorter than its "
                                         r"logged steps \(the last is 300\)"):
        fit_schedule_law(curves, "tissue", schedules={**kinds, "wsd": kinds["wsd"][:250]})
    with pytest.raises(ValueError, match="schedules: no entry for run 'wsd'"):
        fit_schedule_law(curves, "tissue", schedules={"constant": kinds["constant"]})
    with pytest.raises(ValueError, match=r"schedules: run\(s\) \['x'\] have no curve"):
        fit_schedule_law(curves, "tissue", schedules={**kinds, "x": kinds["wsd"]})
    with pytest.raises(ValueError, match="run .constant. has step 0.5, not a whole number"):
        fit_schedule_law(curves.assign(step=curves["step"] - 0.5), "tissue", schedules=kinds)
    fit = fit_schedule_law(curves, "tissue", n_boot=0, schedules=kinds)
    with pytest.raises(ValueError, match=r"steps: whole numbers in 1\.\.300"):
        fit.predict(lrs("cosine"), steps=[301])
