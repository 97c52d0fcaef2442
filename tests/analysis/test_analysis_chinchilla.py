"""analysis.chinchilla and analysis.isoflop: recovery of Epoch's law from noisy synthetic runs,
compute-optimal allocation against published arithmetic, and isoFLOP minima."""
import numpy as np
import pandas as pd
import pytest

from analysis import CHINCHILLA, CHINCHILLA_UNROUNDED, EPOCH, fit_chinchilla, fit_isoflop


def isoflop_grid(law, budgets, spread=1.0, n=7):
    """Runs on isoFLOP lines (C = 6ND) bracketing each budget's optimum by 10^±spread in N."""
    rows = []
    for c in budgets:
        for f in np.logspace(-spread, spread, n):
            N = float(law.n_opt(c) * f)
            rows.append(dict(budget=f"{c:.0e}", C=c, N=N, D=c / (6 * N)))
    df = pd.DataFrame(rows)
    df["loss"] = law(df["N"], df["D"])
    return df


def test_compute_optimal_matches_published_arithmetic():
    # D/N at C = 1e17, 1e18, 1e19 for Epoch, Hoffmann rounded and unrounded
    # (hand-computed from G = (aA/(bB))^(1/(a+b)), N_opt = G (C/6)^a, D_opt = (C/6)^b / G).
    C = [1e17, 1e18, 1e19]
    np.testing.assert_allclose(EPOCH.tokens_per_param(C), [27.2, 25.7, 24.2], atol=0.06)
    np.testing.assert_allclose(CHINCHILLA.tokens_per_param(C), [20.5, 25.7, 32.1], atol=0.06)
    np.testing.assert_allclose(CHINCHILLA_UNROUNDED.tokens_per_param(C), [15.2, 18.6, 22.7],
                               atol=0.06)
    assert EPOCH.exponents[0] == pytest.approx(0.513, abs=0.001)
    n, d = EPOCH.n_opt(1e20), EPOCH.d_opt(1e20)
    assert 6 * n * d == pytest.approx(1e20)
    # The optimum really is the minimum along the isoFLOP line.
    for f in (0.9, 1.1):
        assert EPOCH(n * f, 1e20 / (6 * n * f)) > EPOCH(n, d)


@pytest.mark.slow(reason="no twin")
def test_recovers_epoch_law_with_ci_covering_truth():
    df = isoflop_grid(EPOCH, np.logspace(18, 22, 9))
    rng = np.random.default_rng(1)
    loss = df["loss"] * np.exp(0.01 * rng.standard_normal(len(df)))     # sigma 1% log-normal
    fit = fit_chinchilla(df["N"], df["D"], loss, n_boot=100, seed=0)
    p, ci = fit.params, fit.ci
    assert fit.grad_norm < 1e-5
    assert fit.skipped == 0 and fit.failed == 0 and len(fit.boot) == 100
    assert abs(p["E"] - EPOCH.E) < 0.05
    assert abs(p["alpha"] - EPOCH.alpha) < 0.02 and abs(p["beta"] - EPOCH.beta) < 0.02
    for k, v in EPOCH.params.items():
        assert ci[k][0] <= v <= ci[k][1], (k, v, ci[k])
    assert abs(fit.law.exponents[0] - EPOCH.exponents[0]) < 0.02
    assert fit.tokens_per_param(1e19) == pytest.approx(EPOCH.tokens_per_param(1e19), rel=0.25)
    lo, hi = fit.interval(lambda law: law.tokens_per_param(1e19))
    assert lo <= EPOCH.tokens_per_param(1e19) <= hi


def test_exact_data_recovers_parameters_tightly():
    df = isoflop_grid(CHINCHILLA_UNROUNDED, np.logspace(18, 21, 4), n=6)
    fit = fit_chinchilla(df["N"], df["D"], df["loss"], n_boot=0)
    np.testing.assert_allclose(list(fit.params.values()),
                               list(CHINCHILLA_UNROUNDED.params.values()), rtol=1e-3)


