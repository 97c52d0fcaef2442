"""Profile intervals for L(N, D) = E + A/N^alpha + B/D^beta: which parameter the runs cannot pin.

A bootstrap of a small sweep gives an interval for every parameter, but a very wide one (or
one whose bound is E = 4.79e-310) does not say *why*. The profile does: hold one parameter at
each point of a grid, refit the other four, and see how much worse the fit gets. A parameter
whose profile stays under the chi2(1) threshold up to the end of its range (E down to 0, an
exponent up to 3) is not identified by these runs, and the summary names it.

Statistic: the likelihood ratio of the error model the fit implies. Huber with delta = 1e-3 on
log L is an L1 fit when residuals exceed delta (a Laplace likelihood with its scale profiled
out: 2n log(F_theta / F_best)); when most residuals are inside delta it is least squares
(Gaussian: n log(RSS ratio)). Under Gaussian noise the Laplace form is conservative (its 95%
set has about 97% coverage), which is the safe side for "is this identified".
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from scipy.stats import chi2

UPPER_EXPONENT = 3.0


def _grid(name: str, best: float, min_loss: float, n: int) -> np.ndarray:
    if name == "E":
        return np.unique(np.r_[min_loss * np.r_[0.0, np.linspace(0.02, 0.98, n - 1)], best])
    return np.unique(np.r_[np.geomspace(0.02, UPPER_EXPONENT, n), best])


def profile(theta, objective, args, names=("E", "alpha", "beta"), n_grid: int = 24,
            level: float = 0.95, delta: float = 1e-3) -> dict[str, pd.DataFrame]:
    """Profiles of the fit at `theta` (a, b, e, alpha, beta) of `objective(theta, *args)`.

    Each profile walks outward from the optimum in both directions, warm-starting every refit
    from its neighbour. Returns {name: DataFrame(value, stat)}.
    """
    lN, lD, lL, _ = args
    f_best = objective(theta, *args)[0]
    resid = lL - _lhat(theta, lN, lD)
    factor = 2 * lN.size if np.median(np.abs(resid)) > delta else lN.size
    out = {}
    for name in names:
        i = {"E": 2, "alpha": 3, "beta": 4}[name]
        best_v = float(np.exp(theta[2])) if name == "E" else float(theta[i])
        values = _grid(name, best_v, float(np.exp(lL.min())), n_grid)
        start = int(np.argmin(np.abs(values - best_v)))
        stats = np.full(values.size, np.inf)
        for order in (range(start, values.size), range(start, -1, -1)):
            x = np.array(theta, float)
            for j in order:
                x[i] = np.log(max(values[j], 1e-6 * values[-1])) if name == "E" else values[j]
                bounds = [(None, None)] * 5
                bounds[i] = (x[i], x[i])
                r = minimize(objective, x, args=args, jac=True, method="L-BFGS-B",
                             bounds=bounds, options={"maxiter": 1000, "ftol": 1e-13,
                                                     "gtol": 1e-10})
                if np.all(np.isfinite(r.x)) and np.isfinite(r.fun):
                    x = r.x
                    stats[j] = min(stats[j], factor * np.log(max(r.fun, 1e-300) / f_best))
        out[name] = pd.DataFrame({"value": values, "stat": np.maximum(stats, 0.0)})
    return out


def profile_interval(prof: pd.DataFrame, level: float) -> tuple[float, float, bool]:
    """(lo, hi, identified): the values within the chi2(1) threshold; identified is False
    when that set reaches either end of the profiled range."""
    inside = prof["stat"] <= chi2.ppf(level, 1)
    v = prof["value"][inside]
    if v.empty:
        return float("nan"), float("nan"), False
    lo, hi = float(v.min()), float(v.max())
    return lo, hi, bool(lo > prof["value"].min() and hi < prof["value"].max())


def _lhat(theta, lN, lD):
    a, b, e, alpha, beta = theta
    return np.logaddexp(np.logaddexp(a - alpha * lN, b - beta * lD), e)
