"""End-of-sweep summary: the text the sweep CLI prints, plus a loss-vs-compute plot."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .extrapolate import extrapolation_check
from .fit import fit_power_law
from .plots import plot_loss_vs_compute
from .published import CEREBRAS_GPT
from .results import FLOPS, compute, finished, load_results

MAX_REPORT_RUNS = 5_000  # far beyond a sweep (Chinchilla fitted ~400 runs); bounds the time


def sweep_report(sweep_dir: str | Path, out_png: str | Path | None = None, *,
                 flops: str = "counted", n_boot: int = 1000, seed: int = 0) -> str:
    """Fit L = A * C^(-b) + c to a sweep's finished runs and describe it in a few lines.

    sweep_dir: sweep directory (or its results.csv). out_png: where to write the plot
    (default: <sweep dir>/loss_vs_compute.png). flops: "counted" (default) or "6nd".
    Only runs with status "done" and a val_loss are fitted. If the sweep mixes muP and SP
    runs, the law is fitted to the SP runs and muP is reported as a deviation from it.
    Assumes one (compute-optimal) size per compute budget; for isoFLOP grids see fit_isoflop.
    Replicate seeds of one model are resampled together. The report adds each model's residual
    from the law and the extrapolation check: the law refitted without the largest model
    predicts it, with the error and whether the bootstrap band covers the actual loss.
    """
    df = load_results(sweep_dir)
    src = Path(df.attrs["source"])
    done = finished(df)
    counts = df["status"].value_counts().to_dict()
    sp = done[~done["mup"]] if done["mup"].any() and (~done["mup"]).any() else done
    if len(sp) > MAX_REPORT_RUNS:
        raise ValueError(f"{src}: {len(sp):,} finished runs, more than the {MAX_REPORT_RUNS:,} "
                         f"a sweep report fits (its bootstrap refits them {n_boot} times); is "
                         "this a sweep's results.csv? Fit a subset with "
                         "analysis.fit_power_law")
    if len(sp) < 3:
        raise ValueError(f"{src}: {len(sp)} finished run(s) with a val_loss, need at least 3 to "
                         "fit the 3 parameters (A, b, c); wait for more runs to finish")
    x, y = compute(sp, flops), sp["val_loss"].to_numpy(float)
    fit = fit_power_law(x, y, offset=True, n_boot=n_boot, seed=seed)
    resid = 100 * (y / fit.predict(x) - 1)
    out_png = Path(out_png) if out_png is not None else src.parent / "loss_vs_compute.png"
    plot_loss_vs_compute(x, y, fit, path=out_png, xlabel=f"training FLOPs ({flops})",
                         title=f"{src.parent.name}: loss vs compute", residuals=True)

    status = ", ".join(f"{counts[s]} {s}" for s in ("done", "failed", "running", "pending")
                       if s in counts)
    p, ci = fit.params, fit.ci
    cg = CEREBRAS_GPT.params
    dev = 100 * (y / CEREBRAS_GPT.predict(x) - 1)
    lines = [
        f"sweep {src.parent}: {len(df)} runs ({status}); fitted {len(sp)} "
        f"{'SP ' if len(sp) < len(done) else ''}runs, x = {FLOPS[flops]} ({flops})",
        f"  L(C) = A * C^(-b) + c,  {int(100 * fit.level)}% bootstrap CI from {n_boot} resamples",
        f"    b  = {p['b']:.4f}  [{ci['b'][0]:.4f}, {ci['b'][1]:.4f}]   "
        f"(Cerebras-GPT: {cg['b']:.4f})",
        f"    c  = {p['c']:.4f}  [{ci['c'][0]:.4f}, {ci['c'][1]:.4f}]   "
        f"(Cerebras-GPT: {cg['c']:.4f})",
        f"    A  = {p['A']:.4g}  [{ci['A'][0]:.4g}, {ci['A'][1]:.4g}]   "
        f"(x0 = A^(1/b) = {fit.x0:.3g})",
        f"    least squares on the loss; {len(fit.boot)} refits kept, {fit.skipped} resamples "
        f"skipped (too few sizes), {fit.failed} failed; seeds of a model resampled together",
        f"  Cerebras-GPT law at these budgets: runs are {dev.mean():+.1f}% "
        f"(min {dev.min():+.1f}%, max {dev.max():+.1f}%) vs Pile-trained Cerebras-GPT "
        "(different data and tokenizer: compare slopes, not levels)",
    ]
    if fit.offset_identified is False:
        lo, hi = fit.profile_interval()
        lines.append(f"    c is not identified by these runs: any c in [{lo:.3g}, {hi:.3g}] fits "
                     "within the 95% profile threshold, so read b together with c")
    per_model = sp.assign(r=resid).groupby("model", sort=False)["r"].mean()
    lines.append("  residuals (run / fit - 1, mean per model, small to large): "
                 + ", ".join(f"{m} {r:+.2f}%" for m, r in per_model.items())
                 + f"; rms {np.sqrt(np.mean(resid ** 2)):.2f}%")
    lines.append("  " + _extrapolation_line(x, y, n_boot, seed))
    if len(sp) < len(done):
        mu = done[done["mup"]]
        d = 100 * (mu["val_loss"].to_numpy(float) / fit.predict(compute(mu, flops)) - 1)
        lines.append(f"  muP: {len(mu)} runs, mean {d.mean():+.2f}% vs the SP fit "
                     "(Cerebras-GPT reports -0.43%)")
    lines.append(f"  plot: {out_png}")
    return "\n".join(lines)


def _extrapolation_line(x, y, n_boot: int, seed: int) -> str:
    """The law fitted without the largest-compute run(s), predicting them (needs 4 distinct C)."""
    if np.unique(x).size < 4:
        return ("extrapolation check: skipped, it needs at least 4 model sizes "
                "(3 to fit A, b, c and 1 to predict)")
    ex = extrapolation_check(x, y, n_holdout=1, n_boot=n_boot, seed=seed)
    t = ex.table
    y_true, pred = t["y"].mean(), t["y_pred"].iloc[0]
    lo, hi = t["lo"].iloc[0], t["hi"].iloc[0]
    covered = "covers" if lo <= y_true <= hi else "does NOT cover"
    return (f"extrapolation check: fitted without the largest compute (C = {t['x'].iloc[0]:.3g}, "
            f"{len(t)} run(s)), predicted {pred:.4f} [{lo:.4f}, {hi:.4f}] vs actual "
            f"{y_true:.4f}: error {100 * (pred / y_true - 1):+.2f}%; the band {covered} it")
