"""Is recipe B better than recipe A, and by how much compute? The effective-compute multiplier.

Each recipe's ladder (runs at several compute budgets) is fitted with L(C) = A C^(-b) + c. The
multiplier at compute C is m(C) = C_A / C, where C_A is the compute recipe A needs to reach
the loss recipe B reaches at C: L_A(C_A) = L_B(C). m > 1: B is better (A needs m times the
compute); m < 1: B is worse; m = inf: B's loss at C is below A's asymptote, which A never
reaches. If B is A with its compute scaled, L_B(C) = L_A(k C), then m(C) = k at every C, and
the two laws share b and c; with separate exponents m changes with C.

Options:
  exponent="auto" (default) applies the rule the simulations support (bench/compare.py): one
    law for both (shared b and c: B is A with its compute scaled, m one number) where the
    interval of b_B - b_A (separate fits) and that of c_B - c_A (one exponent, c per law: with
    an exponent per law c trades against b and its interval says little) both contain 0, and
    separate laws otherwise. Where it shares, the reported interval also spans the law with a
    c per recipe, which those runs cannot rule out: a failed test is no proof the asymptotes
    agree, and far beyond the runs a small difference in c moves m most. `.choice` records
    which law and why. exponent="separate" fits each ladder on its own; "shared" fits one b
    to both (each its own amplitude and offset).
  asymptote=None (default) fits c per law; "shared" fits one c to both (with exponent="shared":
    the law of "B is A with its compute scaled", so m is one number at every compute);
    asymptote=E holds c = E in both laws (an irreducible loss known from elsewhere); with a
    shared exponent m is then also one number at every compute (with exponent="auto" the b
    interval alone decides the exponent).

Interval: bootstrap of the two ladders independently (they are independent experiments), 95%
percentile. method="wild" (default) keeps every size and multiplies its residuals by a random
weight (Webb's six-point weights), all seeds of a model together: a cluster wild bootstrap,
which keeps the design of a 4-8-size ladder intact. Each size's mean residual is first
divided by 1 - H, H the size's leverage in the fit (CR3; with one run per size HC3, MacKinnon
and White 1985): a fit of 3 parameters through 4 sizes leaves residuals far smaller than the
noise, and without it the 95% intervals held the truth in only 75-90% of simulated ladders
(bench/compare.py, docs/analysis_compare.md). method="cases"
resamples whole sizes (seeds of a model together) with replacement, as fit_power_law does;
with few sizes most resamples lose the ends of the ladder. Both are measured on simulated
ladders with known multipliers in bench/compare.py (docs/analysis_compare.md).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import warnings

import numpy as np
import pandas as pd

from . import solve
from ._blas import one_blas_thread
from .checks import check_count, check_level, check_xy
from .fit import PowerLaw
from .results import compute, finished, load_results

EXPONENTS = ("auto", "separate", "shared")
UNFINISHED = ("running", "pending")  # a results.csv row that will still change
SPAN = 100.0  # `at` farther than this factor outside both ladders' compute: warned
MAX_LOSS = 100.0  # above any cross-entropy in nats (ln of a 1e43-token vocabulary)
MAX_SPREAD = 1e10  # one ladder's compute span: 4 decades beyond the widest published ladders
METHODS = ("wild", "cases")
_WEBB = np.sqrt([1.5, 1.0, 0.5, 0.5, 1.0, 1.5]) * np.array([-1, -1, -1, 1, 1, 1])


def ladder(runs, flops: str = "counted", name: str = "runs",
           partial: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(compute, loss) of one recipe's finished runs: a sweep directory or results.csv path,
    a results DataFrame (as load_results reads it), or a pair (compute, loss) of arrays. A
    sweep with runs not finished yet (running, pending: not started or stopped) is refused naming
    them, unless `partial` (then a warning names them): half a ladder is another ladder."""
    if isinstance(runs, (str, Path)):
        runs = load_results(runs)
    if isinstance(runs, pd.DataFrame):
        if "status" in runs:
            _check_finished(runs, name, partial)
        df = finished(runs) if "status" in runs else runs
        if "val_loss" not in df:
            raise ValueError(f"{name}: a results table needs a 'val_loss' column (a sweep's "
                             "results.csv), or pass (compute, loss) arrays")
        x, y = compute(df, flops), df["val_loss"].to_numpy(float)
    elif isinstance(runs, dict):
        raise ValueError(f"{name}: a dict ({', '.join(map(str, runs))}); pass the pair "
                         "(compute, loss), e.g. (d['C'], d['L']), or a DataFrame")
    else:
        try:
            x, y = runs
        except (TypeError, ValueError):
            raise ValueError(f"{name}: pass a sweep directory, a results DataFrame or a pair "
                             f"(compute, loss) of arrays, not {type(runs).__name__}") from None
    x, y = check_xy(x, y, f"{name} compute", f"{name} loss")
    if x.max() / x.min() > MAX_SPREAD:
        raise ValueError(f"{name}: compute from {x.min():.3g} to {x.max():.3g}, "
                         f"{np.log10(x.max() / x.min()):.0f} decades in one ladder: some runs "
                         "in other units (PF-days, FLOPs)? write every run's compute in FLOPs")
    if y.min() > MAX_LOSS:   # no cross-entropy in nats is that large
        raise ValueError(f"{name}: losses {y.min():.3g} and above, no loss in nats: the pair "
                         "swapped? pass (compute, loss); a perplexity? pass its log")
    if np.unique(x).size < 3:
        raise ValueError(f"{name}: {np.unique(x).size} distinct compute budget(s); a ladder "
                         "needs at least 3 sizes (4-8 to compare recipes; see "
                         "docs/analysis_compare.md)")
    return x, y


