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
    bad.loc[5, "loss"] = np.nan
    with pytest.raises(ValueError, match="run 'constant' has a loss that is not a finite"):
        fit_schedule_law(bad)
    with pytest.raises(ValueError, match="no run's LR decays after its peak"):
        fit_schedule_law(good[good["run_id"] == "constant"])
    with pytest.raises(ValueError, match="resample='runs' with 2 run"):
        fit_schedule_law(good, resample="runs")
    with pytest.raises(ValueError, match="level=95"):
        fit_schedule_law(good, level=95)
    with pytest.raises(ValueError, match="step 299; the law is fitted to those steps"):
        fit_schedule_law(good, start=299)
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        fit_schedule_law([tmp_path / "nope"])
    _write_run(tmp_path / "nolr", [{"step": 1, "loss": 5.0}])
    with pytest.raises(ValueError, match="no 'lr' logged"):
        fit_schedule_law([tmp_path / "nolr"])
    fit = fit_schedule_law(good, "tissue", n_boot=0)
    with pytest.raises(ValueError, match="lrs: a sequence"):
        fit.predict([0.001, -1.0])
