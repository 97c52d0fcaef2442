"""Chinchilla approach 1: the lower envelope of the training curves.

Every logged step of every run is a (compute, loss) point: C = FLOPs per token x tokens seen.
On a log-spaced grid of C, the run with the lowest (smoothed, interpolated) loss at C is the
best size for that compute; power laws N_opt = k_N C^a and D_opt = k_D C^b are fitted through
those winners (least squares in log-log), as Hoffmann et al. did with 1,500 FLOP values.

A step in the middle of a run with a decaying LR is not the loss that size would reach if
trained to that many tokens (its LR has not decayed yet), so the envelope of plain runs is
biased towards small models early. Cooldown branches of a WSD run (`cgpt train
--branch-from`) end at several budgets with the LR decayed: their curves make a fair envelope.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import linregress

from .checks import check_count, check_level
from .fit import percentile_ci
from .isoflop import Allocation
from cgpt import rundir

from .results import FLOPS, PARAMS, finished, load_results, locate_run


@dataclass
class EnvelopeFit(Allocation):
    """The envelope (per grid point: C, loss, the winning run, its N and D) and the fits."""
    envelope: pd.DataFrame       # C, loss, run_id, N, D
    curves: pd.DataFrame         # run_id, N, C, D, loss (smoothed, after skip_frac)
    a: float                     # N_opt ~ C^a
    b: float                     # D_opt ~ C^b
    log_kN: float
    log_kD: float
    a_stderr: float              # bootstrap over runs (not the ~200 correlated grid points)
    b_stderr: float
    ci: dict = field(default_factory=dict)      # "a", "b": bootstrap percentile intervals
    n_boot: int = 0                             # resamples kept (>= 2 sizes on the envelope)

    def summary(self) -> str:
        e = self.envelope
        ci = "".join(f", {k} in [{lo:.3f}, {hi:.3f}]" for k, (lo, hi) in self.ci.items())
        return (f"approach 1 (training-curve envelope) over C = {e['C'].min():.3g} .. "
                f"{e['C'].max():.3g}, {e['run_id'].nunique()} runs on the envelope: "
                f"N_opt ~ C^{self.a:.4f} (+/- {self.a_stderr:.4f}), "
                f"D_opt ~ C^{self.b:.4f} (+/- {self.b_stderr:.4f}); +/- and intervals from "
                f"{self.n_boot} bootstrap resamples of the runs{ci}")


def read_curves(sweep_dir: str | Path, *, metric: str = "loss", flops: str = "counted",
                params: str = "total", smooth: int = 5, skip_frac: float = 0.1) -> pd.DataFrame:
    """Training curves of a sweep's finished runs, one row per logged step.

    Compute at a step = the run's FLOPs per token (results.csv: flops / tokens, or 6N for
    flops="6nd") x tokens seen. metric: "loss" (training loss, smoothed by a rolling mean over
    `smooth` logged points) or "val_loss" (only the steps where it was evaluated). The first
    skip_frac of each run (warmup and the initial drop) is left out.
    """
    if metric not in ("loss", "val_loss"):
        raise ValueError(f"metric={metric!r}: use 'loss' or 'val_loss'")
    df = finished(load_results(sweep_dir))
    src = Path(df.attrs.get("source", sweep_dir))
    out = []
    for r in df.itertuples():
        why = f"approach 1 needs each run's training curve (results.csv row {r.Index})"
        log = locate_run(df, r, rundir.METRICS_FILE, why) / rundir.METRICS_FILE
        recs = rundir.read_metrics(log)
        for i, rec in enumerate(recs, 1):  # a number per line: a list or text fails in sorting
            for k in ("tokens", metric):
                v = rec.get(k)
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                    raise ValueError(f"{log}, line {i}: {k!r} is {v!r}, not a number; fix or "
                                     "delete that line")
        m = pd.DataFrame(recs)
        if metric not in m or "tokens" not in m:
            raise ValueError(f"{log}: needs columns 'tokens' and {metric!r}")
        m = m[["tokens", metric]].dropna().sort_values("tokens")
        loss = m[metric].rolling(smooth, min_periods=1, center=True).mean() \
            if metric == "loss" and smooth > 1 else m[metric]
        m = m.assign(loss=loss)
        m = m[m["tokens"] >= skip_frac * m["tokens"].max()]
        n = getattr(r, PARAMS[params])
        per_token = getattr(r, FLOPS[flops]) / r.tokens
        out.append(pd.DataFrame({"run_id": r.run_id, "N": n, "C": per_token * m["tokens"],
                                 "D": m["tokens"], "loss": m["loss"]}))
    if not out:
        raise ValueError(f"{src}: no finished runs to read training curves from")
    return pd.concat(out, ignore_index=True)


def fit_envelope(sweep_dir: str | Path, *, n_grid: int = 200, metric: str = "loss",
                 flops: str = "counted", params: str = "total", smooth: int = 5,
                 skip_frac: float = 0.1, n_boot: int = 200, seed: int = 0,
                 level: float = 0.95) -> EnvelopeFit:
    """Approach 1 on a sweep directory: the envelope of loss vs compute and N_opt(C), D_opt(C).

    The grid spans the compute where at least two runs have a curve (elsewhere there is no
    choice to make). Keyword arguments as in read_curves. The uncertainty of a and b comes from
    resampling whole runs (n_boot, seed, level) and redrawing the envelope: the grid's points
    are n_grid readings of a few runs, so a regression standard error over them shrinks with
    n_grid and says nothing about the runs.
    """
    curves = read_curves(sweep_dir, metric=metric, flops=flops, params=params, smooth=smooth,
                         skip_frac=skip_frac)
    return envelope_fit(curves, n_grid=n_grid, n_boot=n_boot, seed=seed, level=level,
                        source=str(sweep_dir))


def envelope_fit(curves: pd.DataFrame, *, n_grid: int = 200, n_boot: int = 200, seed: int = 0,
                 level: float = 0.95, source: str = "curves") -> EnvelopeFit:
    """Approach 1 on training curves already read (columns run_id, N, C, D, loss; one row per
    logged step, as read_curves returns them): fit_envelope without the sweep directory."""
    level, n_boot = check_level(level), check_count(n_boot)
    spans = curves.groupby("run_id")["C"].agg(["min", "max"])
    if len(spans) < 2:
        raise ValueError(f"{source}: approach 1 needs at least 2 runs of different sizes")
    lo = np.sort(spans["min"].to_numpy())[1]
    hi = np.sort(spans["max"].to_numpy())[-2]
    if not lo < hi:
        raise ValueError(f"{source}: no compute range is covered by two runs' curves; "
                         "train the runs longer (or more sizes) so their curves overlap")
    grid = np.geomspace(lo, hi, n_grid)
    runs = list(spans.index)
    table = np.full((len(runs), grid.size), np.inf)
    tokens = np.full_like(table, np.nan)
    for i, rid in enumerate(runs):
        c = curves[curves["run_id"] == rid]
        lc = np.log(c["C"].to_numpy())
        inside = (np.log(grid) >= lc.min()) & (np.log(grid) <= lc.max())
        table[i, inside] = np.interp(np.log(grid[inside]), lc, c["loss"].to_numpy())
        tokens[i, inside] = np.exp(np.interp(np.log(grid[inside]), lc, np.log(c["D"].to_numpy())))
    win = np.argmin(table, axis=0)
    n_of = curves.groupby("run_id")["N"].first()
    env = pd.DataFrame({"C": grid, "loss": table[win, np.arange(grid.size)],
                        "run_id": [runs[w] for w in win],
                        "N": [float(n_of[runs[w]]) for w in win],
                        "D": tokens[win, np.arange(grid.size)]})
    if env["N"].nunique() < 2:
        raise ValueError(f"{source}: one size ({env['N'].iloc[0]:.3g} parameters) wins at "
                         "every compute, so N_opt(C) has no slope; add smaller and larger runs")
    lc = np.log(env["C"].to_numpy())
    fn = linregress(lc, np.log(env["N"].to_numpy()))
    fd = linregress(lc, np.log(env["D"].to_numpy()))
    n_run = n_of[runs].to_numpy(float)
    boot = _bootstrap(table, tokens, np.log(grid), np.log(n_run), n_boot, seed)
    return EnvelopeFit(envelope=env, curves=curves, a=float(fn.slope), b=float(fd.slope),
                       log_kN=float(fn.intercept), log_kD=float(fd.intercept),
                       a_stderr=float(boot["a"].std(ddof=1)) if len(boot) > 1 else np.nan,
                       b_stderr=float(boot["b"].std(ddof=1)) if len(boot) > 1 else np.nan,
                       ci=percentile_ci(boot, level) if len(boot) > 1 else {}, n_boot=len(boot))


def _bootstrap(table, tokens, lc, ln, n_boot: int, seed: int) -> pd.DataFrame:
    """Slopes of log N and log D on log C over envelopes of resampled run sets."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_boot):
        pick = np.unique(rng.integers(0, table.shape[0], table.shape[0]))
        sub = table[pick]
        cols = np.isfinite(sub).any(axis=0)
        win = np.argmin(sub[:, cols], axis=0)
        if np.unique(win).size < 2:
            continue                                   # one size wins everywhere: no slope
        x = lc[cols]
        d = np.log(tokens[pick][win, np.flatnonzero(cols)])
        rows.append((np.polyfit(x, ln[pick][win], 1)[0], np.polyfit(x, d, 1)[0]))
    return pd.DataFrame(rows, columns=["a", "b"], dtype=float)
