"""analysis.compare on simulated ladders with known compute multipliers: bias and coverage.

Every cell is one pair of ladders, drawn `--reps` times (analysis.simulate.recipe_ladders):
  law     recipe A's law: "cerebras" (the published Cerebras-GPT law, b = 0.0737, c = 0.507,
          over its ladder's 3.9 decades, 2.6e18..2.3e22 FLOPs) or "steep" (b = 0.25, c = 2.0,
          over 2 decades, 1e12..1e14: a CPU ladder's shape);
  truth   "scaled": B is A with its compute scaled, L_B(C) = L_A(m C), so m is the same at
          every compute; "offset": B differs from A only in its asymptote c, chosen so that m
          is the target at the top of the ladder (and changes with compute: a case the shared
          law is not built for);
  m       the multiplier at the top of the ladder: 1.0, 1.2 or 2.0;
  noise   run-to-run scatter: 0.5% or 2% (log-normal);
  sizes   budgets per ladder: 4 or 8 (log-spaced); seeds: runs per budget, 1 or 2.
Each fit is read at two computes (`at`): the top of the ladder, and 100x beyond it (the
truth there: m for "scaled", A's law solved for B's loss for "offset", inf where B's loss is
below A's asymptote). Settings: auto (the default), separate, shared (b and c), fixed-c
(shared b, c held at A's true c; "scaled" only).
Per cell, setting and `at`: `bias`, exp(median log(m_hat / m)) - 1 (a robust centre on the
multiplier's natural log scale), with `bias_se` its bootstrap standard error over the pairs;
`cover`, the share of 95% intervals holding the true m; `width`, the median hi / lo; `inf`,
the share of m_hat = inf; `shared`, the share of pairs where auto chose one law.
Targets: |bias| <= 2% at the top (issue 39) and <= 5% at 100x ("scaled", issue 48), cover
>= 90% in every cell.

    python bench/compare.py                          # the family, 40 ladders a cell
    python bench/compare.py --reps 20 --only law=steep --only noise=0.02
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
import warnings

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from analysis import PowerLaw  # noqa: E402
from analysis.multiplier import compare  # noqa: E402
from analysis.simulate import recipe_ladders  # noqa: E402

LAWS = {"cerebras": (PowerLaw.from_scale(5.984e22, 0.0737, 0.5066), (2.6e18, 2.3e22)),
        "steep": (PowerLaw(A=2.0 * 1e13 ** 0.25, b=0.25, c=2.0), (1e12, 1e14))}
BEYOND = 100.0   # the second `at`: this many times the top of the ladder
TARGET_BIAS = {"top": 0.02, "100x": 0.05}
AXES = {"law": list(LAWS), "truth": ["scaled", "offset"], "m": [1.0, 1.2, 2.0],
        "noise": [0.005, 0.02], "sizes": [4, 8], "seeds": [1, 2]}
SETTINGS = {"auto": dict(),
            "separate": dict(exponent="separate"),
            "shared": dict(exponent="shared", asymptote="shared"),
            "fixed-c": dict(exponent="shared", asymptote="true")}


def law_b(cell: dict):
    law, (lo, hi) = LAWS[cell["law"]]
    m = cell["m"]
    if cell["truth"] == "scaled":
        return lambda C: law(m * np.asarray(C, float))
    # B = A + dc: A at m * hi reaches B's loss at hi
    return PowerLaw(A=law.A, b=law.b, c=law.c + float(law(m * hi) - law(hi)))


def true_m(cell: dict, at: float) -> float:
    """The multiplier the truth has at compute `at` (inf: B's loss below A's asymptote)."""
    law, _ = LAWS[cell["law"]]
    if cell["truth"] == "scaled":
        return cell["m"]
    reducible = float(law_b(cell)(at)) - law.c
    return float(np.exp(np.log(reducible / law.A) / -law.b) / at) if reducible > 0 else np.inf


def run_cell(cell: dict, reps: int, n_boot: int) -> list[dict]:
    law, (lo, hi) = LAWS[cell["law"]]
    lb = law_b(cell)
    compute = np.geomspace(lo, hi, cell["sizes"])
    ats = {"top": hi, "100x": hi * BEYOND}
    out = {k: [] for k in SETTINGS}
    for rep in range(reps):
        rng = np.random.default_rng([rep, *map(hash_cell, cell.values())])
        a, b = recipe_ladders(law, lb, compute, noise=cell["noise"], seeds=cell["seeds"],
                              seed=rng)
        for name, kw in SETTINGS.items():
            if kw.get("asymptote") == "true":   # the asymptote known: A's own c
                if cell["truth"] != "scaled":   # the two recipes' c differ: nothing to fix
                    continue
                kw = {**kw, "asymptote": law.c}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    r = compare(a, b, at=hi, n_boot=n_boot, seed=rep, **kw)
            except ValueError:
                out[name].append(None)
                continue
            x = np.array(list(ats.values()))
            lo_, hi_ = r.interval(x)
            out[name].append((r.multiplier_at(x), lo_, hi_,
                              r.choice is not None and r.choice.law == "shared"))
    return [row for name, res in out.items() if res
            for k, (where, at) in enumerate(ats.items())
            for row in [_row(cell, name, where, true_m(cell, at), res, k)]]


def _row(cell: dict, name: str, where: str, m: float, res: list, k: int) -> dict:
    """One (cell, setting, at) row of the table from the reps' results at column k."""
    got = [r for r in res if r is not None]
    r = np.array([(g[0][k], g[1][k], g[2][k]) for g in got], float).reshape(-1, 3)
    row = {**cell, "setting": name, "at": where, "m_true": m,
           "refused": float(1 - len(got) / len(res)),
           "shared": float(np.mean([g[3] for g in got])) if got else np.nan}
    if not got:
        return row
    cover = (r[:, 1] <= m) & (m <= r[:, 2])
    if np.isfinite(m):
        lr = np.log(r[:, 0] / m)
        boot = np.median(np.random.default_rng(0).choice(lr, (200, lr.size)), axis=1)
        with np.errstate(invalid="ignore"):     # an infinite median (m_hat = inf): se nan
            bias, se = float(np.exp(np.median(lr)) - 1), float(np.std(np.exp(boot) - 1))
    else:
        bias = se = np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        width = float(np.nanmedian(np.where(r[:, 1] > 0, r[:, 2] / r[:, 1], np.inf)))
    return row | dict(bias=bias, bias_se=se, cover=float(np.mean(cover)), width=width,
                      inf=float(np.mean(np.isinf(r[:, 0]))))


