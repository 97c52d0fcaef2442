"""Chinchilla approach 2: isoFLOP profiles.

For each compute budget, locate the loss-minimising model size N_opt; then fit power laws
N_opt = k_N * C^a and D_opt = k_D * C^b through the minima (lines in log-log).

The minimum of a budget is read LOCALLY: a parabola in u = log N through the `window` sizes
around the budget's lowest-loss run, its vertex kept between that run's two neighbours. One
parabola over a wide grid is not enough: an isoFLOP curve is lopsided (L = E + A/N^alpha +
B/D^beta climbs as exp(alpha |du|) on one side and exp(beta du) on the other), so the vertex of
a parabola through every size moves with where the grid sits around the optimum, and grids sit
differently at each budget (a fixed set of sizes trained at every budget puts the optimum near
the small end at low compute and near the large end at high compute): the exponent inherits
that drift. `window=None` fits every size (the textbook approach 2).

A budget whose lowest loss is its smallest or largest size does not bracket its minimum: its
N_opt is an extrapolation, and it is left out of a and b (listed in `minima` with why);
`keep_edges=True` keeps it, vertex and all.

Uncertainty: each vertex has a variance from its local fit (delta method, with the run-to-run
noise pooled over the budgets' residuals, relative to the loss), and the line through the
minima is a weighted meta-regression (weights 1 / (vertex variance + tau^2), tau^2 the scatter
the vertices do not explain, by the method of moments) with the Knapp-Hartung interval: the
t distribution on k - 2 degrees of freedom, scaled by the weighted residual scatter (never
below 1). A poorly located vertex counts less, and the interval is wide when the minima
scatter about the line whatever their own variances say.

D at the minimum is interpolated from the window's own runs (log D linear in log N), so the
result does not depend on whether C is 6ND or counted FLOPs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from .checks import check_count, check_level

MIN_T = 3.0   # a window's curvature must stand this many standard errors above 0 (or widen)


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
    """Per-budget minima (`minima`: every budget, `used` says which enter a and b, `why` why
    not), the local parabolas, and the fitted allocation exponents with their intervals."""
    minima: pd.DataFrame        # budget, C, N_opt, D_opt, loss_opt, in_range, n_runs, n_window,
    #                             N_lo, N_hi (the window), log_n_sd, used, why
    parabolas: dict             # budget -> (c2, c1, c0) of loss = c2 u^2 + c1 u + c0, u = log N
    data: pd.DataFrame          # the runs: budget, N, D, C, loss
    a: float                    # N_opt ~ C^a
    b: float                    # D_opt ~ C^b
    log_kN: float
    log_kD: float
    a_stderr: float
    b_stderr: float
    ci: dict = field(default_factory=dict)  # {"a": (lo, hi), "b": (lo, hi)} at `level`
    level: float = 0.95
    window: int | None = 5

    @property
    def used(self) -> pd.DataFrame:
        """The minima that enter a and b."""
        return self.minima[self.minima["used"]]

    def summary(self) -> str:
        k = len(self.used)
        pct = f"{100 * self.level:g}%"
        if k < 3:
            err = (" (interval not estimable: a line through 2 budgets leaves 0 degrees of "
                   "freedom; add a budget)", ) * 2
        else:
            err = tuple(f" [{lo:.4f}, {hi:.4f}] ({pct}, +/- {se:.4f})" for (lo, hi), se in
                        ((self.ci["a"], self.a_stderr), (self.ci["b"], self.b_stderr)))
        how = ("one parabola through every size" if self.window is None else
               f"a parabola through the {self.window} sizes around each budget's best run")
        out = (f"isoFLOP fit over {k} of {len(self.minima)} budgets ({how}): "
               f"N_opt ~ C^{self.a:.4f}{err[0]}, D_opt ~ C^{self.b:.4f}{err[1]}")
        for _, m in self.minima[self.minima["why"] != ""].iterrows():
            state = "kept" if m["used"] else "left out"
            out += f"\n  budget {m['budget']!r} {state}: {m['why']}"
        return out


def fit_isoflop(data: pd.DataFrame, *, N: str = "N", D: str = "D", C: str = "C",
                loss: str = "loss", budget: str = "budget", window: int | None = 5,
                keep_edges: bool = False, level: float = 0.95) -> IsoFlopFit:
    """Fit isoFLOP minima and the compute-optimal allocation through them.

    data: one row per finished run, with columns named by the keyword arguments:
      N (parameters), D (tokens), C (training FLOPs; runs of a budget should share it up to
      rounding, its median is used), loss (e.g. val_loss), budget (label of the isoFLOP
      group; e.g. the nominal budget). Each budget needs >= 3 distinct N; at least 2 budgets
      must be usable.
    window: the number of sizes around each budget's lowest-loss run that its parabola is
      fitted to (>= 3), or None for every size of the budget (the textbook approach 2, whose
      vertex is not clipped).
    keep_edges: keep budgets whose lowest-loss run is their smallest or largest size (their
      minimum is not bracketed: flagged in_range=False, left out by default).
    With 2 usable budgets the exponents' intervals are NaN (a line through 2 points has no
    degrees of freedom), and the summary says so.
    """
    if window is not None and check_count(window, "window") < 3:
        raise ValueError(f"window={window}: a parabola needs at least 3 sizes; pass window=5 "
                         "(the default) or window=None for every size")
    level = check_level(level)
    for col in (N, D, C, loss, budget):
        if col not in data.columns:
            raise ValueError(f"data has no column {col!r}; pass the column names via "
                             f"N=, D=, C=, loss=, budget= (have {list(data.columns)})")
    df = data[[budget, N, D, C, loss]].rename(
        columns={budget: "budget", N: "N", D: "D", C: "C", loss: "loss"})
    if df["budget"].nunique() < 2:  # before the per-budget checks: an empty frame has no rows
        raise ValueError(f"data has {df['budget'].nunique()} isoFLOP budget(s) in column "
                         f"{budget!r}; the compute-optimal fit needs at least 2")
    for col, name in (("N", N), ("D", D), ("C", C), ("loss", loss)):
        v = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
        if not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise ValueError(f"column {name!r} must be finite and > 0; drop unfinished runs "
                             "first (analysis.finished)")
        df[col] = v
    groups = [(key, g.sort_values("N")[["N", "D", "loss"]].to_numpy().T, float(g["C"].median()))
              for key, g in df.groupby("budget", sort=False)]
    fits = [_budget_minimum(*group, window, keep_edges) for group in groups]
    # Run-to-run noise, relative to the loss, pooled over every window with spare sizes.
    dof = sum(f["dof"] for f in fits)
    s2 = sum(f["rss"] for f in fits) / dof if dof > 0 else 0.0
    if s2 > 0 and window is not None:     # widen the windows whose curvature the noise hides
        fits = [_budget_minimum(*group, window, keep_edges, s2) for group in groups]
    for f in fits:
        del f["rss"], f["dof"]
    parabolas = {f["budget"]: f.pop("parabola") for f in fits}
    for f in fits:
        f["log_n_sd"] = float(np.sqrt(f.pop("var1") * s2)) if dof > 0 else np.nan
    minima = pd.DataFrame(fits).sort_values("C").reset_index(drop=True)
    used = minima[minima["used"]]
    if used["C"].nunique() < 2:
        reasons = "; ".join(f"{m['budget']!r}: {m['why']}" for _, m in minima.iterrows()
                            if not m["used"])
        raise ValueError(f"{len(used)} budget(s) with distinct C have a usable minimum; the "
                         f"fit needs at least 2 ({reasons}). Sample sizes on both sides of "
                         "each budget's optimum" + ("" if keep_edges else
                                                    ", or pass keep_edges=True"))
    lc = np.log(used["C"].to_numpy())
    var = used["log_n_sd"].fillna(0).to_numpy() ** 2
    a, log_kN, a_se = _meta_line(lc, np.log(used["N_opt"].to_numpy()), var)
    b, log_kD, b_se = _meta_line(lc, np.log(used["D_opt"].to_numpy()), var)
    q = student_t.ppf(0.5 + level / 2, len(used) - 2) if len(used) > 2 else np.nan
    ci = {"a": (a - q * a_se, a + q * a_se), "b": (b - q * b_se, b + q * b_se)}
    return IsoFlopFit(minima=minima, parabolas=parabolas, data=df, a=a, b=b, log_kN=log_kN,
                      log_kD=log_kD, a_stderr=a_se, b_stderr=b_se, ci=ci, level=level,
                      window=window)


def _budget_minimum(key, runs: np.ndarray, C: float, window: int | None, keep_edges: bool,
                    s2: float = 0.0) -> dict:
    """One budget's minimum from the parabola through its window (see the module docstring).
    With the pooled relative noise s2, a window whose curvature is under MIN_T standard errors
    grows by a size on each side until it is not (or holds every size). runs: rows N, D,
    loss of the budget's runs, sorted by N."""
    u, log_d, y = np.log(runs[0]), np.log(runs[1]), runs[2]
    n, i = len(u), int(np.argmin(y))
    row = dict(budget=key, C=C, N_opt=np.nan, D_opt=np.nan,
               loss_opt=np.nan, in_range=False, n_runs=n, n_window=0, N_lo=np.nan,
               N_hi=np.nan, var1=np.nan, used=False, why="", parabola=(np.nan,) * 3,
               rss=0.0, dof=0)
    if np.unique(u).size < 3:
        row["why"] = f"{np.unique(u).size} distinct model sizes; a parabola needs at least 3"
        return row
    lo, hi = (0, n) if window is None else _window(i, n, window)
    while True:
        uu, yy = u[lo:hi], y[lo:hi]
        X = np.vander(uu, 3)
        (c2, c1, c0), *_ = np.linalg.lstsq(X, yy, rcond=None)
        scale = float(np.mean(yy))
        cov1 = np.linalg.inv(X.T @ X) * scale ** 2               # per unit relative variance
        curved = s2 == 0 or c2 > MIN_T * np.sqrt(s2 * cov1[0, 0])
        if curved or (lo == 0 and hi == n):
            break
        lo, hi = max(lo - 1, 0), min(hi + 1, n)
    row.update(n_window=hi - lo, N_lo=float(np.exp(uu[0])), N_hi=float(np.exp(uu[-1])),
               parabola=(c2, c1, c0))
    if c2 <= 0:
        row["why"] = ("loss is not convex in log N over the sizes fitted (no minimum); sample "
                      "sizes on both sides of the optimum")
        return row
    v = -c1 / (2 * c2)
    if window is not None and curved:   # the best run's neighbours bracket a unimodal minimum
        v = float(np.clip(v, u[max(i - 1, 0)], u[min(i + 1, n - 1)]))
    bracketed = 0 < i < n - 1 and u[0] <= v <= u[-1]
    d1, d0 = np.polyfit(uu, log_d[lo:hi], 1)
    grad = np.array([c1 / (2 * c2 ** 2), -1 / (2 * c2), 0.0])   # d vertex / d (c2, c1, c0)
    row.update(N_opt=float(np.exp(v)), D_opt=float(np.exp(d0 + d1 * v)),
               loss_opt=float(c0 + c1 * v + c2 * v * v), in_range=bool(bracketed),
               var1=float(grad @ cov1 @ grad), used=bracketed or keep_edges,
               rss=float(np.sum((X @ (c2, c1, c0) - yy) ** 2)) / scale ** 2, dof=len(uu) - 3)
    if not bracketed:
        side = "smallest" if i == 0 or v < u[0] else "largest"
        row["why"] = (f"lowest loss at the {side} size: the minimum is not bracketed, its N_opt "
                      f"an extrapolation; sample sizes beyond the {side}")
    return row


