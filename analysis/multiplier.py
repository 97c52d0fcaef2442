"""Is recipe B better than recipe A, and by how much compute? The effective-compute multiplier.

Each recipe's ladder (runs at several compute budgets) is fitted with L(C) = A C^(-b) + c. The
multiplier at compute C is m(C) = C_A / C, where C_A is the compute recipe A needs to reach
the loss recipe B reaches at C: L_A(C_A) = L_B(C). m > 1: B is better (A needs m times the
compute); m < 1: B is worse; m = inf: B's loss at C is below A's asymptote, which A never
reaches. If B is A with its compute scaled, L_B(C) = L_A(k C), then m(C) = k at every C, and
the two laws share b and c; with separate exponents m changes with C.

Options:
  exponent="separate" (default) fits each ladder on its own; "shared" fits one b to both (each
    its own amplitude and offset). The interval of b_B - b_A says whether the slopes differ.
  asymptote=None (default) fits c per law; "shared" fits one c to both (with exponent="shared":
    the law of "B is A with its compute scaled", so m is one number at every compute);
    asymptote=E holds c = E in both laws (an irreducible loss known from elsewhere); with a
    shared exponent m is then also one number at every compute.

Interval: bootstrap of the two ladders independently (they are independent experiments), 95%
percentile. method="wild" (default) keeps every size and multiplies its residuals by a random
weight (Webb's six-point weights), all seeds of a model together: a cluster wild bootstrap,
which keeps the design of a 4-8-size ladder intact. Each size's mean residual is first
divided by 1 - H, H the size's leverage in the fit (CR3; with one run per size HC3, MacKinnon
and White 1985): a fit of 3 parameters through 4 sizes leaves residuals far smaller than the
noise, and without it the 95% intervals held the truth in only 75-90% of simulated ladders
(bench/compare.py, docs/analysis.md). method="cases"
resamples whole sizes (seeds of a model together) with replacement, as fit_power_law does;
with few sizes most resamples lose the ends of the ladder. Both are measured on simulated
ladders with known multipliers in bench/compare.py (docs/analysis.md).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from . import solve
from ._blas import one_blas_thread
from .checks import check_count, check_level, check_xy
from .fit import PowerLaw
from .results import compute, finished, load_results

EXPONENTS = ("separate", "shared")
METHODS = ("wild", "cases")
_WEBB = np.sqrt([1.5, 1.0, 0.5, 0.5, 1.0, 1.5]) * np.array([-1, -1, -1, 1, 1, 1])


def ladder(runs, flops: str = "counted", name: str = "runs") -> tuple[np.ndarray, np.ndarray]:
    """(compute, loss) of one recipe's finished runs: a sweep directory or results.csv path,
    a results DataFrame (as load_results reads it), or a pair (compute, loss) of arrays."""
    if isinstance(runs, (str, Path)):
        runs = load_results(runs)
    if isinstance(runs, pd.DataFrame):
        df = finished(runs) if "status" in runs else runs
        if "val_loss" not in df:
            raise ValueError(f"{name}: a results table needs a 'val_loss' column (a sweep's "
                             "results.csv), or pass (compute, loss) arrays")
        x, y = compute(df, flops), df["val_loss"].to_numpy(float)
    else:
        try:
            x, y = runs
        except (TypeError, ValueError):
            raise ValueError(f"{name}: pass a sweep directory, a results DataFrame or a pair "
                             f"(compute, loss) of arrays, not {type(runs).__name__}") from None
    x, y = check_xy(x, y, f"{name} compute", f"{name} loss")
    if np.unique(x).size < 3:
        raise ValueError(f"{name}: {np.unique(x).size} distinct compute budget(s); a ladder "
                         "needs at least 3 sizes (4-8 to compare recipes; see docs/analysis.md)")
    return x, y


@dataclass(frozen=True)
class Comparison:
    """Recipe B against recipe A: the multiplier at `at` with its interval, the two laws and
    the bootstrap they came from (`boot`: per resample l, b, c of each law in the centred
    coordinates u = log C - u_ref, and `ok`)."""
    law_a: PowerLaw
    law_b: PowerLaw
    at: float
    multiplier: float
    lo: float
    hi: float
    level: float
    exponent: str
    asymptote: float | str | None
    method: str
    boot: pd.DataFrame
    u_ref: float
    points: tuple  # (compute, loss) of A, then of B: the runs fitted
    names: tuple[str, str] = ("A", "B")

    @property
    def n_a(self) -> int:
        return self.points[0][0].size

    @property
    def n_b(self) -> int:
        return self.points[1][0].size

    def multiplier_at(self, C) -> np.ndarray:
        """m(C) of the fitted laws (the point estimate), at each compute C."""
        a, b = self.law_a, self.law_b
        return _multiplier(np.log(a.A), a.b, a.c, np.log(b.A), b.b, b.c, np.log(C))

    def interval(self, C, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Bootstrap percentile interval of m(C) at each compute C."""
        level = self.level if level is None else level
        lc = np.log(np.atleast_1d(np.asarray(C, float)))
        with np.errstate(divide="ignore"):
            m = np.log(self._boot_m(lc))                        # inf where A never gets there
        q = np.quantile(m, [0.5 * (1 - level), 0.5 * (1 + level)], axis=0, method="inverted_cdf")
        return np.exp(q[0]), np.exp(q[1])

    def _boot_m(self, lc: np.ndarray) -> np.ndarray:
        t = self.boot[self.boot["ok"]]
        cols = [t[k].to_numpy()[:, None] for k in ("l_a", "b_a", "c_a", "l_b", "b_b", "c_b")]
        return _multiplier(*cols, lc[None, :] - self.u_ref)

    @property
    def b_diff(self) -> float:
        """b_B - b_A (0 by construction with a shared exponent)."""
        return self.law_b.b - self.law_a.b

    @property
    def b_diff_ci(self) -> tuple[float, float]:
        t = self.boot[self.boot["ok"]]
        d = (t["b_b"] - t["b_a"]).to_numpy()
        q = np.percentile(d, [50 * (1 - self.level), 50 * (1 + self.level)])
        return float(q[0]), float(q[1])

    @property
    def exponents_differ(self) -> bool | None:
        """Whether the interval of b_B - b_A excludes 0 (None with a shared exponent)."""
        if self.exponent == "shared":
            return None
        lo, hi = self.b_diff_ci
        return bool(lo > 0 or hi < 0)

    def summary(self) -> str:
        na, nb = self.names
        pct = int(round(100 * self.level))
        ok = int(self.boot["ok"].sum())
        c = ("c fitted per law" if self.asymptote is None else "one c fitted to both"
             if self.asymptote == "shared" else f"c = {self.asymptote:g} fixed")
        lines = [f"{nb} against {na}: L(C) = A C^-b + c per recipe ({self.exponent} exponent, "
                 f"{c}), {self.n_a} and {self.n_b} runs, {pct}% {self.method} bootstrap "
                 f"({ok} of {len(self.boot)} resamples usable)"]
        for name, law in ((na, self.law_a), (nb, self.law_b)):
            lines.append(f"  {name:>8}: L = {law.A:.4g} C^-{law.b:.4f} + {law.c:.4g}")
        lines.append(f"  compute multiplier at C = {self.at:.3g}: {_fmt(self.multiplier)} "
                     f"[{_fmt(self.lo)}, {_fmt(self.hi)}]  ({na} needs this many times the "
                     f"compute to reach {nb}'s loss)")
        if self.exponent == "separate":
            lo, hi = self.b_diff_ci
            verdict = ("the exponents differ" if self.exponents_differ else
                       "no evidence the exponents differ")
            lines.append(f"  b_{nb} - b_{na} = {self.b_diff:+.4f} [{lo:+.4f}, {hi:+.4f}]: "
                         f"{verdict}" + ("; the multiplier changes with compute"
                                         if self.exponents_differ else ""))
        if self.lo <= 1 <= self.hi:
            lines.append(f"  the interval contains 1: these ladders do not show {nb} better "
                         f"or worse than {na} at this compute")
        return "\n".join(lines)


