"""The critical batch of a sweep's runs, from the gradient noise scale they logged (`cgpt train`
with train.gns=true; docs/gns.md).

Each logged step of such a run carries unbiased estimates of |G|^2 (`gns_g2`) and tr(S)
(`gns_trace`) for one sequence's loss gradient, and their smoothed ratio B_simple
(`gns_b_simple`). The critical batch of a run is B_simple late in training, where McCandlish
et al. 2018 read it (B_crit ~ B_simple, up to a problem-dependent factor of order one): here
the ratio of the mean tr(S) to the mean |G|^2 over the last `late` fraction of the logged
steps, a ratio of means rather than a mean of noisy ratios. It is in sequences of the run's
length; `b_crit_tokens` multiplies by it, the unit to compare across sequence lengths (and with
published batch sizes in tokens).

Its trend is a power law fitted with `analysis.fit.fit_power_law` in log space (least squares
on log B_crit): B_crit = A * loss^(-b) against loss (Kaplan et al. 2020: b = 1/alpha_B ~ 4.8),
and against compute through 1/B_crit = A * C^(-b), so that B_crit grows as C^b.
`fit_bcrit_scaling` fits it against several variables at once, B_crit = k * N^p * D^q (Zhang
et al. 2024, "How does critical batch size scale in pre-training?"), with t intervals: on this
module's table (D = the tokens a run trained on) or on a critical batch measured from a
batch-size sweep (`analysis.batch_tradeoff`, D = E_min in tokens).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from cgpt import rundir

from .checks import check_level
from .fit import PowerLawFit, fit_power_law
from .results import compute, finished, load_results, locate_run, n_params

STEP_KEYS = ("gns_g2", "gns_trace")  # the estimates of one logged step
NEAR_COLLINEAR = 0.9   # |r| of two log predictors above which fit_bcrit_scaling warns


def read_noise(run_dir: str | Path) -> pd.DataFrame:
    """The logged steps of one run that carry the noise scale's estimates: step, tokens,
    loss, gns_g2, gns_trace and (where defined) gns_b_simple, the smoothed B_simple."""
    log = Path(run_dir) / rundir.METRICS_FILE
    if not log.is_file():
        raise FileNotFoundError(f"{log}: no {rundir.METRICS_FILE}, so no noise scale for this run")
    m = pd.DataFrame(rundir.read_metrics(log))
    if not set(STEP_KEYS) <= set(m.columns):
        raise ValueError(f"{log}: no gradient noise scale was logged (no {STEP_KEYS[0]!r}); "
                         "train the run with train.gns=true")
    keep = [c for c in ("step", "tokens", "loss", *STEP_KEYS, "gns_b_simple") if c in m]
    m = m[keep].dropna(subset=list(STEP_KEYS)).reset_index(drop=True)
    if "loss" not in m or m["loss"].isna().any():  # a curve with a hole: crossings misread
        at = m["step"][m["loss"].isna()].tolist()[:5] if "loss" in m else "every step"
        raise ValueError(f"{log}: the loss is null (not a finite number) at step(s) {at}; the "
                         "critical batch reads the loss of every logged step: restore the "
                         "run's log, or leave the run out of the sweep")
    return m


def critical_batch(noise: pd.DataFrame, late: float = 0.5) -> float:
    """B_crit in sequences: mean tr(S) / mean |G|^2 over the logged steps in the last `late`
    fraction of training (`noise`: `read_noise`'s table)."""
    if not 0 < late <= 1:
        raise ValueError(f"late={late}: the fraction of training to average must be in (0, 1]")
    tail = noise[noise["step"] >= (1 - late) * noise["step"].max()]
    g2, trace = tail["gns_g2"].mean(), tail["gns_trace"].mean()
    if not g2 > 0:
        raise ValueError(f"the mean |G|^2 estimate over the last {late:.0%} of training is "
                         f"{g2:.3g} (not positive: noise dominates the gradient there); "
                         "average over more of the run (a larger late=) or log more steps")
    return float(trace / g2)


def noise_table(sweep_dir: str | Path, *, late: float = 0.5, flops: str = "counted",
                params: str = "total") -> pd.DataFrame:
    """One row per finished run of a sweep: run_id, model, N, C, D (tokens trained), val_loss,
    the mean training loss over the same late window (`late_loss`), b_simple (the smoothed
    value at the end), b_crit (sequences), seq_len, b_crit_tokens and the batch it trained
    with (batch_size, sequences)."""
    df = finished(load_results(sweep_dir))
    src = Path(df.attrs.get("source", sweep_dir))
    rows = []
    for r, n, c in zip(df.itertuples(), n_params(df, params), compute(df, flops)):
        d = locate_run(df, r, rundir.METRICS_FILE, "so no noise scale for this run")
        noise, summary = read_noise(d), rundir.read_summary(d)
        seq_len, batch = (_count(summary, k, d) for k in ("seq_len", "batch_size"))
        b_simple = summary.get("gns_b_simple")  # null: not finite at the end
        tail = noise[noise["step"] >= (1 - late) * noise["step"].max()]
        try:
            b_crit = critical_batch(noise, late)
        except ValueError as e:  # which run's log, of the sweep's many
            raise ValueError(f"{d / rundir.METRICS_FILE} (run {r.run_id}): {e}") from None
        rows.append({"run_id": r.run_id, "model": r.model, "N": n, "C": c,
                     "D": float(r.tokens), "val_loss": r.val_loss,
                     "late_loss": float(tail["loss"].mean()),
                     "b_simple": np.nan if b_simple is None else float(b_simple),
                     "b_crit": b_crit, "seq_len": seq_len, "b_crit_tokens": b_crit * seq_len,
                     "batch_size": batch})
    if not rows:
        raise ValueError(f"{src}: no finished runs to read the noise scale from")
    return pd.DataFrame(rows)


def _count(summary: dict, key: str, run_dir: Path) -> int:
    """summary.json's `key`, a positive whole number (the noise scale in tokens needs it)."""
    v = summary.get(key)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{Path(run_dir) / rundir.SUMMARY_FILE}: {key!r} is "
                         f"{'missing' if key not in summary else repr(v)}, not a positive whole "
                         f"number; restore it from the run's {rundir.CONFIG_FILE}")
    return v


