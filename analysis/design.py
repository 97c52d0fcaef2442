"""Plan the next runs: which (N, D) to train so the forecast at a target compute tightens most.

`suggest_runs(results, target_flops, budget_flops)` fits L(N, D) = E + A/N^alpha + B/D^beta to
the finished runs, then picks runs greedily: each step adds the candidate that removes the most
variance from the forecast compute-optimal log loss (and/or log N_opt) at target_flops, until
the budget is spent. The variance comes from the fit's linearisation (Fisher information
J'J / sigma^2, J the gradient of log L_hat in (log A, log B, log E, alpha, beta)) plus a weak
Gaussian prior: sequential c-optimal design.

That criterion trusts the law exactly: alone (method="linear", "bootstrap") it spends the budget
on many cheap runs at extreme D/N, centred on whatever optimum a fit to a few small runs gives,
and held out of its own simulation it lost to a plain isoFLOP grid. method="robust" (the
default) keeps the criterion but (1) fits with a prior on the exponents (EXPONENT_PRIOR), so 4
start runs give a usable fit, (2) holds the fit's optimum to TOKENS_PER_PARAM and candidates to
within SPREAD of it, and (3) puts TOP_SHARE of the budget on runs at the largest affordable
compute near the optimum before the rest goes per FLOP. bench/design.py measures it on a family
of simulated studies (3 laws, 0.5% and 2% noise, 4 start designs, targets 30x and 1000x,
one-shot and rounds) against an isoFLOP grid on the true optimum with twice its compute: at or
below the grid's median error in 37 of 48 cells (6 seeds a cell), 91.7% coverage; no lost cell
beyond the seeds' scatter. It warns where the losses gather, and every lost cell is warned: a
target under SHORT_REACH x the largest run it may add (7 of the 11 lost cells), fewer than
MIN_NOISE_RUNS runs fitted (no noise estimate; 2 more), and a budget over MAX_LEAP x the compute
of the runs fitted (one-shot plans from small starts; the last 2, below the grid at 36 seeds).
docs/analysis_planning.md has the table.
The least-squares fit and its intervals live in analysis.lsfit (re-exported here).
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from .checks import check_count
from .lsfit import (_lhat_jac, fit_ls, frontier, predict_loss_opt, profile_loss_opt,  # noqa: F401
                    residual_sd)

PRIOR_SD = np.array([5.0, 5.0, 1.0, 0.5, 0.5])      # log A, log B, log E, alpha, beta
# method="robust": the exponents' prior (mean, sd): published LM fits give 0.28-0.37 (Hoffmann,
# Epoch, Llama 3's isoFLOPs); 4-6 start runs do not pin five parameters without it.
EXPONENT_PRIOR = (0.35, 0.15)
# ... and the tokens per parameter the fit's optimum is held to: a fit to few small runs can put
# it anywhere (the picks then land at D/N in the thousands, off the law's well-sampled region).
TOKENS_PER_PARAM = (5.0, 200.0)
# ... the rest of the budget per FLOP on runs within 1/SPREAD..SPREAD of that optimum (D/N
# within 64x: the grid's 4x lost a third of the design's information on a known law) ...
SPREAD = 8.0
# ... and this share of the budget on runs at the largest affordable compute near the optimum:
# a per-FLOP criterion alone spends it on small runs and trusts the law 1000x beyond them. A
# share growing as the reach shortens (0.6 at 30x, 0.3 at 1000x) did no better on the family
# (bench/design.py, 6 seeds: one-shot better in 41 cells against 37, rounds in 39 against 42).
TOP_SHARE = 0.3
# Below this target / max_run_flops the robust plan warns: in bench/design.py's family (6 seeds
# a cell) 7 of its 11 lost cells are at 30x (the true-optimum grid within 0.2-1.7% there) ...
SHORT_REACH = 100.0
# ... when fewer runs are fitted than give a residual noise estimate (n - 5 >= 2) ...
MIN_NOISE_RUNS = 7
# ... and when one plan spends over this many times the compute of the runs it is fitted to
# (the leap): in the family at 1000x (6 seeds a cell) the uses with a leap over 100 (one-shot
# from small starts, the first round from 4 small runs) lost 5 of 18 cells, those under it none
# of 30; 100 lies between the nearest two, 59x (the first of 3 rounds from 10 small runs) and
# 177x (one-shot from them).
MAX_LEAP = 100.0


def _real(v) -> bool:
    """A plain or numpy real number (not a bool, not a string)."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _sigma(theta, lN, lD, lL) -> float:
    r = lL - _lhat_jac(theta[None], lN, lD)[0][0]
    dof = lN.size - 5
    return float(max(np.sqrt(r @ r / dof) if dof > 1 else 0.01, 1e-3))


