"""Power-law fits y = A * x^(-b) + c, in log space, with a Huber loss and bootstrap CIs.

Why log space: losses over many decades of compute differ by a factor, not by an offset, so a
residual in log y weighs every run the same. Why Huber: a few diverged or badly tuned runs
should not move the exponent (Chinchilla uses delta = 1e-3 on log loss; so do we by default).

Conditioning: x spans 1e15..1e23, so A * x^(-b) is never formed directly. The optimiser sees
(l, b, e) with log y_hat = logsumexp(l - b * (log x - log x_ref), e), where x_ref is the
geometric mean of x: l is the log amplitude at the middle of the data and e = log c.
The result is reported both as A and as the Cerebras-style scale x0 = A^(1/b).
space="linear" puts the residuals on y instead, to compare with fits published that way.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from scipy.special import huber

from ._blas import one_blas_thread


def huber_loss(r: np.ndarray, delta: float) -> tuple[float, np.ndarray]:
    """Summed Huber loss of residuals r and its derivative with respect to r."""
    return float(np.sum(huber(delta, r))), np.clip(r, -delta, delta)


def bootstrap_indices(n: int, n_boot: int, seed: int, groups=None) -> list[np.ndarray]:
    """Row indices for n_boot resamples with replacement.

    With `groups` (e.g. model size), whole groups are resampled together (cluster bootstrap),
    so repeated seeds of one model do not count as independent evidence.
    """
    rng = np.random.default_rng(seed)
    if groups is None:
        return [rng.integers(0, n, n) for _ in range(n_boot)]
    groups = np.asarray(groups)
    if len(groups) != n:
        raise ValueError(f"groups has length {len(groups)}, expected one label per point ({n})")
    members = [np.flatnonzero(groups == g) for g in pd.unique(groups)]
    out = []
    for _ in range(n_boot):
        pick = rng.integers(0, len(members), len(members))
        out.append(np.concatenate([members[i] for i in pick]))
    return out


def percentile_ci(samples: pd.DataFrame, level: float) -> dict[str, tuple[float, float]]:
    """Percentile intervals of each bootstrap column."""
    lo, hi = 50 * (1 - level), 50 * (1 + level)
    if samples.dropna().empty:
        return {k: (float("nan"), float("nan")) for k in samples}
    return {k: (float(np.nanpercentile(v, lo)), float(np.nanpercentile(v, hi)))
            for k, v in samples.items()}


def check_xy(x, y, name_x: str = "x", name_y: str = "y") -> tuple[np.ndarray, np.ndarray]:
    """Finite, positive 1-d arrays of equal length, or a ValueError saying which one is wrong."""
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"{name_x} and {name_y} differ in length ({x.size} vs {y.size})")
    for name, v in ((name_x, x), (name_y, y)):
        if not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise ValueError(f"{name} must be finite and > 0 for a log-space fit; "
                             "drop unfinished runs first (analysis.finished)")
    return x, y


@dataclass(frozen=True)
class PowerLaw:
    """y = A * x^(-b) + c, also written (x / x0)^(-b) + c with x0 = A^(1/b)."""
    A: float
    b: float
    c: float = 0.0
    name: str = ""

    @classmethod
    def from_scale(cls, x0: float, b: float, c: float = 0.0, name: str = "") -> "PowerLaw":
        """The Cerebras/Kaplan form (x / x0)^(-b) + c."""
        return cls(A=float(np.exp(b * np.log(x0))), b=b, c=c, name=name)

    @property
    def x0(self) -> float:
        return float(np.exp(np.log(self.A) / self.b)) if self.b != 0 else float("nan")

    @property
    def params(self) -> dict[str, float]:
        return {"A": self.A, "b": self.b, "c": self.c}

    def predict(self, x) -> np.ndarray:
        x = np.asarray(x, float)
        return np.exp(np.log(self.A) - self.b * np.log(x)) + self.c

    __call__ = predict


@dataclass
class PowerLawFit:
    """A fitted PowerLaw with bootstrap samples (`boot`) and percentile CIs (`ci`)."""
    law: PowerLaw
    ci: dict[str, tuple[float, float]]
    boot: pd.DataFrame
    n: int
    offset: bool
    delta: float
    level: float
    loss: float
    extra: dict = field(default_factory=dict)

    @property
    def params(self) -> dict[str, float]:
        return self.law.params

    @property
    def x0(self) -> float:
        return self.law.x0

    def predict(self, x) -> np.ndarray:
        return self.law.predict(x)

    def predict_interval(self, x, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise bootstrap percentile band of the prediction at x."""
        level = self.level if level is None else level
        lx = np.log(np.asarray(x, float))
        b = self.boot.dropna()
        if b.empty:
            return np.full(lx.shape, np.nan), np.full(lx.shape, np.nan)
        preds = np.exp(np.log(b["A"].to_numpy())[:, None] - b["b"].to_numpy()[:, None] * lx) \
            + b["c"].to_numpy()[:, None]
        return (np.percentile(preds, 50 * (1 - level), axis=0),
                np.percentile(preds, 50 * (1 + level), axis=0))

    def summary(self) -> str:
        loss = "least squares" if np.isinf(self.delta) else f"Huber delta={self.delta:g}"
        lines = [f"L = A * x^(-b) + c, {self.n} points, {loss} on "
                 f"{self.extra.get('space', 'log')} y, "
                 f"{int(100 * self.level)}% bootstrap CI ({len(self.boot)} resamples)"]
        for k, v in self.params.items():
            if k == "c" and not self.offset:
                continue
            lo, hi = self.ci[k]
            lines.append(f"  {k:>2} = {v:.5g}  [{lo:.5g}, {hi:.5g}]")
        lines.append(f"  x0 = A^(1/b) = {self.x0:.4g}")
        return "\n".join(lines)