def _check_finished(df: pd.DataFrame, name: str, partial: bool) -> None:
    left = df[df["status"].astype(str).isin(UNFINISHED)]
    if left.empty:
        return
    ids = left["run_id"].astype(str).tolist() if "run_id" in left else []
    what = (f"{name}: {len(left)} of {len(df)} runs not finished "
            f"({', '.join(sorted(set(left['status'].astype(str))))}: "
            f"{', '.join(ids[:6])}{' ...' if len(ids) > 6 else ''})")
    if partial:
        warnings.warn(f"{what}: compared without them", stacklevel=3)
        return
    raise ValueError(f"{what}: the sweep is still running or was stopped; finish it (rerun the "
                     "sweep), or pass partial=True (--partial) to compare its finished runs")


def _check_span(xa: np.ndarray, xb: np.ndarray, at: float, names: tuple[str, str]) -> None:
    """Warn, with the spans, where the comparison extrapolates: `at` more than SPAN times
    outside both ladders, or two ladders that do not overlap (a unit mix-up?)."""
    lo, hi = min(xa.min(), xb.min()), max(xa.max(), xb.max())
    spans = (f"{names[0]} spans {xa.min():.3g}-{xa.max():.3g} FLOPs, {names[1]} "
             f"{xb.min():.3g}-{xb.max():.3g}")
    if at > hi * SPAN or at < lo / SPAN:
        far = at / hi if at > hi else lo / at
        warnings.warn(f"at={at:.3g} is {far:.3g} times {'beyond' if at > hi else 'below'} "
                      f"the compute either ladder trained ({spans}): more than {SPAN:g}x "
                      "outside, the multiplier is an extrapolation of both laws", stacklevel=3)
    if xa.max() < xb.min() or xb.max() < xa.min():
        warnings.warn(f"the ladders do not overlap in compute ({spans}): the multiplier "
                      "extrapolates at least one law (FLOPs of different units?)", stacklevel=3)


class UnpinnedExponent(ValueError):
    """A ladder whose own fit runs its exponent to the search bound: exponent="auto" then
    shares the exponent rather than fail."""


def _ci(d: np.ndarray, level: float) -> tuple[float, float]:
    q = np.percentile(d, [50 * (1 - level), 50 * (1 + level)])
    return float(q[0]), float(q[1])


def _has0(ci: tuple[float, float] | None) -> bool:
    return ci is None or ci[0] <= 0 <= ci[1]


