"""Chinchilla approach 3: L(N, D) = E + A / N^alpha + B / D^beta, fitted as Epoch AI did.

Port of Besiroglu et al. 2024 (epoch-research/analyzing-chinchilla): log-sum-exp
parameterisation log L_hat = LSE(a - alpha log N, b - beta log D, e) with A, B, E = exp(a, b, e),
the SUM (not the mean: the mean stopped Hoffmann's optimiser early) of Huber(delta=1e-3) on
log L - log L_hat, and L-BFGS-B from Epoch's grid of starts, keeping the best. To run in about
a second we refine only the grid points with the lowest starting loss (n_refine); each
bootstrap refit screens the same grid on its own resample (n_refine_boot).
Compute-optimal allocation uses C = 6 N D (Hoffmann eq. 4).

tie="alpha=beta" fits L = E + A/N^alpha + B/D^alpha, the form Gadre et al. 2024 and Muennighoff
et al. 2023 fit (one exponent: 4 parameters). Runs far below 20 tokens per parameter (D/N <=
`undertrained`, default 10) are checked by a refit without them: where that moves E, alpha or
beta by more than 5% and those runs sit more than 4 standard errors off the law the others
follow, a warning names them (`fit.undertrained`). Their loss carries more than the law
(warmup, a schedule tuned for longer runs), so they pull the exponents a long extrapolation
rests on; docs/published_studies.md says which runs to fit.
"""
from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from scipy.special import huber

from ._blas import one_blas_thread
from .checks import check_count, check_level, check_xy, fmt_bound
from .fit import bootstrap_indices, huber_loss, percentile_ci
from .profile import profile, profile_interval

NAMES = ("E", "A", "B", "alpha", "beta")
TIES = (None, "alpha=beta")
UNDERTRAINED = 10.0   # tokens per parameter at or below which a run is "far below 20"
PULL = 0.05           # a relative move of E, alpha or beta that counts as a pull

# Epoch's grid (4,500 starts): alpha, beta in {0, .5, .., 2}; e in {-1, -.5, .., 1};
# a, b in {0, 5, .., 25}.
EPOCH_GRID = dict(alpha=np.arange(0, 2.01, 0.5), beta=np.arange(0, 2.01, 0.5),
                  e=np.arange(-1, 1.01, 0.5), a=np.arange(0, 26, 5), b=np.arange(0, 26, 5))


@dataclass(frozen=True)
class ChinchillaLaw:
    """L(N, D) = E + A / N^alpha + B / D^beta, with its compute-optimal frontier."""
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    name: str = ""

    @property
    def params(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in NAMES}

    def predict(self, N, D) -> np.ndarray:
        N, D = np.asarray(N, float), np.asarray(D, float)
        return self.E + self.A * N ** -self.alpha + self.B * D ** -self.beta

    __call__ = predict

    @property
    def G(self) -> float:
        """G = (alpha A / (beta B))^(1/(alpha+beta))."""
        return (self.alpha * self.A / (self.beta * self.B)) ** (1 / (self.alpha + self.beta))

    @property
    def exponents(self) -> tuple[float, float]:
        """(a, b) with N_opt ~ C^a and D_opt ~ C^b:
        a = beta/(alpha+beta), b = alpha/(alpha+beta)."""
        s = self.alpha + self.beta
        return self.beta / s, self.alpha / s

    def n_opt(self, C) -> np.ndarray:
        """Loss-minimising parameter count at compute C (FLOPs, C = 6 N D)."""
        return self.G * (np.asarray(C, float) / 6) ** self.exponents[0]

    def d_opt(self, C) -> np.ndarray:
        """Loss-minimising token count at compute C (FLOPs, C = 6 N D)."""
        return (np.asarray(C, float) / 6) ** self.exponents[1] / self.G

    def tokens_per_param(self, C) -> np.ndarray:
        return self.d_opt(C) / self.n_opt(C)

    def loss_opt(self, C) -> np.ndarray:
        """Loss on the compute-optimal frontier."""
        return self.predict(self.n_opt(C), self.d_opt(C))