def _objective(theta, u, y, delta, offset, space):
    l, b = theta[0], theta[1]
    z = l - b * u
    if offset:
        lyhat = np.logaddexp(z, theta[2])
        w = np.exp(z - lyhat)                              # share of the power-law term
        dl, db, de = w, -w * u, 1.0 - w
    else:
        lyhat, dl, db = z, np.ones_like(z), -u
    if space == "log":
        f, g = huber_loss(np.log(y) - lyhat, delta)
    else:                                                  # residuals in y itself
        yhat = np.exp(lyhat)
        f, g = huber_loss(y - yhat, delta)
        g = g * yhat
    grad = [-g @ dl, -g @ db] + ([-g @ de] if offset else [])
    return f, np.array(grad)


def _solve(u, y, delta, offset, space, starts):
    best = None
    for s in starts:
        r = minimize(_objective, s, args=(u, y, delta, offset, space), jac=True,
                     method="L-BFGS-B", options={"maxiter": 1000, "ftol": 1e-13, "gtol": 1e-10})
        if np.all(np.isfinite(r.x)) and (best is None or r.fun < best.fun):
            best = r
    return best


def _starts(u, y, offset):
    """Deterministic grid: exponents over two decades; offset as a fraction of min(y)."""
    out = []
    for b in (0.02, 0.07, 0.2, 0.6):
        for frac in ((0.0, 0.3, 0.7, 0.9, 0.98) if offset else (0.0,)):
            c = frac * y.min()
            l = float(np.mean(np.log(y - c) + b * u))
            out.append([l, b] + ([np.log(max(c, 1e-3 * y.min()))] if offset else []))
    return out


@one_blas_thread()
def fit_power_law(x, y, offset: bool = True, *, delta: float = 1e-3, space: str = "log",
                  n_boot: int = 1000, seed: int = 0, level: float = 0.95,
                  groups=None) -> PowerLawFit:
    """Fit y = A * x^(-b) (+ c if offset) with a summed Huber loss, multi-start L-BFGS-B.

    x, y: positive arrays (e.g. counted FLOPs and validation loss of finished runs).
    delta: Huber threshold on the residuals; np.inf gives plain least squares.
    space: "log" (default) puts residuals on log y; "linear" on y itself (what a plain
        scipy.optimize.curve_fit does; use it to compare with fits published that way).
    n_boot, seed, level: bootstrap resamples, RNG seed, CI level; `groups` resamples clusters.
    Returns PowerLawFit with .params {"A", "b", "c"} (c = 0.0 without offset), .ci, .predict.
    """
    x, y = check_xy(x, y)
    k = 3 if offset else 2
    if x.size < k:
        raise ValueError(f"need at least {k} points to fit {k} parameters, got {x.size}; "
                         "finish more runs or use offset=False")
    if np.unique(x).size < 2:
        raise ValueError("x must take at least 2 distinct values to fit an exponent")
    if space not in ("log", "linear"):
        raise ValueError(f"space={space!r}: use 'log' or 'linear'")
    if not delta > 0:
        raise ValueError(f"delta={delta} must be > 0 (np.inf for least squares)")
    if n_boot < 0:
        raise ValueError(f"n_boot={n_boot} must be >= 0")
    lx_ref = float(np.mean(np.log(x)))
    u = np.log(x) - lx_ref
    best = _solve(u, y, delta, offset, space, _starts(u, y, offset))

    def to_law(theta) -> PowerLaw:
        l, b = theta[0], theta[1]
        return PowerLaw(A=float(np.exp(l + b * lx_ref)), b=float(b),
                        c=float(np.exp(theta[2])) if offset else 0.0)

    rows = []
    for idx in bootstrap_indices(x.size, n_boot, seed, groups):
        if np.unique(u[idx]).size < 2:                     # no exponent in this resample
            rows.append((np.nan, np.nan, np.nan))
            continue
        r = _solve(u[idx], y[idx], delta, offset, space, [best.x])
        rows.append(tuple(to_law(r.x).params.values()))
    boot = pd.DataFrame(rows, columns=["A", "b", "c"])
    return PowerLawFit(law=to_law(best.x), ci=percentile_ci(boot, level), boot=boot, n=x.size,
                       offset=offset, delta=delta, level=level, loss=float(best.fun),
                       extra={"space": space})
