"""analysis.fit / extrapolate / published: recovery of known power laws, scipy cross-checks,
the refit of Cerebras-GPT's published table, and the held-out extrapolation check."""
import numpy as np
import pytest
from scipy.optimize import curve_fit
from scipy.stats import linregress

from analysis import (CEREBRAS_GPT, KAPLAN_C, PowerLaw, cerebras_gpt_table, extrapolation_check,
                      fit_power_law)

TRUE = PowerLaw.from_scale(3e21, 0.09, 1.9)          # x0, b, c at Cerebras-like compute


def noisy(law, x, sigma, seed):
    rng = np.random.default_rng(seed)
    return law(x) * np.exp(sigma * rng.standard_normal(np.size(x)))


def test_recovers_offset_power_law_with_ci_covering_truth():
    x = np.repeat(np.geomspace(1e15, 1e23, 12), 2)   # 8 decades, 2 seeds each
    y = noisy(TRUE, x, 0.01, seed=1)
    fit = fit_power_law(x, y, n_boot=400, seed=0)
    p, ci = fit.params, fit.ci
    assert abs(p["b"] - TRUE.b) < 0.01 and abs(p["c"] - TRUE.c) < 0.1
    assert abs(np.log(p["A"] / TRUE.A)) < 0.5
    for k, v in TRUE.params.items():
        assert ci[k][0] <= v <= ci[k][1], (k, v, ci[k])
    assert ci["b"][1] - ci["b"][0] < 0.05                 # informative, not a vacuous interval
    np.testing.assert_allclose(fit.predict(x), TRUE(x), rtol=0.01)
    lo, hi = fit.predict_interval(x)
    assert np.all(lo <= fit.predict(x) + 1e-12) and np.all(fit.predict(x) <= hi + 1e-12)


def test_no_offset_matches_linregress():
    x = np.geomspace(1e15, 1e23, 15)
    law = PowerLaw(A=7.3e3, b=0.21)
    exact = fit_power_law(x, law(x), offset=False, n_boot=0)
    assert exact.params["c"] == 0.0
    np.testing.assert_allclose([exact.params["A"], exact.params["b"]], [law.A, law.b], rtol=1e-6)
    y = noisy(law, x, 0.05, seed=3)
    ref = linregress(np.log(x), np.log(y))
    ls = fit_power_law(x, y, offset=False, delta=np.inf, n_boot=0)   # Huber -> least squares
    assert ls.params["b"] == pytest.approx(-ref.slope, rel=1e-6)
    assert np.log(ls.params["A"]) == pytest.approx(ref.intercept, rel=1e-6)
    robust = fit_power_law(x, y, offset=False, n_boot=0)            # default delta differs
    assert abs(robust.params["b"] - law.b) < 0.02


def test_huber_resists_an_outlier():
    x = np.geomspace(1e15, 1e21, 14)
    y = TRUE(x)
    y[5] *= 1.5                                                     # one diverged run
    robust = fit_power_law(x, y, n_boot=0)
    ls = fit_power_law(x, y, delta=np.inf, n_boot=0)
    assert abs(robust.params["b"] - TRUE.b) < 0.003
    assert abs(ls.params["b"] - TRUE.b) > 3 * abs(robust.params["b"] - TRUE.b)


def test_refit_published_cerebras_table():
    t = cerebras_gpt_table()
    # Linear-space least squares (plain curve_fit) reproduces the paper's Eq. 1.
    fit = fit_power_law(t["flops"], t["loss"], delta=np.inf, space="linear", n_boot=100)
    p = fit.params
    assert abs(p["b"] - 0.0737) < 0.003 and abs(p["c"] - 0.5066) < 0.02
    assert fit.x0 == pytest.approx(5.984e22, rel=0.15)
    for k in ("b", "c"):
        assert fit.ci[k][0] <= CEREBRAS_GPT.params[k] <= fit.ci[k][1]
    np.testing.assert_allclose(fit.predict(t["flops"]), CEREBRAS_GPT(t["flops"]), rtol=0.005)
    # Cross-check against scipy's curve_fit in the same (x0, b, c) form.
    f = lambda x, lx0, b, c: np.exp(-b * (np.log(x) - lx0)) + c
    (lx0, b, c), _ = curve_fit(f, t["flops"], t["loss"], p0=[np.log(6e22), 0.07, 0.5])
    assert (p["b"], p["c"], np.log(fit.x0)) == pytest.approx((b, c, lx0), rel=1e-4)
    # The package default (Huber on log loss) lands elsewhere on the flat b-c valley, but its
    # bootstrap interval still contains the published law.
    robust = fit_power_law(t["flops"], t["loss"], n_boot=100)
    for k in ("b", "c"):
        assert robust.ci[k][0] <= CEREBRAS_GPT.params[k] <= robust.ci[k][1]
    np.testing.assert_allclose(robust.predict(t["flops"]), t["loss"], rtol=0.015)


