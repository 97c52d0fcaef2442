"""Learning-rate transfer across width (μP vs SP): each width's best LR, with an interval.

μP's claim (Yang et al. 2021; Cerebras-GPT's μP family uses it) is that the loss-optimal
learning rate found on a narrow proxy stays optimal at every width, while under the
standard parametrization (SP) it drifts down as the width grows. `lr_sweep` reads a sweep
of peak LR x width (`sweeps/mup_transfer.yaml`), `lr_optimum` locates a curve's minimum
with an interval, `transfer_table` does that per parametrization and width, and
`lr_drift` summarizes the drift as the exponent of LR_opt ~ width^k (μP: k ~ 0, SP: k < 0).

The optimum: a quadratic in log LR through the grid minimum and up to `window` grid points
on each side. With several seeds per point (`seed_optimum`) each seed's curve is fit in the
window around the seed-mean curve's minimum, and the interval is a Student-t interval over
the per-seed optima (in log LR): it is the seed variance, with the few-seed t factor (a
bootstrap over 3 seeds has only 10 distinct resamples and under-covers). With one seed
(`lr_optimum`) the interval is a parametric bootstrap of the fit, with noise the larger of
the fit's residual scatter and `rel_noise` x the loss (default 0.35%, the run-to-run seed
spread Cerebras-GPT reports). A minimum on the edge of the grid has no interval on that side
(`edge` says which), since the data cannot say how far beyond the optimum lies.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import t as student_t
from matplotlib import colormaps
from matplotlib.ticker import NullFormatter

from cgpt import rundir

from .plots import _figure, _plain_y, _save
from .checks import check_count
from .results import finished, load_results, locate_run

SEED_REL_STD = 0.0035  # Cerebras-GPT §3.3: run-to-run std of the loss is ~0.35%


@dataclass(frozen=True)
class LrOptimum:
    """Best peak LR of one loss-vs-LR curve and its 95% interval [lo, hi].

    `edge` is "low" or "high" when the grid minimum is the smallest or largest LR tried
    (the interval is then open on that side: lo = 0 or hi = inf), else "". `seed_lrs` are
    the per-seed optima the interval comes from (`seed_optimum`; empty for one seed), and
    `seed_edges` counts the seeds whose own grid minimum is on an edge.
    """

    lr: float
    lo: float
    hi: float
    loss: float
    edge: str = ""
    seed_lrs: tuple = ()
    seed_edges: int = 0

    def __str__(self) -> str:
        hi = "inf" if math.isinf(self.hi) else f"{self.hi:.3g}"
        note = f" (grid {self.edge} edge)" if self.edge else ""
        return f"{self.lr:.3g} [{self.lo:.3g}, {hi}]{note}"


def _quad(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.polyfit(x, y, 2)


def _vertex(coef: np.ndarray, xlo: float, xhi: float) -> float:
    """Minimum of a quadratic on [xlo, xhi] (an end when it is not convex)."""
    a, b, c = coef
    if a > 0:
        return float(np.clip(-b / (2 * a), xlo, xhi))
    return xlo if np.polyval(coef, xlo) <= np.polyval(coef, xhi) else xhi


def _finite_losses(who: str, lr, loss) -> np.ndarray:
    """Which points a curve keeps: an LR must be finite and > 0 and a loss > 0 (else an error
    naming the rows); a non-finite loss (a diverged run) is left out with a warning naming
    them, since the interval then rests on fewer points."""
    labels = np.asarray(loss.index) if isinstance(loss, pd.Series) else np.arange(len(loss))
    lr_a, loss_a = np.asarray(lr, float), np.asarray(loss, float)
    if lr_a.shape != loss_a.shape or lr_a.ndim != 1:
        raise ValueError(f"lr and loss must be 1-d and of one length, got {lr_a.shape} and "
                         f"{loss_a.shape}")
    bad = ~(np.isfinite(lr_a) & (lr_a > 0))  # a typo, not a diverged run: never dropped
    if bad.any():
        raise ValueError(f"{who}: lr must be finite and > 0, got {lr_a[bad].tolist()} at "
                         f"row(s) {labels[bad].tolist()}")
    bad = np.isfinite(loss_a) & (loss_a <= 0)
    if bad.any():
        raise ValueError(f"{who}: loss must be > 0 (a cross-entropy), got "
                         f"{loss_a[bad].tolist()} at row(s) {labels[bad].tolist()}")
    keep = np.isfinite(loss_a)
    if not keep.all():
        warnings.warn(f"{who}: left out {int((~keep).sum())} point(s) whose loss is not finite "
                      f"(diverged?): row(s) {labels[~keep].tolist()} at lr "
                      f"{lr_a[~keep].tolist()}", stacklevel=3)
    return keep


def lr_optimum(lr, loss, window: int = 2, rel_noise: float = SEED_REL_STD,
               n_boot: int = 2000, seed: int = 0) -> LrOptimum:
    """The loss-optimal LR of one curve with a 95% parametric-bootstrap interval."""
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window={window!r}: the LRs on each side of the best one that the "
                         "parabola is fit through, a whole number >= 1 (default 2)")
    n_boot = check_count(n_boot, "n_boot", minimum=1)
    keep = _finite_losses("lr_optimum", lr, loss)
    lr, loss = np.asarray(lr, float)[keep], np.asarray(loss, float)[keep]
    if len(np.unique(lr)) < 3:
        raise ValueError(f"lr_optimum needs finite losses at >= 3 distinct LRs, got "
                         f"{len(np.unique(lr))} distinct of {len(lr)}")
    order = np.argsort(lr)
    lr, loss = lr[order], loss[order]
    x = np.log(lr)
    i = int(np.argmin(loss))
    if i == 0 or i == len(lr) - 1:
        edge = "low" if i == 0 else "high"
        nb = lr[1] if i == 0 else lr[-2]
        return LrOptimum(lr[i], 0.0 if i == 0 else nb, nb if i == 0 else math.inf, loss[i], edge)
    s = slice(max(0, i - window), min(len(lr), i + window + 1))
    xs, ys = x[s], loss[s]
    coef = _quad(xs, ys)
    best = _vertex(coef, xs[0], xs[-1])
    resid = ys - np.polyval(coef, xs)
    dof = len(xs) - 3
    sigma = max(float(np.sqrt(resid @ resid / dof)) if dof > 0 else 0.0,
                rel_noise * float(loss[i]))
    rng = np.random.default_rng(seed)
    fitted = np.polyval(coef, xs)
    boots = np.array([_vertex(_quad(xs, fitted + sigma * rng.standard_normal(len(xs))),
                              xs[0], xs[-1]) for _ in range(n_boot)])
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return LrOptimum(float(np.exp(best)), float(np.exp(min(lo, best))),
                     float(np.exp(max(hi, best))), float(np.polyval(coef, best)))


def _fit_vertex(x: np.ndarray, y: np.ndarray) -> float:
    """A quadratic's minimum on [x.min(), x.max()] (a least-squares fit, >= 3 points)."""
    return _vertex(_quad(x, y), float(x.min()), float(x.max()))