@dataclass(frozen=True)
class LawChoice:
    """What exponent="auto" chose, and the intervals it chose by: b_B - b_A from the separate
    fit; c_B - c_A from one exponent with c per law (with an exponent per law c trades against
    b, and its interval says little). None: not formed (`note` says why)."""
    law: str                                   # "shared", "separate" or "one exponent"
    b_diff_ci: tuple[float, float] | None
    c_diff_ci: tuple[float, float] | None
    level: float
    fixed_c: bool = False                      # asymptote=E given: only the exponent chosen
    note: str = ""

    @property
    def reason(self) -> str:
        pct = f"{round(100 * self.level)}%"
        b = "" if self.b_diff_ci is None else \
            f"b_B - b_A's {pct} interval {_fmt_ci(self.b_diff_ci)}"
        c = "" if self.c_diff_ci is None else f"c_B - c_A's {_fmt_ci(self.c_diff_ci)}"
        if not _has0(self.b_diff_ci):
            why = f"{b} excludes 0: the exponents differ"
        elif self.fixed_c:
            why = (f"{b} contains 0: " if b else "") + "one exponent, c fixed"
        elif self.law != "shared":
            why = (f"{b} contains 0 but " if b else "") + \
                f"{c} (one exponent) excludes 0: the asymptotes differ"
        else:
            why = (f"{b} and " if b else "") + (f"{c} (one exponent) " if c else "") + \
                f"{'both contain' if b else 'contains'} 0: one law, B as A with its compute scaled"
        return why + (f" ({self.note})" if self.note else "")


def _fmt_ci(ci: tuple[float, float]) -> str:
    return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


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
    choice: LawChoice | None = None      # exponent="auto": which law and why
    also: Comparison | None = None       # a fit whose interval the reported one also spans

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
        """Bootstrap percentile interval of m(C) at each compute C (and, where `also` holds a
        second law, the span of both intervals)."""
        level = self.level if level is None else level
        lc = np.log(np.atleast_1d(np.asarray(C, float)))
        with np.errstate(divide="ignore"):
            m = np.log(self._boot_m(lc))                        # inf where A never gets there
        q = np.quantile(m, [0.5 * (1 - level), 0.5 * (1 + level)], axis=0, method="inverted_cdf")
        lo, hi = np.exp(q[0]), np.exp(q[1])
        if self.also is not None:
            lo2, hi2 = self.also.interval(C, level)
            lo, hi = np.minimum(lo, lo2), np.maximum(hi, hi2)
        return lo, hi

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
        return _ci((t["b_b"] - t["b_a"]).to_numpy(), self.level)

    @property
    def c_diff(self) -> float:
        """c_B - c_A, the difference in asymptotes (0 by construction with a shared or fixed
        asymptote)."""
        return self.law_b.c - self.law_a.c

    @property
    def c_diff_ci(self) -> tuple[float, float]:
        """Bootstrap interval of c_B - c_A in this fit (with separate exponents wide: c trades
        against b; `choice.c_diff_ci` is the one-exponent interval exponent="auto" used)."""
        t = self.boot[self.boot["ok"]]
        return _ci((t["c_b"] - t["c_a"]).to_numpy(), self.level)

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
        if self.asymptote is None:
            lo, hi = self.c_diff_ci
            lines.append(f"  c_{nb} - c_{na} = {self.c_diff:+.4f} [{lo:+.4f}, {hi:+.4f}]")
        if self.choice is not None:
            law = ("one law (shared b and c)" if self.choice.law == "shared" and
                   not self.choice.fixed_c else "one exponent" if self.choice.law == "shared"
                   else "separate laws" if self.choice.law == "separate"
                   else "one exponent, c per recipe")
            lines.append(f"  law: exponent='auto' chose {law}: {self.choice.reason}")
        if self.also is not None:
            lines.append(f"  the interval also spans one exponent with a c per recipe, which "
                         f"these runs cannot rule out (m = {_fmt(self.also.multiplier)} "
                         f"[{_fmt(self.also.lo)}, {_fmt(self.also.hi)}])")
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