def fit_critical_batch(table: pd.DataFrame, against: str = "loss", *, tokens: bool = True,
                       n_boot: int = 1000, seed: int = 0) -> PowerLawFit:
    """The power law of the critical batch across runs (`noise_table`'s rows), least squares
    on log B_crit: against="loss" (the late training loss) fits B_crit = A * loss^(-b);
    against="compute" fits 1/B_crit = A * C^(-b), i.e. B_crit grows as C^b. `tokens`: B_crit
    in tokens (else sequences)."""
    col = {"loss": "late_loss", "compute": "C"}
    if against not in col:
        raise ValueError(f"against={against!r}: use 'loss' or 'compute'")
    b = table["b_crit_tokens" if tokens else "b_crit"].to_numpy(float)
    x = table[col[against]].to_numpy(float)
    y = b if against == "loss" else 1.0 / b
    return fit_power_law(x, y, offset=False, space="log", n_boot=n_boot, seed=seed)


@dataclass(frozen=True)
class BcritScaling:
    """log B_crit = log k + sum_j p_j log x_j (B_crit = k * prod x_j^p_j), least squares;
    `ci`: (lo, hi) per exponent and for k from the OLS covariance (Student t with n - p - 1
    degrees of freedom: exact for Gaussian scatter in log B_crit)."""
    on: tuple
    k: float
    exponents: dict
    ci: dict
    n: int
    rms_log: float
    level: float = 0.95
    max_corr: float = 0.0    # the largest |correlation| between two log columns, signed
    pair: tuple = ()         # the two columns it is between

    def predict(self, **x) -> np.ndarray:
        out = np.log(self.k)
        for name in self.on:
            out = out + self.exponents[name] * np.log(np.asarray(x[name], float))
        return np.exp(out)

    def summary(self) -> str:
        law = " * ".join(f"{v}^{self.exponents[v]:.3g}" for v in self.on)
        parts = [f"B_crit = {self.k:.3g} * {law}  ({self.n} points, rms log {self.rms_log:.3f})"]
        for v in self.on:
            lo, hi = self.ci[v]
            parts.append(f"  exponent of {v}: {self.exponents[v]:.3f}  "
                         f"[{lo:.3f}, {hi:.3f}] ({self.level:.0%})")
        if abs(self.max_corr) > NEAR_COLLINEAR:
            parts.append(f"  NEAR COLLINEAR: log {self.pair[0]} and log {self.pair[1]} correlate "
                         f"r = {self.max_corr:.3f}; their exponents trade off")
        return "\n".join(parts)


