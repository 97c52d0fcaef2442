"""Plots for scaling-law analysis. Figures are built directly on the Agg canvas (no pyplot, no
screen, no global state), returned, and optionally saved as PNG. In a notebook, display(fig).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter

from .multiplier import Comparison
from .fit import PowerLawFit, fit_power_law
from .envelope import EnvelopeFit
from .isoflop import IsoFlopFit
from .published import CEREBRAS_GPT, KAPLAN_BCRIT, cerebras_gpt_batches


def _figure(ncols: int = 1, residuals: bool = False) -> tuple[Figure, list]:
    fig = Figure(figsize=(5.5 * ncols, 5.6 if residuals else 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    if residuals:                     # a main panel and a short residual panel under it
        grid = fig.add_gridspec(2, 1, height_ratios=(3, 1))
        ax = fig.add_subplot(grid[0])
        return fig, [ax, fig.add_subplot(grid[1], sharex=ax)]
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]


def _plain_y(ax) -> None:
    """Log-scaled loss axes read better as 2.4, 2.6 than as 2.4x10^0."""
    ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%.3g"))


def _save(fig: Figure, path) -> Figure:
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def _grid(x, lo_factor=0.5, hi_factor=4.0, n=200) -> np.ndarray:
    return np.geomspace(np.min(x) * lo_factor, np.max(x) * hi_factor, n)


def plot_loss_vs_compute(x, y, fit: PowerLawFit | None = None, *, overlays=(CEREBRAS_GPT,),
                         band: bool = True, path=None, title: str | None = None,
                         xlabel: str = "training FLOPs (counted)",
                         ylabel: str = "validation loss (nats/token)",
                         residuals: bool = False) -> Figure:
    """Runs as points, the fitted law with its bootstrap band, and published laws as dashed
    lines (default: Cerebras-GPT; pass overlays=() for none). Log-log axes.

    Published laws are drawn only over the compute range they were fitted on (`law.x_range`
    where set). residuals=True adds a panel of run / fit - 1 (%) under the plot."""
    fig, axes = _figure(residuals=residuals and fit is not None)
    ax = axes[0]
    x, y = np.asarray(x, float), np.asarray(y, float)
    xx = _grid(x)
    ax.scatter(x, y, s=18, color="k", zorder=3, label=f"runs ({x.size})")
    if fit is not None:
        p = fit.params
        ax.plot(xx, fit.predict(xx), color="C0",
                label=f"fit: b={p['b']:.4f}, c={p['c']:.3f}")
        if band and len(fit.boot.dropna()):
            lo, hi = fit.predict_interval(xx)
            ax.fill_between(xx, lo, hi, color="C0", alpha=0.2,
                            label=f"{int(100 * fit.level)}% bootstrap band")
    for i, law in enumerate(overlays):
        lo_x, hi_x = getattr(law, "x_range", None) or (xx[0], xx[-1])
        xs = xx[(xx >= lo_x) & (xx <= hi_x)]
        if xs.size:
            ax.plot(xs, law.predict(xs), ls="--", color=f"C{i + 1}",
                    label=law.name or "published")
    ax.set(xscale="log", yscale="log", xlabel=None if len(axes) > 1 else xlabel, ylabel=ylabel,
           title=title)
    _plain_y(ax)
    ax.legend(fontsize=8)
    if len(axes) > 1:
        ax2 = axes[1]
        ax2.axhline(0, color="0.5", lw=0.8)
        ax2.scatter(x, 100 * (y / fit.predict(x) - 1), s=14, color="k")
        ax2.set(xscale="log", xlabel=xlabel, ylabel="run / fit - 1 (%)")
    return _save(fig, path)


def plot_isoflop(iso: IsoFlopFit, *, path=None, title: str | None = None) -> Figure:
    """Left: loss vs N per budget with each fitted parabola (over the sizes it was fitted to)
    and its minimum. Right: N_opt and D_opt against C with the fitted power laws; minima left
    out of the fit are hollow."""
    fig, (ax, ax2) = _figure(2)
    m = iso.minima.set_index("budget")
    for i, (key, g) in enumerate(iso.data.groupby("budget", sort=False)):
        ax.scatter(g["N"], g["loss"], s=14, color=f"C{i % 10}")
        row = m.loc[key]
        if np.isfinite(row["N_opt"]):
            c2, c1, c0 = iso.parabolas[key]
            u = np.linspace(np.log(row["N_lo"]) - 0.15, np.log(row["N_hi"]) + 0.15, 100)
            ax.plot(np.exp(u), c2 * u ** 2 + c1 * u + c0, color=f"C{i % 10}",
                    label=f"C={g['C'].median():.2g}" + ("" if row["used"] else " (left out)"))
    used, out = iso.minima[iso.minima["used"]], iso.minima[~iso.minima["used"]]
    ax.scatter(used["N_opt"], used["loss_opt"], marker="*", s=80, color="k", zorder=3,
               label="minima")
    ax.scatter(out["N_opt"], out["loss_opt"], marker="*", s=80, facecolor="none",
               edgecolor="k", zorder=3, label="left out")
    ax.set(xscale="log", xlabel="parameters N", ylabel="loss", title=title or "isoFLOP profiles")
    ax.legend(fontsize=7)
    cc = _grid(used["C"], 0.5, 2.0)
    for col, fn, exp, color in (("N_opt", iso.n_opt, iso.a, "C0"),
                                ("D_opt", iso.d_opt, iso.b, "C1")):
        ax2.scatter(used["C"], used[col], color=color)
        ax2.scatter(out["C"], out[col], facecolor="none", edgecolor=color)
        ax2.plot(cc, fn(cc), color=color, label=f"{col} ~ C^{exp:.3f}")
    ax2.set(xscale="log", yscale="log", xlabel="compute C (FLOPs)", ylabel="N_opt, D_opt")
    ax2.legend(fontsize=8)
    return _save(fig, path)


def plot_mup_vs_sp(x, y, mup, *, reference=None, path=None, title: str | None = None,
                   xlabel: str = "training FLOPs (counted)") -> Figure:
    """muP vs standard parametrisation. Left: loss vs compute for both. Right: each run's
    deviation (%) from `reference` (anything with .predict; default: a power law fitted to the
    SP runs), the comparison Cerebras-GPT reports (muP 0.43% below the SP law)."""
    x, y, mup = np.asarray(x, float), np.asarray(y, float), np.asarray(mup, bool)
    if mup.all() or not mup.any():
        raise ValueError("mup must mark some runs True (muP) and some False (SP)")
    if reference is None:
        sp_x = x[~mup]
        reference = fit_power_law(sp_x, y[~mup], offset=np.unique(sp_x).size >= 3, n_boot=0)
    fig, (ax, ax2) = _figure(2)
    xx = _grid(x, 0.7, 1.4)
    ax.plot(xx, reference.predict(xx), color="0.5", ls="--", label="SP reference law")
    for sel, name, col in ((~mup, "SP", "C0"), (mup, "muP", "C3")):
        ax.scatter(x[sel], y[sel], color=col, label=name, zorder=3)
        dev = 100 * (y[sel] / reference.predict(x[sel]) - 1)
        ax2.scatter(x[sel], dev, color=col, label=f"{name}: mean {dev.mean():+.2f}%")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="loss", title=title or "muP vs SP")
    _plain_y(ax)
    ax.legend(fontsize=8)
    ax2.axhline(0, color="0.5", ls="--")
    ax2.set(xscale="log", xlabel=xlabel, ylabel="loss vs SP law (%)")
    ax2.legend(fontsize=8)
    return _save(fig, path)


def plot_envelope(env: EnvelopeFit, *, path=None, title: str | None = None) -> Figure:
    """Approach 1. Left: every run's training curve (loss vs compute) and their lower envelope.
    Right: N_opt and D_opt on the envelope against C with the fitted power laws."""
    fig, (ax, ax2) = _figure(2)
    for i, (rid, c) in enumerate(env.curves.groupby("run_id", sort=False)):
        ax.plot(c["C"], c["loss"], lw=0.8, color=f"C{i % 10}", alpha=0.6)
    e = env.envelope
    ax.plot(e["C"], e["loss"], color="k", lw=2, label="envelope")
    ax.set(xscale="log", yscale="log", xlabel="compute C (FLOPs)", ylabel="loss",
           title=title or "training curves and their envelope")
    _plain_y(ax)
    ax.legend(fontsize=8)
    ax2.scatter(e["C"], e["N"], s=6, color="C0")
    ax2.plot(e["C"], env.n_opt(e["C"]), color="C0", label=f"N_opt ~ C^{env.a:.3f}")
    ax2.scatter(e["C"], e["D"], s=6, color="C1")
    ax2.plot(e["C"], env.d_opt(e["C"]), color="C1", label=f"D_opt ~ C^{env.b:.3f}")
    ax2.set(xscale="log", yscale="log", xlabel="compute C (FLOPs)", ylabel="N_opt, D_opt")
    ax2.legend(fontsize=8)
    return _save(fig, path)


def plot_curves(curves, *, path=None, title: str | None = None,
                xlabel: str = "training FLOPs (counted)") -> Figure:
    """Training curves (analysis.read_curves): loss vs compute, one line per run, labelled
    with its parameter count."""
    fig, (ax,) = _figure()
    for i, (rid, c) in enumerate(curves.groupby("run_id", sort=False)):
        ax.plot(c["C"], c["loss"], lw=1, color=f"C{i % 10}",
                label=f"{rid} (N={c['N'].iloc[0]:.3g})")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="training loss (smoothed)",
           title=title or "training curves")
    _plain_y(ax)
    ax.legend(fontsize=6, ncol=2)
    return _save(fig, path)


def plot_critical_batch(table, fit_loss: PowerLawFit | None = None,
                        fit_compute: PowerLawFit | None = None, *, published: bool = True,
                        overlays=(KAPLAN_BCRIT,), path=None, title: str | None = None) -> Figure:
    """The critical batch (tokens) of a sweep's runs (`analysis.gns.noise_table`), against their
    late training loss (left) and their compute (right), with the fits of
    `analysis.gns.fit_critical_batch` (B ~ loss^-b; B ~ C^b, fitted as 1/B). `published`: the
    batches Cerebras-GPT trained with against its Pile losses and FLOPs (chosen, not measured
    critical batches); `overlays`: laws of B_crit(loss) drawn dashed (default Kaplan's)."""
    fig, (ax, ax2) = _figure(2)
    loss, c, b = (np.asarray(table[k], float) for k in ("late_loss", "C", "b_crit_tokens"))
    pub = cerebras_gpt_batches() if published else None
    xs_l = np.concatenate([loss, pub["loss"]]) if published else loss
    ll = np.geomspace(xs_l.min() * 0.95, xs_l.max() * 1.05, 100)
    for a, x in ((ax, loss), (ax2, c)):
        a.scatter(x, b, color="k", zorder=3, label=f"runs ({x.size}): B_crit from the noise scale")
        for xi, bi, name in zip(x, b, table["model"]):
            a.annotate(str(name), (xi, bi), fontsize=6, xytext=(3, 3), textcoords="offset points")
    if fit_loss is not None:
        xx = _grid(loss, 0.9, 1.1)
        ax.plot(xx, fit_loss.predict(xx), color="C0",
                label=f"fit: B_crit ~ loss^-{fit_loss.params['b']:.2f}")
    if fit_compute is not None:
        cc = _grid(c, 0.5, 2.0)
        ax2.plot(cc, 1 / fit_compute.predict(cc), color="C0",
                 label=f"fit: B_crit ~ C^{fit_compute.params['b']:.3f}")
    if published:
        for a, x in ((ax, pub["loss"]), (ax2, pub["flops"])):
            a.scatter(x, pub["batch_tokens"], marker="s", color="C3", zorder=3,
                      label="Cerebras-GPT batch (trained with)")
    for i, law in enumerate(overlays):
        ax.plot(ll, law.predict(ll), ls="--", color=f"C{i + 1}", label=law.name)
    ax.set(xscale="log", yscale="log", xlabel="training loss (late, nats/token)",
           ylabel="batch (tokens)", title=title or "critical batch vs loss")
    ax.xaxis.set_major_formatter(FormatStrFormatter("%.3g"))
    ax.xaxis.set_minor_formatter(FormatStrFormatter("%.3g"))
    ax2.set(xscale="log", yscale="log", xlabel="training FLOPs (counted)",
            ylabel="batch (tokens)", title="critical batch vs compute")
    for a in (ax, ax2):
        a.legend(fontsize=7)
    return _save(fig, path)


def plot_batch_tradeoff(measured, fits: dict, *, path=None, title: str | None = None) -> Figure:
    """The critical batch measured from a batch-size sweep (`analysis.batch_tradeoff.
    measure_critical_batch`'s table and fits). Left: steps against examples (sequences) to
    reach each target loss, one point per batch size (its best LR), the fitted trade-off
    (S/S_min - 1)(E/E_min - 1) = 1 as a line and B = B_crit as a cross. Right: the measured
    B_crit (with its interval) and the noise scale B_simple of the same runs against the target
    loss, the band where B_simple is within 2x of B_crit shaded."""
    fig, (ax, ax2) = _figure(2)
    for i, ((n, target), fit) in enumerate(fits.items()):
        color = f"C{i % 10}"
        ax.scatter(fit.steps * fit.batch, fit.steps, color=color, zorder=3,
                   label=f"loss {target:g}: B_crit {fit.b_crit:.3g}")
        bb = np.geomspace(fit.batch.min() / 2, fit.batch.max() * 2, 100)
        s = fit.predict(bb)
        ax.plot(s * bb, s, color=color, lw=1)
        ax.plot(2 * fit.e_min, 2 * fit.s_min, "x", color=color, ms=8)
        for b, si in zip(fit.batch, fit.steps):
            ax.annotate(f"{b:g}", (si * b, si), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlabel="examples E (sequences) to the target",
           ylabel="steps S to the target",
           title=title or "steps vs examples per batch size (x: B = B_crit)")
    t = measured.sort_values("target")
    x = t["target"].to_numpy(float)
    ax2.errorbar(x, t["b_crit"], yerr=[t["b_crit"] - t["b_crit_lo"], t["b_crit_hi"] - t["b_crit"]],
                 fmt="o", color="k", capsize=3, label="B_crit measured (E_min / S_min)")
    ax2.errorbar(x * 1.002, t["b_simple"],
                 yerr=[t["b_simple"] - t["b_simple_lo"], t["b_simple_hi"] - t["b_simple"]],
                 fmt="s", color="C3", capsize=3, label="B_simple (noise scale, same runs)")
    ax2.fill_between(x, t["b_crit"] / 2, t["b_crit"] * 2, color="0.85",
                     label="within 2x of B_crit")
    ax2.set(yscale="log", xlabel="target training loss (nats/token)",
            ylabel="batch (sequences)", title="measured vs predicted critical batch")
    _plain_y(ax2)
    ax2.invert_xaxis()
    for a in (ax, ax2):
        a.legend(fontsize=7)
    return _save(fig, path)


def plot_compare(cmp: Comparison, *, path=None, title: str | None = None,
                 xlabel: str = "training FLOPs (counted)") -> Figure:
    """Left: both recipes' runs and fitted laws. Right: the compute multiplier m(C) (A's
    compute to reach B's loss, over C) with its bootstrap band, from the smallest run to 10x
    past the compared compute; the runs' range is shaded and 1 (no difference) is marked."""
    fig, (ax, ax2) = _figure(ncols=2)
    (xa, ya), (xb, yb) = cmp.points
    xs = np.r_[xa, xb]
    xx = np.geomspace(xs.min() / 2, max(xs.max(), cmp.at) * 10, 200)
    for i, (x, y, law, name) in enumerate(((xa, ya, cmp.law_a, cmp.names[0]),
                                           (xb, yb, cmp.law_b, cmp.names[1]))):
        ax.scatter(x, y, s=18, color=f"C{i}", zorder=3, label=f"{name} ({x.size} runs)")
        ax.plot(xx, law.predict(xx), color=f"C{i}",
                label=f"{name}: b={law.b:.4f}, c={law.c:.3g}")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="validation loss (nats/token)",
           title=title)
    _plain_y(ax)
    ax.legend(fontsize=8)
    lo, hi = cmp.interval(xx)
    ax2.axvspan(xs.min(), xs.max(), color="0.9", label="the runs' compute")
    ax2.fill_between(xx, lo, hi, color="C2", alpha=0.25,
                     label=f"{int(100 * cmp.level)}% bootstrap band")
    ax2.plot(xx, cmp.multiplier_at(xx), color="C2", label="multiplier")
    ax2.axhline(1, color="0.4", lw=0.8, ls="--")
    ax2.errorbar([cmp.at], [cmp.multiplier], yerr=[[cmp.multiplier - cmp.lo],
                                                   [cmp.hi - cmp.multiplier]],
                 fmt="o", color="k", capsize=3, label=f"at C = {cmp.at:.3g}: {cmp.multiplier:.3g}")
    finite = np.isfinite(hi)
    top = np.nanmax(hi[finite]) if finite.any() else 10.0
    ax2.set(xscale="log", yscale="log", xlabel=xlabel,
            ylabel=f"compute multiplier of {cmp.names[1]} over {cmp.names[0]}",
            ylim=(min(np.nanmin(lo), 0.9), max(top, 1.1) * 1.1))
    ax2.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
    ax2.legend(fontsize=8)
    return _save(fig, path)