def test_chinchilla_bad_input():
    with pytest.raises(ValueError, match="at least 5 runs"):
        fit_chinchilla([1e8, 2e8], [1e9, 2e9], [3.0, 2.9])
    with pytest.raises(ValueError, match="D must be finite"):
        fit_chinchilla(np.full(6, 1e8) * np.arange(1, 7), [-1.0] * 6, np.linspace(3, 2, 6))
    with pytest.raises(ValueError, match="grid"):
        fit_chinchilla(np.arange(1, 7) * 1e8, np.arange(1, 7)[::-1] * 1e9,
                       np.linspace(3, 2, 6), grid={"a": [0]})


def test_isoflop_recovers_known_optimum():
    budgets = np.logspace(18, 21, 4)
    iso = fit_isoflop(isoflop_grid(EPOCH, budgets, spread=0.8))
    m = iso.minima
    assert m["in_range"].all() and len(m) == 4
    np.testing.assert_allclose(m["N_opt"], EPOCH.n_opt(m["C"]), rtol=0.03)
    np.testing.assert_allclose(m["D_opt"], EPOCH.d_opt(m["C"]), rtol=0.03)
    np.testing.assert_allclose(m["N_opt"] * m["D_opt"] * 6, m["C"], rtol=1e-9)
    np.testing.assert_allclose(m["loss_opt"], EPOCH.loss_opt(m["C"]), rtol=1e-3)
    assert iso.a == pytest.approx(EPOCH.exponents[0], abs=0.01)
    assert iso.b == pytest.approx(EPOCH.exponents[1], abs=0.01)
    assert iso.a + iso.b == pytest.approx(1.0, abs=1e-9)                 # C = 6ND exactly
    assert iso.tokens_per_param(1e19) == pytest.approx(EPOCH.tokens_per_param(1e19), rel=0.05)


def test_isoflop_custom_columns_and_errors():
    df = isoflop_grid(EPOCH, [1e18, 1e19, 1e20]).rename(
        columns={"N": "n_params", "D": "tokens", "C": "flops", "loss": "val_loss", "budget": "b"})
    iso = fit_isoflop(df, N="n_params", D="tokens", C="flops", loss="val_loss", budget="b")
    assert len(iso.minima) == 3
    with pytest.raises(ValueError, match="no column 'N'"):
        fit_isoflop(df)
    one_sided = isoflop_grid(EPOCH, [1e18, 1e19], n=7)
    one_sided = one_sided[one_sided["N"] >= EPOCH.n_opt(one_sided["C"]) * 2]
    with pytest.raises(ValueError, match="0 budget.*not bracketed.*keep_edges=True"):
        fit_isoflop(one_sided)                                  # every minimum extrapolated
    iso = fit_isoflop(one_sided, keep_edges=True)
    assert not iso.minima["in_range"].any() and iso.minima["used"].all()
    with pytest.raises(ValueError, match="distinct model sizes"):
        fit_isoflop(isoflop_grid(EPOCH, [1e18, 1e19], n=2))


def central_diff(f, theta, eps=1e-6):
    """Central finite differences, the reference for the analytic gradients."""
    e = np.eye(theta.size) * eps
    return np.array([(f(theta + d) - f(theta - d)) / (2 * eps) for d in e])


def test_analytic_gradient_matches_finite_differences():
    from analysis.chinchilla import _objective
    df = isoflop_grid(EPOCH, [1e18, 1e20], n=5)
    loss = df["loss"].to_numpy() * np.exp(0.02 * np.random.default_rng(0).standard_normal(len(df)))
    args = (np.log(df["N"].to_numpy()), np.log(df["D"].to_numpy()), np.log(loss), 0.01)
    theta = np.array([6.0, 7.5, 0.6, 0.33, 0.37])
    num = central_diff(lambda t: _objective(t, *args)[0], theta)
    np.testing.assert_allclose(_objective(theta, *args)[1], num, rtol=1e-4, atol=1e-6)