def _reproduces(Y, W, fit) -> np.ndarray:
    """Per row: whether a fitted law reproduces its (weighted) points at least about as well
    as their mean does (with c free the law holds the mean in its family): where not, the
    fit failed, and a multiplier from it (inf, 1e-9) is the solver's artefact, not the runs'."""
    Y, W, fit = np.atleast_2d(Y), np.atleast_2d(W), np.atleast_2d(fit)
    mean = (W * Y).sum(1, keepdims=True) / W.sum(1, keepdims=True)
    ss_res = (W * (Y - fit) ** 2).sum(1)
    ss_tot = (W * (Y - mean) ** 2).sum(1)
    tol = W.sum(1) * (1e-6 * np.abs(mean[:, 0])) ** 2
    with np.errstate(invalid="ignore"):
        return ss_res <= 2 * ss_tot + tol


def _check_reproduces(name: str, y: np.ndarray, fit: np.ndarray, log_a: float, b: float,
                      c: float) -> None:
    """The point fit of one ladder must reproduce its runs (`_reproduces`): else an error
    naming the ladder, not a multiplier the runs do not say."""
    if _reproduces(y, np.ones_like(y), fit)[0]:
        return
    show = ", ".join(f"{v:.3g}" for v in fit[:4]) + (" ..." if fit.size > 4 else "")
    seen = ", ".join(f"{v:.3g}" for v in y[:4]) + (" ..." if y.size > 4 else "")
    raise ValueError(f"{name}: its fitted law L = {np.exp(log_a):.4g} C^-{b:.4f} + {c:.4g} "
                     f"predicts {show} at its own runs, whose losses are {seen}: the law does "
                     "not fit this ladder (do its losses fall with compute?); check its runs, "
                     "or fix the asymptote (asymptote=E, --asymptote E)")


def _check_resamples(draws: np.ndarray, n_boot: int, level: float, method: str,
                     sizes: tuple[int, int]) -> None:
    """A percentile interval needs resamples that differ: refused when the usable ones (each
    ladder keeps 3 sizes, the fit converged) hold fewer distinct draws than its tails need
    (with 3 sizes a cases resample keeps all 3 only as the data itself)."""
    need = int(np.ceil(2 / (1 - level)))
    distinct = np.unique(draws, axis=0).shape[0] if draws.size else 0
    if distinct >= need:
        return
    raise ValueError(f"no {level:.0%} interval can be formed: {draws.shape[0]} of {n_boot} "
                     f"{method} resamples are usable, {distinct} of them distinct, and its tails "
                     f"need at least {need} (the ladders have {sizes[0]} and {sizes[1]} sizes; a "
                     "resample must keep 3 of each); use method='wild' or add sizes")


@one_blas_thread()
def compare(runs_a, runs_b, at: float | None = None, *, exponent: str = "auto",
            asymptote: float | str | None = None, method: str = "wild", n_boot: int = 2000,
            seed: int = 0, level: float = 0.95, flops: str = "counted",
            names: tuple[str, str] = ("A", "B"), partial: bool = False) -> Comparison:
    """The effective-compute multiplier of recipe B over recipe A at compute `at`.

    runs_a, runs_b: each a sweep directory (or its results.csv), a results DataFrame, or a
        pair (compute, loss); losses are final validation losses, compute in FLOPs
        (flops="counted" or "6nd" for sweep results).
    at: the compute to compare at (default: the largest compute either ladder trained).
    exponent: "auto" (default: the module docstring's rule), "separate" or "shared";
        asymptote: None (c per law), "shared" (one c, with exponent="shared") or a fixed
        c >= 0 for both laws.
    method: "wild" (default) or "cases" bootstrap (module docstring); n_boot, seed, level.
    partial: compare a sweep's finished runs while others are not finished (else refused).
    Returns a Comparison: .multiplier, .lo, .hi, .law_a, .law_b, .b_diff_ci, .c_diff_ci,
    .choice (exponent="auto"), .summary().
    """
    if exponent not in EXPONENTS:
        raise ValueError(f"exponent={exponent!r}: use one of {list(EXPONENTS)}")
    if method not in METHODS:
        raise ValueError(f"method={method!r}: use one of {list(METHODS)}")
    level, n_boot = check_level(level), check_count(n_boot, minimum=100)
    seed = check_count(seed, "seed")
    if isinstance(names, str) or len(names) != 2:
        raise ValueError(f"names={names!r}: two names, recipe A's and B's")
    xa, ya = ladder(runs_a, flops, f"runs_a ({names[0]})", partial)
    xb, yb = ladder(runs_b, flops, f"runs_b ({names[1]})", partial)
    if asymptote == "shared" and exponent != "shared":
        raise ValueError("asymptote='shared' needs exponent='shared' (one law shape for both "
                         "recipes); with exponent='auto' leave it None (the rule decides c "
                         "too), with separate exponents use None or a number")
    _check_asymptote(asymptote, ya, yb)
    try:
        at = float(max(xa.max(), xb.max()) if at is None else at)
    except (TypeError, ValueError):
        raise ValueError(f"at={at!r}: the compute to compare at, a number of FLOPs "
                         "(e.g. at=1e21)") from None
    if not (np.isfinite(at) and at > 0):
        raise ValueError(f"at={at}: the compute to compare at, in FLOPs (> 0)")
    _check_span(xa, xb, at, names)
    fit = _Ladders((xa, ya), (xb, yb), at, method, n_boot, seed, level, tuple(names))
    if exponent == "auto":
        return _auto(fit, asymptote)
    return fit(exponent, asymptote)


