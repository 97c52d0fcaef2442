"""analysis.fit_envelope (Chinchilla approach 1) on synthetic training curves from a known law."""
import json

import numpy as np
import pandas as pd
import pytest

from analysis import EPOCH, COLUMNS, fit_envelope, plot_envelope


def make_sweep(root, sizes, tokens_per_param=100.0, steps=200, noise=0.0, seed=0):
    """Runs whose logged loss at D tokens is EPOCH(N, D): the final loss of a run of D tokens,
    which is what WSD cooldown branches approximate."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        rid = f"n{n:.3g}"
        d = root / rid
        d.mkdir(parents=True)
        D = np.linspace(1, steps, steps) / steps * tokens_per_param * n
        loss = EPOCH(n, D) * np.exp(noise * rng.standard_normal(D.size))
        (d / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i + 1, "tokens": float(t), "loss": float(l)}) + "\n"
            for i, (t, l) in enumerate(zip(D, loss))))
        row = {c: np.nan for c in COLUMNS}
        row.update(run_id=rid, model=rid, seed=0, status="done", error="", n_params=n,
                   n_params_nonembed=n, tokens=D[-1], flops=6 * n * D[-1],
                   flops_6nd=6 * n * D[-1], val_loss=loss[-1], mup=False, run_dir=str(d))
        rows.append(row)
    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(root / "results.csv", index=False)
    return root


def test_envelope_recovers_the_compute_optimal_allocation(tmp_path):
    sweep = make_sweep(tmp_path, np.geomspace(1e7, 1e9, 17))
    env = fit_envelope(sweep, smooth=1)
    a, b = EPOCH.exponents
    assert env.a == pytest.approx(a, abs=0.03) and env.b == pytest.approx(b, abs=0.03)
    C = np.geomspace(env.envelope["C"].min(), env.envelope["C"].max(), 5)
    np.testing.assert_allclose(env.n_opt(C), EPOCH.n_opt(C), rtol=0.25)
    np.testing.assert_allclose(env.envelope["C"], 6 * env.envelope["N"] * env.envelope["D"],
                               rtol=1e-6)
    # The envelope is each winner's curve (interpolated), and it falls with compute.
    np.testing.assert_allclose(env.envelope["loss"], EPOCH(env.envelope["N"], env.envelope["D"]),
                               rtol=1e-3)
    assert np.all(np.diff(env.envelope["loss"]) < 0)
    # No other size beats the winner by more than the interpolation error at that compute.
    for r in env.envelope.iloc[::20].itertuples():
        others = EPOCH(np.geomspace(1e7, 1e9, 17), r.C / (6 * np.geomspace(1e7, 1e9, 17)))
        assert r.loss <= others.min() * 1.001
    assert "N_opt ~ C^" in env.summary()
    plot_envelope(env, path=tmp_path / "env.png")
    assert (tmp_path / "env.png").stat().st_size > 5000


def test_envelope_with_noisy_curves_and_moved_sweep(tmp_path):
    sweep = make_sweep(tmp_path / "orig", np.geomspace(1e7, 1e9, 9), noise=0.003, seed=2)
    moved = tmp_path / "moved"
    (tmp_path / "orig").rename(moved)                 # run_dir paths in results.csv are stale
    env = fit_envelope(moved, smooth=9)
    assert env.a == pytest.approx(EPOCH.exponents[0], abs=0.08)


def test_envelope_errors(tmp_path):
    sweep = make_sweep(tmp_path / "one", [1e8])
    with pytest.raises(ValueError, match="at least 2 runs"):
        fit_envelope(sweep)
    sweep = make_sweep(tmp_path / "two", [1e7, 1e9])
    (sweep / "n1e+07" / "metrics.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        fit_envelope(sweep)
    with pytest.raises(ValueError, match="metric="):
        fit_envelope(sweep, metric="acc")
