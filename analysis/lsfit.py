"""Least squares on log L for L(N, D) = E + A/N^alpha + B/D^beta, and the forecast it gives.

`fit_ls` fits by least squares on log L (a Gaussian likelihood, which the planner's Fisher
information needs) with a vectorised Levenberg-Marquardt, bootstrap resamples included (200
refits in ~0.1 s); `predict_loss_opt` gives the compute-optimal loss and its percentile band,
`profile_loss_opt` the profile-likelihood interval. fit_chinchilla (Huber, Epoch's procedure)
remains the analysis fit; analysis.design plans runs on this one.
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from scipy.stats import chi2

from .checks import check_count, check_level, check_xy
from .chinchilla import EPOCH_GRID, _screen
from .fit import bootstrap_indices


def _lhat_jac(theta, lN, lD):
    """log L_hat [R, n] and its Jacobian [R, n, 5] for theta [R, 5] = (a, b, e, alpha, beta)."""
    a, b, e, al, be = (theta[:, i:i + 1] for i in range(5))
    t = np.stack(np.broadcast_arrays(a - al * lN, b - be * lD, e + 0 * lN))   # [3, R, n]
    m = t.max(axis=0)
    w = np.exp(t - m)
    s = w.sum(axis=0)
    w /= s
    jac = np.stack([w[0], w[1], w[2], -w[0] * lN, -w[1] * lD], axis=-1)
    return m + np.log(s), jac


def _lm(theta, lN, lD, lL, W, iters: int = 100, prior=None):
    """Weighted least squares on log L for every row of theta / W [R, n] at once (LM).
    prior=(mu [5], prec [5]) adds sum(prec (theta - mu)^2) to every row's cost: a Gaussian prior
    in units of the residuals (prec = noise^2 / prior sd^2), the MAP fit."""
    theta = np.array(theta, float)
    mu, prec = (np.zeros(5), np.zeros(5)) if prior is None else map(np.asarray, prior)
    lam = np.full(theta.shape[0], 1e-3)
    lh, J = _lhat_jac(theta, lN, lD)
    cost = (W * (lL - lh) ** 2).sum(1) + ((theta - mu) ** 2 * prec).sum(1)
    eye = np.eye(5)
    for _ in range(iters):
        if np.all(lam > 1e6):                                # every row stalled: converged
            break
        r = lL - lh
        JtJ = np.einsum("rn,rni,rnj->rij", W, J, J) + np.diag(prec)
        g = np.einsum("rn,rni,rn->ri", W, J, r) + prec * (mu - theta)
        A = JtJ + lam[:, None, None] * (eye * np.diagonal(JtJ, axis1=1, axis2=2)[:, None, :]
                                        + 1e-9 * eye)
        step = np.linalg.solve(A, g[..., None])[..., 0]
        new = theta + step
        lh2, J2 = _lhat_jac(new, lN, lD)
        c2 = (W * (lL - lh2) ** 2).sum(1) + ((new - mu) ** 2 * prec).sum(1)
        ok = np.isfinite(c2) & (c2 < cost)
        theta = np.where(ok[:, None], new, theta)
        lh, J = np.where(ok[:, None], lh2, lh), np.where(ok[:, None, None], J2, J)
        cost = np.where(ok, c2, cost)
        lam = np.clip(np.where(ok, lam / 3, lam * 4), 1e-12, 1e12)
    return theta, cost


def fit_ls(N, D, L, *, n_boot: int = 200, seed: int = 0, groups=None, n_starts: int = 32,
           resample: str = "runs", prior=None):
    """Least squares on log L for L(N, D); returns (theta [5], bootstrap thetas [n_boot', 5]).

    theta = (log A, log B, log E, alpha, beta). The main fit runs LM from the n_starts points of
    Epoch's grid with the lowest starting loss; every bootstrap refit starts from the main
    optimum and from the best grid start, keeping the better. resample="runs" resamples runs
    (or whole `groups`): the runs as a random sample. resample="residuals" keeps every (N, D)
    and adds resampled residuals (scaled by sqrt(n / (n - 5))) to the fit: the fixed-design
    bootstrap, right when the runs were chosen (a grid, or `suggest_runs`), not sampled.
    prior=(mu [5], prec [5]): a Gaussian prior on theta, in units of squared log-loss residuals
    (prec = noise^2 / prior sd^2), for every fit: the MAP fit (the planner's, from few runs).
    """
    if resample not in ("runs", "residuals"):
        raise ValueError(f"resample={resample!r}: use 'runs' or 'residuals'")
    if resample == "residuals" and groups is not None:
        raise ValueError("groups= resamples whole groups of runs: use it with resample='runs'")
    N, L = check_xy(N, L, "N", "L")
    D, _ = check_xy(D, L, "D", "L")
    n_boot = check_count(n_boot)
    lN, lD, lL = np.log(N), np.log(D), np.log(L)
    grid = np.array(list(itertools.product(*(EPOCH_GRID[k] for k in
                                             ("a", "b", "e", "alpha", "beta")))), float)
    starts = _screen(grid, lN, lD, lL, np.inf, n_starts)
    th, cost = _lm(starts, lN, lD, lL, np.ones((len(starts), N.size)), prior=prior)
    best = th[np.argmin(np.where(np.isfinite(cost), cost, np.inf))]
    if n_boot == 0:
        return best, np.empty((0, 5))
    idx = bootstrap_indices(N.size, n_boot, seed, groups)
    if resample == "runs":
        W = np.stack([np.bincount(i, minlength=N.size) for i in idx]).astype(float)
        y = lL
    else:
        if N.size <= 5:
            raise ValueError(f"resample='residuals' needs more runs than the law's 5 "
                             f"parameters (got {N.size})")
        lh = _lhat_jac(best[None], lN, lD)[0][0]
        r = (lL - lh) * np.sqrt(N.size / (N.size - 5))
        W, y = np.ones((n_boot, N.size)), lh + (r - r.mean())[np.stack(idx)]
    a, ca = _lm(np.tile(best, (n_boot, 1)), lN, lD, y, W, prior=prior)
    b, cb = _lm(np.tile(starts[0], (n_boot, 1)), lN, lD, y, W, prior=prior)
    boot = np.where((cb < ca)[:, None], b, a)
    return best, boot[np.all(np.isfinite(boot), axis=1)]


def frontier(theta, C):
    """log N_opt and log loss_opt at compute C (6ND) for thetas [R, 5] (Chinchilla eq. 4)."""
    theta = np.atleast_2d(theta)
    a, b, e, al, be = (theta[:, i] for i in range(5))
    lG = (np.log(al) + a - np.log(be) - b) / (al + be)
    lc = np.log(C / 6.0)
    ln = lG + be / (al + be) * lc
    ld = lc - ln
    lhat, _ = _lhat_jac(theta, ln[:, None], ld[:, None])
    return ln, lhat[:, 0]


def predict_loss_opt(theta, boot, C, level: float = 0.95) -> tuple[float, float, float]:
    """The compute-optimal loss at C, with the bootstrap percentile interval (lo, hi)."""
    level = check_level(level)
    point = float(np.exp(frontier(theta, C)[1][0]))
    with np.errstate(all="ignore"):
        vals = np.exp(frontier(boot, C)[1]) if len(boot) else np.array([np.nan])
    vals = vals[np.isfinite(vals)]
    if vals.size == 0:
        return point, np.nan, np.nan
    return point, *np.percentile(vals, [50 * (1 - level), 50 * (1 + level)])



def residual_sd(theta, N, D, L) -> float:
    """The sd of the fit's log-loss residuals (n - 5 degrees of freedom)."""
    lN, lD, lL = (np.log(np.asarray(v, float)) for v in (N, D, L))
    r = lL - _lhat_jac(np.asarray(theta, float)[None], lN, lD)[0][0]
    return float(np.sqrt(r @ r / max(r.size - 5, 1)))



def profile_loss_opt(N, D, L, C: float, level: float = 0.95, n_grid: int = 41,
                     span: float = 0.6) -> tuple[float, float, float, pd.DataFrame]:
    """The compute-optimal loss at C with its profile-likelihood interval (lo, hi).

    A bootstrap around a fit that sits on the edge of the parameter space (E = 0: the runs show
    no floor) keeps most refits on that edge, and its interval is too narrow. The profile does
    not resample: for each value v of log loss_opt(C) on a grid (the fit's +- span) it refits
    all five parameters under the constraint (a penalty; by the envelope theorem the gradient
    of loss_opt is that of L_hat at (N_opt, D_opt)) and keeps the v whose least-squares
    likelihood ratio n log(RSS_v / RSS_best) stays under chi2(1). A bound that the grid does
    not reach is NaN (not pinned within exp(+-span) of the fit). Returns (point, lo, hi, table).
    """
    level = check_level(level)
    N, L = check_xy(N, L, "N", "L")
    D, _ = check_xy(D, L, "D", "L")
    lN, lD, lL = np.log(N), np.log(D), np.log(L)
    theta, _ = fit_ls(N, D, L, n_boot=0)
    if not (isinstance(C, (int, float)) and np.isfinite(C) and C > 0):
        raise ValueError(f"C={C!r}: must be a positive number of FLOPs, e.g. 1e21")
    rss0 = max(float(((lL - _lhat_jac(theta[None], lN, lD)[0][0]) ** 2).sum()), 1e-300)
    p0 = float(frontier(theta, C)[1][0])
    lv = p0 + np.linspace(-span, span, n_grid)
    best = None
    for start in (np.tile(theta, (n_grid, 1)), None):      # from the fit, then from neighbours
        if start is None:
            start = best[0].copy()
            for j in range(1, n_grid):                      # warm start outward from the middle
                for k in ((n_grid // 2 + j), (n_grid // 2 - j)):
                    if 0 <= k < n_grid:
                        start[k] = best[0][k - np.sign(k - n_grid // 2)]
        th, rss, got = _lm_profile(start, lN, lD, lL, lv, C)
        if best is None:
            best = (th, rss, got)
        else:
            ok = rss < best[1]
            best = (np.where(ok[:, None], th, best[0]), np.where(ok, rss, best[1]),
                    np.where(ok, got, best[2]))
    _, rss, got = best
    stat = lN.size * np.log(np.maximum(rss, rss0) / rss0)
    table = pd.DataFrame({"loss_opt": np.exp(got), "stat": stat}).sort_values("loss_opt")
    thr = float(chi2.ppf(level, 1))
    x, s = table["loss_opt"].to_numpy(), np.sqrt(table["stat"].to_numpy())
    point = float(np.exp(p0))
    lo = hi = np.nan
    below, above = x < point, x > point
    if (s[below] > np.sqrt(thr)).any():
        i = np.flatnonzero(below & (s > np.sqrt(thr)))[-1]
        lo = float(np.interp(np.sqrt(thr), s[[i + 1, i]], x[[i + 1, i]]))
    if (s[above] > np.sqrt(thr)).any():
        i = np.flatnonzero(above & (s > np.sqrt(thr)))[0]
        hi = float(np.interp(np.sqrt(thr), s[[i - 1, i]], x[[i - 1, i]]))
    return point, lo, hi, table.reset_index(drop=True)


def _lm_profile(theta, lN, lD, lL, lv, C, weight: float = 30.0, iters: int = 200):
    """LM on RSS + weight^2 (lv - log loss_opt(theta, C))^2, one row of theta per lv; returns
    the thetas, their data RSS and the log loss_opt they reach (the profile's exact points)."""
    theta = np.array(theta, float)

    def parts(th):
        with np.errstate(all="ignore"):
            lh, J = _lhat_jac(th, lN, lD)
            ln, lo = frontier(th, C)
            _, Jo = _lhat_jac(th, ln[:, None], np.log(C / 6.0) - ln[:, None])
        r = np.concatenate([lL - lh, weight * (lv - lo)[:, None]], axis=1)
        return r, np.concatenate([J, weight * Jo], axis=1), lo

    r, J, lo = parts(theta)
    cost = (r ** 2).sum(1)
    lam = np.full(theta.shape[0], 1e-3)
    eye = np.eye(5)
    for _ in range(iters):
        if np.all(lam > 1e6):
            break
        JtJ = np.einsum("rni,rnj->rij", J, J)
        g = np.einsum("rni,rn->ri", J, r)
        A = JtJ + lam[:, None, None] * (eye * np.diagonal(JtJ, axis1=1, axis2=2)[:, None, :]
                                        + 1e-9 * eye)
        new = theta + np.linalg.solve(A, g[..., None])[..., 0]
        r2, J2, lo2 = parts(new)
        c2 = (r2 ** 2).sum(1)
        ok = np.isfinite(c2) & (c2 < cost)
        theta = np.where(ok[:, None], new, theta)
        r, J = np.where(ok[:, None], r2, r), np.where(ok[:, None, None], J2, J)
        lo, cost = np.where(ok, lo2, lo), np.where(ok, c2, cost)
        lam = np.clip(np.where(ok, lam / 3, lam * 4), 1e-12, 1e12)
    return theta, (r[:, :-1] ** 2).sum(1), lo
