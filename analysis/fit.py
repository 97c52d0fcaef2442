"""Power-law fits y = A * x^(-b) + c with bootstrap intervals you can trust.

Default loss: least squares on y itself, the fit Cerebras-GPT (and a plain curve_fit) used,
so a sweep's law is comparable with the published one; on the seven published points it gives
b = 0.0733, c = 0.501 (paper: 0.0737, 0.5066). Huber with delta = 1e-3 on log y (Chinchilla's
choice) behaves like an L1 fit through a few points when there are only 5-10 runs, as a
compute-optimal sweep has, and moved the published law to b = 0.067, c = 0.33; it stays
available (delta=1e-3, space="log") and is the default of approach 3 (analysis.chinchilla).

Intervals: every bootstrap refit is a full fit (the global least-squares search, or the same
grid of starts as the main fit), not a polish of the full-data optimum; resamples with fewer
distinct x than parameters are skipped and counted; failed refits are counted; runs with equal
x (replicate seeds of one model) are resampled together. The offset c is bounded at 0 rather
than parameterised as log c, so a refit can leave the bound. When the data cannot pin c down
(the profile of the fit over c stays under the 95% threshold up to a bound) the fit says so
and carries that profile.

Conditioning: x spans 1e15..1e23, so A * x^(-b) is never formed directly. The solvers see
(l, b, c) with y_hat = exp(l - b * (log x - log x_ref)) + c, x_ref the geometric mean of x.
The result is reported both as A and as the Cerebras-style scale x0 = A^(1/b).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.special import huber
from scipy.stats import chi2, spearmanr

from . import solve
from ._blas import one_blas_thread
from .checks import check_count, check_level, check_xy, fmt_bound


def huber_loss(r: np.ndarray, delta: float) -> tuple[float, np.ndarray]:
    """Summed Huber loss of residuals r and its derivative with respect to r."""
    return float(np.sum(huber(delta, r))), np.clip(r, -delta, delta)


def bootstrap_indices(n: int, n_boot: int, seed: int, groups=None) -> list[np.ndarray]:
    """Row indices for n_boot resamples with replacement.

    With `groups` (e.g. model size, or x itself), whole groups are resampled together (cluster
    bootstrap), so repeated seeds of one model do not count as independent evidence.
    """
    rng = np.random.default_rng(seed)
    if groups is None:
        return [rng.integers(0, n, n) for _ in range(n_boot)]
    groups = np.asarray(groups)
    if len(groups) != n:
        raise ValueError(f"groups has length {len(groups)}, expected one label per point ({n})")
    # each group's rows in first-seen order, from one sort (not one scan per group: O(n^2))
    _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    members = np.split(order, np.cumsum(np.bincount(inverse.ravel()))[:-1])
    members = [members[i] for i in np.argsort(first, kind="stable")]
    out = []
    for _ in range(n_boot):
        pick = rng.integers(0, len(members), len(members))
        out.append(np.concatenate([members[i] for i in pick]))
    return out


def percentile_ci(samples: pd.DataFrame, level: float) -> dict[str, tuple[float, float]]:
    """Percentile intervals of each bootstrap column."""
    lo, hi = 50 * (1 - level), 50 * (1 + level)
    if samples.dropna().empty:
        return {k: (float("nan"), float("nan")) for k in samples}
    return {k: (float(np.nanpercentile(v, lo)), float(np.nanpercentile(v, hi)))
            for k, v in samples.items()}


@dataclass(frozen=True)
class PowerLaw:
    """y = A * x^(-b) + c, also written (x / x0)^(-b) + c with x0 = A^(1/b).

    x_range: the x the law was fitted on, where known (plots draw a published law only there).
    """
    A: float
    b: float
    c: float = 0.0
    name: str = ""
    x_range: tuple[float, float] | None = None

    @classmethod
    def from_scale(cls, x0: float, b: float, c: float = 0.0, name: str = "",
                   x_range: tuple[float, float] | None = None) -> "PowerLaw":
        """The Cerebras/Kaplan form (x / x0)^(-b) + c."""
        return cls(A=float(np.exp(b * np.log(x0))), b=b, c=c, name=name, x_range=x_range)

    @property
    def x0(self) -> float:
        return float(np.exp(np.log(self.A) / self.b)) if self.b != 0 else float("nan")

    @property
    def params(self) -> dict[str, float]:
        return {"A": self.A, "b": self.b, "c": self.c}

    def predict(self, x) -> np.ndarray:
        x = np.asarray(x, float)
        return np.exp(np.log(self.A) - self.b * np.log(x)) + self.c

    __call__ = predict


@dataclass
class PowerLawFit:
    """A fitted PowerLaw with bootstrap samples (`boot`) and percentile CIs (`ci`).

    skipped: resamples with too few distinct x to fit; failed: refits that did not converge;
    neither is in `boot`. profile: the fit over a grid of fixed offsets (c, stat, where stat =
    n log(RSS_c / RSS_best), about chi2(1) when c is the truth); offset_identified: False when
    every c up to a bound (0 or min y) fits within the level's threshold.
    """
    law: PowerLaw
    ci: dict[str, tuple[float, float]]
    boot: pd.DataFrame
    n: int
    offset: bool
    delta: float
    level: float
    loss: float
    extra: dict = field(default_factory=dict)
    skipped: int = 0
    failed: int = 0
    profile: pd.DataFrame | None = None
    offset_identified: bool | None = None

    @property
    def params(self) -> dict[str, float]:
        return self.law.params

    @property
    def x0(self) -> float:
        return self.law.x0

    def predict(self, x) -> np.ndarray:
        return self.law.predict(x)

    def predict_interval(self, x, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise bootstrap percentile band of the prediction at x."""
        level = self.level if level is None else level
        lx = np.log(np.asarray(x, float))
        b = self.boot.dropna()
        if b.empty:
            return np.full(lx.shape, np.nan), np.full(lx.shape, np.nan)
        preds = np.exp(np.log(b["A"].to_numpy())[:, None] - b["b"].to_numpy()[:, None] * lx) \
            + b["c"].to_numpy()[:, None]
        return (np.percentile(preds, 50 * (1 - level), axis=0),
                np.percentile(preds, 50 * (1 + level), axis=0))

    def profile_interval(self) -> tuple[float, float]:
        """The offsets whose profile statistic is within the level's chi2(1) threshold."""
        if self.profile is None:
            return (float("nan"), float("nan"))
        inside = self.profile[self.profile["stat"] <= chi2.ppf(self.level, 1)]
        return float(inside["c"].min()), float(inside["c"].max())

    def summary(self) -> str:
        loss = "least squares" if np.isinf(self.delta) else f"Huber delta={self.delta:g}"
        n_boot = len(self.boot) + self.skipped + self.failed
        lines = [f"L = A * x^(-b) + c, {self.n} points, {loss} on "
                 f"{self.extra.get('space', 'linear')} y, {int(100 * self.level)}% bootstrap CI "
                 f"({len(self.boot)} of {n_boot} resamples; {self.skipped} skipped with too few "
                 f"distinct x, {self.failed} failed)"]
        for k, v in self.params.items():
            if k == "c" and not self.offset:
                continue
            lo, hi = self.ci[k]
            lines.append(f"  {k:>2} = {v:.5g}  [{fmt_bound(lo, v)}, {fmt_bound(hi, v)}]")
        lines.append(f"  x0 = A^(1/b) = {self.x0:.4g}")
        if self.offset_identified is False:
            plo, phi = self.profile_interval()
            lines.append(f"  c is not identified by these data: every c in [{plo:.4g}, {phi:.4g}] "
                         f"fits within the {int(100 * self.level)}% profile threshold; "
                         "read b and A together with c. Profile (c: n log RSS ratio):")
            rows = self.profile.iloc[np.linspace(0, len(self.profile) - 1, 6).round().astype(int)]
            lines.append("    " + ", ".join(f"{r.c:.3g}: {r.stat:.2f}" for r in rows.itertuples()))
        return "\n".join(lines)


