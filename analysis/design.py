"""Plan the next runs: which (N, D) to train so the prediction at a target compute tightens most.

`suggest_runs(results, target_flops, budget_flops)` fits L(N, D) = E + A/N^alpha + B/D^beta to
the finished runs, then picks runs greedily: each step adds the candidate that removes the most
variance from the predicted compute-optimal log loss (and log N_opt) at target_flops per FLOP
it costs, until the budget is spent. The variance comes from the fit's linearisation (Fisher
information J'J / sigma^2, J the gradient of log L_hat in (log A, log B, log E, alpha, beta))
plus a weak Gaussian prior (PRIOR_SD) that keeps directions the runs cannot see finite: this is
sequential c-optimal design. Candidates are log-spaced compute levels up to the largest run you
allow, each at sizes around the current fit's optimum (N_opt x 1/8 .. 8), or at the sizes you
give (a sweep's presets, `sizes=`).

The design fits by least squares on log L (a Gaussian likelihood, which the Fisher information
needs); `fit_ls` does that with a vectorised Levenberg-Marquardt, bootstrap resamples included
(200 refits in ~0.1 s), and `predict_loss_opt` gives the prediction and its percentile band.
fit_chinchilla (Huber, Epoch's procedure) remains the analysis fit.
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from .checks import check_count, check_level, check_xy
from .chinchilla import EPOCH_GRID, _screen
from .fit import bootstrap_indices

PRIOR_SD = np.array([5.0, 5.0, 1.0, 0.5, 0.5])      # log A, log B, log E, alpha, beta


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


def _lm(theta, lN, lD, lL, W, iters: int = 100):
    """Weighted least squares on log L for every row of theta / W [R, n] at once (LM)."""
    theta = np.array(theta, float)
    lam = np.full(theta.shape[0], 1e-3)
    lh, J = _lhat_jac(theta, lN, lD)
    cost = (W * (lL - lh) ** 2).sum(1)
    eye = np.eye(5)
    for _ in range(iters):
        if np.all(lam > 1e6):                                # every row stalled: converged
            break
        r = lL - lh
        JtJ = np.einsum("rn,rni,rnj->rij", W, J, J)
        g = np.einsum("rn,rni,rn->ri", W, J, r)
        A = JtJ + lam[:, None, None] * (eye * np.diagonal(JtJ, axis1=1, axis2=2)[:, None, :]
                                        + 1e-9 * eye)
        step = np.linalg.solve(A, g[..., None])[..., 0]
        new = theta + step
        lh2, J2 = _lhat_jac(new, lN, lD)
        c2 = (W * (lL - lh2) ** 2).sum(1)
        ok = np.isfinite(c2) & (c2 < cost)
        theta = np.where(ok[:, None], new, theta)
        lh, J = np.where(ok[:, None], lh2, lh), np.where(ok[:, None, None], J2, J)
        cost = np.where(ok, c2, cost)
        lam = np.clip(np.where(ok, lam / 3, lam * 4), 1e-12, 1e12)
    return theta, cost


def fit_ls(N, D, L, *, n_boot: int = 200, seed: int = 0, groups=None, n_starts: int = 32,
           resample: str = "runs"):
    """Least squares on log L for L(N, D); returns (theta [5], bootstrap thetas [n_boot', 5]).

    theta = (log A, log B, log E, alpha, beta). The main fit runs LM from the n_starts points of
    Epoch's grid with the lowest starting loss; every bootstrap refit starts from the main
    optimum and from the best grid start, keeping the better. resample="runs" resamples runs
    (or whole `groups`): the runs as a random sample. resample="residuals" keeps every (N, D)
    and adds resampled residuals (scaled by sqrt(n / (n - 5))) to the fit: the fixed-design
    bootstrap, right when the runs were chosen (a grid, or `suggest_runs`), not sampled.
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
    th, cost = _lm(starts, lN, lD, lL, np.ones((len(starts), N.size)))
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
    a, ca = _lm(np.tile(best, (n_boot, 1)), lN, lD, y, W)
    b, cb = _lm(np.tile(starts[0], (n_boot, 1)), lN, lD, y, W)
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


def _real(v) -> bool:
    """A plain or numpy real number (not a bool, not a string)."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def residual_sd(theta, N, D, L) -> float:
    """The sd of the fit's log-loss residuals (n - 5 degrees of freedom)."""
    lN, lD, lL = (np.log(np.asarray(v, float)) for v in (N, D, L))
    r = lL - _lhat_jac(np.asarray(theta, float)[None], lN, lD)[0][0]
    return float(np.sqrt(r @ r / max(r.size - 5, 1)))


def _sigma(theta, lN, lD, lL) -> float:
    r = lL - _lhat_jac(theta[None], lN, lD)[0][0]
    dof = lN.size - 5
    return float(max(np.sqrt(r @ r / dof) if dof > 1 else 0.01, 1e-3))


def suggest_runs(results: pd.DataFrame, target_flops: float, budget_flops: float, *,
                 max_runs: int | None = None, max_run_flops: float | None = None,
                 min_run_flops: float | None = None,
                 sizes=None, objective: str = "both", noise: float | None = None,
                 n_levels: int = 10, method: str = "linear", n_boot: int = 400,
                 seed: int = 0, max_tokens: float | None = None,
                 fit_min_flops: float | None = None) -> pd.DataFrame:
    """The runs to add, together within budget_flops (6ND each), that shrink the uncertainty of
    the predicted compute-optimal loss (objective "loss"), of N_opt ("n_opt") or of both (the
    sum of their relative variance reductions) at target_flops most per FLOP.

    results: finished runs with columns n_params, tokens, val_loss (results.csv; >= 5 runs at
        >= 2 values of D/N). max_run_flops: the largest single run you can train (default: the
        budget). min_run_flops: the smallest run worth adding (default: the largest finished
        run, so the plan climbs towards the target; each candidate is used at most once).
        sizes: allowed parameter counts (a sweep's models); default any N.
    noise: the run-to-run sd of log loss (default: from the fit's residuals, 0.01 when < 7 runs).
    method: "linear" (the fit's Fisher information plus PRIOR_SD) or "bootstrap": the joint
        covariance of every candidate's predicted log loss and the targets across n_boot
        fixed-design bootstrap refits (`fit_ls(resample="residuals")`, seed), keeping the refits
        inside the central 95% of log loss_opt: the quantity the interval is read from. The
        linearisation cannot see E when the fit puts E at 0 (d log L / d log E = E / L = 0).
    max_tokens: the most tokens a run may see, e.g. the corpus's unique tokens: L(N, D) counts
        fresh tokens, and a run that repeats its data flattens above the law (default: no cap).
    fit_min_flops: leave runs below this compute (6ND) out of the fit: runs of a few hundred
        steps are still in the early transient and off the law (notebook 05: the 1e11 runs of
        35-241 steps made the residual sd 5x larger and biased every later forecast upwards).
    Returns one row per run, in the order picked (the most useful per FLOP first): n_params,
    tokens, flops and sd_log_loss, the predicted sd of log loss_opt(target) once the runs up
    to that row are added.
    """
    for col in ("n_params", "tokens", "val_loss"):
        if col not in getattr(results, "columns", ()):
            raise ValueError(f"results: needs columns n_params, tokens, val_loss (a sweep's "
                             f"results.csv, analysis.load_results(..., finished_only=True)); "
                             f"missing {col!r}")
    for name, v in (("target_flops", target_flops), ("budget_flops", budget_flops)):
        if not (_real(v) and np.isfinite(v) and v > 0):
            raise ValueError(f"{name}={v!r}: must be a positive number of FLOPs, e.g. 1e21")
    if objective not in ("loss", "n_opt", "both"):
        raise ValueError(f"objective={objective!r}: use 'loss', 'n_opt' or 'both'")
    if method not in ("linear", "bootstrap"):
        raise ValueError(f"method={method!r}: use 'linear' or 'bootstrap'")
    max_runs = None if max_runs is None else check_count(max_runs, "max_runs", 1)
    cap = float(budget_flops if max_run_flops is None else min(max_run_flops, budget_flops))
    N, D, L = (results[c].to_numpy(float) for c in ("n_params", "tokens", "val_loss"))
    if fit_min_flops is not None:
        if not (_real(fit_min_flops) and fit_min_flops >= 0):
            raise ValueError(f"fit_min_flops={fit_min_flops!r}: must be a FLOP count >= 0")
        keep = 6 * N * D >= fit_min_flops
        if keep.sum() < 6:
            raise ValueError(f"fit_min_flops={fit_min_flops:.3g} leaves {int(keep.sum())} "
                             "run(s) to fit; L(N, D) needs at least 6: lower it")
        N, D, L = N[keep], D[keep], L[keep]
    theta, _ = fit_ls(N, D, L, n_boot=0)
    lN, lD, lL = np.log(N), np.log(D), np.log(L)
    sigma = noise if noise is not None else _sigma(theta, lN, lD, lL)
    lo = float((6 * N * D).max() if min_run_flops is None else min_run_flops)
    cands = _candidates(theta, min(lo, cap), cap, sizes, n_levels)
    if max_tokens is not None:
        if not (_real(max_tokens) and max_tokens > 0):
            raise ValueError(f"max_tokens={max_tokens!r}: must be a positive token count")
        cands = cands[cands["tokens"] <= max_tokens].reset_index(drop=True)
    if cands.empty:
        raise ValueError(f"no candidate run fits in max_run_flops/budget_flops={cap:.3g}"
                         + ("" if max_tokens is None else f" and max_tokens={max_tokens:.3g}")
                         + "; raise the budget or allow other sizes")
    if method == "bootstrap":
        _, boot = fit_ls(N, D, L, n_boot=check_count(n_boot, "n_boot", 20), seed=seed,
                         resample="residuals")
        return _greedy_ensemble(boot, cands, float(target_flops), objective, sigma,
                                float(budget_flops), max_runs, theta)
    # Posterior covariance of theta: data (J'J / sigma^2) plus the weak prior.
    _, J = _lhat_jac(theta[None], lN, lD)
    M = J[0].T @ J[0] / sigma ** 2 + np.diag(PRIOR_SD ** -2.0)
    S = np.linalg.inv(M)
    gs = _target_gradients(theta, target_flops, objective)
    _, Jc = _lhat_jac(theta[None], np.log(cands["n_params"].to_numpy())[None],
                      np.log(cands["tokens"].to_numpy())[None])
    Jc, cost = Jc[0], cands["flops"].to_numpy()
    g_loss = _target_gradients(theta, target_flops, "loss")[0]
    v0 = [g @ S @ g for g in gs]
    picked, left, used = [], float(budget_flops), np.ones(len(cands), bool)
    while max_runs is None or len(picked) < max_runs:
        fits = (cost <= left * (1 + 1e-9)) & used
        if not fits.any():
            break
        SJ = Jc @ S                                           # [K, 5]
        denom = sigma ** 2 + np.einsum("ki,ki->k", SJ, Jc)
        gain = sum((SJ @ g) ** 2 / denom / v for g, v in zip(gs, v0))
        score = np.where(fits, gain / cost, -np.inf)
        k = int(np.argmax(score))
        if gain[k] < 1e-6:
            break
        S = S - np.outer(SJ[k], SJ[k]) / denom[k]             # rank-one update (Sherman-Morrison)
        left -= cost[k]
        used[k] = False
        picked.append((*cands.iloc[k][["n_params", "tokens", "flops"]],
                       float(np.sqrt(g_loss @ S @ g_loss))))
    out = pd.DataFrame(picked, columns=["n_params", "tokens", "flops", "sd_log_loss"])
    out.attrs.update(sd_log_loss_before=float(np.sqrt(g_loss @ np.linalg.inv(M) @ g_loss)),
                     theta=theta, sigma=sigma)
    return out


def _target_gradients(theta, C, objective: str) -> list[np.ndarray]:
    """Gradients of log loss_opt(C) and/or log N_opt(C) in theta (central differences)."""
    h = 1e-5 * np.maximum(1.0, np.abs(theta))
    tp, tm = theta + np.diag(h), theta - np.diag(h)
    (np_, lp), (nm, lm) = frontier(tp, C), frontier(tm, C)
    out = []
    if objective in ("loss", "both"):
        out.append((lp - lm) / (2 * h))
    if objective in ("n_opt", "both"):
        out.append((np_ - nm) / (2 * h))
    return out


def _candidates(theta, c_min: float, cap: float, sizes, n_levels: int) -> pd.DataFrame:
    """Candidate runs: compute levels log-spaced from the smallest run to `cap`, each at
    N_opt(C) x 2^k (k = -3..3) under the current fit, or at the given sizes."""
    levels = np.geomspace(c_min, cap, n_levels)
    if sizes is not None:
        n = np.unique(np.asarray(sizes, float))
        rows = [(ni, c / (6 * ni)) for c in levels for ni in n]
    else:
        ln, _ = frontier(np.tile(theta, (levels.size, 1)), levels)
        rows = [(np.exp(l) * 2.0 ** k, c / (6 * np.exp(l) * 2.0 ** k))
                for c, l in zip(levels, ln) for k in range(-3, 4)]
    df = pd.DataFrame(rows, columns=["n_params", "tokens"])
    df["n_params"], df["tokens"] = df["n_params"].round(), df["tokens"].round()
    df = df[(df["n_params"] >= 1) & (df["tokens"] >= 1)]
    df["flops"] = 6 * df["n_params"] * df["tokens"]
    return df.reset_index(drop=True)


def _greedy_ensemble(boot, cands, C, objective, sigma, budget, max_runs, theta) -> pd.DataFrame:
    """suggest_runs(method="bootstrap"): greedy picks on the bootstrap covariance of
    (candidates' log L, log loss_opt(C), log N_opt(C)), each pick a linear-Gaussian update."""
    lnc = np.log(cands["n_params"].to_numpy())[None]
    ldc = np.log(cands["tokens"].to_numpy())[None]
    with np.errstate(all="ignore"):
        P = _lhat_jac(boot, lnc, ldc)[0]                       # [R, K]
        n_opt, loss = frontier(boot, C)
    X = np.column_stack([P, loss, n_opt])
    X = X[np.all(np.isfinite(X), axis=1)]
    lo, hi = np.percentile(X[:, -2], [2.5, 97.5])
    X = X[(X[:, -2] >= lo) & (X[:, -2] <= hi)]
    if len(X) < 10:
        raise ValueError(f"method='bootstrap': only {len(X)} usable bootstrap refits; "
                         "raise n_boot or use method='linear'")
    S = np.cov(X, rowvar=False)
    K = P.shape[1]
    tgt = {"loss": [K], "n_opt": [K + 1], "both": [K, K + 1]}[objective]
    v0 = [S[t, t] for t in tgt]
    cost = cands["flops"].to_numpy()
    picked, left, used = [], budget, np.ones(K, bool)
    sd0 = float(np.sqrt(S[K, K]))
    while max_runs is None or len(picked) < max_runs:
        fits = (cost <= left * (1 + 1e-9)) & used
        if not fits.any():
            break
        denom = sigma ** 2 + np.diag(S)[:K]
        gain = sum(S[t, :K] ** 2 / denom / v for t, v in zip(tgt, v0))
        k = int(np.argmax(np.where(fits, gain / cost, -np.inf)))
        if gain[k] < 1e-6:
            break
        S = S - np.outer(S[:, k], S[k, :]) / denom[k]
        left -= cost[k]
        used[k] = False
        picked.append((*cands.iloc[k][["n_params", "tokens", "flops"]],
                       float(np.sqrt(max(S[K, K], 0.0)))))
    out = pd.DataFrame(picked, columns=["n_params", "tokens", "flops", "sd_log_loss"])
    out.attrs.update(sd_log_loss_before=sd0, theta=theta, sigma=sigma)
    return out


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
    from scipy.stats import chi2

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