@dataclass
class ChinchillaFit:
    """A fitted ChinchillaLaw plus bootstrap samples (`boot`) and percentile CIs (`ci`)."""
    law: ChinchillaLaw
    ci: dict[str, tuple[float, float]]
    boot: pd.DataFrame
    n: int
    level: float
    loss: float
    grad_norm: float
    skipped: int = 0
    failed: int = 0
    profiles: dict = field(default_factory=dict)   # name -> DataFrame(value, stat)
    tie: str | None = None
    undertrained: dict = field(default_factory=dict)   # the leave-them-out check, if it ran

    @property
    def params(self) -> dict[str, float]:
        return self.law.params

    def profile_ci(self) -> dict[str, tuple[float, float, bool]]:
        """name -> (lo, hi, identified) from the profiles (analysis.profile)."""
        return {k: profile_interval(v, self.level) for k, v in self.profiles.items()}

    @property
    def unidentified(self) -> list[str]:
        """Parameters whose profile interval runs to the end of its range."""
        return [k for k, (_, _, ok) in self.profile_ci().items() if not ok]

    def predict(self, N, D) -> np.ndarray:
        return self.law.predict(N, D)

    def n_opt(self, C) -> np.ndarray:
        return self.law.n_opt(C)

    def d_opt(self, C) -> np.ndarray:
        return self.law.d_opt(C)

    def tokens_per_param(self, C) -> np.ndarray:
        return self.law.tokens_per_param(C)

    def interval(self, fn, level: float | None = None) -> tuple[float, float]:
        """Bootstrap percentile interval of a derived scalar, e.g.
        fit.interval(lambda law: law.tokens_per_param(1e19))."""
        level = self.level if level is None else level
        vals = [float(fn(ChinchillaLaw(**row))) for row in self.boot.dropna().to_dict("records")]
        return (float(np.percentile(vals, 50 * (1 - level))),
                float(np.percentile(vals, 50 * (1 + level))))

    def summary(self) -> str:
        lines = [f"L = E + A/N^alpha + B/D^{'alpha' if self.tie else 'beta'}, {self.n} runs, "
                 f"{int(100 * self.level)}% bootstrap CI ({len(self.boot)} resamples; "
                 f"{self.skipped} skipped, {self.failed} failed)"]
        prof = self.profile_ci()
        for k, v in self.params.items():
            lo, hi = self.ci[k]
            line = f"  {k:>5} = {v:.5g}  [{fmt_bound(lo, v)}, {fmt_bound(hi, v)}]"
            if k in prof:
                plo, phi, ok = prof[k]
                line += (f"   profile [{fmt_bound(plo, v)}, {fmt_bound(phi, v)}]"
                         + ("" if ok else "  NOT IDENTIFIED: reaches the end of its range"))
            lines.append(line)
        a, b = self.law.exponents
        lines.append(f"  N_opt ~ C^{a:.4f}, D_opt ~ C^{b:.4f}")
        u = self.undertrained
        if u.get("pulls"):
            lines.append(f"  UNDER-TRAINED RUNS PULL THE FIT: {u['message']}")
        if self.unidentified:
            lines.append(f"  these runs do not pin down {', '.join(self.unidentified)}: any value "
                         f"in the profile interval fits within the {int(100 * self.level)}% "
                         "threshold, so read the other parameters (and N_opt) with it; runs over "
                         "a wider range of N and D/N identify it")
        return "\n".join(lines)


def _objective(theta, lN, lD, lL, delta):
    a, b, e, alpha, beta = theta
    t = np.stack([a - alpha * lN, b - beta * lD, np.full_like(lN, e)])
    m = t.max(axis=0)
    w = np.exp(t - m)
    s = w.sum(axis=0)
    lhat = m + np.log(s)
    w /= s                                                  # softmax shares of the three terms
    f, g = huber_loss(lL - lhat, delta)
    grad = -np.array([g @ w[0], g @ w[1], g @ w[2], -(g * w[0]) @ lN, -(g * w[1]) @ lD])
    return f, grad


def _objective_tied(theta, lN, lD, lL, delta):
    """`_objective` with beta = alpha: theta[4] is ignored (its gradient 0), alpha moves both."""
    t = np.array(theta, float)
    t[4] = t[3]
    f, g = _objective(t, lN, lD, lL, delta)
    g = g.copy()
    g[3] += g[4]
    g[4] = 0.0
    return f, g


def _minimise(x0, lN, lD, lL, delta, objective=_objective):
    r = minimize(objective, x0, args=(lN, lD, lL, delta), jac=True, method="L-BFGS-B",
                 options={"maxiter": 1000, "ftol": 1e-13, "gtol": 1e-10})
    if objective is _objective_tied:
        r.x[4] = r.x[3]
    return r


def _to_law(theta) -> ChinchillaLaw:
    a, b, e, alpha, beta = (float(v) for v in theta)
    return ChinchillaLaw(E=np.exp(e), A=np.exp(a), B=np.exp(b), alpha=alpha, beta=beta)


