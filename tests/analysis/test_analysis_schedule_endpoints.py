"""analysis.predict_endpoints: per model size, a WSD run and its cooldown branches simulated
from a known schedule law predict the cosine endpoints the sweep never trained; bad input is
one clear error."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis import predict_endpoints
from analysis.schedule_law import _curve, _features

PEAK, WARM, T = 8e-3, 30, 400
# L0, A, alpha, B, C, beta, gamma: two sizes, the larger lower and annealing more
LAWS = {"small": [3.2, 2.0, 0.45, 0.3, 2.0, 0.6, 0.5],
        "large": [2.9, 2.2, 0.5, 0.4, 1.5, 0.5, 0.4]}


def wsd(total: int, frac: float = 0.2, end: float = 0.1) -> np.ndarray:
    """cgpt's WSD shape: warmup, the peak, a 1-sqrt cooldown over the last `frac` to `end`."""
    s = np.arange(total, dtype=float)          # 0-based update index, as lr_at
    eta = np.full(total, PEAK)
    eta[:WARM] = PEAK * s[:WARM] / WARM
    start = total - round(frac * total)
    eta[start:] = PEAK - PEAK * (1 - end) * np.sqrt((s[start:] - start) / (total - start))
    return eta


def cosine(total: int, end: float = 0.1) -> np.ndarray:
    s = np.arange(total, dtype=float)
    eta = PEAK * (end + (1 - end) * 0.5 * (1 + np.cos(np.pi * (s - WARM) / (total - WARM))))
    eta[:WARM] = PEAK * s[:WARM] / WARM
    return eta


def law(model: str, eta: np.ndarray) -> np.ndarray:
    y = _curve("multipower", np.array(LAWS[model]), _features(eta / PEAK, np.arange(eta.size),
                                                               0.999))
    first = int(np.argmax(np.isfinite(y)))   # no update yet (cgpt's LR of update 0 is 0)
    y[:first] = y[first]
    return y


def law_after(model: str, eta: np.ndarray) -> np.ndarray:
    """The law's loss of the weights after step s's update (the val_loss logged at s)."""
    return _curve("multipower", np.array(LAWS[model]),
                  _features(eta / PEAK, np.arange(1, eta.size + 1), 0.999))


def truth_end(model: str, eta: np.ndarray) -> float:
    return float(law(model, eta)[-max(1, min(50, eta.size // 20)):].mean())


def write_sweep(tmp_path, sigma: float, every: int = 0, val_sigma: float = 0.0) -> pd.DataFrame:
    """Per model: a WSD parent of T steps and branches at 1/4 and 1/2 of its budget, whose
    logs repeat the parent's lines up to the branch step (as `cgpt train --branch-from`);
    `every` > 0: val_loss every `every` steps and at the end, noise `val_sigma`."""
    rng = np.random.default_rng(0)
    rows = []
    for model in LAWS:
        noise = sigma * rng.standard_normal(T)  # one data order: the runs share their noise
        parent = wsd(T)
        for name, eta in [("", parent), ("_b0.25", wsd(T // 4)), ("_b0.5", wsd(T // 2))]:
            if name:
                branch = int(0.8 * eta.size) // 10 * 10
                assert np.allclose(eta[:branch], parent[:branch])
            loss = law(model, eta) + noise[:eta.size]
            val = law_after(model, eta) + (val_sigma * rng.standard_normal(eta.size) if every
                                           else 0.0)
            d = tmp_path / f"{model}{name}"
            d.mkdir()
            (d / "metrics.jsonl").write_text("".join(
                json.dumps({"step": i + 1, "lr": float(eta[i]), "loss": float(loss[i])} |
                           ({"val_loss": float(val[i])} if every and (
                               (i + 1) % every == 0 or i + 1 == eta.size) else {})) + "\n"
                for i in range(eta.size)))
            rows.append(dict(run_id=d.name, model=model, n_params=len(model), run_dir=str(d)))
    return pd.DataFrame(rows)


def test_cosine_endpoints_predicted_from_wsd_branches(tmp_path):
    runs = write_sweep(tmp_path, 0.01)
    targets = {m: {f"{f:g}": cosine(round(f * T)) for f in (0.25, 0.5, 1.0)} for m in LAWS}
    out = predict_endpoints(runs, targets, n_boot=30)
    assert len(out.table) == 6 and set(out.table["runs"]) == {3}
    covered = 0
    for r in out.table.itertuples():
        want = truth_end(r.model, targets[r.model][r.target])
        assert abs(r.loss / want - 1) < 0.005, (r.model, r.target, r.loss, want)
        covered += r.lo <= want <= r.hi
        assert r.steps == round(float(r.target) * T)
    # six 95% intervals (one shared noise series per size, as one data order gives): at most
    # one misses (a 3% event if each covers 95% independently)
    assert covered >= 5
    # the whole cosine curve, far from the WSD curves mid-run, comes back too
    for m, fit in out.fits.items():
        want, got = law(m, cosine(T)), fit.predict(cosine(T))["loss"].to_numpy()
        assert want[T // 2] < law(m, wsd(T))[T // 2] - 0.02
        assert np.abs(got[WARM:] / want[WARM:] - 1).max() < 0.005
    assert "small: 0.25:" in out.summary() and "multi-power" in out.summary()


def test_endpoints_from_the_fixed_set_evaluations(tmp_path):
    """metric='val_loss': the law fitted to evaluations every 10 steps (the training loss
    noisy, sd 0.05, and ignored) predicts the evaluation after each cosine run's last step."""
    runs = write_sweep(tmp_path, 0.05, every=10, val_sigma=0.002)
    targets = {m: {f"{f:g}": cosine(round(f * T)) for f in (0.5, 1.0)} for m in LAWS}
    out = predict_endpoints(runs, targets, metric="val_loss", n_boot=20)
    for r in out.table.itertuples():
        want = float(law_after(r.model, targets[r.model][r.target])[-1])
        assert abs(r.loss / want - 1) < 0.005, (r.model, r.target, r.loss, want)
    assert all(f.metric == "val_loss" for f in out.fits.values())
    # the peak is step 31: evaluations at 40, 50, .. of each run
    assert out.fits["small"].n_points == sum(n // 10 - 3 for n in (T, T // 4, T // 2))


def test_tissue_form_and_fit_options_pass_through(tmp_path):
    runs = write_sweep(tmp_path, 0.0)
    targets = {"large": {"cos": cosine(T)}}
    out = predict_endpoints(runs, targets, form="tissue", n_boot=0, start=60)
    assert list(out.fits) == ["large"] and out.fits["large"].form == "tissue"
    assert out.fits["large"].n_points == sum(n - 59 for n in (T, T // 4, T // 2))
    assert np.isnan(out.table["lo"].iloc[0])


def test_bad_input_is_one_clear_error(tmp_path):
    runs = write_sweep(tmp_path, 0.0)
    with pytest.raises(ValueError, match="runs: no column 'n_params'"):
        predict_endpoints(runs.drop(columns="n_params"), {"small": {"c": cosine(T)}})
    with pytest.raises(ValueError, match="model 'huge' has no runs to fit"):
        predict_endpoints(runs, {"huge": {"c": cosine(T)}})
    with pytest.raises(ValueError, match="targets: a non-empty"):
        predict_endpoints(runs, {})
    with pytest.raises(ValueError, match=r"targets\['small'\]: a non-empty"):
        predict_endpoints(runs, {"small": {}})
    with pytest.raises(ValueError, match="lrs: a sequence"):
        predict_endpoints(runs, {"small": {"c": [-1.0, 0.1]}}, n_boot=0)
