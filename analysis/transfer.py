"""Learning-rate transfer across width (μP vs SP): each width's best LR, with an interval.

μP's claim (Yang et al. 2021; Cerebras-GPT's μP family uses it) is that the loss-optimal
learning rate found on a narrow proxy stays optimal at every width, while under the
standard parametrization (SP) it drifts down as the width grows. `lr_sweep` reads a sweep
of peak LR x width (`sweeps/mup_transfer.yaml`), `lr_optimum` locates a curve's minimum
with an interval, `transfer_table` does that per parametrization and width, and
`lr_drift` summarizes the drift as the exponent of LR_opt ~ width^k (μP: k ~ 0, SP: k < 0).

The optimum: a quadratic in log LR through the grid minimum and up to `window` grid points
on each side; the interval is a parametric bootstrap of that fit, with noise the larger
of the fit's residual scatter and `rel_noise` x the loss (default 0.35%, the run-to-run
seed spread Cerebras-GPT reports). A minimum on the edge of the grid has no interval on
that side (`edge` says which), since the data cannot say how far beyond the optimum lies.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from matplotlib.ticker import NullFormatter

from .plots import _figure, _plain_y, _save
from .checks import check_count
from .results import finished, load_results

SEED_REL_STD = 0.0035  # Cerebras-GPT §3.3: run-to-run std of the loss is ~0.35%


@dataclass(frozen=True)
class LrOptimum:
    """Best peak LR of one loss-vs-LR curve and its 95% interval [lo, hi].

    `edge` is "low" or "high" when the grid minimum is the smallest or largest LR tried
    (the interval is then open on that side: lo = 0 or hi = inf), else "".
    """

    lr: float
    lo: float
    hi: float
    loss: float
    edge: str = ""

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


def lr_optimum(lr, loss, window: int = 2, rel_noise: float = SEED_REL_STD,
               n_boot: int = 2000, seed: int = 0) -> LrOptimum:
    """The loss-optimal LR of one curve with a 95% parametric-bootstrap interval."""
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window={window!r}: the LRs on each side of the best one that the "
                         "parabola is fit through, a whole number >= 1 (default 2)")
    n_boot = check_count(n_boot, "n_boot", minimum=1)
    lr, loss = np.asarray(lr, float), np.asarray(loss, float)
    keep = np.isfinite(loss) & (lr > 0)
    lr, loss = lr[keep], loss[keep]
    if len(np.unique(lr)) < 3:
        raise ValueError(f"lr_optimum needs finite losses at >= 3 distinct LRs, got {len(lr)}")
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


def _run_config(sweep_dir: Path, row) -> dict:
    """A run's config.yaml: DIR/<run_id>/ first (the sweep may have moved), else run_dir."""
    for d in (sweep_dir / str(row.run_id), Path(str(row.run_dir))):
        f = d / "config.yaml"
        if f.is_file():
            return yaml.safe_load(f.read_text())
    raise FileNotFoundError(f"{sweep_dir}: no config.yaml for run {row.run_id!r} (looked in "
                            f"{sweep_dir / str(row.run_id)} and {row.run_dir}); the peak LR "
                            "and width of each run are read from it")


def lr_sweep(path: str | Path, loss: str = "val_loss") -> pd.DataFrame:
    """One row per finished run of an LR x width sweep: parametrization ("μP"/"SP"), width
    (d_model), peak_lr and the loss, read from results.csv and each run's config.yaml."""
    path = Path(path)
    df = finished(load_results(path))
    sweep_dir = path if path.is_dir() else path.parent
    rows = []
    for r in df.itertuples():
        cfg = _run_config(sweep_dir, r)
        lr = cfg["train"].get("peak_lr")
        if lr is None:
            raise ValueError(f"{sweep_dir / str(r.run_id)}/config.yaml: train.peak_lr is unset; "
                             "an LR sweep must set it in every run")
        rows.append({"run_id": r.run_id, "param": "μP" if cfg["model"]["mup"] else "SP",
                     "width": int(cfg["model"]["d_model"]), "peak_lr": float(lr),
                     "loss": float(getattr(r, loss))})
    return pd.DataFrame(rows)


def transfer_table(sweep: pd.DataFrame, **kw) -> pd.DataFrame:
    """Per parametrization and width: the optimum LR, its interval, the loss there."""
    out = []
    for (param, width), g in sweep.groupby(["param", "width"]):
        o = lr_optimum(g["peak_lr"], g["loss"], **kw)
        out.append({"param": param, "width": width, "lr_opt": o.lr, "lr_lo": o.lo,
                    "lr_hi": o.hi, "loss_opt": o.loss, "edge": o.edge, "n": len(g)})
    return pd.DataFrame(out).sort_values(["param", "width"]).reset_index(drop=True)


def lr_drift(table: pd.DataFrame) -> dict[str, float]:
    """Per parametrization, k in LR_opt ~ width^k (least squares in log-log): μP's claim
    is k = 0; SP's optimum typically falls, k < 0. Edge optima make k a bound, not a value."""
    out = {}
    for param, g in table.groupby("param"):
        out[param] = float(np.polyfit(np.log(g["width"]), np.log(g["lr_opt"]), 1)[0])
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
        drift = lr_drift(table[table["param"] == param])[param]
        for w in widths:
            g = sweep[(sweep["param"] == param) & (sweep["width"] == w)].sort_values("peak_lr")
            if g.empty:
                continue
            ax.plot(g["peak_lr"], g["loss"], "o-", color=colors[w], ms=4, label=f"width {w}")
            t = table[(table["param"] == param) & (table["width"] == w)].iloc[0]
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
        ax.set_title(f"{param}: best LR ~ width^{drift:+.2f}  (stars: optimum, 95% CI)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    lo = min(a.get_ylim()[0] for a in axes)
    hi = max(a.get_ylim()[1] for a in axes)
    for a in axes:
        a.set_ylim(lo, hi)
    return _save(fig, path)


def _colors(n: int) -> list:
    from matplotlib import colormaps

    return [colormaps["viridis"](v) for v in np.linspace(0.0, 0.85, n)]
