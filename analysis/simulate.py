"""Simulated isoFLOP studies from a known Chinchilla-form law: the truth an estimator is judged by.

A study is what a researcher runs: a few compute budgets, a grid of model sizes on each
isoFLOP line (C = 6 N D), the final loss of each run with run-to-run noise. The grid is
placed the way real ones are, not around the true optimum: its centre is a guess that drifts
from the truth across budgets (a wrong guess of the exponent) and jitters per budget, and some
budgets miss the optimum entirely (it lies beyond the grid's smallest or largest size). The
true allocation exponent of the law is a = beta / (alpha + beta) (N_opt ~ C^a).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .chinchilla import ChinchillaLaw


def isoflop_study(law: ChinchillaLaw, budgets, *, decades: float, sizes: int, noise: float,
                  edges: int = 0, drift: float = 0.6, jitter: float | None = None,
                  seed: int | np.random.Generator = 0) -> pd.DataFrame:
    """One simulated isoFLOP study: columns budget, C, N, D, loss, n_opt_true.

    decades: width of each budget's grid in log10 N; sizes: model sizes per budget, log-spaced;
    noise: log-normal sd of the loss (0.01 = 1% run-to-run scatter); edges: how many budgets
    (drawn at random) have their grid placed so the true optimum lies 0-0.3 decades beyond its
    smallest or largest size; drift: how far the grid's centre moves against the true optimum
    from the smallest budget to the largest, as a share of the grid's width (0.6: the optimum
    sits at 20% of the grid at one end of the budgets and at 80% at the other, as when a fixed
    set of sizes is trained at every budget; its direction drawn per study); jitter: the
    centre's uniform per-budget error in decades (default decades / 6).
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    budgets = np.sort(np.asarray(budgets, float))
    if edges > len(budgets):
        raise ValueError(f"edges={edges} budgets cannot miss the optimum: only {len(budgets)}")
    jitter = decades / 6 if jitter is None else jitter
    x = np.linspace(-0.5, 0.5, len(budgets))
    centre = (rng.choice([-1, 1]) * drift * decades * x
              + rng.uniform(-jitter, jitter, len(budgets)))
    for i in rng.choice(len(budgets), edges, replace=False):   # the optimum beyond an edge
        centre[i] = rng.choice([-1, 1]) * (decades / 2 + rng.uniform(0, 0.3))
    rows = []
    for c, off in zip(budgets, centre):
        n_opt = float(law.n_opt(c))
        for f in np.linspace(-decades / 2, decades / 2, sizes):
            n = n_opt * 10 ** (f - off)
            rows.append(dict(budget=f"{c:.3g}", C=c, N=n, D=c / (6 * n), n_opt_true=n_opt))
    df = pd.DataFrame(rows)
    df["loss"] = law(df["N"], df["D"]) * np.exp(rng.normal(0, noise, len(df)))
    return df


def recipe_ladders(law_a, law_b, compute, *, noise: float, seeds: int = 1,
                   seed: int | np.random.Generator = 0) -> tuple[tuple, tuple]:
    """Two simulated ladders, ((C, loss) of recipe A, (C, loss) of recipe B): every compute
    budget trained `seeds` times per recipe, the loss of each run the law's times a log-normal
    scatter of sd `noise` (0.01 = 1%). law_a, law_b: callables of C (e.g. analysis.PowerLaw);
    B = A with its compute scaled k-fold is law_b = lambda C: law_a(k * C)."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    C = np.repeat(np.asarray(compute, float), seeds)
    return tuple((C, law(C) * np.exp(rng.normal(0, noise, C.size))) for law in (law_a, law_b))