def _t_quantile(level: float, dof: int) -> float:
    return float(student_t.ppf(0.5 + level / 2, dof))


def seed_optimum(lr, loss, seed, window: int = 2, level: float = 0.95) -> LrOptimum:
    """The loss-optimal LR of a curve measured at several seeds, with a seed-variance interval.

    The window is the `window` grid LRs each side of the seed-mean curve's minimum; each
    seed's curve gets its own quadratic in log LR there, and the optimum is the geometric
    mean of the per-seed vertices with a Student-t interval (n - 1 dof) over them, so it
    widens with the seed spread and with few seeds. A seed-mean minimum on the grid edge
    leaves the interval open on that side, as in `lr_optimum`.
    """
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window={window!r}: the LRs on each side of the best one that the "
                         "parabola is fit through, a whole number >= 1 (default 2)")
    if not 0 < level < 1:
        raise ValueError(f"level={level!r}: the interval's coverage, between 0 and 1 (e.g. 0.95)")
    keep = _finite_losses("seed_optimum", lr, loss)
    lr, loss, seed = np.asarray(lr, float), np.asarray(loss, float), np.asarray(seed)
    if seed.shape != lr.shape:
        raise ValueError(f"seed must be one per point, got {seed.shape} for {lr.shape}")
    lr, loss, seed = lr[keep], loss[keep], seed[keep]
    seeds = np.unique(seed)
    if len(seeds) < 2:
        raise ValueError(f"seed_optimum needs >= 2 seeds, got {len(seeds)}; one seed's curve "
                         "takes lr_optimum (a parametric bootstrap of its fit)")
    grid, inv = np.unique(lr, return_inverse=True)
    if len(grid) < 3:
        raise ValueError(f"seed_optimum needs finite losses at >= 3 distinct LRs, got {len(grid)}")
    mean = np.bincount(inv, loss) / np.bincount(inv)
    i = int(np.argmin(mean))
    per_seed = [(s, seed == s) for s in seeds]
    seed_edges = sum(int(lr[m][np.argmin(loss[m])] in (grid[0], grid[-1])) for _, m in per_seed)
    if i == 0 or i == len(grid) - 1:
        edge = "low" if i == 0 else "high"
        nb = grid[1] if i == 0 else grid[-2]
        return LrOptimum(float(grid[i]), 0.0 if i == 0 else float(nb),
                         float(nb) if i == 0 else math.inf, float(mean[i]), edge,
                         seed_edges=seed_edges)
    lo_i, hi_i = max(0, i - window), min(len(grid), i + window + 1)
    win = grid[lo_i:hi_i]
    verts = []
    for s, m in per_seed:
        m = m & (lr >= win[0]) & (lr <= win[-1])
        if len(np.unique(lr[m])) < 3:
            raise ValueError(f"seed {s}: finite losses at only {len(np.unique(lr[m]))} of the "
                             f"LRs {[float(v) for v in win]} around the optimum; the per-seed "
                             "fit needs 3 (rerun the failed points or drop that seed)")
        verts.append(_fit_vertex(np.log(lr[m]), loss[m]))
    verts = np.array(verts)
    n, centre = len(verts), float(verts.mean())
    half = _t_quantile(level, n - 1) * float(verts.std(ddof=1)) / math.sqrt(n)
    xw, yw = np.log(win), mean[lo_i:hi_i]
    return LrOptimum(math.exp(centre), math.exp(centre - half), math.exp(centre + half),
                     float(np.polyval(_quad(xw, yw), centre)), "",
                     tuple(float(math.exp(v)) for v in verts), seed_edges)


