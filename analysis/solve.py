"""The optimisers behind fit_power_law, for y = exp(l - b*u) + c with u = log x - mean(log x).

Two solvers, one answer each:
  * `least_squares`: residuals on y, no robust loss (the default fit). For a fixed exponent b
    the model is linear in (exp(l), c), so the best amplitude and offset have a closed form
    (variable projection). The exponent is then found by scanning a log-spaced grid of b and
    refining the best cell by golden section. That is a global search, it handles c at its
    bound exactly, and it is vectorised over bootstrap resamples (1,000 refits in ~0.3 s).
  * `multistart`: any other loss or space (Huber, log y). L-BFGS-B with the offset bounded at
    0 (not log c, whose gradient vanishes at the bound), from a fixed grid of starts.
Both return, per problem, the parameters (l, b, c), the objective and an ok flag, so callers
can count failures instead of silently keeping them.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from scipy.special import huber

B_GRID = np.geomspace(1e-3, 3.0, 241)       # exponents searched by the least-squares solver
_GOLDEN = (np.sqrt(5) - 1) / 2


_BLOCK = 1 << 21  # elements of one [rows, exponents, n] temporary: 16 MiB of float64


def _amp_offset(b, U, Y, offset: bool, c_fixed, W=None):
    """Best (amplitude a, offset c >= 0) and residual sum of squares for exponents b [R, G],
    in blocks of at most _BLOCK elements: the [R, G, n] temporaries of 1,000 resamples of a
    large results.csv would otherwise need tens of GiB at once. W [R, n]: weights of the
    points (a bootstrap's multiplicities), None for all ones."""
    R, G = b.shape
    n = max(Y.shape[1], 1)
    rows = max(1, _BLOCK // (G * n))
    cols = G if rows > 1 else max(1, min(G, _BLOCK // n))
    if rows >= R and cols >= G:
        return _amp_offset_block(b, U, Y, offset, c_fixed, W)
    cf = None if c_fixed is None else np.broadcast_to(np.asarray(c_fixed, float), (R,))
    a, c, rss = np.empty((R, G)), np.empty((R, G)), np.empty((R, G))
    for r in range(0, R, rows):
        for g in range(0, G, cols):
            at = (slice(r, r + rows), slice(g, g + cols))
            a[at], c[at], rss[at] = _amp_offset_block(
                b[at], U[r:r + rows], Y[r:r + rows], offset,
                None if cf is None else cf[r:r + rows], None if W is None else W[r:r + rows])
    return a, c, rss


def _amp_offset_block(b, U, Y, offset: bool, c_fixed, W=None):
    f = np.exp(-b[..., None] * U[:, None, :])                  # [R, G, n]
    y = Y[:, None, :]
    w = np.ones_like(y) if W is None else W[:, None, :]
    wf = w * f
    sff, sfy = (wf * f).sum(-1), (wf * y).sum(-1)
    if c_fixed is not None:                                    # profile: offset held at c
        c = np.broadcast_to(np.asarray(c_fixed, float)[:, None], sff.shape)
        a = ((wf * (y - c[..., None])).sum(-1)) / sff
    else:
        a, c = sfy / sff, np.zeros_like(sff)                   # the c = 0 solution
        if offset:
            n = np.broadcast_to(w.sum(-1), sff.shape)
            sf, sy = wf.sum(-1), (w * y).sum(-1)
            det = n * sff - sf * sf
            with np.errstate(divide="ignore", invalid="ignore"):
                a2 = (n * sfy - sf * sy) / det
                c2 = (sff * sy - sf * sfy) / det
            inside = np.isfinite(a2) & np.isfinite(c2) & (c2 >= 0) & (a2 > 0)
            a, c = np.where(inside, a2, a), np.where(inside, c2, c)
    rss = (w * (y - a[..., None] * f - c[..., None]) ** 2).sum(-1)
    return a, c, rss


def _amp_common_offset(b, data):
    """Per problem k, amplitudes a_k and one offset c >= 0 common to all K problems for
    exponents b [R, G]: the weighted normal equations of (a_1..a_K, c), solved per (R, G); where
    c < 0 or an amplitude <= 0, the c = 0 solution. Returns [(a_k, c, rss_k)] as _amp_offset."""
    K = len(data)
    f = [np.exp(-b[..., None] * U[:, None, :]) for U, _, _ in data]   # [R, G, n_k]
    w = [W[:, None, :] for _, _, W in data]
    y = [Y[:, None, :] for _, Y, _ in data]
    sff = [(wk * fk * fk).sum(-1) for wk, fk in zip(w, f)]
    sf = [(wk * fk).sum(-1) for wk, fk in zip(w, f)]
    sfy = [(wk * fk * yk).sum(-1) for wk, fk, yk in zip(w, f, y)]
    M = np.zeros(b.shape + (K + 1, K + 1))
    v = np.zeros(b.shape + (K + 1,))
    for k in range(K):
        M[..., k, k], M[..., k, K], M[..., K, k] = sff[k], sf[k], sf[k]
        M[..., K, K] += np.broadcast_to(w[k].sum(-1), b.shape)
        v[..., k] = sfy[k]
        v[..., K] += (w[k] * y[k]).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        try:
            sol = np.linalg.solve(M, v[..., None])[..., 0]
        except np.linalg.LinAlgError:
            sol = np.full(v.shape, np.nan)
        a0 = [sfy[k] / sff[k] for k in range(K)]                      # the c = 0 solution
    inside = np.all(np.isfinite(sol), -1) & (sol[..., K] >= 0) & np.all(sol[..., :K] > 0, -1)
    c = np.where(inside, sol[..., K], 0.0)
    out = []
    for k in range(K):
        a = np.where(inside, sol[..., k], a0[k])
        rss = (w[k] * (y[k] - a[..., None] * f[k] - c[..., None]) ** 2).sum(-1)
        out.append((a, c, rss))
    return out


def _exponent(rss_of, R: int, iters: int) -> np.ndarray:
    """The exponent b [R] minimising rss_of(b [R, G]) -> [R, G]: a scan of B_GRID, then golden
    section inside the best cell, vectorised over the R problems."""
    rss = rss_of(np.broadcast_to(B_GRID, (R, B_GRID.size)))
    rss = np.where(np.isfinite(rss), rss, np.inf)
    i = np.argmin(rss, axis=1)
    lo, hi = B_GRID[np.maximum(i - 1, 0)], B_GRID[np.minimum(i + 1, B_GRID.size - 1)]

    def f(b):
        return rss_of(b[:, None])[:, 0]

    x1, x2 = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
    f1, f2 = f(x1), f(x2)
    for _ in range(iters):
        left = f1 < f2
        lo, hi = np.where(left, lo, x1), np.where(left, x2, hi)
        n1 = np.where(left, hi - _GOLDEN * (hi - lo), x2)
        n2 = np.where(left, x1, lo + _GOLDEN * (hi - lo))
        g1, g2 = np.where(left, f(n1), f2), np.where(left, f1, f(n2))
        x1, x2, f1, f2 = n1, n2, g1, g2
    return (lo + hi) / 2


def least_squares(U, Y, offset: bool = True, c_fixed=None, iters: int = 48):
    """Global least-squares fit of every row of Y [R, n] on design U [R, n] (or [n]).

    c_fixed: per-row offsets to hold fixed (for the profile over c). Returns l, b, c, rss, ok
    (each [R]); ok is False where the best amplitude is not positive.
    """
    Y = np.atleast_2d(np.asarray(Y, float))
    U = np.broadcast_to(np.asarray(U, float), Y.shape)
    b = _exponent(lambda bb: _amp_offset(bb, U, Y, offset, c_fixed)[2], Y.shape[0], iters)
    a, c, rss = (v[:, 0] for v in _amp_offset(b[:, None], U, Y, offset, c_fixed))
    ok = np.isfinite(rss) & (a > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        l = np.log(a)
    return l, b, c, rss, ok


def least_squares_shared(problems, offset: bool | str = True, c_fixed=None, iters: int = 48):
    """Weighted least squares of K power laws that share one exponent b, each with its own
    amplitude and offset (offset="shared": one offset c >= 0 for all; c_fixed: that offset
    held fixed for all): problems = [(u_k [n_k], y_k [n_k],
    w_k [R, n_k])], w the weights of R resamples (a bootstrap's multiplicities). The summed
    RSS is searched over b as in `least_squares`, which is the one-problem, unit-weight case.

    Returns l [K, R], b [R], c [K, R], rss [R] (summed) and ok [R] (every amplitude positive).
    """
    data = []
    for u, y, w in problems:
        W = np.atleast_2d(np.asarray(w, float))
        data.append((np.broadcast_to(np.asarray(u, float), W.shape),
                     np.broadcast_to(np.asarray(y, float), W.shape), W))
    R = data[0][2].shape[0]

    def fits(b):
        if offset == "shared":
            return _amp_common_offset(b, data)
        return [_amp_offset(b, U, Y, offset, c_fixed, W) for U, Y, W in data]

    b = _exponent(lambda bb: sum(v[2] for v in fits(bb)), R, iters)
    out = fits(b[:, None])
    a = np.stack([v[0][:, 0] for v in out])
    c = np.stack([v[1][:, 0] for v in out])
    rss = sum(v[2][:, 0] for v in out)
    ok = np.isfinite(rss) & np.all(a > 0, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        l = np.log(a)
    return l, b, c, rss, ok


def objective(theta, u, y, delta: float, offset: bool, space: str):
    """Summed Huber (least squares if delta is inf) of the residuals, and its gradient."""
    l, b = theta[0], theta[1]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # inf: rejected step
        p = np.exp(l - b * u)                                  # the power-law term
        c = theta[2] if offset else 0.0
        yhat = p + c
        if space == "log":
            r, dr = np.log(y) - np.log(yhat), 1.0 / yhat       # d log(yhat) / d yhat
        else:
            r, dr = y - yhat, np.ones_like(yhat)
        f = float(np.sum(huber(delta, r))) if np.isfinite(delta) else float(0.5 * r @ r)
        g = -np.clip(r, -delta, delta) * dr                    # d f / d yhat
        grad = [g @ p, -(g * p) @ u] + ([g.sum()] if offset else [])
    if not np.isfinite(f):
        return np.inf, np.zeros(len(theta))
    return f, np.array(grad)


def starts(u, y, offset: bool) -> list[list[float]]:
    """Deterministic grid: exponents over two decades; offset as a fraction of min(y)."""
    out = []
    for b in (0.02, 0.07, 0.2, 0.6):
        for frac in ((0.0, 0.3, 0.7, 0.9, 0.98) if offset else (0.0,)):
            c = frac * y.min()
            l = float(np.mean(np.log(y - c) + b * u))
            out.append([l, b] + ([c] if offset else []))
    return out


def screen(grid, u, y, delta: float, offset: bool, space: str, n_refine: int | None):
    """The n_refine starts of `grid` with the lowest starting objective (all if None)."""
    if n_refine is None or n_refine >= len(grid):
        return list(grid)
    f0 = [objective(np.asarray(s, float), u, y, delta, offset, space)[0] for s in grid]
    return [grid[i] for i in np.argsort(f0, kind="stable")[:n_refine]]


def multistart(u, y, delta: float, offset: bool, space: str, grid, c_fixed=None):
    """L-BFGS-B from every start in `grid`; the best result.

    Returns (theta, fun, ok): ok is False when no start reached a finite optimum or the best one
    did not converge (scipy's success flag).
    """
    best = None
    for s in grid:
        s = list(s)
        if offset:
            s[2] = float(c_fixed) if c_fixed is not None else max(s[2], 0.0)
            bounds = [(None, None), (None, None),
                      (s[2], s[2]) if c_fixed is not None else (0.0, None)]
        else:
            bounds = None
        r = minimize(objective, s, args=(u, y, delta, offset, space), jac=True,
                     method="L-BFGS-B", bounds=bounds,
                     options={"maxiter": 2000, "ftol": 1e-14, "gtol": 1e-10})
        if not np.all(np.isfinite(r.x)) or not np.isfinite(r.fun):
            continue
        if best is None or r.fun < best.fun:
            best = r
    if best is None:
        return None, np.inf, False
    return best.x, float(best.fun), bool(best.success)