def _check_asymptote(asymptote, ya: np.ndarray, yb: np.ndarray) -> None:
    if asymptote is None or asymptote == "shared":
        return
    if not isinstance(asymptote, (int, float)):
        raise ValueError(f"asymptote={asymptote!r}: use None, 'shared' or a number >= 0")
    if not (np.isfinite(asymptote) and asymptote >= 0):
        raise ValueError(f"asymptote={asymptote}: a fixed irreducible loss >= 0, or None")
    if asymptote >= min(ya.min(), yb.min()):
        raise ValueError(f"asymptote={asymptote:g} is not below every loss (lowest "
                         f"{min(ya.min(), yb.min()):.4g}): the power-law term must be > 0")


def _auto(fit: "_Ladders", asymptote) -> Comparison:
    """The module docstring's rule: separate laws where b_B - b_A's interval excludes 0, or
    (asymptote None) where c_B - c_A's one-exponent interval does; else one law, its
    interval also spanning the c-per-recipe law. A separate fit that fails (an exponent at
    its bound: the ladder does not pin its own b) leaves the exponent to be shared."""
    try:
        sep, note = fit("separate", asymptote), ""
        b_ci = sep.b_diff_ci
    except UnpinnedExponent as e:
        sep, b_ci, note = None, None, f"separate laws could not be fitted: {e}"
    fixed = asymptote is not None
    if sep is not None and not _has0(b_ci):
        return replace(sep, choice=LawChoice("separate", b_ci, None, fit.level, fixed))
    if fixed:
        return replace(fit("shared", asymptote),
                       choice=LawChoice("shared", b_ci, None, fit.level, True, note))
    one_b = fit("shared", None)
    c_ci = one_b.c_diff_ci
    if not _has0(c_ci):    # separate laws; one exponent where they could not be fitted
        law = "separate" if sep is not None else "one exponent"
        return replace(sep or one_b, choice=LawChoice(law, b_ci, c_ci, fit.level, False, note))
    return _at(replace(fit("shared", "shared"), also=one_b,
                       choice=LawChoice("shared", b_ci, c_ci, fit.level, False, note)))