def _screen(starts, lN, lD, lL, delta, n_refine):
    """The n_refine starts with the lowest initial objective (all of them if n_refine is None).
    The objective of every start is computed at once (vectorised; 4,500 starts in ~10 ms)."""
    if n_refine is None or n_refine >= len(starts):
        return starts
    a, b, e, alpha, beta = (starts[:, i:i + 1] for i in range(5))
    lhat = np.logaddexp(np.logaddexp(a - alpha * lN, b - beta * lD), e)
    f0 = huber(delta, lL - lhat).sum(axis=1)
    return starts[np.argsort(f0, kind="stable")[:n_refine]]


def _best_of(starts, lN, lD, lL, delta, objective=_objective):
    """L-BFGS-B from each start; the best finite result (None if none is finite)."""
    best = None
    for start in starts:
        r = _minimise(start, lN, lD, lL, delta, objective)
        if np.all(np.isfinite(r.x)) and (best is None or r.fun < best.fun):
            best = r
    return best


@one_blas_thread()
def fit_chinchilla(N, D, L, *, delta: float = 1e-3, grid: dict | None = None,
                   n_refine: int | None = 64, n_refine_boot: int | None = 4,
                   n_boot: int = 200, seed: int = 0, level: float = 0.95,
                   groups=None, profile_params=("E", "alpha", "beta"), tie: str | None = None,
                   undertrained: float | None = UNDERTRAINED) -> ChinchillaFit:
    """Fit L = E + A/N^alpha + B/D^beta (Chinchilla approach 3, Epoch's procedure).

    N: parameters (total by default in this package, see analysis.results), D: tokens, L: loss.
    grid: starting values, a dict of arrays with keys a, b, e, alpha, beta (default EPOCH_GRID,
        4,500 starts). n_refine: run L-BFGS-B from the n_refine starts with the lowest initial
        objective (default 64, ~1 s); n_refine=None runs every start, exactly as Epoch did.
    Bootstrap refits are full fits from the same grid, screened on each resample to its
    n_refine_boot best starts; resamples with one distinct N or D are skipped, refits that do
    not converge are counted as failed (`.skipped`, `.failed`). Needs D/N to vary (several
    token budgets per
    size), else B and beta are unidentifiable.
    profile_params: parameters to profile (analysis.profile; () skips it, ~1 s): the summary
    prints their profile intervals beside the bootstrap's and names any the runs cannot pin.
    tie: None, or "alpha=beta" for L = E + A/N^alpha + B/D^alpha (Gadre et al., Muennighoff
    et al.): beta is reported equal to alpha in every refit.
    undertrained: the runs at D/N <= this many tokens per parameter are refitted without
    (module docstring); a warning names them if E, alpha or beta move (`.undertrained`);
    None skips the check.
    """
    N, L = check_xy(N, L, "N", "L")
    D, _ = check_xy(D, L, "D", "L")
    level, n_boot = check_level(level), check_count(n_boot)
    if N.size < 5:
        raise ValueError(f"need at least 5 runs to fit 5 parameters, got {N.size}")
    if np.unique(N).size < 2 or np.unique(D).size < 2:
        raise ValueError("N and D must each take at least 2 distinct values")
    if len(set(zip(N, D))) < 5:
        raise ValueError(f"only {len(set(zip(N, D)))} distinct (N, D) pairs: repeated seeds do "
                         "not add shape information, and 5 parameters need 5; add runs")
    if np.linalg.matrix_rank(np.c_[np.ones_like(N), np.log(N), np.log(D)], tol=1e-6) < 3:
        raise ValueError(f"tokens per parameter D/N is the same for every run "
                         f"({np.median(D / N):.3g}), so N and D move together and alpha and "
                         "beta (A and B) cannot be told apart; add runs at other D/N "
                         "(e.g. an isoFLOP grid)")
    if tie not in TIES:
        raise ValueError(f"tie={tie!r}: use None (five parameters) or 'alpha=beta' (one "
                         "exponent for N and D, as Gadre et al. and Muennighoff et al. fit)")
    if tie and profile_params:
        profile_params = tuple(p for p in profile_params if p != "beta")   # beta is alpha
    bad = sorted(set(profile_params) - {"E", "alpha", "beta"})
    if bad:
        raise ValueError(f"profile_params: unknown {bad}; choose from E, alpha, beta")
    g = EPOCH_GRID if grid is None else grid
    if not isinstance(g, dict) or set(g) != {"a", "b", "e", "alpha", "beta"}:
        raise ValueError(f"grid: expected a dict with keys a, b, e, alpha, beta, got {grid!r}")
    lN, lD, lL = np.log(N), np.log(D), np.log(L)
    starts = np.array(list(itertools.product(*(np.atleast_1d(g[k]) for k in
                                               ("a", "b", "e", "alpha", "beta")))), float)
    objective = _objective
    if tie:
        objective = _objective_tied
        starts = np.unique(starts[starts[:, 3] == starts[:, 4]], axis=0)
    best = _best_of(_screen(starts, lN, lD, lL, delta, n_refine), lN, lD, lL, delta, objective)
    if best is None:
        raise ValueError("the Chinchilla fit found no finite optimum from any start; "
                         "check the runs for outliers or pass a wider grid")

    rows, skipped, failed = [], 0, 0
    for idx in bootstrap_indices(N.size, n_boot, seed, groups):
        if np.unique(lN[idx]).size < 2 or np.unique(lD[idx]).size < 2:
            skipped += 1                                   # alpha or beta not identifiable
            continue
        # A full refit: the same grid of starts as the main fit, screened on the resample.
        grid = _screen(starts, lN[idx], lD[idx], lL[idx], delta, n_refine_boot)
        r = _best_of(grid, lN[idx], lD[idx], lL[idx], delta, objective)
        if r is None or not r.success:
            failed += 1
            continue
        rows.append(tuple(_to_law(r.x).params.values()))
    boot = pd.DataFrame(rows, columns=list(NAMES), dtype=float)
    profs = profile(best.x, objective, (lN, lD, lL, delta), tuple(profile_params),
                    level=level) if profile_params else {}
    law, ci = _to_law(best.x), percentile_ci(boot, level)
    under = {}
    if undertrained is not None:
        under = _undertrained(N, D, lL, law, undertrained, starts, delta, n_refine, objective)
        if under.get("pulls"):
            warnings.warn(f"fit_chinchilla: {under['message']}", UserWarning, stacklevel=3)
    return ChinchillaFit(law=law, ci=ci, boot=boot, n=N.size,
                         level=level, loss=float(best.fun),
                         grad_norm=float(np.linalg.norm(best.jac)),
                         skipped=skipped, failed=failed, profiles=profs, tie=tie,
                         undertrained=under)


