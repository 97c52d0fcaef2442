"""Chinchilla approach 2: isoFLOP profiles.

For each compute budget, fit a parabola of loss in log N and take its minimum; then fit power
laws N_opt = k_N * C^a and D_opt = k_D * C^b through the minima (least squares in log-log).
D at the minimum is interpolated from the budget's own runs (log D linear in log N), so the
result does not depend on whether C is 6ND or counted FLOPs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import linregress


class Allocation:
    """N_opt(C) = kN·C^a and D_opt(C) = kD·C^b, shared by the approach-1 and approach-2 fits
    (their dataclasses hold a, b, log_kN, log_kD)."""

    def n_opt(self, C) -> np.ndarray:
        return np.exp(self.log_kN + self.a * np.log(np.asarray(C, float)))

    def d_opt(self, C) -> np.ndarray:
        return np.exp(self.log_kD + self.b * np.log(np.asarray(C, float)))

    def tokens_per_param(self, C) -> np.ndarray:
        return self.d_opt(C) / self.n_opt(C)


@dataclass
class IsoFlopFit(Allocation):
    """Per-budget minima (`minima`), the parabolas, and the fitted allocation exponents."""
    minima: pd.DataFrame        # budget, C, N_opt, D_opt, loss_opt, in_range, n_runs
    parabolas: dict             # budget -> (c2, c1, c0) of loss = c2 u^2 + c1 u + c0, u = log N
    data: pd.DataFrame          # the runs used: budget, N, D, C, loss
    a: float                    # N_opt ~ C^a
    b: float                    # D_opt ~ C^b
    log_kN: float
    log_kD: float
    a_stderr: float
    b_stderr: float

    def summary(self) -> str:
        k = len(self.minima)
        if k < 3:
            err = (" (+/- not estimable: a line through 2 budgets leaves 0 degrees of freedom; "
                   "add a budget)", ) * 2
        else:
            err = tuple(f" (+/- {e:.4f})" for e in (self.a_stderr, self.b_stderr))
        out = (f"isoFLOP fit over {k} budgets: N_opt ~ C^{self.a:.4f}{err[0]}, "
               f"D_opt ~ C^{self.b:.4f}{err[1]}")
        edge = self.minima.loc[~self.minima["in_range"], "budget"].tolist()
        if edge:
            out += (f"\n  budgets {edge}: minimum at or beyond the edge of the sampled sizes "
                    "(the lowest loss is the smallest or largest model): not bracketed, so its "
                    "N_opt is an extrapolation; sample sizes beyond that edge")
        return out


def fit_isoflop(data: pd.DataFrame, *, N: str = "N", D: str = "D", C: str = "C",
                loss: str = "loss", budget: str = "budget") -> IsoFlopFit:
    """Fit isoFLOP parabolas and the compute-optimal allocation through their minima.

    data: one row per finished run, with columns named by the keyword arguments:
      N (parameters), D (tokens), C (training FLOPs; runs of a budget should share it up to
      rounding, its median is used), loss (e.g. val_loss), budget (label of the isoFLOP
      group; e.g. the nominal budget). Each budget needs >= 3 distinct N; at least 2 budgets.
    A minimum outside a budget's sampled N range, or one whose lowest-loss run is the smallest
    or largest size (the data do not bracket it), is flagged in_range=False: sample more sizes
    on that side rather than trusting it. With 2 budgets a_stderr/b_stderr are NaN (the line
    through 2 points has no degrees of freedom), and the summary says so.
    """
    for col in (N, D, C, loss, budget):
        if col not in data.columns:
            raise ValueError(f"data has no column {col!r}; pass the column names via "
                             f"N=, D=, C=, loss=, budget= (have {list(data.columns)})")
    df = data[[budget, N, D, C, loss]].rename(
        columns={budget: "budget", N: "N", D: "D", C: "C", loss: "loss"})
    if df["budget"].nunique() < 2:  # before the per-budget checks: an empty frame has no rows
        raise ValueError(f"data has {df['budget'].nunique()} isoFLOP budget(s) in column "
                         f"{budget!r}; the compute-optimal fit needs at least 2")
    for col in ("N", "D", "C", "loss"):
        v = df[col].to_numpy(float)
        if not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise ValueError(f"column {col!r} must be finite and > 0; drop unfinished runs first")
    rows, parabolas = [], {}
    for key, g in df.groupby("budget", sort=False):
        u = np.log(g["N"].to_numpy(float))
        if np.unique(u).size < 3:
            raise ValueError(f"budget {key!r} has {np.unique(u).size} distinct model sizes; "
                             "a parabola needs at least 3")
        c2, c1, c0 = np.polyfit(u, g["loss"].to_numpy(float), 2)
        if c2 <= 0:
            raise ValueError(f"budget {key!r}: loss is not convex in log N (no minimum); "
                             "sample sizes on both sides of the optimum")
        u_opt = -c1 / (2 * c2)
        d1, d0 = np.polyfit(u, np.log(g["D"].to_numpy(float)), 1)
        parabolas[key] = (c2, c1, c0)
        rows.append(dict(budget=key, C=float(g["C"].median()), N_opt=float(np.exp(u_opt)),
                         D_opt=float(np.exp(d0 + d1 * u_opt)),
                         loss_opt=float(c0 - c1 ** 2 / (4 * c2)),
                         in_range=_bracketed(u, g["loss"].to_numpy(float), u_opt),
                         n_runs=len(g)))
    minima = pd.DataFrame(rows).sort_values("C").reset_index(drop=True)
    if minima["C"].nunique() < 2:
        raise ValueError(f"need at least 2 budgets with distinct C, got {minima['C'].nunique()}")
    lc = np.log(minima["C"].to_numpy())
    fn = linregress(lc, np.log(minima["N_opt"].to_numpy()))
    fd = linregress(lc, np.log(minima["D_opt"].to_numpy()))
    # Through 2 budgets the line is exact: linregress's stderr 0 means "no degrees of freedom".
    se = (float(fn.stderr), float(fd.stderr)) if len(minima) > 2 else (np.nan, np.nan)
    return IsoFlopFit(minima=minima, parabolas=parabolas, data=df, a=float(fn.slope),
                      b=float(fd.slope), log_kN=float(fn.intercept), log_kD=float(fd.intercept),
                      a_stderr=se[0], b_stderr=se[1])


def _bracketed(u: np.ndarray, loss: np.ndarray, u_opt: float) -> bool:
    """The vertex lies inside the sampled sizes AND a sampled size on each side has a higher
    loss than the best run: losses rising monotonically from the smallest size put the vertex
    next to the edge, where the parabola's curvature, not the data, places it."""
    i = int(np.argmin(loss))
    return bool(u.min() <= u_opt <= u.max() and u.min() < u[i] < u.max())