def test_published_laws_reproduce_their_numbers():
    t = cerebras_gpt_table()
    np.testing.assert_allclose(CEREBRAS_GPT(t["flops"]), t["loss"], atol=0.021)
    assert CEREBRAS_GPT.params["c"] == 0.5066 and CEREBRAS_GPT.x0 == pytest.approx(5.984e22)
    mup = t.dropna()
    dev = mup["loss_mup"] / CEREBRAS_GPT(mup["flops"]) - 1
    assert dev.mean() == pytest.approx(-0.0043, abs=0.0005)            # paper: muP 0.43% better
    # Kaplan L(C_min) = (C_c/C)^0.050 with C_c = 3.1e8 PF-days.
    assert KAPLAN_C(3.1e8 * 8.64e19) == pytest.approx(1.0)


def test_extrapolation_check():
    x = np.repeat(np.geomspace(1e17, 1e22, 8), 2)
    y = noisy(TRUE, x, 0.005, seed=5)
    ex = extrapolation_check(x, y, n_holdout=2, n_boot=100)
    assert ex.fit.n == 12 and len(ex.table) == 4 and ex.threshold == pytest.approx(x.max() / 10 ** (5 / 7))
    assert (ex.table["x"] >= ex.threshold).all()
    np.testing.assert_allclose(ex.table["abs_err"], ex.table["y_pred"] - ex.table["y"])
    np.testing.assert_allclose(ex.table["rel_err"], ex.table["abs_err"] / ex.table["y"])
    assert ex.max_rel_err < 0.02
    # A law with the wrong shape is caught: bend the top decade upward.
    y_bad = np.where(x > 1e21, y * 1.08, y)
    assert extrapolation_check(x, y_bad, n_holdout=2, n_boot=0).max_rel_err > 0.04
    with pytest.raises(ValueError, match="n_holdout"):
        extrapolation_check(x, y, n_holdout=8)


def test_cerebras_13b_from_smaller_models():
    t = cerebras_gpt_table()
    ex = extrapolation_check(t["flops"], t["loss"], n_holdout=1, delta=np.inf, space="linear",
                             n_boot=0)
    assert ex.table["x"].tolist() == [2.3e22]
    assert abs(ex.table["rel_err"].iloc[0]) < 0.02


def test_bad_input():
    x = np.geomspace(1e15, 1e20, 5)
    with pytest.raises(ValueError, match="at least 3 points"):
        fit_power_law(x[:2], TRUE(x[:2]))
    with pytest.raises(ValueError, match="y must be finite"):
        fit_power_law(x, np.r_[TRUE(x[:4]), np.nan])
    with pytest.raises(ValueError, match="differ in length"):
        fit_power_law(x, TRUE(x)[:4])
    with pytest.raises(ValueError, match="space="):
        fit_power_law(x, TRUE(x), space="loglog")


def test_cluster_bootstrap_resamples_whole_groups():
    x = np.repeat(np.geomspace(1e17, 1e22, 6), 3)
    y = noisy(TRUE, x, 0.01, seed=7)
    fit = fit_power_law(x, y, n_boot=50, groups=x)
    assert len(fit.boot.dropna()) > 40
    with pytest.raises(ValueError, match="groups"):
        fit_power_law(x, y, n_boot=5, groups=x[:3])


def central_diff(f, theta, eps=1e-6):
    """Central finite differences, the reference for the analytic gradients."""
    e = np.eye(theta.size) * eps
    return np.array([(f(theta + d) - f(theta - d)) / (2 * eps) for d in e])


@pytest.mark.parametrize("offset", [True, False])
@pytest.mark.parametrize("space", ["log", "linear"])
def test_analytic_gradient_matches_finite_differences(offset, space):
    from analysis.fit import _objective
    x = np.geomspace(1e15, 1e23, 9)
    y = noisy(TRUE, x, 0.02, seed=2)
    u = np.log(x) - np.log(x).mean()
    theta = np.array([0.9, 0.08, 0.5][: 3 if offset else 2])
    args = (u, y, 0.05, offset, space)          # delta large enough that residuals straddle it
    num = central_diff(lambda t: _objective(t, *args)[0], theta)
    np.testing.assert_allclose(_objective(theta, *args)[1], num, rtol=1e-4, atol=1e-6)
