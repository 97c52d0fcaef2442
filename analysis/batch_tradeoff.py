"""The critical batch measured the direct way, from a batch-size sweep, beside the gradient noise
scale the same runs logged (McCandlish et al. 2018, "An Empirical Model of Large-Batch
Training"), and its scaling with model size N and data D (Zhang et al. 2024, "How does critical
batch size scale in pre-training?").

To reach a loss L, training at batch B takes S steps and E = S * B examples. McCandlish et al.
found the trade-off (S / S_min - 1)(E / E_min - 1) = 1, i.e. S(B) = S_min + E_min / B: far below
the critical batch B_crit = E_min / S_min each example counts fully (E ~ E_min), far above it
each step does (S ~ S_min). `fit_tradeoff` fits S(B) by least squares on log S (the steps'
scatter is relative) and bootstraps the residuals for intervals; `measure_critical_batch`
reads a sweep: per run and target loss the first step its smoothed training loss reaches the
target, per batch size the peak LR that gets there in fewest steps, per target the fit, and
the noise scale B_simple the same runs logged around their crossings.

Conventions:
  - Batches, S, E and B_crit count **sequences** (examples) of the runs' length, as the noise
    scale does (docs/gns.md); the `*_tokens` columns multiply by seq_len.
  - The loss is the **training loss** (nats/token), each step's on sequences it has not seen
    (one pass over the data: the sweep's runs stay under one epoch), smoothed by a centred
    mean over the logged steps within +-`width` (relative) of each step, so the noise of a
    small batch's loss does not cross a target early.
  - Steps count optimizer updates from the first (warmup included, the same few steps for
    every batch size; with a constant LR after it, S does not depend on the run's length).
  - D, for the fit of B_crit against N and D (`analysis.gns.fit_bcrit_scaling`), is E_min in
    tokens: the data the target takes when every example counts fully.

Two definitions of the critical batch (`definition=`), both read off the same fitted S(B):
  - "mccandlish": B_crit = E_min / S_min, where the two asymptotes of S(B) meet (S = 2 S_min).
  - "overhead": Zhang et al. 2024's CBS, the batch at which the steps exceed linear scaling
    from a reference batch b_ref (S(B) = S(b_ref) b_ref / B) by a fraction `overhead` (their
    20%, from b_ref = 256 sequences): solving S_min + E_min / B = (1 + o) S(b_ref) b_ref / B
    gives CBS = (1 + o) b_ref + o E_min / S_min. On the same data it is 3-4x below McCandlish's
    at o = 0.2 (o B_crit plus 1.2 b_ref); it needs b_ref in the linear-scaling regime.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from cgpt import rundir

from .checks import as_numbers, check_count, check_level, numeric_column
from .gns import read_noise
from .results import finished, load_results, locate_run, n_params

WITHIN = 2.0  # "the noise scale predicts B_crit": B_crit / B_simple within [1/2, 2]
MAX_BATCH_TOKENS = 1e8  # 25x the largest published batch (Llama 3: 16M tokens): a unit mix-up
DEFINITIONS = ("mccandlish", "overhead")


def check_definition(definition: str, b_ref, overhead) -> tuple[float, float]:
    """(b_ref, overhead) for `definition`, or one error naming the argument and the fix."""
    if definition not in DEFINITIONS:
        raise ValueError(f"definition={definition!r}: use 'mccandlish' (E_min / S_min) or "
                         "'overhead' (Zhang et al.'s CBS, with b_ref= and overhead=)")
    if definition == "mccandlish":
        return float("nan"), float("nan")
    if b_ref is None or not np.isfinite(b_ref) or not b_ref > 0:
        raise ValueError(f"b_ref={b_ref!r}: definition='overhead' needs the reference batch "
                         "(sequences) whose steps linear scaling starts from, e.g. b_ref=256 "
                         "as Zhang et al. use")
    if not np.isfinite(overhead) or not overhead > 0:
        raise ValueError(f"overhead={overhead!r}: the fraction of extra steps over linear "
                         "scaling that defines the CBS, > 0, e.g. overhead=0.2 (Zhang et al.)")
    return float(b_ref), float(overhead)


def critical_batch_of(s_min, e_min, definition: str = "mccandlish", *, b_ref=None,
                      overhead: float = 0.2):
    """The critical batch (sequences) of S(B) = S_min + E_min / B by `definition` (module
    docstring): E_min / S_min, or (1 + overhead) b_ref + overhead E_min / S_min."""
    b_ref, overhead = check_definition(definition, b_ref, overhead)
    ratio = np.asarray(e_min, float) / np.asarray(s_min, float)
    return ratio if definition == "mccandlish" else (1 + overhead) * b_ref + overhead * ratio


def smooth_loss(steps: np.ndarray, loss: np.ndarray, width: float = 0.1) -> np.ndarray:
    """The centred mean of `loss` over the logged steps within [s (1 - width), s (1 + width)]
    of each step s: a window a fixed fraction of the step, so it averages many steps of a long
    small-batch run and few of a short large-batch one, and biases a crossing by at most
    ~width relative (less where the loss is straight over the window)."""
    steps, loss = np.asarray(steps, float), np.asarray(loss, float)
    if not 0 <= width < 1:
        raise ValueError(f"width={width}: the smoothing window is a fraction of the step in [0, 1)")
    lo = np.searchsorted(steps, steps * (1 - width), side="left")
    hi = np.searchsorted(steps, steps * (1 + width), side="right")
    csum = np.concatenate([[0.0], np.cumsum(loss)])
    return (csum[hi] - csum[lo]) / (hi - lo)


def steps_to_loss(steps: np.ndarray, loss: np.ndarray, target: float) -> float:
    """The first step at which `loss` (already smoothed) reaches `target`, linearly
    interpolated between the logged steps around it; NaN if it never does."""
    steps, loss = np.asarray(steps, float), np.asarray(loss, float)
    below = np.flatnonzero(loss <= target)
    if below.size == 0:
        return float("nan")
    i = below[0]
    if i == 0:
        return float(steps[0])
    s0, s1, l0, l1 = steps[i - 1], steps[i], loss[i - 1], loss[i]
    return float(s0 + (s1 - s0) * (l0 - target) / (l0 - l1))


def _window_noise(log: pd.DataFrame, step: float, width: float) -> tuple[float, float, int]:
    """Summed tr(S) and |G|^2 estimates over the logged steps within +-width of `step`."""
    w = log[(log["step"] >= step * (1 - width)) & (log["step"] <= step * (1 + width))]
    return float(w["gns_trace"].sum()), float(w["gns_g2"].sum()), len(w)


def crossings(sweep_dir: str | Path, targets, *, width: float = 0.1,
              gns_width: float = 0.25, params: str = "total") -> pd.DataFrame:
    """One row per finished run and target loss: run_id, N, batch_size, peak_lr, seq_len,
    target, steps (S, NaN if the run never reaches it), examples (E = S * batch_size), and the
    noise scale around the crossing, b_simple = sum tr(S) / sum |G|^2 over the logged steps
    within +-`gns_width` of S (a ratio of sums; its inputs gns_trace, gns_g2 and the step
    count gns_steps are kept for pooling and resampling)."""
    targets = np.sort(np.asarray(targets, float).ravel())[::-1]
    if targets.size == 0 or not np.all(np.isfinite(targets) & (targets > 0)):
        raise ValueError(f"targets={list(targets)}: give one or more positive target losses "
                         "(nats/token), e.g. [3.9, 3.7, 3.5]")
    df = finished(load_results(sweep_dir))
    src = Path(df.attrs.get("source", sweep_dir))
    if "peak_lr" not in df.columns or df["peak_lr"].isna().any():
        raise ValueError(f"{src}: no peak_lr for every run (column 'peak_lr'), so the best LR "
                         "per batch size cannot be chosen; rerun `cgpt sweep` to rewrite "
                         "results.csv (it records each run's peak LR)")
    rows = []
    for r, n in zip(df.itertuples(), n_params(df, params)):
        d = locate_run(df, r, rundir.METRICS_FILE, "the training curve is read from it")
        log, summary = read_noise(d), rundir.read_summary(d)
        smooth = smooth_loss(log["step"], log["loss"], width)
        batch = int(summary["batch_size"])
        for t in targets:
            s = steps_to_loss(log["step"], smooth, t)
            trace, g2, k = _window_noise(log, s, gns_width) if np.isfinite(s) else (np.nan,) * 3
            rows.append({"run_id": r.run_id, "N": n, "batch_size": batch,
                         "peak_lr": float(r.peak_lr), "seq_len": int(summary["seq_len"]),
                         "target": t, "steps": s, "examples": s * batch,
                         "b_simple": trace / g2 if g2 and g2 > 0 else np.nan,
                         "gns_trace": trace, "gns_g2": g2, "gns_steps": k})
    if not rows:
        raise ValueError(f"{src}: no finished runs to read the training curves from")
    return pd.DataFrame(rows)


def best_lr(table: pd.DataFrame) -> pd.DataFrame:
    """Per model, target and batch size the run that reaches the target in fewest steps
    (`crossings`' rows), with `lr_at_edge`: its peak LR is the smallest or largest of that
    batch size's grid (the optimum may lie outside it, so S is an upper bound) and `n_lr`."""
    reached = table[np.isfinite(table["steps"])]
    keys = ["N", "target", "batch_size"]
    best = reached.loc[reached.groupby(keys, dropna=False)["steps"].idxmin()].copy()
    grid = table.groupby(["N", "batch_size"], dropna=False)["peak_lr"].agg(
        ["min", "max", "nunique"])
    g = grid.loc[list(zip(best["N"], best["batch_size"]))]
    best["n_lr"] = g["nunique"].to_numpy()
    best["lr_at_edge"] = ((best["n_lr"].to_numpy() > 1)
                          & (np.isclose(best["peak_lr"], g["min"].to_numpy())
                             | np.isclose(best["peak_lr"], g["max"].to_numpy())))
    return best.sort_values(["N", "target", "batch_size"], ascending=[True, False, True]) \
        .reset_index(drop=True)


def _tradeoff_solve(batch: np.ndarray, log_s: np.ndarray, iters: int = 100) -> np.ndarray:
    """Least squares of log S = log(S_min + E_min / B) for each row of `log_s` (replicates x
    batch sizes) at once: Levenberg-Marquardt in (log S_min, log E_min), started from the
    linear fit of S on 1/B. Returns (replicates, 2)."""
    s = np.exp(log_s)
    x = 1.0 / batch
    xc = x - x.mean()
    slope = (s - s.mean(1, keepdims=True)) @ xc / (xc @ xc)
    icpt = s.mean(1) - slope * x.mean()
    smin0 = s.min(1)
    th = np.stack([np.log(np.where(icpt > 0, np.minimum(icpt, smin0), 0.5 * smin0)),
                   np.log(np.where(slope > 0, slope, 0.5 * (s / x).min(1)))], axis=1)
    lo = np.stack([log_s.min(1) - 30.0, np.log(s / x).min(1) - 30.0], axis=1)
    hi = np.stack([log_s.max(1) + 1.0, np.log(s / x).max(1) + 1.0], axis=1)
    th = np.clip(th, lo, hi)

    def resid(t):
        return log_s - np.logaddexp(t[:, :1], t[:, 1:] + np.log(x))

    r = resid(th)
    cost = (r ** 2).sum(1)
    lam = np.full(len(th), 1e-3)
    for _ in range(iters):
        w = 1.0 / (1.0 + np.exp(th[:, 1:] - th[:, :1] + np.log(x)))   # d f / d log S_min
        j = np.stack([w, 1 - w], axis=2)                               # (R, n, 2)
        jtj = np.einsum("rni,rnj->rij", j, j)
        jtr = np.einsum("rni,rn->ri", j, r)
        a = jtj + lam[:, None, None] * (np.eye(2) * np.diagonal(jtj, axis1=1, axis2=2)[:, None]
                                        + 1e-12 * np.eye(2))
        step = np.linalg.solve(a, jtr[..., None])[..., 0]
        new = np.clip(th + step, lo, hi)
        r_new = resid(new)
        c_new = (r_new ** 2).sum(1)
        ok = c_new <= cost
        th = np.where(ok[:, None], new, th)
        r = np.where(ok[:, None], r_new, r)
        cost = np.where(ok, c_new, cost)
        lam = np.where(ok, lam / 3, lam * 4)
        if np.all(np.abs(step) < 1e-9) or np.all(lam > 1e12):
            break
    return th


@dataclass(frozen=True)
class TradeoffFit:
    """S(B) = S_min + E_min / B fitted to steps-to-target at several batch sizes (sequences);
    `ci`: (lo, hi) of s_min, e_min, b_crit at `level` (residual bootstrap on log S).
    `bracketed`: B_crit lies within the batch sizes measured (outside, it is an extrapolation
    and its interval reaches far)."""
    batch: np.ndarray
    steps: np.ndarray
    s_min: float
    e_min: float
    ci: dict = field(repr=False)
    level: float = 0.95
    rms_log: float = float("nan")     # residual scatter of log S
    boot: np.ndarray = field(repr=False, default=None)   # (n_boot, 2): log S_min, log E_min

    @property
    def b_crit(self) -> float:
        return self.e_min / self.s_min

    @property
    def bracketed(self) -> bool:
        return bool(self.batch.min() <= self.b_crit <= self.batch.max())

    def critical_batch(self, definition: str = "mccandlish", *, b_ref=None,
                       overhead: float = 0.2) -> tuple[float, float, float]:
        """(B_crit, lo, hi) by `definition` (module docstring), the interval from the same
        bootstrap as `ci` (log percentiles widened by t_{n-2}/z)."""
        est = float(critical_batch_of(self.s_min, self.e_min, definition, b_ref=b_ref,
                                      overhead=overhead))
        if self.boot is None or not len(self.boot):
            return est, float("nan"), float("nan")
        v = critical_batch_of(np.exp(self.boot[:, 0]), np.exp(self.boot[:, 1]), definition,
                              b_ref=b_ref, overhead=overhead)
        lo, hi = _widened(np.log(est), np.log(v), self.level, self.batch.size)
        return est, lo, hi

    def predict(self, batch) -> np.ndarray:
        """Steps to the target at batch sizes `batch`."""
        return self.s_min + self.e_min / np.asarray(batch, float)


def _grows(batch: np.ndarray, steps: np.ndarray) -> str:
    """'S at B' of the smallest and largest batch when the steps (mean over each batch size's
    runs) never fall and grow from the smallest batch to the largest: no trade-off fits that,
    and noise about a flat S_min (B far above B_crit) does it by chance only at 2 sizes. Else
    ""."""
    sizes = np.unique(batch)
    if sizes.size < 3:
        return ""
    s = np.array([steps[batch == b].mean() for b in sizes])
    if not (np.all(np.diff(s) >= 0) and s[-1] > s[0]):
        return ""
    return f"{s[0]:.4g} at B = {sizes[0]:g}, {s[-1]:.4g} at B = {sizes[-1]:g}"


def fit_tradeoff(batch, steps, *, n_boot: int = 1000, level: float = 0.95,
                 seed: int = 0) -> TradeoffFit:
    """Fit McCandlish et al.'s (S/S_min - 1)(E/E_min - 1) = 1, i.e. S = S_min + E_min / B, to the
    steps `steps` one loss target takes at batch sizes `batch` (sequences; E = S * B). Least
    squares on log S; intervals from a residual bootstrap (residuals of log S rescaled by
    sqrt(n / (n - 2)) for the two fitted parameters; percentile intervals of the log
    parameters widened by t_{n-2}/z), the batch sizes held fixed, as they are in a sweep."""
    if isinstance(batch, dict) or isinstance(steps, dict):
        raise TypeError("batch and steps: sequences of numbers (lists, arrays, columns), not a "
                        "dict; pass list(d.values())")
    shapes = np.shape(batch), np.shape(steps)
    batch, steps = (as_numbers(np.asarray(v, object), name).reshape(shape)
                    for v, name, shape in ((batch, "batch", shapes[0]),
                                           (steps, "steps", shapes[1])))
    n_boot, level = check_count(n_boot, "n_boot"), check_level(level)
    if batch.shape != steps.shape or batch.ndim != 1:
        raise ValueError(f"batch and steps must be 1-d of equal length, got {batch.shape} "
                         f"and {steps.shape}")
    if not np.all(np.isfinite(batch) & (batch > 0)):
        raise ValueError(f"batch: batch sizes are > 0 sequences, got "
                         f"{batch[~(np.isfinite(batch) & (batch > 0))][:5].tolist()}")
    if (steps <= 0).any() or np.isinf(steps).any():
        raise ValueError(f"steps: {steps[(steps <= 0) | np.isinf(steps)][:5].tolist()}: steps to "
                         "a target are > 0 (NaN: the batch size never reached it)")
    ok = np.isfinite(steps)
    grow = _grows(batch[ok], steps[ok])
    if grow:
        raise ValueError(f"steps grow with the batch size ({grow}): S = S_min + E_min / B "
                         "takes fewer steps at a larger batch; check that each step count "
                         "belongs to its batch size (and its target)")
    if np.unique(batch[ok]).size < 3:
        raise ValueError(f"fit_tradeoff needs steps at >= 3 distinct batch sizes, got "
                         f"{np.unique(batch[ok]).size} (batch sizes that never reach the target "
                         "are left out); train more batch sizes or choose a target they reach")
    batch, steps = batch[ok], steps[ok]
    log_s = np.log(steps)
    th = _tradeoff_solve(batch, log_s[None])[0]
    fitted = np.logaddexp(th[0], th[1] - np.log(batch))
    res = log_s - fitted
    n = batch.size
    res = (res - res.mean()) * np.sqrt(n / max(n - 2, 1))
    rng = np.random.default_rng(seed)
    boot = _tradeoff_solve(batch, fitted + rng.choice(res, (n_boot, n))) if n_boot else \
        np.empty((0, 2))
    # Percentile intervals of the log parameters, their half-widths widened by t_{n-2} / z: the
    # residual bootstrap reproduces the scatter but not the small-sample spread of a fit with
    # n - 2 degrees of freedom (6 batch sizes leave 4; without it 95% intervals covered ~86%
    # of simulated truths, with it ~95%: tests/analysis/test_batch_tradeoff.py).
    est = {"s_min": th[0], "e_min": th[1], "b_crit": th[1] - th[0]}
    logs = {"s_min": boot[:, 0], "e_min": boot[:, 1], "b_crit": boot[:, 1] - boot[:, 0]}
    ci = {name: _widened(est[name], v, level, n) if n_boot else (np.nan, np.nan)
          for name, v in logs.items()}
    return TradeoffFit(batch=batch, steps=steps, s_min=float(np.exp(th[0])),
                       e_min=float(np.exp(th[1])), ci=ci, level=level,
                       rms_log=float(np.sqrt(np.mean((log_s - fitted) ** 2))), boot=boot)


def _widened(est: float, boot: np.ndarray, level: float, n: int) -> tuple[float, float]:
    """exp of the bootstrap percentile interval of a log parameter, its half-widths widened by
    t_{n-2} / z (fit_tradeoff's docstring)."""
    widen = stats.t.ppf((1 + level) / 2, max(n - 2, 1)) / stats.norm.ppf((1 + level) / 2)
    lo, hi = np.percentile(boot, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(np.exp(est - widen * (est - lo))), float(np.exp(est + widen * (hi - est)))


def pooled_noise_scale(best: pd.DataFrame, *, n_boot: int = 1000,
                       seed: int = 0) -> tuple[float, np.ndarray]:
    """B_simple at one target from the best-LR runs of each batch size (`best_lr` rows of one
    target): the median over batch sizes of each run's b_simple around its crossing, and its
    bootstrap replicates (the batch sizes resampled) for intervals."""
    v = best["b_simple"].to_numpy(float)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size == 0:
        return float("nan"), np.full(n_boot, np.nan)
    rng = np.random.default_rng(seed)
    return float(np.median(v)), np.median(v[rng.integers(0, v.size, (n_boot, v.size))], axis=1)


def steps_table(table: pd.DataFrame, seq_len: int | None = None) -> pd.DataFrame:
    """Any steps-to-target table as `best_lr`'s rows: columns batch_size (sequences) and steps
    are required; N and target (one model / one target if absent), peak_lr (the fewest steps
    per batch size are kept if present; else one row per batch size is required), b_simple
    and seq_len (the `seq_len` argument if absent) are optional."""
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"table: a DataFrame of steps to a target, not a "
                        f"{type(table).__name__} (a CSV: pandas.read_csv(path); a sweep: "
                        "crossings(sweep_dir, targets))")
    missing = [c for c in ("batch_size", "steps") if c not in table.columns]
    if missing:
        raise ValueError(f"table: no column {missing[0]!r}; measure_critical_batch reads the "
                         "steps to a target loss (column 'steps') at each batch size in "
                         "sequences (column 'batch_size'); rename yours, e.g. "
                         "table.rename(columns={'batch': 'batch_size'})")
    t = table.copy()
    for c in ("batch_size", "steps", "N", "target", "b_simple", "seq_len", "peak_lr"):
        if c in t:   # text in a cell is named, not read as NaN ("1,000" as "never reached")
            t[c] = numeric_column(t, c)
    for c in ("batch_size", "steps"):
        if c == "batch_size" and not (np.isfinite(t[c]) & (t[c] > 0)).all():
            raise ValueError("table: column 'batch_size' has a value that is not a positive "
                             "number; batch sizes count sequences (convert tokens with "
                             "batch_size = tokens / seq_len)")
    t["N"] = t["N"] if "N" in t else np.nan
    t["target"] = t["target"] if "target" in t else np.nan
    t["b_simple"] = t["b_simple"] if "b_simple" in t else np.nan
    if "seq_len" not in t:
        t["seq_len"] = np.nan if seq_len is None else check_count(seq_len, "seq_len", 1)
    tokens = t["batch_size"] * t["seq_len"]
    if (tokens > MAX_BATCH_TOKENS).any():
        i = int(np.argmax((tokens > MAX_BATCH_TOKENS).to_numpy()))
        raise ValueError(f"table: batch_size {t['batch_size'].iloc[i]:g} x seq_len "
                         f"{t['seq_len'].iloc[i]:g} = {tokens.iloc[i]:.3g} tokens in one batch "
                         f"(row {t.index[i]}), more than any model trains with "
                         f"({MAX_BATCH_TOKENS:.0e}): is batch_size in tokens? batch sizes count "
                         "sequences (batch_size = tokens / seq_len)")
    if "peak_lr" in t and t["peak_lr"].notna().all():
        return best_lr(t)
    keys = ["N", "target", "batch_size"]
    dup = t[t.duplicated(keys, keep=False)]
    if len(dup):
        r = dup.iloc[0]
        raise ValueError(f"table: {int(dup.duplicated(keys).sum() + 1)} rows for batch size "
                         f"{r.batch_size:g} (N {r.N:g}, target {r.target:g}) and no 'peak_lr' "
                         "column to choose among them; give one row per batch size (its fewest "
                         "steps) or a peak_lr column")
    return t.assign(lr_at_edge=False, n_lr=1).sort_values(keys).reset_index(drop=True)


def measure_critical_batch(table: pd.DataFrame, *, n_boot: int = 1000, level: float = 0.95,
                           seed: int = 0, definition: str = "mccandlish", b_ref=None,
                           overhead: float = 0.2,
                           seq_len: int | None = None) -> tuple[pd.DataFrame, dict]:
    """The measured critical batch per model and target loss from a steps-to-target table
    (`crossings`' rows, or any table `steps_table` reads: batch_size and steps, optionally N,
    target, peak_lr, b_simple, seq_len): the trade-off fit on each batch size's best LR,
    beside the pooled noise scale where the table has it. B_crit by `definition`
    ("mccandlish", or "overhead" with b_ref and overhead: module docstring). Returns a table
    (N, target, n_batch, s_min, e_min, b_crit with b_crit_lo/hi, definition, b_ref,
    overhead, bracketed, b_simple with lo/hi, ratio = b_crit / b_simple with its interval (the
    two intervals' log half-widths in quadrature), within_2x, D = e_min * seq_len tokens,
    lr_at_edge = how many batch sizes' best LR sits at its grid's edge) and the fits by
    (N, target)."""
    n_boot, level = check_count(n_boot, "n_boot"), check_level(level)
    b_ref, overhead = check_definition(definition, b_ref, overhead)
    best = steps_table(table, seq_len)
    rows, fits, short = [], {}, []
    for (n, t), g in best.groupby(["N", "target"], sort=False, dropna=False):
        g = g[np.isfinite(g["steps"])]
        if g["batch_size"].nunique() < 3:
            short.append(f"{t:g}" + ("" if np.isnan(n) else f" (N {n:g})"))
            continue                                  # fit_tradeoff's minimum: not measurable
        fit = fit_tradeoff(g["batch_size"], g["steps"], n_boot=n_boot, level=level, seed=seed)
        b, c_lo, c_hi = fit.critical_batch(definition, b_ref=b_ref, overhead=overhead)
        bs, bs_boot = pooled_noise_scale(g, n_boot=n_boot, seed=seed + 1)
        ratio = b / bs
        bs_lo, bs_hi = _interval(bs_boot, level)
        # the two estimates' errors are independent: their log half-widths add in quadrature
        r_lo = ratio * np.exp(-np.hypot(np.log(b / c_lo), np.log(bs_hi / bs)))
        r_hi = ratio * np.exp(np.hypot(np.log(c_hi / b), np.log(bs / bs_lo)))
        seq = float(g["seq_len"].iloc[0])
        fits[(n, t)] = fit
        rows.append({"N": n, "target": t, "n_batch": fit.batch.size, "s_min": fit.s_min,
                     "e_min": fit.e_min, "b_crit": b, "b_crit_lo": c_lo, "b_crit_hi": c_hi,
                     "definition": definition, "b_ref": b_ref, "overhead": overhead,
                     "bracketed": bool(fit.batch.min() <= b <= fit.batch.max()),
                     "b_simple": bs, "b_simple_lo": bs_lo, "b_simple_hi": bs_hi,
                     "ratio": ratio, "ratio_lo": r_lo, "ratio_hi": r_hi,
                     "within_2x": bool(1 / WITHIN <= ratio <= WITHIN), "seq_len": seq,
                     "D": fit.e_min * seq, "b_crit_tokens": b * seq,
                     "lr_at_edge": int(g["lr_at_edge"].sum())})
    if not rows:
        raise ValueError("no target loss is reached by >= 3 batch sizes: choose targets the "
                         "runs reach (crossings(..., targets=...)) or train longer")
    if short:
        warnings.warn(f"left out target(s) {', '.join(short)}: reached by fewer than 3 batch "
                      "sizes, so no trade-off can be fitted there", stacklevel=2)
    return pd.DataFrame(rows), fits


def _interval(v: np.ndarray, level: float) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates (NaN with none)."""
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.percentile(v, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)
