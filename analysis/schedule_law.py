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
each batch's noise; the fixed set does not (docs/analysis_schedule_law.md). Only records after
the peak are fitted (the papers fit from the end of warmup). Parameters linear in the law (L0,
A, C; L0, A, B) are solved exactly for each value of the others (variable projection; A and C
or B kept >= 0, as both papers define them: the annealing term lowers the loss), the rest by
least squares from a few starts. The bootstrap resamples blocks of each curve's residuals
(moving blocks, so the residuals' correlation along a curve is kept) or whole runs, and
refits: its intervals are for the law's expected curve, not for one more run's seed-to-seed scatter.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, lsq_linear, minimize_scalar

from cgpt import rundir

from .checks import check_count, check_level, numeric_column

FORMS = ("tissue", "multipower")
PARAMS = {"tissue": ("L0", "A", "alpha", "C"),
          "multipower": ("L0", "A", "alpha", "B", "C", "beta", "gamma")}
COLUMNS = ("run_id", "step", "lr", "loss")
# the records a law is fitted to -> the updates behind the weights of the record logged at step
# s, minus s: the training loss is computed before step s's update, the evaluation after it
METRICS = {"loss": -1, "val_loss": 0}
LAMBDA = 0.999  # Tissue et al.'s momentum decay factor
EXTRAPOLATION = 1.5  # predict() warns past this multiple of the last fitted step: a check
                     # within the curves (fit two thirds, predict the rest) reaches no further


# ---- the curves --------------------------------------------------------------------------
def read_schedule_curves(run_dirs) -> pd.DataFrame:
    """The (run_id, step, lr, loss, val_loss) records of each run directory's metrics.jsonl
    (run_id: the directory's name, or as much of its path as tells apart runs of one name in
    two sweeps; val_loss NaN at the steps not evaluated), read through the run-directory
    contract (`cgpt.rundir`)."""
    if isinstance(run_dirs, (str, os.PathLike)):
        run_dirs = [run_dirs]
    try:
        run_dirs = [Path(d) for d in run_dirs]
    except TypeError:
        what = "None" if run_dirs is None else f"a {type(run_dirs).__name__}" + (
            f" of {type(run_dirs[0]).__name__}" if isinstance(run_dirs, (list, tuple))
            and run_dirs else "")
        raise TypeError(f"curves: {what}: pass one DataFrame with columns run_id, step, lr, "
                        "loss (pandas.concat "
                        "several), or run directories") from None
    ids = _run_ids(run_dirs)
    out = []
    for d, rid in zip(run_dirs, ids):
        log = d / rundir.METRICS_FILE
        if d.is_file():
            raise ValueError(f"curves: {d} is a file, not a run directory; read a table of "
                             "curves with pandas.read_csv and pass the DataFrame (columns "
                             "run_id, step, lr, loss)")
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
        out.append(m[["step", "lr", "loss", "val_loss"]].assign(run_id=rid))
    if not out:
        raise ValueError("no run directories given: pass one or more run directories or a "
                         "DataFrame with columns run_id, step, lr, loss")
    return pd.concat(out, ignore_index=True)[[*COLUMNS, "val_loss"]]


def _run_ids(dirs: list[Path]) -> list[str]:
    """Each directory's name; where two share it (one run name in two sweeps), the shortest
    path suffix that tells them apart, so their curves stay two. One directory given twice is
    an error (its curve would be fitted twice)."""
    real = [d.resolve() for d in dirs]
    twice = sorted({str(d) for d, r in zip(dirs, real) if real.count(r) > 1})
    if twice:
        raise ValueError(f"run directories {twice} given more than once (the same run); pass "
                         "each run once")
    full = [Path(os.path.abspath(d)) for d in dirs]
    ids = [d.name for d in full]
    for k in range(2, max((len(f.parts) for f in full), default=1) + 1):
        clash = {i for i in ids if ids.count(i) > 1}
        if not clash:
            break
        ids = ["/".join(f.parts[-k:]) if i in clash else i for i, f in zip(ids, full)]
    return ids


def _check_curves(curves: pd.DataFrame, metric: str = "loss",
                  schedules: dict | None = None) -> dict[str, pd.DataFrame]:
    """One table per run with an `lr` for every step 1..T (the law needs each step's LR) and
    the `metric` at every step or at some (NaN where not logged: a W&B export pads the steps
    where only another metric was logged with NaN; NaN from some step to the end is a run
    that diverged, refused). Without `schedules` the curves carry the LRs: every step from 1
    must be there. With them, the curves may hold only the logged steps (a loss every k
    steps) and each run's LRs come from schedules[run_id]."""
    if curves.columns.duplicated().any():
        twice = curves.columns[curves.columns.duplicated()][0]
        raise ValueError(f"curves: column {twice!r} appears "
                         f"{int((curves.columns == twice).sum())} times (two columns renamed "
                         "to one name?); keep one")
    cols = ["run_id", "step", metric] + ([] if schedules is not None else ["lr"])
    missing = [c for c in cols if c not in curves]
    if missing:
        hint = ("; a log without LRs (nanoGPT's, a W&B export of the loss alone) gives them "
                "as schedules={run_id: the LR of every step 1..T}") if missing == ["lr"] else ""
        raise ValueError(f"curves: no column(s) {missing}; a schedule law of {metric!r} is "
                         f"fitted to columns {cols} (read_schedule_curves(run_dirs) reads them)"
                         f"{hint}")
    if curves["run_id"].isna().any():
        at = curves.index[curves["run_id"].isna()]
        raise ValueError(f"curves: {at.size} row(s) have no run_id (row {at[0]} first); give "
                         "every row its run's id")
    curves = curves.assign(**{c: _numbers(curves, c) for c in ("step", "lr", metric)
                              if c in curves})
    for rid, g in curves.groupby("run_id", sort=False):   # before rows are dropped below
        g = g.sort_values("step", kind="stable")
        for col in [c for c in ("lr", metric) if c in g]:
            inf = np.isinf(g[col].to_numpy(float))
            if inf.any():
                raise ValueError(f"curves: run {rid!r} has a {col} that is not a finite number "
                                 f"(at step {g['step'].iloc[int(np.argmax(inf))]:g}); drop that "
                                 "run or fix its log")
        _check_tail(str(rid), g["step"].to_numpy(float), g[metric].to_numpy(float), metric)
    held = [c for c in ("lr", metric) if c in curves]
    curves = curves[curves[held].notna().any(axis=1)]  # rows of other metrics: nothing held
    runs = {}
    for rid, g in curves.groupby("run_id", sort=False):
        g = g.sort_values("step")
        raw = g["step"].to_numpy(float)
        if (~np.isfinite(raw) | (raw != np.round(raw))).any():
            step = raw[np.flatnonzero(~np.isfinite(raw) | (raw != np.round(raw)))[0]]
            raise ValueError(f"curves: run {rid!r} has step {step:g}, not a whole number; steps "
                             "count optimizer updates: fix its log")
        steps = raw.astype(int)
        if steps[0] == 0:
            raise ValueError(f"curves: run {rid!r} has a record of step 0; steps count "
                             "optimizer updates from 1 (step 1 is the first update, its loss "
                             "computed before it): a log counted from 0 (W&B's _step, "
                             "nanoGPT's iter, Lightning's global_step) needs 1 added to every "
                             "step")
        again = steps[1:][np.diff(steps) == 0]
        if again.size:
            raise ValueError(f"curves: run {rid!r} has {(steps == again[0]).sum()} records of "
                             f"step {again[0]}; one per step: two runs given one run_id? (give "
                             "each its own), a log written twice (keep one record), or one "
                             "step's values in two rows (merge them: curves.groupby(['run_id', "
                             "'step']).first().reset_index())")
        for col in [c for c in ("lr", metric) if c in g]:
            v = g[col].to_numpy(float)
            bad = ~np.isfinite(v) & ~(np.isnan(v) & (col == metric))  # not logged: NaN
            if bad.any():
                raise ValueError(f"curves: run {rid!r} has a {col} that is not a finite number "
                                 f"(at step {steps[int(np.argmax(bad))]}); drop that run or "
                                 "fix its log")
        if schedules is not None:
            g = _with_schedule(str(rid), g, schedules)
            steps = g["step"].to_numpy(int)
        if steps[0] != 1 or (np.diff(steps) != 1).any():
            gap = 1 if steps[0] != 1 else int(steps[np.argmax(np.diff(steps) != 1)] + 1)
            raise ValueError(f"curves: run {rid!r} has no record for step {gap}; the law needs "
                             "the LR of every step from 1 (train with train.log_every=1, or "
                             "pass schedules={run_id: the LR of every step} to fit records "
                             "logged every k steps)")
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
    if schedules is not None and set(map(str, schedules)) - set(runs):
        extra = sorted(set(map(str, schedules)) - set(runs))
        raise ValueError(f"schedules: run(s) {extra} have no curve; key schedules by the "
                         "curves' run_id")
    return runs


def _numbers(curves: pd.DataFrame, col: str) -> pd.Series:
    """Column `col` as floats (text such as "3.21" or "NaN" read as the number), or one error
    naming the column, row and first cell that is no number (a W&B export's "Summary" row)."""
    v = numeric_column(curves, col, "curves")
    if col == "step" and v.isna().any():
        i = int(np.argmax(v.isna().to_numpy()))
        raise ValueError(f"curves: run {curves['run_id'].iloc[i]!r} has a row without a step "
                         f"(row {curves.index[i]}); give every record its step")
    return v


def _check_tail(rid: str, steps: np.ndarray, y: np.ndarray, metric: str) -> None:
    """A run whose `metric` is NaN from some step to its last record, over at least as many
    steps as the largest gap between its logged records, stopped being logged: diverged
    (a NaN loss), not a record merely skipped (one error naming the step)."""
    logged = np.flatnonzero(~np.isnan(y))
    if not logged.size:
        return
    tail = steps[-1] - steps[logged[-1]]
    gap = np.diff(np.r_[0, steps[logged]]).max()
    if tail > 0 and tail >= gap:
        first = steps[logged[-1] + 1]
        raise ValueError(f"curves: run {rid!r} has no {metric} from step {first:g} to its "
                         f"last record (step {steps[-1]:g}): NaN to the end, a run that "
                         "diverged? "
                         "drop that run, or the rows after its last logged "
                         f"{metric}")


def _with_schedule(rid: str, g: pd.DataFrame, schedules: dict) -> pd.DataFrame:
    """Run `rid`'s records on every step 1..T of its schedule (metric NaN where not logged):
    the schedule's entry i is the LR of step i + 1, the first update's first."""
    if rid not in map(str, schedules):
        raise ValueError(f"schedules: no entry for run {rid!r}; pass schedules={{{rid!r}: the "
                         "LR of every step from 1} for every run of the curves")
    eta = np.asarray(dict(zip(map(str, schedules), schedules.values()))[rid], float).ravel()
    steps = g["step"].to_numpy(float)
    if (steps != np.round(steps)).any() or steps.min() < 1 or (np.diff(steps) <= 0).any():
        raise ValueError(f"curves: run {rid!r} has steps that are not distinct whole numbers "
                         ">= 1 (step 1 is the first update); renumber its records")
    if eta.size < steps.max():
        raise ValueError(f"schedules[{rid!r}]: {eta.size} steps, shorter than its logged steps "
                         f"(the last is {int(steps.max())}); pass the LR of every step 1.."
                         f"{int(steps.max())}")
    if not np.isfinite(eta).all():
        raise ValueError(f"schedules[{rid!r}]: an LR that is not a finite number; fix the "
                         "schedule")
    if "lr" in g:   # the logged LRs must be the schedule's at the same steps
        want = eta[steps.astype(int) - 1]
        off = ~np.isclose(g["lr"].to_numpy(float), want, rtol=1e-4, atol=1e-6 * eta.max())
        if off.any():
            i = int(np.argmax(off))
            raise ValueError(f"curves: run {rid!r} logs lr {g['lr'].iloc[i]:.6g} at step "
                             f"{int(steps[i])} where schedules[{rid!r}] has {want[i]:.6g} (its "
                             "entry i is step i + 1's LR); shift the steps or the schedule so "
                             "they agree, or drop the curves' lr column")
    full = pd.DataFrame({"step": np.arange(1, eta.size + 1), "lr": eta})
    rec = g.drop(columns=[c for c in ("lr", "run_id") if c in g]).assign(
        step=steps.astype(int))
    return full.merge(rec, on="step", how="left").assign(run_id=rid)


# ---- the two laws ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Features:
    """What the laws need of one LR sequence (units of lr_scale), at the steps `at` (the
    updates behind each record's weights). No (records x drops) matrix is kept: the loss-drop
    sum is formed a block of records at a time (`_loss_drop`), so memory is linear in the
    schedule's length however many records are asked for."""
    eta: np.ndarray      # every step's LR
    at: np.ndarray       # updates behind each record's weights
    s1: np.ndarray       # forward area at `at`
    s2: np.ndarray       # Tissue's annealing area at `at`
    before: np.ndarray   # before[i] = Σ_{τ<i} eta[τ] (0-based), length len(eta) + 1
    k: np.ndarray        # 0-based steps after the peak where the LR drops
    drop: np.ndarray     # η_{k-1} − η_k at those steps
    eta_k: np.ndarray    # η_k at those steps


def _features(eta: np.ndarray, at: np.ndarray, lam: float) -> _Features:
    """`eta[i]`: the LR of step i+1's update, as metrics.jsonl logs it; `at`: the number of
    updates behind each record's weights (0..len(eta)), so its areas sum eta[:at]: s − 1 for
    the loss logged at step s (before that step's update), s for the val_loss (after it)."""
    at = np.asarray(at, int)
    peak = int(np.argmax(eta))
    before = np.concatenate([[0.0], np.cumsum(eta)])   # before[i] = Σ_{τ<i} eta[τ]
    d = np.zeros_like(eta)
    d[peak + 1:] = eta[peak:-1] - eta[peak + 1:]
    m = np.zeros_like(eta)
    for i in range(peak + 1, len(eta)):
        m[i] = lam * m[i - 1] + d[i]
    s2 = np.concatenate([[0.0], np.cumsum(m)])
    k = np.flatnonzero(d)
    return _Features(eta, at, before[at], s2[at], before, k, d[k], eta[k])


_BLOCK = 1 << 22   # elements of one block of the exact loss-drop sum (32 MiB of float64)
_EXACT_UP_TO = 1 << 20   # records x drops summed term by term; above it, in bins (below)
_RATIO = 1.05      # the bins' growth: the drops 1..~20 steps before a record one by one, then
                   # bins 5% wider each step back (~210 bins for 24k steps)


def _loss_drop(f: _Features, c: float, beta: float, gamma: float) -> np.ndarray:
    """Σ_k (η_{k−1} − η_k) G(η_k^−γ S_k(t)) at each record (the multi-power law's LD / B), over
    the drops k before the record's update count. Term by term (a block of records at a time)
    where records x drops <= 2^20 or a drop is negative or lands on a zero LR; else in bins of
    the distance t − k, 1 step wide up to ~20 steps back and 5% wider each step beyond, each
    bin's drops summed and G taken at their drop-weighted mean η_k^−γ S_k(t): the error is
    second order in a bin's 5% spread (below 1e-5 nats on Luo et al.'s 24k-step cosine,
    tests/analysis/test_analysis_schedule_law.py), the cost ~200 terms a record instead of ~T."""
    if not f.k.size:
        return np.zeros(f.at.size)
    with np.errstate(divide="ignore", over="ignore"):
        w = np.where(f.eta_k > 0, f.eta_k ** -gamma, np.inf)
    if f.at.size * f.k.size > _EXACT_UP_TO and (f.drop > 0).all() and np.isfinite(w).all():
        return _loss_drop_binned(f, c, beta, w)
    out = np.zeros(f.at.size)
    n_live = np.searchsorted(f.k, f.at, side="left")       # drops k < at: the terms of LD(t)
    rows = max(1, _BLOCK // f.k.size)
    for i in range(0, f.at.size, rows):
        sl = slice(i, i + rows)
        live = int(n_live[sl].max(initial=0))
        if not live:
            continue
        k = f.k[:live]
        s_k = f.before[f.at[sl]][:, None] - f.before[k][None, :]
        with np.errstate(over="ignore", invalid="ignore"):
            x = w[None, :live] * s_k
            g = np.where(np.isfinite(x), -np.expm1(-beta * np.log1p(c * x)), 1.0)
        g[np.arange(live)[None, :] >= n_live[sl][:, None]] = 0.0
        out[sl] = g @ f.drop[:live]
    return out


def _loss_drop_binned(f: _Features, c: float, beta: float, w: np.ndarray) -> np.ndarray:
    """`_loss_drop` in bins of t − k (drops all > 0, η_k all > 0); w = η_k^−γ."""
    top = int(f.at.max(initial=1))
    edges = np.unique(np.ceil(_RATIO ** np.arange(np.log(top + 1) / np.log(_RATIO) + 2))
                      .astype(int))                       # 1, 2, 3, .., > top
    def cum(v):
        return np.concatenate([[0.0], np.cumsum(v)])
    cd, cdw, cdwb = cum(f.drop), cum(f.drop * w), cum(f.drop * w * f.before[f.k])
    out = np.zeros(f.at.size)
    for i in range(0, f.at.size, max(1, _BLOCK // edges.size)):
        at = f.at[i:i + max(1, _BLOCK // edges.size)]
        # bin j of record t: the drops at t − k in [edges[j], edges[j+1]), positions
        # pos[:, j+1] to pos[:, j] of f.k
        pos = np.searchsorted(f.k, at[:, None] - edges[None, :] + 1, side="left")
        hi, lo = pos[:, :-1], pos[:, 1:]
        d = cd[hi] - cd[lo]
        with np.errstate(invalid="ignore", divide="ignore"):
            x = np.where(d > 0, (f.before[at][:, None] * (cdw[hi] - cdw[lo])
                                 - (cdwb[hi] - cdwb[lo])) / d, 0.0)
        g = -np.expm1(-beta * np.log1p(c * np.maximum(x, 0.0)))
        out[i:i + at.size] = (g * d).sum(axis=1)
    return out


def _design(form: str, f: _Features, nl: np.ndarray) -> np.ndarray:
    """Columns multiplying the linear parameters (L0, A, C) or (L0, A, B) given the others."""
    one = np.ones_like(f.s1)
    with np.errstate(divide="ignore"):
        power = np.where(f.s1 > 0, f.s1, np.nan) ** -nl[0]   # no update yet: no prediction
    if form == "tissue":
        return np.column_stack([one, power, -f.s2])
    return np.column_stack([one, power, -_loss_drop(f, *nl[1:])])


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


def _solve_linear(form: str, feats: list[_Features], ys: list[np.ndarray],
                  nl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The linear parameters (L0, A, C) or (L0, A, B) given the others, least squares with A
    and C (B) >= 0, as both papers define them (annealing lowers the loss); the residuals."""
    x = np.vstack([_design(form, f, nl) for f in feats])
    y = np.concatenate(ys)
    lin, *_ = np.linalg.lstsq(x, y, rcond=None)
    if (lin[1:] < 0).any():
        lin = lsq_linear(x, y, bounds=([-np.inf, 0.0, 0.0], np.inf), method="bvls").x
    return lin, y - x @ lin


def _solve(form: str, feats: list[_Features], ys: list[np.ndarray], x0=None,
           only_x0: bool = False) -> np.ndarray:
    """The least-squares parameters over all curves (variable projection). x0: also start from
    these nonlinear parameters (only from them with only_x0)."""
    def linear(nl):
        return _solve_linear(form, feats, ys, nl)

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
        starts = [x0] if only_x0 else [x0, starts[int(np.argmin(cost))]]
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

    restarts: int = 0            # refits started from a resample's better optimum
    horizon: int = 0             # the last logged step fitted (of the longest curve)

    def _eta(self, lrs) -> np.ndarray:
        eta = np.asarray(lrs, float).ravel()
        if eta.size == 0 or not np.isfinite(eta).all() or (eta < 0).any() or not eta.max() > 0:
            raise ValueError("lrs: a sequence of the LR at every step 1..T, finite, >= 0 and not "
                             "all zero")
        return eta

    def _features(self, eta: np.ndarray, steps: np.ndarray) -> _Features:
        return _features(eta / self.lr_scale, steps + METRICS[self.metric], self.lam)

    def _steps(self, eta: np.ndarray, steps) -> np.ndarray:
        """The logged steps asked for: whole numbers in 1..len(lrs) (default every step)."""
        if steps is None:
            return np.arange(1, eta.size + 1)
        s = np.asarray(steps, float).ravel()
        if s.size == 0 or not np.isfinite(s).all() or (s != np.round(s)).any() \
                or s.min() < 1 or s.max() > eta.size:
            raise ValueError(f"steps: whole numbers in 1..{eta.size} (the steps of lrs, the LR "
                             "of every step from the first update); pass a schedule as long as "
                             "the last step asked for")
        return s.astype(int)

    def _curves(self, f: _Features) -> tuple[np.ndarray, np.ndarray]:
        """The law's curve at the features' records, and each bootstrap resample's."""
        p = np.array([self.params[k] for k in PARAMS[self.form]])
        b = np.array([_curve(self.form, q, f) for q in self.boot]).reshape(-1, f.at.size)
        return _curve(self.form, p, f), b

    def _band(self, b: np.ndarray, axis=0):
        if not len(b):
            shape = np.delete(b.shape, axis) if b.ndim > 1 else ()
            return np.full(shape, np.nan), np.full(shape, np.nan)
        with warnings.catch_warnings():  # step 1 (no update yet) is NaN in every resample
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanpercentile(b, [50 * (1 - self.level), 50 * (1 + self.level)], axis=axis)

    def predict(self, lrs, steps=None) -> pd.DataFrame:
        """The law's `metric` as it would be logged at `steps` (default every step 1..T) of a
        run with the LR sequence `lrs` (the LR of every step, step 1 first; for "loss" NaN at
        step 1, before any update), with the bootstrap percentile interval at `level`: columns
        step, lr, loss, lo, hi. Memory is linear in len(lrs) (the loss-drop sum is formed a
        block of steps at a time), so a 72k-step schedule evaluated at its last step or every
        128 steps costs megabytes."""
        eta = self._eta(lrs)
        s = self._steps(eta, steps)
        self._beyond(int(s.max()))
        loss, b = self._curves(self._features(eta, s))
        lo, hi = self._band(b)
        return pd.DataFrame({"step": s, "lr": eta[s - 1], "loss": loss, "lo": lo, "hi": hi})

    def final_loss(self, lrs, window: int | None = None) -> tuple[float, float, float]:
        """(loss, lo, hi) averaged over the last `window` steps. Default: what results.csv
        holds for a trained run, cgpt's summary train_loss window for "loss"
        (`cgpt.rundir.train_loss_window`), the last step's evaluation for "val_loss"."""
        eta = self._eta(lrs)
        default = rundir.train_loss_window(eta.size) if self.metric == "loss" else 1
        w = default if window is None else check_count(window, "window", 1)
        self._beyond(eta.size)
        est, b = self._curves(self._features(eta, np.arange(max(eta.size - w, 0), eta.size)
                                             + 1))
        if not len(b):
            return float(est.mean()), float("nan"), float("nan")
        lo, hi = self._band(b.mean(axis=1))
        return float(est.mean()), float(lo), float(hi)

    def _beyond(self, step: int) -> None:
        """Warn when `step` lies well past the fitted curves: the interval is the fitted law's
        (resampled residuals of those curves) and carries none of the error of extrapolating
        it in steps."""
        if self.horizon and step > EXTRAPOLATION * self.horizon:
            warnings.warn(f"step {step} is {step / self.horizon:.1f}x the last fitted step "
                          f"({self.horizon}): the interval is the fitted law's and does not "
                          "carry the error of extrapolating it (on Luo et al.'s curves, 3x "
                          "beyond, it missed the 72k-step cosine at every size: "
                          "docs/published_studies.md); fit longer curves to narrow the gap",
                          UserWarning, stacklevel=3)

    def params_in(self, units: str = "lr") -> pd.DataFrame:
        """The parameters with their bootstrap intervals (columns value, lo, hi) in `units`:
        "peak", as fitted (every LR divided by lr_scale, so S1 and S2 count steps at the peak
        LR), or "lr", the LRs as logged: the papers' parameterization (Luo et al. eq. 5, whose
        S1 + S_W is this module's S1, warmup included; Tissue et al. eq. 1). With s = lr_scale:
        A_lr = A s^alpha; multi-power B_lr = B / s, C_lr = C s^(gamma - 1); Tissue C_lr = C / s;
        L0 and the exponents are the same in both."""
        if units not in ("peak", "lr"):
            raise ValueError(f"units={units!r}: use 'peak' (as fitted, LRs / lr_scale) or 'lr' "
                             "(the LRs as logged, the papers' parameterization)")
        rows = np.vstack([[self.params[k] for k in PARAMS[self.form]], self.boot])
        if units == "lr":
            rows = _to_lr_units(self.form, rows, self.lr_scale)
        lo, hi = self._band(rows[1:])
        return pd.DataFrame({"value": rows[0], "lo": lo, "hi": hi}, index=list(PARAMS[self.form]))

    @property
    def weak(self) -> list[str]:
        """Parameters the curves pin only weakly: the bootstrap interval wider than the value
        itself (hi - lo > |value|), or the value outside its own interval."""
        if len(self.boot) < 2:
            return []
        t = self.params_in("peak")
        return [k for k, r in t.iterrows()
                if r.hi - r.lo > abs(r.value) or not r.lo <= r.value <= r.hi]

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
        msg = (f"NOT PINNED by these curves ({'; '.join(out)}): read its predictions with "
               "care. ") if out else ""
        if self.weak:
            msg += (f"WEAKLY IDENTIFIED: {', '.join(self.weak)} (the {self.level:.0%} interval "
                    "wider than the value): the curves constrain a combination, not each; "
                    "compare predictions, not these parameters. ")
        return msg

    def summary(self) -> str:
        name = {"tissue": "Tissue et al. 2024 L0 + A*S1^-alpha - C*S2 (lambda "
                          f"{self.lam:g})",
                "multipower": "Luo et al. 2025 multi-power law"}[self.form]
        t = self.params_in("peak")
        parts = [f"{k} = {r.value:.4g}" + (f" [{r.lo:.4g}, {r.hi:.4g}]" if len(self.boot) else "")
                 for k, r in t.iterrows()]
        return (self._warnings() + f"{name} on {len(self.runs)} run(s) ({', '.join(self.runs)}), "
                f"{self.n_points} {self.metric} records after warmup to step {self.horizon}, "
                f"rmse {self.rmse:.4g}; "
                f"LRs in units of {self.lr_scale:g} (params_in('lr') for the LRs as logged); "
                + ", ".join(parts) +
                (f" ({self.level:.0%} intervals from {len(self.boot)} {self.resample} "
                 "resamples" + (f"; refitted {self.restarts}x from a resample's better optimum"
                                if self.restarts else "") + ")" if len(self.boot) else ""))


def _to_lr_units(form: str, rows: np.ndarray, s: float) -> np.ndarray:
    """Parameter rows (PARAMS order) fitted with LRs / s -> the LRs as logged."""
    rows = np.array(rows, float)
    idx = {k: i for i, k in enumerate(PARAMS[form])}
    rows[:, idx["A"]] *= s ** rows[:, idx["alpha"]]
    if form == "tissue":
        rows[:, idx["C"]] /= s
    else:
        rows[:, idx["B"]] /= s
        rows[:, idx["C"]] *= s ** (rows[:, idx["gamma"]] - 1)
    return rows


def fit_schedule_law(curves, form: str = "multipower", *, metric: str = "loss",
                     lam: float = LAMBDA, n_boot: int = 200, resample: str = "blocks",
                     block: int | None = None, max_points: int = 400, start: int | None = None,
                     seed: int = 0, level: float = 0.95,
                     schedules: dict | None = None) -> ScheduleLawFit:
    """Fit `form` ("tissue" | "multipower") to the loss curves of one model size.

    curves: a DataFrame with columns run_id, step, lr (every step from 1) and `metric`, or run
    directories (read with read_schedule_curves). metric: "loss", the training loss, or
    "val_loss", the evaluations on the fixed validation set (NaN where not evaluated): the
    evaluation after step s's update is L(s), the training loss of step s is L(s − 1) (module
    docstring). schedules: {run_id: the LR of every step 1..T} (entry i is step i + 1's LR):
    then the curves may hold only the steps logged (a published training loss every k steps,
    as run_id, step, loss; an lr column, if any, must agree with the schedule at those steps),
    fitted as `metric` with the same step convention. At least one curve must
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
    if schedules is not None and not isinstance(schedules, Mapping):
        raise TypeError(f"schedules: a dict {{run_id: the LR of every step 1..T}}, not a "
                        f"{type(schedules).__name__} (from a DataFrame with a column per run: "
                        "{c: df[c].to_numpy() for c in df})")
    if not isinstance(curves, pd.DataFrame):
        curves = read_schedule_curves(curves)
    runs = _check_curves(curves, metric, schedules)
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
    fs, ys_ = [feats[r] for r in ids], [ys[r] for r in ids]
    p = _solve(form, fs, ys_)
    restarts = 0
    while True:
        fits = {r: _curve(form, p, feats[r]) for r in ids}
        resid = {r: ys[r] - fits[r] for r in ids}
        boot = _bootstrap(form, p, feats, fits, resid, ys, ids, n_boot, resample, block, seed)
        better = _better_optimum(form, p, boot, fs, ys_)
        if better is None or restarts == 2:
            break
        # a resample's optimum fits the data themselves better: the main fit stopped in a
        # local optimum. Refit from there and redo the bootstrap around the better point.
        p, restarts = better, restarts + 1
    n_points = sum(len(y) for y in ys.values())
    horizon = int(max(f.at.max() for f in feats.values())) - shift   # back to logged steps
    rmse = float(np.sqrt(np.mean(np.concatenate(list(resid.values())) ** 2)))
    return ScheduleLawFit(form=form, params=dict(zip(PARAMS[form], map(float, p))),
                          lr_scale=scale, lam=float(lam), runs=tuple(ids), n_points=n_points,
                          rmse=rmse, boot=boot, level=level, resample=resample, metric=metric,
                          restarts=restarts, horizon=horizon)


def _rss(form: str, p: np.ndarray, feats: list[_Features], ys: list[np.ndarray]) -> float:
    return float(sum(np.sum((y - _curve(form, p, f)) ** 2) for f, y in zip(feats, ys)))


def _bootstrap(form, p, feats, fits, resid, ys, ids, n_boot, resample, block, seed):
    """(n_boot, n_params) refits on moving-block residual resamples or resampled runs."""
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
    return np.array(boot).reshape(-1, len(PARAMS[form]))


def _better_optimum(form, p, boot, feats, ys) -> np.ndarray | None:
    """The law refitted to the data from the resample whose nonlinear parameters fit the data
    best, if that beats `p` (by more than 1e-9 of its residual sum of squares); else None."""
    if form == "tissue" or not len(boot):
        return None    # Tissue's one nonlinear parameter is searched on a grid: global already
    base = _rss(form, p, feats, ys)
    costs = [float(np.sum(_solve_linear(form, feats, ys, _split(form, q)[1])[1] ** 2))
             for q in boot]
    i = int(np.argmin(costs))
    if not costs[i] < base * (1 - 1e-9):
        return None
    new = _solve(form, feats, ys, x0=_split(form, boot[i])[1], only_x0=True)
    return new if _rss(form, new, feats, ys) < base * (1 - 1e-9) else None


def _blocks(r: np.ndarray, block: int | None, rng: np.random.Generator) -> np.ndarray:
    """A moving-block (circular) resample of the residuals `r`, same length."""
    n = r.size
    b = max(1, n // 10) if block is None else check_count(block, "block", 1)
    starts = rng.integers(0, n, -(-n // b))
    idx = (starts[:, None] + np.arange(b)[None, :]).ravel()[:n] % n
    return r[idx]