def _undertrained(N, D, lL, law, threshold, starts, delta, n_refine, objective) -> dict:
    """The runs at D/N <= threshold, refitted without: {runs, law (without them), z (their
    mean log residual under that law over its standard error, the kept runs' scatter / sqrt
    of their number), moved (E, alpha, beta that moved by more than PULL), pulls (moved and
    |z| > 4: they disagree with the law the others follow, and move it), message}. Empty if
    there are none, or too few runs are left to refit."""
    low = np.flatnonzero(D / N <= threshold)
    keep = np.setdiff1d(np.arange(N.size), low)
    if not low.size or keep.size < 6 or np.unique(N[keep]).size < 2 \
            or np.unique(D[keep]).size < 2 \
            or np.linalg.matrix_rank(np.c_[np.ones(keep.size), np.log(N[keep]),
                                           np.log(D[keep])], tol=1e-6) < 3:
        return {}
    lN, lD = np.log(N[keep]), np.log(D[keep])
    r = _best_of(_screen(starts, lN, lD, lL[keep], delta, n_refine), lN, lD, lL[keep], delta,
                 objective)
    if r is None:
        return {}
    out = _to_law(r.x)
    res_keep = lL[keep] - np.log(out(N[keep], D[keep]))
    scatter = np.sqrt(res_keep @ res_keep / (keep.size - 5))
    z = float(np.mean(lL[low] - np.log(out(N[low], D[low]))) / (scatter / np.sqrt(low.size)))
    moved = [f"{k} {law.params[k]:.4g} -> {out.params[k]:.4g}" for k in ("E", "alpha", "beta")
             if abs(out.params[k] - law.params[k]) > PULL * abs(law.params[k])]
    pulls = bool(moved) and abs(z) > 4
    runs = [f"{N[i]:.3g}/{D[i]:.3g}" for i in low]
    msg = (f"{low.size} run(s) at <= {threshold:g} tokens per parameter (N/D "
           f"{', '.join(runs[:6])}{' ...' if len(runs) > 6 else ''}) pull the fit: without "
           f"them {'; '.join(moved)}, and their loss sits {abs(z):.1f} standard errors "
           f"{'above' if z > 0 else 'below'} the law the other runs follow. To extrapolate, "
           "fit without them (docs/published_studies.md)") if pulls else ""
    return {"runs": low.tolist(), "law": out, "z": z, "moved": moved, "pulls": pulls,
            "message": msg}