def _group_labels(x, groups):
    if isinstance(groups, str):
        if groups != "x":
            raise ValueError(f"groups={groups!r}: use 'x' (runs with equal x together), None "
                             "(each run alone) or one label per run")
        return x
    return groups


def _profile(u, y, best, delta, offset, space, n_grid: int = 41) -> pd.DataFrame:
    """Refit with c held at each point of a grid on [0, min y); n log(RSS_c / RSS_best)."""
    cs = np.unique(np.r_[np.linspace(0.0, 0.999 * y.min(), n_grid), best[2]])

    def rss(l, b, c):
        yhat = np.exp(l - b * u) + c
        r = np.log(y) - np.log(yhat) if space == "log" else y - yhat
        return float(r @ r)

    if np.isinf(delta) and space == "linear":
        l, b, c, _, _ = solve.least_squares(u, np.tile(y, (cs.size, 1)), offset, c_fixed=cs)
        out = [rss(*t) for t in zip(l, b, c)]
    else:
        out = []
        for c in cs:
            grid = [s for s in solve.starts(u, y, offset) if s[2] == 0.0]
            theta, _, _ = solve.multistart(u, y, delta, offset, space, grid, c_fixed=c)
            out.append(rss(*theta) if theta is not None else np.inf)
    base = rss(*best)
    stat = y.size * np.log(np.maximum(np.array(out), 1e-300) / max(base, 1e-300))
    return pd.DataFrame({"c": cs, "stat": np.maximum(stat, 0.0)})


