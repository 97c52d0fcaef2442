"""Approach 2 on wide, lopsided, drifting grids: simulated studies with a known exponent
(analysis.simulate; the whole family and its table: bench/isoflop.py, docs/analysis_isoflop.md)."""
import numpy as np
import pandas as pd
import pytest

from analysis import ChinchillaLaw, fit_isoflop
from analysis.simulate import isoflop_study

BUDGETS = np.logspace(17, 20, 8)
# alpha 0.2, beta 0.5: on a 2-decade grid the isoFLOP curve climbs far faster on the large-N
# side, so a parabola's vertex moves with where the grid sits around the optimum.
LOPSIDED = ChinchillaLaw(E=1.8, A=300.0, B=3000.0, alpha=0.2, beta=0.5)
TRUE_A = LOPSIDED.exponents[0]                                     # 5/7


@pytest.mark.parametrize("seed", [0, 2])
def test_local_minima_recover_a_where_one_parabola_does_not(seed):
    """Noise-free runs on 15-size, 2-decade grids that drift against the optimum: the
    textbook parabola through every size is off by 0.05-0.07, the local one by < 0.002."""
    df = isoflop_study(LOPSIDED, BUDGETS, decades=2, sizes=15, noise=0, seed=seed)
    textbook = fit_isoflop(df, window=None, keep_edges=True)
    local = fit_isoflop(df)
    assert abs(textbook.a - TRUE_A) > 0.04
    assert local.a == pytest.approx(TRUE_A, abs=0.002)
    assert local.ci["a"][0] <= TRUE_A <= local.ci["a"][1]
    assert local.a + local.b == pytest.approx(1.0, abs=1e-9)                 # C = 6ND exactly
    np.testing.assert_allclose(local.minima["N_opt"],
                               LOPSIDED.n_opt(local.minima["C"]), rtol=0.02)


def test_unbracketed_budgets_are_left_out_listed_and_kept_on_request():
    df = isoflop_study(LOPSIDED, BUDGETS, decades=1, sizes=7, noise=0.002, edges=3, drift=0,
                       seed=4)
    fit = fit_isoflop(df)
    m = fit.minima
    assert (~m["in_range"]).sum() == 3 and m["used"].sum() == 5
    assert fit.used["in_range"].all()
    text = fit.summary()
    assert "over 5 of 8 budgets" in text and text.count("left out: lowest loss at the") == 3
    assert abs(fit.a - TRUE_A) < 0.01
    kept = fit_isoflop(df, keep_edges=True)
    assert kept.minima["used"].all() and "kept: lowest loss" in kept.summary()
    assert abs(kept.a - TRUE_A) > 3 * abs(fit.a - TRUE_A)      # the extrapolations pull it off


def test_interval_covers_the_truth_on_noisy_studies():
    """40 studies, 1% noise, 7 sizes over 1 decade with 0-3 misplaced budgets: the 95%
    intervals cover the true a in at least 34 and the median error is within 0.01."""
    hits, errs = 0, []
    for seed in range(40):
        df = isoflop_study(LOPSIDED, BUDGETS, decades=1, sizes=7, noise=0.01, edges=seed % 4,
                           seed=100 + seed)
        fit = fit_isoflop(df)
        lo, hi = fit.ci["a"]
        hits += lo <= TRUE_A <= hi
        errs.append(fit.a - TRUE_A)
    assert hits >= 34, hits
    assert abs(np.median(errs)) < 0.01


def test_a_noisy_budget_counts_less():
    """One budget's vertex uncertainty (its local parabola barely curves) is carried into the
    line: it has the largest log_n_sd, and moving its minimum moves a less than an OLS line."""
    df = isoflop_study(LOPSIDED, BUDGETS, decades=1, sizes=7, noise=0.003, seed=7)
    flat = df["budget"] == df["budget"].iloc[0]
    # flatten the first budget's curve around its mean: same minimum, much less curvature
    y = df.loc[flat, "loss"]
    df.loc[flat, "loss"] = y.mean() + (y - y.mean()) * 0.05
    fit = fit_isoflop(df)
    sd = fit.minima.set_index("budget")["log_n_sd"]
    assert sd.idxmax() == df["budget"].iloc[0]
    assert sd.max() > 5 * sd.drop(sd.idxmax()).median()


def test_window_argument_errors():
    df = isoflop_study(LOPSIDED, BUDGETS[:3], decades=1, sizes=5, noise=0, seed=0)
    with pytest.raises(ValueError, match="window=2: a parabola needs at least 3 sizes"):
        fit_isoflop(df, window=2)
    with pytest.raises(ValueError, match="window=2.5"):
        fit_isoflop(df, window=2.5)
    three = fit_isoflop(df, window=3)
    assert (three.minima["n_window"] == 3).all()
    every = fit_isoflop(df, window=None)
    assert (every.minima["n_window"] == 5).all()


def test_simulated_study_places_the_grid_as_asked():
    df = isoflop_study(LOPSIDED, BUDGETS, decades=2, sizes=5, noise=0, edges=2, seed=1)
    assert len(df) == 40 and set(df.columns) >= {"budget", "C", "N", "D", "loss"}
    span = df.groupby("budget")["N"].agg(lambda n: np.log10(n.max() / n.min()))
    np.testing.assert_allclose(span, 2.0)
    np.testing.assert_allclose(6 * df["N"] * df["D"], df["C"], rtol=1e-12)
    outside = df.groupby("budget").apply(
        lambda g: not g["N"].min() <= g["n_opt_true"].iloc[0] <= g["N"].max(),
        include_groups=False)
    assert outside.sum() == 2
    with pytest.raises(ValueError, match="edges=9"):
        isoflop_study(LOPSIDED, BUDGETS, decades=1, sizes=5, noise=0, edges=9)
    assert isinstance(df, pd.DataFrame)