def hash_cell(v) -> int:
    """A stable integer for a cell's value (Python's hash of a str changes per process)."""
    return int.from_bytes(str(v).encode(), "little") % (2 ** 32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=40, help="ladder pairs per cell")
    ap.add_argument("--n-boot", type=int, default=400, help="bootstrap resamples per fit")
    ap.add_argument("--only", action="append", default=[], metavar="AXIS=VALUE",
                    help="keep only cells with this value (repeatable)")
    ap.add_argument("--csv", help="also write the table here")
    args = ap.parse_args()
    axes = dict(AXES)
    for o in args.only:
        k, _, v = o.partition("=")
        if k not in axes:
            ap.error(f"--only {o}: the axes are {list(axes)}")
        axes[k] = [x for x in axes[k] if str(x) == v]
    t0 = time.time()
    rows = []
    for values in itertools.product(*axes.values()):
        rows += run_cell(dict(zip(axes, values)), args.reps, args.n_boot)
    df = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.csv:
        df.to_csv(args.csv, index=False)
    se_cover = np.sqrt(0.9 * 0.1 / args.reps)
    target = df["at"].map(TARGET_BIAS)
    met = ((df["bias"].abs() <= target) | df["bias"].isna()) & (df["cover"] >= 0.90)
    # a miss the simulation can tell from its own scatter: beyond 2 standard errors
    bias_miss = df["bias"].abs() - target > 2 * df["bias_se"]
    cover_miss = 0.90 - df["cover"] > 2 * se_cover
    for (where, truth, name), g in df.groupby(["at", "truth", "setting"], sort=False):
        print(f"at={where:<4} truth={truth:<7} {name:<9} targets met in "
              f"{int(met[g.index].sum())}/{len(g)} cells; misses beyond 2 se: bias "
              f"{int(bias_miss[g.index].sum())}, coverage {int(cover_miss[g.index].sum())}; "
              f"|bias| median {g['bias'].abs().median():.3f} max {g['bias'].abs().max():.3f}, "
              f"cover min {g['cover'].min():.2f} median {g['cover'].median():.2f}, "
              f"width median {g['width'].median():.3g}")
    print(f"{len(df)} rows, {args.reps} ladder pairs a cell, {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