def _fmt(m: float) -> str:
    return "inf" if np.isinf(m) else f"{m:.3g}"


def _multiplier(la, ba, ca, lb, bb, cb, u):
    """m at u (log compute in the laws' coordinates): u_A solves la - ba u_A = log(L_B - ca)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        reducible = np.exp(lb - bb * u) + cb - ca                # A's reducible loss to match
        log_m = np.where(reducible > 0, (la - np.log(reducible)) / ba - u, np.inf)
        return np.exp(log_m)


def _weights(x: np.ndarray, n_boot: int, rng: np.random.Generator, method: str):
    """[n_boot, n] per-point weights: the wild bootstrap's residual multipliers, or the cases
    bootstrap's multiplicities; all runs with equal compute (seeds of one model) together.
    Also [n_boot] the number of distinct sizes each resample keeps."""
    _, g = np.unique(x, return_inverse=True)
    k = g.max() + 1
    if method == "wild":
        return rng.choice(_WEBB, (n_boot, k))[:, g], np.full(n_boot, k)
    counts = np.stack([np.bincount(rng.integers(0, k, k), minlength=k) for _ in range(n_boot)])
    return counts[:, g].astype(float), (counts > 0).sum(1)


def _fit(problems, exponent: str, c_fixed, offset: bool | str = True):
    """Least squares of each (u, Y [R, n], W [R, n]) problem: laws (l, b, c) per problem."""
    if exponent == "shared":
        l, b, c, _, ok = solve.least_squares_shared(problems, offset, c_fixed)
        return [(l[k], b, c[k]) for k in range(len(problems))], ok
    out, ok = [], True
    for p in problems:
        l, b, c, _, okk = solve.least_squares_shared([p], True, c_fixed)
        out.append((l[0], b, c[0]))
        ok = ok & okk
    return out, ok


def _leverage(us, laws, exponent: str, offset) -> list[np.ndarray]:
    """Each point's leverage, the diagonal of J (J'J)^+ J' for the Jacobian J of the joint
    model at the fit (columns: each law's log amplitude, the exponent(s), the offset(s); none
    for a fixed offset), split back into the two ladders; capped at 0.9."""
    n = [u.size for u in us]
    cols = []
    p = [np.exp(l - b * u) for u, (l, b, c) in zip(us, laws)]
    side = [np.r_[np.ones(n[0]), np.zeros(n[1])], np.r_[np.zeros(n[0]), np.ones(n[1])]]
    cols += [np.r_[p[0], np.zeros(n[1])], np.r_[np.zeros(n[0]), p[1]]]
    db = np.r_[-us[0] * p[0], -us[1] * p[1]]
    cols += [db * side[0], db * side[1]] if exponent == "separate" else [db]
    if offset is True:
        cols += side
    elif offset == "shared":
        cols.append(np.ones(sum(n)))
    J = np.stack(cols, axis=1)
    h = np.einsum("ij,jk,ik->i", J, np.linalg.pinv(J.T @ J), J)
    return [h[:n[0]], h[n[0]:]]


def _unshrunk(x: np.ndarray, r: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Residuals r with the fit's pull undone per size (CR3, Bell and McCaffrey 2002): the
    runs of one size share a design row, so only their mean residual is pulled toward 0, by
    the size's leverage H (the sum of its runs' h): mean / (1 - H) + each run's deviation from
    the mean. One run per size is HC3's r / (1 - h). H is capped at 0.9."""
    _, g = np.unique(x, return_inverse=True)
    count = np.bincount(g)
    mean = np.bincount(g, r) / count
    H = np.minimum(np.bincount(g, h), 0.9)
    return mean[g] / (1 - H[g]) + (r - mean[g])


