"""Held-out extrapolation check: fit without the largest runs, predict them.

A law that only interpolates is not worth much; Cerebras-GPT fitted up to 6.7B and predicted
13B to within 0.5%, and Chinchilla chose its Huber delta the same way. This is that test.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .checks import check_xy
from .fit import PowerLawFit, fit_power_law


@dataclass
class Extrapolation:
    """The fit on the smaller runs and a table of the held-out runs with prediction errors."""
    fit: PowerLawFit
    table: pd.DataFrame         # x, y, y_pred, lo, hi, abs_err, rel_err, covered
    threshold: float            # runs with x >= threshold were held out

    @property
    def max_rel_err(self) -> float:
        return float(self.table["rel_err"].abs().max())

    def summary(self) -> str:
        lines = [f"fit on {self.fit.n} runs with x < {self.threshold:.3g}, "
                 f"predicting {len(self.table)} held-out run(s):"]
        for r in self.table.itertuples():
            lines.append(f"  x={r.x:.3g}: y={r.y:.4f}, predicted {r.y_pred:.4f} "
                         f"[{r.lo:.4f}, {r.hi:.4f}], "
                         f"error {r.abs_err:+.4f} ({100 * r.rel_err:+.2f}%)")
        return "\n".join(lines)


def extrapolation_check(x, y, n_holdout: int = 1, **fit_kwargs) -> Extrapolation:
    """Fit a power law on all but the n_holdout largest distinct x (all seeds of those sizes
    are held out together) and report absolute and relative error on the held-out runs.

    fit_kwargs go to fit_power_law (offset, delta, space, n_boot, seed, level, groups...).
    rel_err = (y_pred - y) / y; `covered` says whether y lies in the bootstrap band.
    """
    x, y = check_xy(x, y)
    xs = np.unique(x)
    if not 1 <= n_holdout < xs.size:
        raise ValueError(f"n_holdout={n_holdout}: must be >= 1 and leave some of the "
                         f"{xs.size} distinct x values to fit")
    threshold = float(xs[-n_holdout])
    train, test = x < threshold, x >= threshold
    groups = fit_kwargs.pop("groups", "x")
    fit_kwargs["groups"] = groups if groups is None or isinstance(groups, str) \
        else np.asarray(groups)[train]
    fit = fit_power_law(x[train], y[train], **fit_kwargs)
    pred = fit.predict(x[test])
    lo, hi = fit.predict_interval(x[test])
    table = pd.DataFrame(dict(x=x[test], y=y[test], y_pred=pred, lo=lo, hi=hi,
                              abs_err=pred - y[test], rel_err=(pred - y[test]) / y[test],
                              covered=(lo <= y[test]) & (y[test] <= hi)))
    return Extrapolation(fit=fit, table=table.sort_values("x").reset_index(drop=True),
                         threshold=threshold)