def suggest_runs(results: pd.DataFrame, target_flops: float, budget_flops: float, *,
                 max_runs: int | None = None, max_run_flops: float | None = None,
                 min_run_flops: float | None = None,
                 sizes=None, objective: str = "loss", noise: float | None = None,
                 n_levels: int = 10, method: str = "robust", n_boot: int = 400,
                 seed: int = 0, max_tokens: float | None = None,
                 fit_min_flops: float | None = None,
                 top_share: float | None = None) -> pd.DataFrame:
    """The runs to add, together within budget_flops (6ND each), that shrink the uncertainty of
    the predicted compute-optimal loss (objective "loss"), of N_opt ("n_opt") or of both (the
    sum of their relative variance reductions) at target_flops most per FLOP.

    results: finished runs with columns n_params, tokens, val_loss (results.csv; >= 4 runs at
        >= 2 values of D/N for "robust", >= 6 for "bootstrap"). max_run_flops: the largest
        single run you can train (default: the budget). min_run_flops: the smallest run worth
        adding (default: the smallest finished run for "robust", else the largest, so the plan
        climbs towards the target; each candidate is used at most once, but "robust"'s runs at
        the top compute may repeat). sizes: allowed parameter counts (a sweep's models).
    noise: the run-to-run sd of log loss (default: from the fit's residuals, 0.01 when < 7 runs).
    method: "robust" (default; the module docstring): the MAP fit, candidates held near its
        optimum, top_share of the budget (default TOP_SHARE) on round(top_share * budget /
        max_run_flops) >= 1 runs at the largest affordable compute within 2^1.5 of N_opt, the
        rest per FLOP; the criterion is the linearisation with the prior's covariance.
        "linear" (the fit's Fisher information plus PRIOR_SD) or "bootstrap": the joint
        covariance of every candidate's predicted log loss and the targets across n_boot
        fixed-design bootstrap refits (`fit_ls(resample="residuals")`, seed), keeping the refits
        inside the central 95% of log loss_opt: the quantity the interval is read from. The
        linearisation cannot see E when the fit puts E at 0 (d log L / d log E = E / L = 0).
    max_tokens: the most tokens a run may see, e.g. the corpus's unique tokens: L(N, D) counts
        fresh tokens, and a run that repeats its data flattens above the law (default: no cap).
    fit_min_flops: leave runs below this compute (6ND) out of the fit: runs of a few hundred
        steps are still in the early transient and off the law (notebook 05: the 1e11 runs of
        35-241 steps made the residual sd 5x larger and biased every later forecast upwards).
    Warns (UserWarning; method="robust") where bench/design.py's family saw it lose to a grid:
    target_flops < SHORT_REACH (100) x the largest run it may add (max_run_flops, else the
    budget), fewer than MIN_NOISE_RUNS (7) runs fitted (no noise estimate: plan in rounds), and
    budget_flops > MAX_LEAP (100) x the total compute of the runs fitted (plan in rounds).
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
    if method not in ("robust", "linear", "bootstrap"):
        raise ValueError(f"method={method!r}: use 'robust', 'linear' or 'bootstrap'")
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
    if max_tokens is not None and not (_real(max_tokens) and max_tokens > 0):
        raise ValueError(f"max_tokens={max_tokens!r}: must be a positive token count")
    if method == "robust":
        top_share = TOP_SHARE if top_share is None else top_share
        if min_run_flops is None:          # every compute from the smallest run up: each round
            lo = float((6 * N * D).min())  # may fill in below the largest
        if not (_real(top_share) and 0 <= top_share <= 1):
            raise ValueError(f"top_share={top_share!r}: the budget's share for the largest "
                             "runs, a number in [0, 1]")
        _warn_where_it_loses(float(target_flops / cap), N.size,
                             float(budget_flops / (6 * N * D).sum()))
        return _robust(N, D, L, sigma, float(target_flops), float(budget_flops), cap,
                       min(lo, cap), sizes, max_runs, max_tokens, objective, float(top_share),
                       n_levels)
    cands = _candidates(theta, min(lo, cap), cap, sizes, n_levels)
    cands = _usable(cands, cap, max_tokens)
    if method == "bootstrap":
        _, boot = fit_ls(N, D, L, n_boot=check_count(n_boot, "n_boot", 20), seed=seed,
                         resample="residuals")
        return _greedy_ensemble(boot, cands, float(target_flops), objective, sigma,
                                float(budget_flops), max_runs, theta)
    # Posterior covariance of theta: data (J'J / sigma^2) plus the weak prior.
    _, J = _lhat_jac(theta[None], lN, lD)
    M = J[0].T @ J[0] / sigma ** 2 + np.diag(PRIOR_SD ** -2.0)
    gs = _target_gradients(theta, target_flops, objective)
    g_loss = _target_gradients(theta, target_flops, "loss")[0]
    S = np.linalg.inv(M)
    picked, _, _ = _greedy(S, theta, cands, gs, [g @ S @ g for g in gs], g_loss, sigma,
                           float(budget_flops), max_runs, per_flop=True)
    return _table(picked, float(np.sqrt(g_loss @ S @ g_loss)), theta, sigma)


def _warn_where_it_loses(reach: float, n_runs: int, leap: float) -> None:
    """Warn where bench/design.py's family shows the robust plan losing to a true-optimum grid
    with twice its compute (docs/analysis_planning.md): a short reach, a fit with no noise
    estimate, or one plan spending far more than the fit's runs (a single leap where rounds
    held)."""
    if reach < SHORT_REACH:
        warnings.warn(f"target_flops is {reach:.3g}x the largest run (under {SHORT_REACH:g}x): "
                      "at such short reaches an isoFLOP grid at the largest compute is as good "
                      "as this plan (docs/analysis_planning.md: the cells it lost)", stacklevel=3)
    if n_runs < MIN_NOISE_RUNS:
        warnings.warn(f"{n_runs} finished runs fitted (under {MIN_NOISE_RUNS}): no noise estimate "
                      "from the residuals, and the fit's optimum rests on the exponent prior; "
                      "plan in rounds (a few runs, refit, plan again), where one-shot plans lost "
                      "to a grid (docs/analysis_planning.md)", stacklevel=3)
    if leap > MAX_LEAP:
        warnings.warn(f"budget_flops is {leap:.3g}x the compute of the runs fitted (over "
                      f"{MAX_LEAP:g}x): one plan puts it all where a fit to much smaller runs "
                      "puts the optimum; plan in rounds (a third of the budget, refit, plan "
                      "again), where such one-shot plans lost to a grid "
                      "(docs/analysis_planning.md)", stacklevel=3)


def _table(picked, sd0, theta, sigma) -> pd.DataFrame:
    out = pd.DataFrame(picked, columns=["n_params", "tokens", "flops", "sd_log_loss"])
    out.attrs.update(sd_log_loss_before=sd0, theta=theta, sigma=sigma)
    return out


def _greedy(S, theta, cands, gs, v0, g_loss, sigma, budget, max_picks, per_flop: bool,
            reuse: bool = False):
    """Sequential c-optimal picks from cands (linear-Gaussian updates of the posterior
    covariance S of theta), each the largest relative variance reduction of the targets (per
    FLOP when per_flop), until nothing fits the budget or max_picks are made. Returns the picks
    (n_params, tokens, flops, sd of log loss_opt after it), S and the budget left."""
    _, Jc = _lhat_jac(theta[None], np.log(cands["n_params"].to_numpy())[None],
                      np.log(cands["tokens"].to_numpy())[None])
    Jc, cost = Jc[0], cands["flops"].to_numpy()
    rows = cands[["n_params", "tokens", "flops"]].to_numpy(float)
    picked, left, free = [], budget, np.ones(len(cands), bool)
    while max_picks is None or len(picked) < max_picks:
        fits = (cost <= left * (1 + 1e-9)) & free
        if not fits.any():
            break
        SJ = Jc @ S                                           # [K, 5]
        denom = sigma ** 2 + np.einsum("ki,ki->k", SJ, Jc)
        gain = sum((SJ @ g) ** 2 / denom / v for g, v in zip(gs, v0))
        k = int(np.argmax(np.where(fits, gain / cost if per_flop else gain, -np.inf)))
        if gain[k] < 1e-6:
            break
        S = S - np.outer(SJ[k], SJ[k]) / denom[k]             # rank-one update (Sherman-Morrison)
        left -= cost[k]
        free[k] = reuse
        picked.append((*rows[k], float(np.sqrt(g_loss @ S @ g_loss))))
    return picked, S, left


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


def _usable(cands: pd.DataFrame, cap: float, max_tokens) -> pd.DataFrame:
    """The candidates within max_tokens; an error naming the limits when none is."""
    if max_tokens is not None:
        cands = cands[cands["tokens"] <= max_tokens].reset_index(drop=True)
    if cands.empty:
        raise ValueError(f"no candidate run fits in max_run_flops/budget_flops={cap:.3g}"
                         + ("" if max_tokens is None else f" and max_tokens={max_tokens:.3g}")
                         + "; raise the budget or allow other sizes")
    return cands


def _robust(N, D, L, sigma, C, budget, cap, c_min, sizes, max_runs, max_tokens, objective,
            top_share, n_levels) -> pd.DataFrame:
    """suggest_runs(method="robust"): the MAP fit (EXPONENT_PRIOR), top_share of the budget on
    runs at the largest affordable compute within 2^1.5 of the optimum, the rest per FLOP on
    runs within 4x of it (D/N within 16x), the optimum held to TOKENS_PER_PARAM."""
    mu = np.array([0, 0, 0, EXPONENT_PRIOR[0], EXPONENT_PRIOR[0]])
    prec = np.array([0, 0, 0, 1.0, 1.0]) * (sigma / EXPONENT_PRIOR[1]) ** 2
    theta, _ = fit_ls(N, D, L, n_boot=0, prior=(mu, prec))
    prior_sd = np.concatenate([PRIOR_SD[:3], [EXPONENT_PRIOR[1]] * 2])
    _, J = _lhat_jac(theta[None], np.log(N), np.log(D))
    S = np.linalg.inv(J[0].T @ J[0] / sigma ** 2 + np.diag(prior_sd ** -2.0))
    gs = _target_gradients(theta, C, objective)
    v0 = [g @ S @ g for g in gs]
    g_loss = _target_gradients(theta, C, "loss")[0]
    sd0 = float(np.sqrt(g_loss @ S @ g_loss))
    picked, left = [], budget
    if top_share > 0:
        n_top = max(1, int(np.floor(top_share * budget / cap + 0.5)))
        c_top = min(cap, top_share * budget / n_top)
        top = _usable(_near_optimum(theta, [c_top], sizes, 2 ** 1.5, 3), cap, max_tokens)
        picked, S, left = _greedy(S, theta, top, gs, v0, g_loss, sigma, left,
                                  n_top if max_runs is None else min(n_top, max_runs),
                                  per_flop=False, reuse=True)
    levels = np.geomspace(c_min, cap, n_levels)
    steps = max(1, round(2 * np.log2(SPREAD)))                # sizes sqrt(2) apart
    rest = _usable(_near_optimum(theta, levels, sizes, SPREAD, steps), cap, max_tokens)
    more, _, _ = _greedy(S, theta, rest, gs, v0, g_loss, sigma, left,
                         None if max_runs is None else max_runs - len(picked), per_flop=True)
    return _table(picked + more, sd0, theta, sigma)


def _near_optimum(theta, levels, sizes, spread: float, steps: int) -> pd.DataFrame:
    """Candidates at each compute level within 1/spread..spread of the fit's N_opt, its tokens
    per parameter held to TOKENS_PER_PARAM: 2 * steps + 1 log-spaced sizes, or the given sizes
    in that range (the nearest one when none is)."""
    levels = np.asarray(levels, float)
    ln, _ = frontier(np.tile(theta, (levels.size, 1)), levels)
    lo, hi = TOKENS_PER_PARAM
    n_opt = np.clip(np.exp(ln), np.sqrt(levels / 6 / hi), np.sqrt(levels / 6 / lo))
    rows = []
    for c, n0 in zip(levels, n_opt):
        if sizes is None:
            ns = n0 * spread ** (np.arange(-steps, steps + 1) / steps)
        else:
            n = np.unique(np.asarray(sizes, float))
            ns = n[np.abs(np.log(n / n0)) <= np.log(spread) + 1e-9]
            ns = ns if ns.size else n[[np.argmin(np.abs(np.log(n / n0)))]]
        ns = np.round(ns)
        rows += [(ni, np.floor(c / (6 * ni))) for ni in ns]     # 6ND within the level
    df = pd.DataFrame(rows, columns=["n_params", "tokens"])
    df = df[(df["n_params"] >= 1) & (df["tokens"] >= 1)].drop_duplicates()
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
    return _table(picked, sd0, theta, sigma)