def lr_sweep(path: str | Path, loss: str = "val_loss") -> pd.DataFrame:
    """One row per finished run of an LR x width sweep: parametrization ("μP"/"SP"), width
    (d_model), peak_lr, seed (train.seed) and the loss, from results.csv and each run's
    config.yaml."""
    df = finished(load_results(path))
    rows = []
    for r in df.itertuples():
        d = locate_run(df, r, rundir.CONFIG_FILE, "the peak LR and width of each run are "
                       "read from it")
        cfg = rundir.read_config(d)
        lr = cfg["train"].get("peak_lr")
        if lr is None:
            raise ValueError(f"{d / rundir.CONFIG_FILE}: train.peak_lr is unset; an LR sweep "
                             "must set it in every run")
        rows.append({"run_id": r.run_id, "param": "μP" if cfg["model"]["mup"] else "SP",
                     "width": int(cfg["model"]["d_model"]), "peak_lr": float(lr),
                     "seed": int(cfg["train"].get("seed", 0)), "loss": float(getattr(r, loss))})
    return pd.DataFrame(rows)


def transfer_table(sweep: pd.DataFrame, **kw) -> pd.DataFrame:
    """Per parametrization and width: the optimum LR, its interval, the loss there. A width
    with >= 2 seeds takes `seed_optimum` (seed-variance interval), one seed `lr_optimum`."""
    out = []
    for (param, width), g in sweep.groupby(["param", "width"]):
        multi = "seed" in g and g["seed"].nunique() > 1
        if multi:
            o = seed_optimum(g["peak_lr"], g["loss"], g["seed"],
                             **{k: v for k, v in kw.items() if k in ("window", "level")})
        else:
            o = lr_optimum(g["peak_lr"], g["loss"], **{k: v for k, v in kw.items()
                                                        if k != "level"})
        out.append({"param": param, "width": width, "lr_opt": o.lr, "lr_lo": o.lo,
                    "lr_hi": o.hi, "loss_opt": o.loss, "edge": o.edge, "n": len(g),
                    "seeds": g["seed"].nunique() if "seed" in g else 1,
                    "seed_edges": o.seed_edges, "seed_lrs": o.seed_lrs})
    return pd.DataFrame(out).sort_values(["param", "width"]).reset_index(drop=True)


def lr_drift(table: pd.DataFrame) -> dict[str, float]:
    """Per parametrization, k in LR_opt ~ width^k (least squares in log-log): μP's claim
    is k = 0; SP's optimum typically falls, k < 0. Edge optima make k a bound, not a value."""
    out = {}
    for param, g in table.groupby("param"):
        out[param] = float(np.polyfit(np.log(g["width"]), np.log(g["lr_opt"]), 1)[0])
    return out