def fit_bcrit_scaling(table: pd.DataFrame, on=("N", "D"), *, b: str = "b_crit",
                level: float = 0.95) -> BcritScaling:
    """Fit B_crit as a power law of the columns `on` of `table` (Zhang et al. 2024's form
    B_crit = k * N^p * D^q with on=("N", "D"); on=("target",) gives B_crit against loss).
    Columns that take one value (a single model's N) or move together (D = 20 N in a
    Chinchilla-optimal sweep, up to rounding: 1 - |r| of their logs below 1e-3) cannot be
    separated: an error says which; above |r| = 0.9 (NEAR_COLLINEAR) a warning names the pair
    and r, and the summary repeats it. B_crit is whichever column `b` names (the measured
    table's b_crit follows its `definition=`). Works on
    `noise_table`'s rows (B_crit from the noise scale; D = the tokens each run trained on,
    target -> late_loss) and on `analysis.batch_tradeoff.measure_critical_batch`'s (B_crit
    measured from a batch-size sweep; D = E_min in tokens, the loss is the target's)."""
    level = check_level(level)
    on = tuple(on)
    missing = [c for c in (*on, b) if c not in table.columns]
    if missing:
        raise ValueError(f"fit_bcrit_scaling: no column(s) {missing} in the table (it has "
                         f"{list(table.columns)})")
    d = table[[*on, b]].astype(float)
    d = d[np.isfinite(d).all(axis=1) & (d > 0).all(axis=1)]
    for c in on:
        if d[c].nunique() < 2:
            raise ValueError(f"fit_bcrit_scaling: column {c!r} takes one value "
                             f"({d[c].iloc[0]:.4g}) in the rows fitted, so its exponent is "
                             f"not identified; fit on={tuple(x for x in on if x != c)} or "
                             "add runs that vary it")
    n, p = len(d), len(on) + 1
    if n <= p:
        raise ValueError(f"fit_bcrit_scaling: {n} points for {p} parameters; need at least "
                         f"{p + 1}")
    x = np.column_stack([np.ones(n), *(np.log(d[c]) for c in on)])
    y = np.log(d[b].to_numpy())
    z = x[:, 1:] - x[:, 1:].mean(0)
    z = z / np.linalg.norm(z, axis=0)
    max_corr, pair = 0.0, ()
    if p > 2:   # the most correlated pair of log columns
        r = z.T @ z
        np.fill_diagonal(r, 0.0)
        i, j = np.unravel_index(np.argmax(np.abs(r)), r.shape)
        max_corr, pair = float(r[i, j]), (on[min(i, j)], on[max(i, j)])
    # the smallest eigenvalue of the log columns' correlation matrix: 1 - |r| for two columns
    if p > 2 and np.linalg.svd(z, compute_uv=False).min() ** 2 < 1e-3:
        raise ValueError(f"fit_bcrit_scaling: the columns {list(on)} are collinear in log "
                         f"space ({pair[0]!r} and {pair[1]!r}: r = {max_corr:.4f}; e.g. D = "
                         "20 N in a Chinchilla-optimal sweep), so their exponents are not "
                         "separately identified; fit one of them, or add runs at other D/N")
    if abs(max_corr) > NEAR_COLLINEAR:
        warnings.warn(f"fit_bcrit_scaling: columns {pair[0]!r} and {pair[1]!r} correlate "
                      f"r = {max_corr:.3f} in log space (near collinear): their exponents "
                      "trade off against each other, so each interval is wide and the two "
                      "errors are tied; trust their sum along the runs' path, or add runs "
                      "that move one without the other", UserWarning, stacklevel=2)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    res = y - x @ coef
    s2 = res @ res / (n - p)
    cov = s2 * np.linalg.inv(x.T @ x)
    tq = stats.t.ppf((1 + level) / 2, n - p)
    se = np.sqrt(np.diag(cov))
    ci = {c: (coef[i + 1] - tq * se[i + 1], coef[i + 1] + tq * se[i + 1]) for i, c in enumerate(on)}
    ci["k"] = (float(np.exp(coef[0] - tq * se[0])), float(np.exp(coef[0] + tq * se[0])))
    return BcritScaling(on=on, k=float(np.exp(coef[0])),
                        exponents={c: float(coef[i + 1]) for i, c in enumerate(on)},
                        ci={c: tuple(map(float, v)) for c, v in ci.items()}, n=n,
                        rms_log=float(np.sqrt(res @ res / n)), level=level,
                        max_corr=max_corr, pair=pair)
