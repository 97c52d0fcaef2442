"""Endpoints a sweep did not train, predicted from the runs it did: per model size, a schedule
law (analysis.schedule_law) fitted to its WSD run and cooldown branches (`cgpt train
--branch-from`, the sweep's `grid.branches`), evaluated on the LR sequence of another schedule
(the published cosine decay at each budget), so a scaling law can be fitted to endpoints that
cost one WSD run per size instead of one run per budget.

The predicted endpoint is the law's mean loss over the summary's train_loss window of the
target run (`cgpt.rundir.train_loss_window`), the number results.csv's train_loss holds for a
trained run, with the law's bootstrap interval; fitted to the fixed-set evaluations
(`metric="val_loss"`, runs with a frequent train.eval_every), the evaluation after the target's
last step, results.csv's val_loss. A branch's metrics.jsonl repeats its parent's
lines up to the branch step, so each curve is whole from step 1 (the law needs every step's
LR); the shared stable phase is fitted once per curve, as in any fit to WSD runs of one seed.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cgpt import rundir

from .results import locate_run
from .schedule_law import ScheduleLawFit, fit_schedule_law, read_schedule_curves


@dataclass(frozen=True)
class PredictedEndpoints:
    """Per model size, the fitted schedule law and the endpoints it predicts."""
    table: pd.DataFrame              # model, n_params, target, steps, loss, lo, hi, runs, rmse
    fits: dict                       # model -> ScheduleLawFit

    def summary(self) -> str:
        lines = []
        for model, fit in self.fits.items():
            rows = self.table[self.table["model"] == model]
            ends = ", ".join(f"{r.target}: {r.loss:.4f} [{r.lo:.4f}, {r.hi:.4f}]"
                             for r in rows.itertuples())
            lines.append(f"{model}: {ends}\n  {fit.summary()}")
        return "\n".join(lines)


def predict_endpoints(runs: pd.DataFrame, targets: Mapping, *, form: str = "multipower",
                      n_boot: int = 100, **fit_kw) -> PredictedEndpoints:
    """Predict the final loss of the runs in `targets` from the curves of `runs`.

    runs: rows of a sweep's results (`load_results`, `finished`) with columns run_id, model,
    n_params, run_dir: per model, the WSD run and its branches (or any runs whose curves the
    law is fitted to; at least one must anneal). targets: {model: {label: lrs}}, lrs the LR of
    every step 1..T of the run to predict, as metrics.jsonl would log it (for cgpt's recipe:
    `cgpt.train.optim.lr_at` of the target's resolved recipe). fit_kw: passed to
    fit_schedule_law (metric, lam, start, resample, level, seed, max_points).
    """
    missing = [c for c in ("run_id", "model", "n_params", "run_dir") if c not in runs]
    if missing:
        raise ValueError(f"runs: no column {missing[0]!r}; pass the rows of a sweep's "
                         "results.csv (analysis.load_results)")
    if not isinstance(targets, Mapping) or not targets:
        raise ValueError("targets: a non-empty {model: {label: lrs}} of the runs to predict")
    models = set(runs["model"].astype(str))
    unknown = sorted(set(map(str, targets)) - models)
    if unknown:
        raise ValueError(f"targets: model {unknown[0]!r} has no runs to fit in `runs` (models "
                         f"there: {sorted(models)}); train its WSD run and branches first")
    rows, fits = [], {}
    for model, wanted in targets.items():
        if not isinstance(wanted, Mapping) or not wanted:
            raise ValueError(f"targets[{model!r}]: a non-empty {{label: lrs}}")
        mine = runs[runs["model"].astype(str) == str(model)]
        dirs = [locate_run(runs, r, rundir.METRICS_FILE, "its loss curve is fitted")
                for r in mine.itertuples()]
        fit: ScheduleLawFit = fit_schedule_law(read_schedule_curves(dirs), form, n_boot=n_boot,
                                               **fit_kw)
        fits[str(model)] = fit
        for label, lrs in wanted.items():
            loss, lo, hi = fit.final_loss(lrs)
            rows.append(dict(model=str(model), n_params=int(mine["n_params"].iloc[0]),
                             target=label, steps=int(np.asarray(lrs).size), loss=loss, lo=lo,
                             hi=hi, runs=len(dirs), rmse=fit.rmse))
    return PredictedEndpoints(pd.DataFrame(rows), fits)
