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
    ls = fit_power_law(x, y, offset=False, delta=np.inf, space="log", n_boot=0)
    assert ls.params["b"] == pytest.approx(-ref.slope, rel=1e-6)
    assert np.log(ls.params["A"]) == pytest.approx(ref.intercept, rel=1e-6)
    robust = fit_power_law(x, y, offset=False, delta=1e-3, space="log", n_boot=0)
    assert abs(robust.params["b"] - law.b) < 0.02


def test_huber_resists_an_outlier():
    x = np.geomspace(1e15, 1e21, 14)
    y = TRUE(x)
    y[5] *= 1.5                                                     # one diverged run
    robust = fit_power_law(x, y, delta=1e-3, space="log", n_boot=0)
    ls = fit_power_law(x, y, n_boot=0)                              # the default: least squares
    assert abs(robust.params["b"] - TRUE.b) < 0.003
    assert abs(ls.params["b"] - TRUE.b) > 3 * abs(robust.params["b"] - TRUE.b)


def test_refit_published_cerebras_table():
    t = cerebras_gpt_table()
    # The default fit (least squares on the loss) reproduces the paper's Eq. 1 (issue #12:
    # b within 0.004 of 0.0737, c within 0.03 of 0.5066).
    fit = fit_power_law(t["flops"], t["loss"], n_boot=200)
    p = fit.params
    assert abs(p["b"] - 0.0737) < 0.004 and abs(p["c"] - 0.5066) < 0.03
    assert fit.x0 == pytest.approx(5.984e22, rel=0.15)
    for k in ("b", "c"):
        assert fit.ci[k][0] <= CEREBRAS_GPT.params[k] <= fit.ci[k][1]
    np.testing.assert_allclose(fit.predict(t["flops"]), CEREBRAS_GPT(t["flops"]), rtol=0.005)
    # Cross-check against scipy's curve_fit in the same (x0, b, c) form.
    f = lambda x, lx0, b, c: np.exp(-b * (np.log(x) - lx0)) + c
    (lx0, b, c), _ = curve_fit(f, t["flops"], t["loss"], p0=[np.log(6e22), 0.07, 0.5])
    assert (p["b"], p["c"], np.log(fit.x0)) == pytest.approx((b, c, lx0), rel=1e-4)
    # Huber delta=1e-3 on log loss (Chinchilla's choice) lands elsewhere on the flat b-c valley
    # (it acts like an L1 fit through a few of the seven points); its interval still holds the
    # published law, and the general multi-start solver agrees with the least-squares one.
    robust = fit_power_law(t["flops"], t["loss"], delta=1e-3, space="log", n_boot=40)
    assert abs(robust.params["b"] - 0.0668) < 0.001 and abs(robust.params["c"] - 0.334) < 0.01
    for k in ("b", "c"):
        assert robust.ci[k][0] <= CEREBRAS_GPT.params[k] <= robust.ci[k][1]
    general = fit_power_law(t["flops"], t["loss"], delta=1e6, n_boot=0)    # Huber = LS here
    assert general.params["b"] == pytest.approx(p["b"], rel=1e-5)
    assert general.params["c"] == pytest.approx(p["c"], rel=1e-4)
    # Seven points over four decades do not pin c down: the fit says so (profile, not a point).
    assert fit.offset_identified is False
    lo, hi = fit.profile_interval()
    assert lo == 0.0 and 0.6 < hi < 1.2
    assert "c is not identified" in fit.summary()


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
    from analysis.solve import objective
    x = np.geomspace(1e15, 1e23, 9)
    y = noisy(TRUE, x, 0.02, seed=2)
    u = np.log(x) - np.log(x).mean()
    theta = np.array([0.9, 0.08, 1.5][: 3 if offset else 2])
    args = (u, y, 0.05, offset, space)          # delta large enough that residuals straddle it
    num = central_diff(lambda t: objective(t, *args)[0], theta)
    np.testing.assert_allclose(objective(theta, *args)[1], num, rtol=1e-4, atol=1e-6)


def test_offset_at_its_bound_still_gets_an_interval():
    """A law with no floor: the full-data optimum sits at c = 0. Refits are full fits (c is
    bounded, not log c), so resamples can move c off the bound; the old code gave [0, 0]."""
    x = np.geomspace(1e12, 1e15, 7)
    law = PowerLaw.from_scale(1e10, 0.1)                 # c = 0
    y = noisy(law, x, 0.01, seed=11)
    fit = fit_power_law(x, y, n_boot=300)
    assert fit.ci["c"][1] > fit.ci["c"][0] >= 0.0
    assert fit.ci["b"][0] <= law.b <= fit.ci["b"][1]
    assert len(fit.boot) + fit.skipped + fit.failed == 300


def test_resamples_with_too_few_distinct_x_are_skipped_and_counted():
    x = np.geomspace(1e17, 1e20, 4)                      # 4 sizes: many resamples have < 3
    y = noisy(TRUE, x, 0.01, seed=3)
    fit = fit_power_law(x, y, n_boot=400, seed=1)
    assert fit.skipped > 20 and len(fit.boot) == 400 - fit.skipped - fit.failed
    assert f"{fit.skipped} skipped with too few distinct x" in fit.summary()
    # Without an offset two distinct x suffice, so fewer resamples are skipped.
    assert fit_power_law(x, y, offset=False, n_boot=400, seed=1).skipped < fit.skipped


def test_seeds_of_one_model_are_resampled_together_by_default():
    x = np.repeat(np.geomspace(1e17, 1e22, 6), 3)         # 6 models x 3 seeds
    y = noisy(TRUE, x, 0.01, seed=7)
    grouped = fit_power_law(x, y, n_boot=300)
    rows = fit_power_law(x, y, n_boot=300, groups=None)
    labels = fit_power_law(x, y, n_boot=300, groups=np.repeat(np.arange(6), 3))
    assert grouped.ci == labels.ci                        # "x" = one group per distinct x
    # Treating 18 correlated-by-design runs as independent narrows the interval.
    assert np.ptp(grouped.ci["b"]) > np.ptp(rows.ci["b"])
    with pytest.raises(ValueError, match="groups="):
        fit_power_law(x, y, n_boot=5, groups="model")


def test_identified_offset_with_a_wide_sweep():
    x = np.geomspace(1e12, 1e20, 12)                      # 8 decades pin c down
    law = PowerLaw.from_scale(3e17, 0.12, 2.2)
    fit = fit_power_law(x, noisy(law, x, 0.005, seed=4), n_boot=100)
    assert fit.offset_identified is True
    lo, hi = fit.profile_interval()
    assert 0 < lo <= law.c <= hi < law(x).min()
    assert "not identified" not in fit.summary()


def test_unequal_seeds_per_model_are_bootstrapped():
    """Models with unequal numbers of seeds give cluster resamples of unequal length: the batched
    least-squares bootstrap solves each length's resamples together (it once stacked them all
    and raised), keeping every usable resample."""
    x = np.array([1e17] * 3 + [1e18] + [1e19] * 2 + [1e20] + [1e21] * 3 + [1e22])
    y = noisy(TRUE, x, 0.005, seed=3)
    fit = fit_power_law(x, y, n_boot=300)
    assert len(fit.boot) == 300 - fit.skipped - fit.failed > 200
    lo, hi = fit.ci["b"]
    assert lo < TRUE.b < hi