@dataclass(frozen=True)
class _Ladders:
    """Two checked ladders and the bootstrap's settings: called with (exponent, asymptote),
    the Comparison of that law family."""
    a: tuple[np.ndarray, np.ndarray]
    b: tuple[np.ndarray, np.ndarray]
    at: float
    method: str
    n_boot: int
    seed: int
    level: float
    names: tuple[str, str]

    def __call__(self, exponent: str, asymptote) -> Comparison:
        (xa, ya), (xb, yb) = self.a, self.b
        u_ref = float(np.mean(np.log(np.r_[xa, xb])))
        us = (np.log(xa) - u_ref, np.log(xb) - u_ref)
        fixed = asymptote is not None and asymptote != "shared"
        shape = (exponent, np.full(1, float(asymptote)) if fixed else None,
                 "shared" if asymptote == "shared" else True)
        laws = self._point(us, shape, u_ref)
        boot = self._bootstrap(us, laws, shape, fixed)

        def law(l, b, c, name):
            return PowerLaw(A=float(np.exp(l + b * u_ref)), b=b, c=c, name=name)

        out = Comparison(law_a=law(*laws[0], self.names[0]),
                         law_b=law(*laws[1], self.names[1]), at=self.at,
                         multiplier=float("nan"), lo=float("nan"), hi=float("nan"),
                         level=self.level, exponent=exponent, asymptote=asymptote,
                         method=self.method, boot=boot, u_ref=u_ref,
                         points=(self.a, self.b), names=self.names)
        return _at(out)

    def _point(self, us, shape, u_ref: float) -> tuple[tuple[float, ...], ...]:
        """The two laws (l, b, c) fitted to the runs, each checked to reproduce them."""
        exponent, c_fixed, offset = shape
        (ya, yb), names = (self.a[1], self.b[1]), self.names
        laws = tuple(tuple(float(v[0]) for v in t) for t in _fit(
            [(us[0], ya, np.ones((1, ya.size))), (us[1], yb, np.ones((1, yb.size)))],
            exponent, c_fixed, offset)[0])
        for name, (l, b, c) in zip(names, laws):
            if not solve.B_GRID[0] * 1.01 < b < solve.B_GRID[-1] / 1.01:
                raise UnpinnedExponent(
                    f"{name}: the exponent ran to its search bound ({b:.3g}); this ladder does "
                    "not determine it (too little range or noise); try exponent='shared' or "
                    "add sizes")
        for name, flag, u, y, (l, b, c) in zip(names, ("runs_a", "runs_b"), us, (ya, yb), laws):
            _check_reproduces(f"{flag} ({name})", y, np.exp(l - b * u) + c, l + b * u_ref, b, c)
        return laws

    def _bootstrap(self, us, laws, shape, fixed: bool) -> pd.DataFrame:
        """Per resample the two laws (l, b, c) and `ok`: both ladders resampled independently
        (module docstring), each keeping 3 sizes and fitted as well as its mean does."""
        exponent, _, offset = shape
        n_boot, method = self.n_boot, self.method
        rng = np.random.default_rng(self.seed)
        sides, usable, draws = [], np.ones(n_boot, bool), []
        lev = _leverage(us, laws, exponent, offset if not fixed else None)
        for (x, y), u, (l, b, c), h in zip((self.a, self.b), us, laws, lev):
            w, kept = _weights(x, n_boot, rng, method)
            usable &= kept >= 3            # a resample of fewer than 3 sizes cannot fit the law
            draws.append(w)
            if method == "wild":
                fit = np.exp(l - b * u) + c
                # a fit through 4-8 sizes pulls each residual toward 0 by its leverage: undone
                sides.append((u, fit + _unshrunk(x, y - fit, h) * w, np.ones_like(w)))
            else:
                sides.append((u, np.broadcast_to(y, w.shape), w))
        c_boot = np.full(n_boot, float(shape[1][0])) if fixed else None
        ((bla, bba, bca), (blb, bbb, bcb)), ok = _fit(sides, exponent, c_boot, offset)
        for (u, Y, W), (l, b, c) in zip(sides, ((bla, bba, bca), (blb, bbb, bcb))):
            usable &= _reproduces(Y, W, np.exp(l[:, None] - b[:, None] * u) + c[:, None])
        boot = pd.DataFrame(dict(l_a=bla, b_a=bba, c_a=bca, l_b=blb, b_b=bbb, c_b=bcb,
                                 ok=ok & usable))
        _check_resamples(np.hstack(draws)[boot["ok"].to_numpy()], n_boot, self.level, method,
                         (np.unique(self.a[0]).size, np.unique(self.b[0]).size))
        return boot


def _at(cmp: Comparison) -> Comparison:
    """cmp with its multiplier and interval at cmp.at (the interval spanning `also`'s)."""
    lo, hi = cmp.interval(cmp.at)
    return replace(cmp, multiplier=float(cmp.multiplier_at(cmp.at)), lo=float(lo[0]),
                   hi=float(hi[0]))