@one_blas_thread()
def compare(runs_a, runs_b, at: float | None = None, *, exponent: str = "separate",
            asymptote: float | str | None = None, method: str = "wild", n_boot: int = 2000,
            seed: int = 0, level: float = 0.95, flops: str = "counted",
            names: tuple[str, str] = ("A", "B")) -> Comparison:
    """The effective-compute multiplier of recipe B over recipe A at compute `at`.

    runs_a, runs_b: each a sweep directory (or its results.csv), a results DataFrame, or a
        pair (compute, loss); losses are final validation losses, compute in FLOPs
        (flops="counted" or "6nd" for sweep results).
    at: the compute to compare at (default: the largest compute either ladder trained).
    exponent: "separate" (default) or "shared"; asymptote: None (c per law), "shared" (one c,
        with exponent="shared") or a fixed c >= 0 for both laws.
    method: "wild" (default) or "cases" bootstrap (module docstring); n_boot, seed, level.
    Returns a Comparison: .multiplier, .lo, .hi, .law_a, .law_b, .b_diff_ci, .summary().
    """
    if exponent not in EXPONENTS:
        raise ValueError(f"exponent={exponent!r}: use one of {list(EXPONENTS)}")
    if method not in METHODS:
        raise ValueError(f"method={method!r}: use one of {list(METHODS)}")
    level, n_boot = check_level(level), check_count(n_boot, minimum=100)
    xa, ya = ladder(runs_a, flops, f"runs_a ({names[0]})")
    xb, yb = ladder(runs_b, flops, f"runs_b ({names[1]})")
    if asymptote == "shared" and exponent != "shared":
        raise ValueError("asymptote='shared' needs exponent='shared' (one law shape for both "
                         "recipes); with separate exponents use asymptote=None or a number")
    if asymptote is not None and asymptote != "shared":
        if not isinstance(asymptote, (int, float)):
            raise ValueError(f"asymptote={asymptote!r}: use None, 'shared' or a number >= 0")
        if not (np.isfinite(asymptote) and asymptote >= 0):
            raise ValueError(f"asymptote={asymptote}: a fixed irreducible loss >= 0, or None")
        if asymptote >= min(ya.min(), yb.min()):
            raise ValueError(f"asymptote={asymptote:g} is not below every loss (lowest "
                             f"{min(ya.min(), yb.min()):.4g}): the power-law term must be > 0")
    at = float(max(xa.max(), xb.max()) if at is None else at)
    if not (np.isfinite(at) and at > 0):
        raise ValueError(f"at={at}: the compute to compare at, in FLOPs (> 0)")
    u_ref = float(np.mean(np.log(np.r_[xa, xb])))
    ua, ub = np.log(xa) - u_ref, np.log(xb) - u_ref
    fixed = asymptote is not None and asymptote != "shared"
    c_fixed = np.full(1, float(asymptote)) if fixed else None
    offset = "shared" if asymptote == "shared" else True
    (la, ba, ca), (lb, bb, cb) = (tuple(float(v[0]) for v in t) for t in _fit(
        [(ua, ya, np.ones((1, xa.size))), (ub, yb, np.ones((1, xb.size)))], exponent, c_fixed,
        offset)[0])
    for name, l, b in ((names[0], la, ba), (names[1], lb, bb)):
        if not solve.B_GRID[0] * 1.01 < b < solve.B_GRID[-1] / 1.01:
            raise ValueError(f"{name}: the exponent ran to its search bound ({b:.3g}); this "
                             "ladder does not determine it (too little range or noise); "
                             "try exponent='shared' or add sizes")
    rng = np.random.default_rng(seed)
    sides, usable = [], np.ones(n_boot, bool)
    laws = ((la, ba, ca), (lb, bb, cb))
    lev = _leverage((ua, ub), laws, exponent, offset if not fixed else None)
    for x, u, y, (l, b, c), h in zip((xa, xb), (ua, ub), (ya, yb), laws, lev):
        w, kept = _weights(x, n_boot, rng, method)
        usable &= kept >= 3            # a resample of fewer than 3 sizes cannot fit the law
        if method == "wild":
            fit = np.exp(l - b * u) + c
            # a fit through 4-8 sizes pulls each residual toward 0 by its leverage: undone
            sides.append((u, fit + _unshrunk(x, y - fit, h) * w, np.ones_like(w)))
        else:
            sides.append((u, np.broadcast_to(y, w.shape), w))
    c_boot = np.full(n_boot, float(asymptote)) if fixed else None
    ((bla, bba, bca), (blb, bbb, bcb)), ok = _fit(sides, exponent, c_boot, offset)
    boot = pd.DataFrame(dict(l_a=bla, b_a=bba, c_a=bca, l_b=blb, b_b=bbb, c_b=bcb,
                             ok=ok & usable))

    def law(l, b, c, name):
        return PowerLaw(A=float(np.exp(l + b * u_ref)), b=b, c=c, name=name)

    out = Comparison(law_a=law(la, ba, ca, names[0]), law_b=law(lb, bb, cb, names[1]), at=at,
                     multiplier=float("nan"), lo=float("nan"), hi=float("nan"), level=level,
                     exponent=exponent, asymptote=asymptote, method=method, boot=boot,
                     u_ref=u_ref, points=((xa, ya), (xb, yb)), names=tuple(names))
    lo, hi = out.interval(at)
    return replace(out, multiplier=float(out.multiplier_at(at)), lo=float(lo[0]),
                   hi=float(hi[0]))
