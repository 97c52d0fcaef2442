"""Loss curves across learning-rate schedules: a law of L(step) given the LR at every step,
fitted to the curves of one model size and used to predict the curve of any other schedule.

Two published forms (`form=`). η_i is the LR of step i (steps 1..s); p is the step where
the LR peaks (the end of warmup: the first maximum). Both use the forward area
S1(s) = Σ_{i=1}^{s} η_i over every step, warmup included (Luo et al.'s S1 + S_W).

* "tissue": Tissue et al. 2024, "Scaling Law with Learning Rate Annealing" (arXiv 2408.11029,
  eq. 1 and §3): L(s) = L0 + A·S1^(−α) − C·S2, with the annealing area
  S2(s) = Σ_{i=1}^{s} m_i, m_i = λ·m_{i−1} + (η_{i−1} − η_i), m_0 = 0, and λ the
  momentum decay factor (the paper uses 0.999; `lam=`). The warmup's rising LR is not annealing:
  m_i = 0 for i ≤ p (the paper's curves start the law after warmup).
* "multipower": Luo et al. 2025 (ICLR), "A Multi-Power Law for Loss Curve Prediction Across
  Learning Rate Schedules" (arXiv 2503.12811, eq. 5):
  L(t) = L0 + A·(S1(t) + S_W)^(−α) − LD(t),
  LD(t) = B·Σ_{k=1}^{t} (η_{k−1} − η_k)·G(η_k^(−γ)·S_k(t)),
  G(x) = 1 − (C·x + 1)^(−β),
  S_k(t) = Σ_{τ=k}^{t} η_τ, the sum over the steps after the peak (η_p the peak LR).

Conventions: LRs enter in units of `lr_scale` (the largest LR of the fitted curves), so S1 and
S2 are in steps x peak LR and A, C, B are in those units. η_i is the LR metrics.jsonl logs at
step i (the LR of step i's update). The law is fitted to one of two records (`metric=`):
"loss", the training loss logged at step s, computed on step s's batch before its update: the
papers' L(s−1), its areas sum η_1..η_{s−1}; or "val_loss", the evaluation logged at step s
(every train.eval_every steps, on the same fixed validation sequences each time), computed on
the weights after step s's update: L(s), its areas sum η_1..η_s. The training loss carries
each batch's noise; the fixed set does not (docs/analysis.md). Only records after the peak
are fitted (the papers fit from the end of warmup). Parameters linear in the law (L0, A, C;
L0, A, B) are solved exactly for each value of the others (variable projection; A and C or B
kept >= 0, as both papers define them: the annealing term lowers the loss), the rest by
least squares from a few starts. The bootstrap resamples blocks of each curve's residuals
(moving blocks, so the residuals' correlation along a curve is kept) or whole runs, and
refits: its intervals are for the law's expected curve, not for one more run's seed-to-seed scatter.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, lsq_linear, minimize_scalar

from cgpt import rundir

from .checks import check_count, check_level

FORMS = ("tissue", "multipower")
PARAMS = {"tissue": ("L0", "A", "alpha", "C"),
          "multipower": ("L0", "A", "alpha", "B", "C", "beta", "gamma")}
COLUMNS = ("run_id", "step", "lr", "loss")
# the records a law is fitted to -> the updates behind the weights of the record logged at step
# s, minus s: the training loss is computed before step s's update, the evaluation after it
METRICS = {"loss": -1, "val_loss": 0}
LAMBDA = 0.999  # Tissue et al.'s momentum decay factor


# ---- the curves --------------------------------------------------------------------------
def read_schedule_curves(run_dirs) -> pd.DataFrame:
    """The (run_id, step, lr, loss, val_loss) records of each run directory's metrics.jsonl
    (run_id: the directory's name; val_loss NaN at the steps not evaluated), read through the
    run-directory contract (`cgpt.rundir`)."""
    if isinstance(run_dirs, (str, os.PathLike)):
        run_dirs = [run_dirs]
    out = []
    for d in map(Path, run_dirs):
        log = d / rundir.METRICS_FILE
        if not log.is_file():
            raise FileNotFoundError(f"{log}: no {rundir.METRICS_FILE}, so no loss curve for run "
                                    f"{d.name!r}; pass the directory of a run cgpt trained")
        m = pd.DataFrame(rundir.read_metrics(log))
        missing = [c for c in ("lr", "loss") if c not in m]
        if missing:
            raise ValueError(f"{log}: no {missing[0]!r} logged, which a schedule law needs at "
                             "every step; train with train.log_every=1")
        if "val_loss" not in m:
            m["val_loss"] = np.nan
        out.append(m[["step", "lr", "loss", "val_loss"]].assign(run_id=d.name))
    if not out:
        raise ValueError("no run directories given: pass one or more run directories or a "
                         "DataFrame with columns run_id, step, lr, loss")
    return pd.concat(out, ignore_index=True)[[*COLUMNS, "val_loss"]]


def _check_curves(curves: pd.DataFrame, metric: str = "loss") -> dict[str, pd.DataFrame]:
    """One table per run, each with every step 1..T (the law needs each step's LR) and the
    `metric` at every step ("loss") or at some ("val_loss": NaN where not evaluated)."""
    cols = [*COLUMNS[:3], metric]
    missing = [c for c in cols if c not in curves]
    if missing:
        raise ValueError(f"curves: no column(s) {missing}; a schedule law of {metric!r} is "
                         f"fitted to columns {cols} (read_schedule_curves(run_dirs) reads them)")
    runs = {}
    for rid, g in curves.groupby("run_id", sort=False):
        g = g.sort_values("step")
        for col in ("step", "lr", metric):
            v = pd.to_numeric(g[col], errors="coerce").to_numpy(float)
            bad = ~np.isfinite(v) & ~(np.isnan(v) & (col == "val_loss"))  # not evaluated: NaN
            if bad.any():
                step = g["step"].iloc[int(np.argmax(bad))]
                raise ValueError(f"curves: run {rid!r} has a {col} that is not a finite number "
                                 f"(at step {step}); drop that run or fix its log")
        steps = g["step"].to_numpy(int)
        if steps[0] != 1 or (np.diff(steps) != 1).any():
            gap = 1 if steps[0] != 1 else int(steps[np.argmax(np.diff(steps) != 1)] + 1)
            raise ValueError(f"curves: run {rid!r} has no record for step {gap}; the law needs "
                             "the LR of every step from 1 (train with train.log_every=1)")
        if (g["lr"] < 0).any():
            raise ValueError(f"curves: run {rid!r} has a negative lr; learning rates are >= 0")
        if not (g["lr"] > 0).any():
            raise ValueError(f"curves: run {rid!r} never has a positive lr")
        if not g[metric].notna().any():
            raise ValueError(f"curves: run {rid!r} has no {metric} record; evaluate during the "
                             "run (train.eval_every=10, say) or fit metric='loss'")
        runs[str(rid)] = g.reset_index(drop=True)
    if not runs:
        raise ValueError("curves: no rows; pass at least one run's curve")
    return runs


# ---- the two laws ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Features:
    """What the laws need of one LR sequence (units of lr_scale), at the steps `at` (0-based)."""
    eta: np.ndarray      # every step's LR
    s1: np.ndarray       # forward area at `at`
    s2: np.ndarray       # Tissue's annealing area at `at`
    drop: np.ndarray     # η_{k-1} − η_k at the steps k after the peak where it is nonzero
    eta_k: np.ndarray    # η_k at those steps
    s_k: np.ndarray      # S_k(t) = Σ_{τ=k}^{t} η_τ, shape (len(at), len(drop))
    live: np.ndarray     # k <= t: the terms of LD(t)


def _features(eta: np.ndarray, at: np.ndarray, lam: float) -> _Features:
    """`eta[i]`: the LR of step i+1's update, as metrics.jsonl logs it; `at`: the number of
    updates behind each record's weights (0..len(eta)), so its areas sum eta[:at]: s − 1 for
    the loss logged at step s (before that step's update), s for the val_loss (after it)."""
    peak = int(np.argmax(eta))
    before = np.concatenate([[0.0], np.cumsum(eta)])   # before[i] = Σ_{τ<i} eta[τ]
    d = np.zeros_like(eta)
    d[peak + 1:] = eta[peak:-1] - eta[peak + 1:]
    m = np.zeros_like(eta)
    for i in range(peak + 1, len(eta)):
        m[i] = lam * m[i - 1] + d[i]
    s2 = np.concatenate([[0.0], np.cumsum(m)])
    k = np.flatnonzero(d)
    live = k[None, :] < at[:, None]
    s_k = np.where(live, before[at][:, None] - before[k][None, :], 0.0)
    return _Features(eta, before[at], s2[at], d[k], eta[k], s_k, live)


def _design(form: str, f: _Features, nl: np.ndarray) -> np.ndarray:
    """Columns multiplying the linear parameters (L0, A, C) or (L0, A, B) given the others."""
    one = np.ones_like(f.s1)
    with np.errstate(divide="ignore"):
        power = np.where(f.s1 > 0, f.s1, np.nan) ** -nl[0]   # no update yet: no prediction
    if form == "tissue":
        return np.column_stack([one, power, -f.s2])
    alpha, c, beta, gamma = nl
    with np.errstate(divide="ignore", over="ignore"):
        x = np.where(f.eta_k > 0, f.eta_k ** -gamma, np.inf)[None, :] * f.s_k
        g = np.where(np.isfinite(x), 1.0 - (c * x + 1.0) ** -beta, 1.0)
    g[~f.live] = 0.0
    return np.column_stack([one, power, -(g * f.drop[None, :]).sum(axis=1)])


def _full(form: str, lin: np.ndarray, nl: np.ndarray) -> np.ndarray:
    if form == "tissue":
        return np.array([lin[0], lin[1], nl[0], lin[2]])
    return np.array([lin[0], lin[1], nl[0], lin[2], nl[1], nl[2], nl[3]])


def _split(form: str, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if form == "tissue":
        return p[[0, 1, 3]], p[[2]]
    return p[[0, 1, 3]], p[[2, 4, 5, 6]]


# the search range of the parameters the law is not linear in (alpha; alpha, C, beta, gamma)
_BOUNDS = {"tissue": ([0.02], [4.0]),
           "multipower": ([1e-3, 1e-4, 1e-3, 0.0], [5.0, 1e4, 10.0, 3.0])}
_STARTS = {"tissue": [],
           "multipower": [[a, c, b, g] for a in (0.3, 1.0) for c in (0.5, 5.0)
                          for b in (0.5,) for g in (0.5,)]}


def _solve(form: str, feats: list[_Features], ys: list[np.ndarray], x0=None) -> np.ndarray:
    """The least-squares parameters over all curves (variable projection)."""
    y = np.concatenate(ys)

    def linear(nl):
        x = np.vstack([_design(form, f, nl) for f in feats])
        lin, *_ = np.linalg.lstsq(x, y, rcond=None)
        if (lin[1:] < 0).any():  # A and C (B) are >= 0 in both papers: annealing lowers the loss
            lin = lsq_linear(x, y, bounds=([-np.inf, 0.0, 0.0], np.inf), method="bvls").x
        return lin, y - x @ lin

    if form == "tissue":
        grid = np.geomspace(_BOUNDS[form][0][0], _BOUNDS[form][1][0], 40)
        rss = [float(np.sum(linear([a])[1] ** 2)) for a in grid]
        i = int(np.argmin(rss))
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
        best = minimize_scalar(lambda a: float(np.sum(linear([a])[1] ** 2)), bounds=(lo, hi),
                               method="bounded", options={"xatol": 1e-6})
        nl = np.array([best.x])
        return _full(form, linear(nl)[0], nl)
    lb, ub = map(np.asarray, _BOUNDS[form])
    starts = _STARTS[form]
    if x0 is not None:  # a bootstrap refit: from the main fit's values and from the start
        # cheapest on this resample, so a parameter the curves leave flat can still move
        cost = [float(np.sum(linear(np.clip(s, lb, ub))[1] ** 2)) for s in starts]
        starts = [x0, starts[int(np.argmin(cost))]]
    best = None
    for s in starts:
        s = np.clip(np.asarray(s, float), lb + 1e-9, ub - 1e-9)
        r = least_squares(lambda nl: linear(nl)[1], s, bounds=(lb, ub), x_scale="jac",
                          max_nfev=400)
        if best is None or r.cost < best.cost:
            best = r
    return _full(form, linear(best.x)[0], best.x)


def _curve(form: str, p: np.ndarray, f: _Features) -> np.ndarray:
    lin, nl = _split(form, p)
    return _design(form, f, nl) @ lin


# ---- the fit -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ScheduleLawFit:
    """A schedule law fitted to curves of one model size: parameters, bootstrap resamples."""
    form: str
    params: dict                 # the law's parameters (LRs in units of lr_scale)
    lr_scale: float              # the largest LR of the fitted curves
    lam: float                   # Tissue's momentum decay factor (unused by multipower)
    runs: tuple                  # the run ids fitted
    n_points: int                # records fitted (logged after each run's peak)
    rmse: float                  # of the fit over those records
    boot: np.ndarray = field(repr=False)   # (n_boot, n_params) refits
    level: float = 0.95
    resample: str = "blocks"
    metric: str = "loss"         # the record fitted and predicted: "loss" or "val_loss"

    def _features(self, lrs) -> _Features:
        eta = np.asarray(lrs, float).ravel()
        if eta.size == 0 or not np.isfinite(eta).all() or (eta < 0).any() or not eta.max() > 0:
            raise ValueError("lrs: a sequence of the LR at every step 1..T, finite, >= 0 and not "
                             "all zero")
        steps = np.arange(1, eta.size + 1)
        return _features(eta / self.lr_scale, steps + METRICS[self.metric], self.lam)

    def predict(self, lrs) -> pd.DataFrame:
        """The law's `metric` as it would be logged at every step of the LR sequence `lrs`
        (step 1 first; for "loss" NaN at step 1, before any update), with the bootstrap
        percentile interval at `level`: columns step, lr, loss, lo, hi."""
        f = self._features(lrs)
        p = np.array([self.params[k] for k in PARAMS[self.form]])
        loss = _curve(self.form, p, f)
        lo = hi = np.full_like(loss, np.nan)
        if len(self.boot):
            b = np.array([_curve(self.form, q, f) for q in self.boot])
            with warnings.catch_warnings():  # step 1 (no update yet) is NaN in every resample
                warnings.simplefilter("ignore", RuntimeWarning)
                lo, hi = np.nanpercentile(b, [50 * (1 - self.level), 50 * (1 + self.level)],
                                          axis=0)
        return pd.DataFrame({"step": np.arange(1, f.eta.size + 1), "lr": f.eta * self.lr_scale,
                             "loss": loss, "lo": lo, "hi": hi})

    def final_loss(self, lrs, window: int | None = None) -> tuple[float, float, float]:
        """(loss, lo, hi) averaged over the last `window` steps. Default: what results.csv
        holds for a trained run, cgpt's summary train_loss window for "loss"
        (`cgpt.rundir.train_loss_window`), the last step's evaluation for "val_loss"."""
        eta = np.asarray(lrs, float).ravel()
        default = rundir.train_loss_window(eta.size) if self.metric == "loss" else 1
        w = default if window is None else check_count(window, "window", 1)
        f = self._features(eta)
        p = np.array([self.params[k] for k in PARAMS[self.form]])
        est = float(_curve(self.form, p, f)[-w:].mean())
        if not len(self.boot):
            return est, float("nan"), float("nan")
        b = [float(_curve(self.form, q, f)[-w:].mean()) for q in self.boot]
        lo, hi = np.nanpercentile(b, [50 * (1 - self.level), 50 * (1 + self.level)])
        return est, float(lo), float(hi)

    def _warnings(self) -> str:
        """What the curves did not pin: a parameter at the end of its search range, L0 < 0."""
        names = [k for k in PARAMS[self.form] if k not in ("L0", "A", "B")
                 and not (self.form == "tissue" and k == "C")]
        lb, ub = _BOUNDS[self.form]
        stuck = [k for k, a, b in zip(names, lb, ub)
                 if np.isclose(self.params[k], a, rtol=1e-3) or np.isclose(self.params[k], b,
                                                                            rtol=1e-3)]
        out = [f"{', '.join(stuck)} at the end of the search range"] if stuck else []
        if self.params["L0"] < 0:
            out.append(f"L0 = {self.params['L0']:.3g} < 0")
        return (f"NOT PINNED by these curves ({'; '.join(out)}): read its predictions with "
                "care. ") if out else ""

    def summary(self) -> str:
        name = {"tissue": "Tissue et al. 2024 L0 + A*S1^-alpha - C*S2 (lambda "
                          f"{self.lam:g})",
                "multipower": "Luo et al. 2025 multi-power law"}[self.form]
        lo, hi = 50 * (1 - self.level), 50 * (1 + self.level)
        parts = []
        for i, k in enumerate(PARAMS[self.form]):
            ci = (f" [{np.nanpercentile(self.boot[:, i], lo):.4g}, "
                  f"{np.nanpercentile(self.boot[:, i], hi):.4g}]") if len(self.boot) else ""
            parts.append(f"{k} = {self.params[k]:.4g}{ci}")
        return (self._warnings() + f"{name} on {len(self.runs)} run(s) ({', '.join(self.runs)}), "
                f"{self.n_points} {self.metric} records after warmup, rmse {self.rmse:.4g}; "
                f"LRs in units of {self.lr_scale:g}; " + ", ".join(parts) +
                (f" ({self.level:.0%} intervals from {len(self.boot)} {self.resample} "
                 "resamples)" if len(self.boot) else ""))


def fit_schedule_law(curves, form: str = "multipower", *, metric: str = "loss",
                     lam: float = LAMBDA, n_boot: int = 200, resample: str = "blocks",
                     block: int | None = None, max_points: int = 400, start: int | None = None,
                     seed: int = 0, level: float = 0.95) -> ScheduleLawFit:
    """Fit `form` ("tissue" | "multipower") to the loss curves of one model size.

    curves: a DataFrame with columns run_id, step, lr (every step from 1) and `metric`, or run
    directories (read with read_schedule_curves). metric: "loss", the training loss logged at
    every step, or "val_loss", the evaluations on the fixed validation set (logged every
    train.eval_every steps; NaN at the others): the evaluation after step s's update is L(s),
    the training loss of step s is L(s − 1) (module docstring). At least one curve must
    anneal (its LR fall after its peak): a constant LR says nothing of the annealing term.
    max_points: the records per run fitted, evenly spaced after the peak (the areas use every
    step's LR). start: the first logged step fitted (default: the first record after the
    peak, as the papers do; a later one leaves out an early phase the law does not describe).
    resample: "blocks" (moving blocks of `block` residuals per curve, default a tenth of it)
    or "runs" (whole runs, with replacement; needs >= 3 runs).
    """
    if form not in FORMS:
        raise ValueError(f"form={form!r}: use one of {', '.join(map(repr, FORMS))}")
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r}: use one of {', '.join(map(repr, METRICS))}")
    if resample not in ("blocks", "runs"):
        raise ValueError(f"resample={resample!r}: use 'blocks' or 'runs'")
    if not 0 < lam <= 1:
        raise ValueError(f"lam={lam!r}: Tissue's momentum decay factor is in (0, 1], e.g. 0.999")
    level = check_level(level)
    n_boot = check_count(n_boot)
    max_points = check_count(max_points, "max_points", 5)
    if start is not None:
        start = check_count(start, "start", 1)
    if not isinstance(curves, pd.DataFrame):
        curves = read_schedule_curves(curves)
    runs = _check_curves(curves, metric)
    if resample == "runs" and len(runs) < 3:
        raise ValueError(f"resample='runs' with {len(runs)} run(s): resampling whole runs needs "
                         "at least 3; use resample='blocks'")
    scale = max(float(g["lr"].max()) for g in runs.values())
    feats, ys = {}, {}
    shift = METRICS[metric]
    for rid, g in runs.items():
        eta = g["lr"].to_numpy(float) / scale
        logged = g[metric].notna().to_numpy()
        steps = g["step"].to_numpy(int)[logged]
        y = g[metric].to_numpy(float)[logged]
        # updates behind each record's weights; fitted from the first update after the peak
        first = int(np.argmax(eta)) + 1 if start is None else max(int(np.argmax(eta)) + 1,
                                                                    start + shift)
        keep = np.flatnonzero(steps + shift >= first)
        if keep.size < 5:
            raise ValueError(f"curves: run {rid!r} has {keep.size} {metric} record(s) after its "
                             f"LR peak (the end of warmup)"
                             f"{'' if start is None else f' and step {start}'}; the law is "
                             "fitted to those records: lower start or pass longer runs")
        keep = keep[np.unique(np.linspace(0, keep.size - 1, min(max_points, keep.size))
                              .round().astype(int))]
        feats[rid] = _features(eta, steps[keep] + shift, lam)
        ys[rid] = y[keep]
    if not any(f.drop.size and f.drop.max() > 0 for f in feats.values()):
        raise ValueError(f"curves: no run's LR decays after its peak ({', '.join(runs)}); the "
                         "annealing term needs at least one decaying schedule (a WSD cooldown "
                         "or a cosine run) beside a constant one")
    ids = list(runs)
    p = _solve(form, [feats[r] for r in ids], [ys[r] for r in ids])
    fits = {r: _curve(form, p, feats[r]) for r in ids}
    resid = {r: ys[r] - fits[r] for r in ids}
    n_points = sum(len(y) for y in ys.values())
    rmse = float(np.sqrt(np.mean(np.concatenate(list(resid.values())) ** 2)))
    rng = np.random.default_rng(seed)
    x0 = None if form == "tissue" else _split(form, p)[1]
    boot = []
    for _ in range(n_boot):
        if resample == "runs":
            pick = [ids[i] for i in rng.integers(0, len(ids), len(ids))]
            if not any(feats[r].drop.size and feats[r].drop.max() > 0 for r in pick):
                continue
            fb, yb = [feats[r] for r in pick], [ys[r] for r in pick]
        else:
            fb, yb = [feats[r] for r in ids], [fits[r] + _blocks(resid[r], block, rng)
                                               for r in ids]
        boot.append(_solve(form, fb, yb, x0=x0))
    return ScheduleLawFit(form=form, params=dict(zip(PARAMS[form], map(float, p))),
                          lr_scale=scale, lam=float(lam), runs=tuple(ids), n_points=n_points,
                          rmse=rmse, boot=np.array(boot).reshape(-1, len(PARAMS[form])),
                          level=level, resample=resample, metric=metric)


def _blocks(r: np.ndarray, block: int | None, rng: np.random.Generator) -> np.ndarray:
    """A moving-block (circular) resample of the residuals `r`, same length."""
    n = r.size
    b = max(1, n // 10) if block is None else check_count(block, "block", 1)
    starts = rng.integers(0, n, -(-n // b))
    idx = (starts[:, None] + np.arange(b)[None, :]).ravel()[:n] % n
    return r[idx]