@one_blas_thread()
def fit_power_law(x, y, offset: bool = True, *, delta: float = np.inf, space: str = "linear",
                  n_boot: int = 1000, seed: int = 0, level: float = 0.95,
                  groups="x", n_refine: int | None = 4) -> PowerLawFit:
    """Fit y = A * x^(-b) (+ c if offset, c >= 0), with bootstrap percentile intervals.

    x, y: positive arrays (e.g. counted FLOPs and validation loss of finished runs).
    delta: Huber threshold on the residuals; np.inf (default) is least squares.
    space: "linear" (default) puts residuals on y, as the published Cerebras-GPT fit did;
        "log" on log y (with delta=1e-3: Chinchilla's robust choice).
    n_boot, seed, level: bootstrap resamples, RNG seed, CI level.
    groups: "x" (default) resamples runs with equal x (seeds of one model) together; None
        resamples runs one by one; or one label per run.
    n_refine: for Huber or log-space fits, L-BFGS-B runs from the n_refine starts of the
        20-point grid with the lowest starting objective (None: all 20), in the main fit and
        in every bootstrap refit alike. Least squares on y needs no starts (a global search).
    Returns PowerLawFit with .params {"A", "b", "c"} (c = 0.0 without offset), .ci, .predict,
    .skipped/.failed bootstrap counts and, with an offset, .profile / .offset_identified.
    """
    x, y = check_xy(x, y)
    level, n_boot = check_level(level), check_count(n_boot)
    k = 3 if offset else 2
    if x.size < k:
        raise ValueError(f"need at least {k} points to fit {k} parameters, got {x.size}; "
                         "finish more runs or use offset=False")
    if np.unique(x).size < k:
        raise ValueError(f"x takes {np.unique(x).size} distinct value(s): repeated seeds of one "
                         f"size add no information about the curve's shape, and {k} parameters "
                         f"need at least {k} distinct x; add sizes"
                         + (" or use offset=False" if offset else ""))
    if np.ptp(y) == 0 or spearmanr(x, y)[0] >= 0:
        raise ValueError("y does not fall as x grows (constant or rising losses), so no "
                         "decaying power law fits; check the runs (diverged? same model?)")
    if space not in ("log", "linear"):
        raise ValueError(f"space={space!r}: use 'log' or 'linear'")
    if not delta > 0:
        raise ValueError(f"delta={delta} must be > 0 (np.inf for least squares)")
    labels = _group_labels(x, groups)
    lx_ref = float(np.mean(np.log(x)))
    u = np.log(x) - lx_ref
    fast = np.isinf(delta) and space == "linear"

    def fit_one(uu, yy) -> tuple[np.ndarray | None, float, bool]:
        if fast:
            l, b, c, rss, ok = solve.least_squares(uu, yy[None], offset)
            return np.array([l[0], b[0]] + ([c[0]] if offset else [])), 0.5 * rss[0], bool(ok[0])
        grid = solve.screen(solve.starts(uu, yy, offset), uu, yy, delta, offset, space, n_refine)
        return solve.multistart(uu, yy, delta, offset, space, grid)

    best, fun, ok = fit_one(u, y)
    if best is None or not ok:
        raise ValueError("the power-law fit did not converge on the full data "
                         f"(best objective {fun:.3g}); check the runs for outliers")
    if fast and not solve.B_GRID[0] * 1.01 < best[1] < solve.B_GRID[-1] / 1.01:
        raise ValueError(f"the exponent b ran to its search bound ({best[1]:.3g}, searched "
                         f"{solve.B_GRID[0]:g}..{solve.B_GRID[-1]:g}): these runs do not "
                         "determine it; add runs over a wider range of x")

    def to_law(theta) -> PowerLaw:
        return PowerLaw(A=float(np.exp(theta[0] + theta[1] * lx_ref)), b=float(theta[1]),
                        c=float(theta[2]) if offset else 0.0)

    idx = [i for i in bootstrap_indices(x.size, n_boot, seed, labels)]
    usable = [i for i in idx if np.unique(u[i]).size >= k]
    skipped, failed, rows = len(idx) - len(usable), 0, []
    if usable and fast:
        # a cluster bootstrap over groups of unequal size (e.g. more seeds at one size) draws
        # resamples of unequal length: solve each length's resamples as one batch
        for size in dict.fromkeys(i.size for i in usable):
            I = np.stack([i for i in usable if i.size == size])
            l, b, c, _, okb = solve.least_squares(u[I], y[I], offset)
            failed += int((~okb).sum())
            rows += [(np.exp(li + bi * lx_ref), bi, ci if offset else 0.0)
                     for li, bi, ci in zip(l[okb], b[okb], c[okb])]
    else:
        for i in usable:
            theta, _, okb = fit_one(u[i], y[i])
            if theta is None or not okb:
                failed += 1
                continue
            rows.append(tuple(to_law(theta).params.values()))
    boot = pd.DataFrame(rows, columns=["A", "b", "c"], dtype=float)
    out = PowerLawFit(law=to_law(best), ci=percentile_ci(boot, level), boot=boot, n=x.size,
                      offset=offset, delta=delta, level=level, loss=float(fun),
                      extra={"space": space}, skipped=skipped, failed=failed)
    if offset and np.unique(x).size > k:
        out.profile = _profile(u, y, best, delta, offset, space)
        lo, hi = out.profile_interval()
        out.offset_identified = bool(lo > 0 and hi < out.profile["c"].max())
    return out