def lr_drift_ci(table: pd.DataFrame, level: float = 0.95) -> dict[str, tuple[float, float, float]]:
    """Per parametrization, (k, lo, hi): the drift exponent with a Student-t interval over
    seeds. Each seed's optima across widths give one slope k_s (seeds are independent runs,
    so any pairing across widths is valid); k is their mean, which equals `lr_drift` of the
    per-width geometric-mean optima. Needs the same number (>= 2) of seeds at every width and
    no edge optimum (an edge makes k a bound)."""
    if "seed_lrs" not in table:
        raise ValueError("lr_drift_ci needs transfer_table's seed_lrs column: a sweep with "
                         ">= 2 seeds per point (grid key `seed`)")
    out = {}
    for param, g in table.groupby("param"):
        bad = g[g["edge"] != ""]
        if len(bad):
            raise ValueError(f"{param}: the optimum of width(s) {list(bad['width'])} is on the "
                             "grid edge, so the drift is only a bound; extend the LR grid")
        counts = {len(v) for v in g["seed_lrs"]}
        if len(counts) != 1 or min(counts) < 2:
            raise ValueError(f"{param}: seeds per width {sorted(counts)}; lr_drift_ci needs the "
                             "same number (>= 2) of seeds at every width")
        logw = np.log(g["width"].to_numpy(float))
        opt = np.log(np.array([list(v) for v in g["seed_lrs"]], float))  # [width, seed]
        ks = np.array([np.polyfit(logw, opt[:, j], 1)[0] for j in range(opt.shape[1])])
        half = _t_quantile(level, len(ks) - 1) * float(ks.std(ddof=1)) / math.sqrt(len(ks))
        k = float(ks.mean())
        out[param] = (k, k - half, k + half)
    return out


def plot_lr_transfer(sweep: pd.DataFrame, table: pd.DataFrame | None = None, path=None):
    """Loss against peak LR, one curve per width, one panel per parametrization, with each
    width's optimum and interval marked: the figure of the μP transfer claim."""
    table = transfer_table(sweep) if table is None else table
    params = [p for p in ("μP", "SP") if p in set(sweep["param"])]
    fig, axes = _figure(len(params))
    widths = sorted(sweep["width"].unique())
    colors = {w: c for w, c in zip(widths, _colors(len(widths)))}
    for ax, param in zip(axes, params):
        tp = table[table["param"] == param]
        try:
            k, klo, khi = lr_drift_ci(tp)[param]
            drift = f"{k:+.2f} [{klo:+.2f}, {khi:+.2f}]"
        except ValueError:  # one seed, or an edge optimum: the point value only
            drift = f"{lr_drift(tp)[param]:+.2f}"
        for w in widths:
            g = sweep[(sweep["param"] == param) & (sweep["width"] == w)].sort_values("peak_lr")
            if g.empty:
                continue
            m = g.groupby("peak_lr")["loss"].mean()
            ax.plot(m.index, m.to_numpy(), "o-", color=colors[w], ms=4, label=f"width {w}")
            if "seed" in g and g["seed"].nunique() > 1:  # each seed's point, faint
                ax.plot(g["peak_lr"], g["loss"], ".", color=colors[w], ms=3, alpha=0.4)
            t = tp[tp["width"] == w].iloc[0]
            hi = min(t["lr_hi"], g["peak_lr"].max() * 1.5)
            lo = max(t["lr_lo"], g["peak_lr"].min() / 1.5)
            ax.errorbar([t["lr_opt"]], [t["loss_opt"]], xerr=[[t["lr_opt"] - lo],
                        [hi - t["lr_opt"]]], fmt="*", color=colors[w], ms=11, capsize=3,
                        mec="k", mew=0.5)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yscale("log")
        _plain_y(ax)
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel("validation loss (nats/token)")
        ax.set_title(f"{param}: best LR ~ width^{drift}\n(lines: seed mean; stars: optimum, "
                     "95% CI)", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    lo = min(a.get_ylim()[0] for a in axes)
    hi = max(a.get_ylim()[1] for a in axes)
    for a in axes:
        a.set_ylim(lo, hi)
    return _save(fig, path)


def _colors(n: int) -> list:
    return [colormaps["viridis"](v) for v in np.linspace(0.0, 0.85, n)]