def _window(i: int, n: int, width: int) -> tuple[int, int]:
    """[lo, hi) of `width` consecutive sizes (all of them if fewer), centred on i where the
    grid allows."""
    width = min(width, n)
    lo = min(max(i - width // 2, 0), n - width)
    return lo, lo + width


def _meta_line(x: np.ndarray, y: np.ndarray, var: np.ndarray) -> tuple[float, float, float]:
    """slope, intercept and the slope's Knapp-Hartung standard error of y = c + s x, weights
    1 / (var + tau^2), tau^2 by the method of moments (generalised Q = k - 2)."""
    k = len(x)

    def wls(tau2: float):
        w = 1 / (var + tau2)
        xm, ym = np.average(x, weights=w), np.average(y, weights=w)
        sxx = np.sum(w * (x - xm) ** 2)
        s = np.sum(w * (x - xm) * (y - ym)) / sxx
        return s, ym - s * xm, np.sum(w * (y - ym - s * (x - xm)) ** 2), sxx

    if k <= 2:
        s, c, _, _ = wls(1.0)
        return float(s), float(c), np.nan
    if not np.any(var > 0):                   # no vertex variances: ordinary least squares
        s, c, q, sxx = wls(1.0)
        return float(s), float(c), float(np.sqrt(q / (k - 2) / sxx))
    tau2 = 0.0
    if wls(0.0)[2] > k - 2:                   # Q(tau2) falls as tau2 grows: bisect Q = k - 2
        lo, hi = 0.0, float(np.var(y)) + float(var.max())
        for _ in range(60):
            tau2 = (lo + hi) / 2
            lo, hi = (tau2, hi) if wls(tau2)[2] > k - 2 else (lo, tau2)
        tau2 = hi
    s, c, q, sxx = wls(tau2)
    return float(s), float(c), float(np.sqrt(max(1.0, q / (k - 2)) / sxx))
