"""Approach 2 (and 1 and 3) on a family of simulated isoFLOP studies it was not built on.

Every cell is one study design, drawn `--reps` times (analysis.simulate.isoflop_study):
  law     Hoffmann's fit (unrounded: alpha 0.34, beta 0.28, a = 0.46), and two lopsided laws,
          alpha 0.20 / beta 0.50 (a = 0.71: loss climbs much faster on the large-N side)
          and alpha 0.50 / beta 0.20 (a = 0.29: faster on the small-N side);
  decades the width of each budget's grid in log10 N: 0.5, 1 or 2;
  sizes   model sizes per budget: 3, 7 or 15;
  noise   run-to-run scatter of the loss: 0.5% or 2% (log-normal);
  edges   budgets whose grid misses the optimum (it lies 0-0.3 decades beyond an end): 0 or 3.
8 budgets from 1e17 to 1e20 FLOPs. The grids drift against the optimum as a fixed set of
sizes does (the optimum at 20% of the grid at one end of the budgets, 80% at the other) and
jitter by a sixth of their width.
Per cell and estimator: `bias`, the median of a_hat - a over the studies (a robust centre:
a study whose noise hides a budget's curvature gives a far-off a_hat); `mad`, the median
|a_hat - a|; `cover`, the share of 95% intervals that contain the true a; `refused`, the share
of studies where the estimator raised (fewer than 2 usable budgets) or gave no interval.
Targets (issue 39): |bias| <= 0.01 and cover >= 0.90 in every cell.

    python bench/isoflop.py                          # approach 2, before and after (~4 min)
    python bench/isoflop.py --reps 60 --only law=a0.71 --only noise=0.02
    python bench/isoflop.py --approach 1 --reps 30   # the training-curve envelope
    python bench/isoflop.py --approach 3 --reps 20   # Chinchilla's L(N, D) fit (slow)
    python bench/isoflop.py --porian ../shared/data/external/porian2024_isoflops.csv
                                   # the published study: a per setting against the paper's
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
from analysis import CHINCHILLA_UNROUNDED, ChinchillaLaw, fit_chinchilla, fit_isoflop  # noqa: E402
from analysis.envelope import envelope_fit  # noqa: E402
from analysis.simulate import isoflop_study  # noqa: E402

LAWS = {"a0.46": CHINCHILLA_UNROUNDED,
        "a0.71": ChinchillaLaw(E=1.8, A=300.0, B=3000.0, alpha=0.2, beta=0.5),
        "a0.29": ChinchillaLaw(E=1.8, A=3000.0, B=300.0, alpha=0.5, beta=0.2)}
AXES = {"law": list(LAWS), "decades": [0.5, 1.0, 2.0], "sizes": [3, 7, 15],
        "noise": [0.005, 0.02], "edges": [0, 3]}
BUDGETS = np.logspace(17, 20, 8)


def approach2(df, window, keep_edges):
    fit = fit_isoflop(df, window=window, keep_edges=keep_edges)
    return fit.a, *fit.ci["a"]


def approach1(df, law, noise, rng):
    """Each run's training curve as if every step were a finished run of that many tokens
    (a constant LR, or WSD branches): the best case for the envelope."""
    rows = []
    for r in df.itertuples():
        d = r.D * np.geomspace(0.05, 1, 24)
        loss = law(r.N, d) * np.exp(rng.normal(0, noise) + rng.normal(0, noise / 4, d.size))
        rows.append(pd.DataFrame({"run_id": r.Index, "N": r.N, "C": 6 * r.N * d, "D": d,
                                  "loss": loss}))
    fit = envelope_fit(pd.concat(rows, ignore_index=True), n_boot=100)
    return fit.a, *fit.ci.get("a", (np.nan, np.nan))


def approach3(df, n_boot):
    fit = fit_chinchilla(df["N"], df["D"], df["loss"], n_refine=8, n_refine_boot=2,
                         n_boot=n_boot, profile_params=())
    a = fit.law.exponents[0]
    if n_boot == 0:
        return a, np.nan, np.nan
    lo, hi = fit.interval(lambda law: law.exponents[0])
    return a, lo, hi


def run_cell(cell: dict, reps: int, approach: int, n_boot: int) -> list[dict]:
    law = LAWS[cell["law"]]
    truth = law.exponents[0]
    estimators = {2: {"before": lambda d, r: approach2(d, None, True),
                      "after": lambda d, r: approach2(d, 5, False),
},
                  1: {"envelope": lambda d, r: approach1(d, law, cell["noise"], r)},
                  3: {"L(N,D)": lambda d, r: approach3(d, n_boot)}}[approach]
    out = {k: [] for k in estimators}
    for rep in range(reps):
        rng = np.random.default_rng([rep, *map(hash_cell, cell.values())])
        df = isoflop_study(law, BUDGETS, decades=cell["decades"], sizes=cell["sizes"],
                           noise=cell["noise"], edges=cell["edges"], seed=rng)
        for name, est in estimators.items():
            try:
                out[name].append(est(df, rng))
            except ValueError:
                out[name].append((np.nan, np.nan, np.nan))
    rows = []
    for name, res in out.items():
        r = np.array(res, float)
        ok = np.isfinite(r[:, 0])
        err = r[ok, 0] - truth
        has_ci = ok & np.isfinite(r[:, 1])
        boot = np.random.default_rng(0).choice(err, (200, err.size)) if err.size else err
        rows.append({**cell, "estimator": name,
                     "bias": float(np.median(err)) if ok.any() else np.nan,
                     "bias_se": float(np.std(np.median(boot, axis=1))) if ok.any() else np.nan,
                     "mad": float(np.median(np.abs(err))) if ok.any() else np.nan,
                     "cover": float(np.mean((r[has_ci, 1] <= truth) & (truth <= r[has_ci, 2])))
                     if has_ci.any() else np.nan,
                     "refused": float(1 - has_ci.mean()) if approach != 3 or n_boot else
                     float(1 - ok.mean())})
    return rows


def hash_cell(v) -> int:
    """A stable integer for a cell's value (Python's hash of a str changes per process)."""
    return int.from_bytes(str(v).encode(), "little") % (2 ** 32)


def porian(path: str) -> int:
    """Porian et al. 2024's 11 settings: a before/after against the published 95% interval
    (a miss is more than 0.01 outside it, as the issue counts)."""
    df = pd.read_csv(path, comment="#").rename(columns={"budget_flops": "budget"})
    df["C"] = df["budget"]
    rows = []
    for setting, g in df.groupby("setting", sort=False):
        pub = g[["pub_a", "pub_lo", "pub_hi"]].iloc[0].to_numpy()
        row = {"setting": setting, "runs": len(g), "budgets": g["budget"].nunique(),
               "published": f"{pub[0]:.3f} [{pub[1]:.3f}, {pub[2]:.3f}]"}
        for name, kw in (("before", dict(window=None, keep_edges=True)), ("after", {})):
            fit = fit_isoflop(g, **kw)
            inside = pub[1] - 0.01 <= fit.a <= pub[2] + 0.01
            row[name] = (f"{fit.a:.3f} [{fit.ci['a'][0]:.3f}, {fit.ci['a'][1]:.3f}] "
                         f"{len(fit.used)}/{len(fit.minima)} {'ok' if inside else 'MISS'}")
        rows.append(row)
    t = pd.DataFrame(rows)
    print(t.to_string(index=False))
    for name in ("before", "after"):
        print(f"{name}: within 0.01 of the published interval in "
              f"{t[name].str.endswith('ok').sum()} of {len(t)} settings")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=200, help="studies per cell (default 200)")
    ap.add_argument("--approach", type=int, choices=(1, 2, 3), default=2)
    ap.add_argument("--n-boot", type=int, default=0,
                    help="approach 3's bootstrap refits per study (0: bias only; 40 ~ 3 s)")
    ap.add_argument("--only", action="append", default=[], metavar="KEY=V[,V]",
                    help=f"a slice of the family; KEY one of {', '.join(AXES)}")
    ap.add_argument("--out", help="write the table as CSV here")
    ap.add_argument("--porian", metavar="CSV", help="instead: the published study in this file")
    args = ap.parse_args(argv)
    if args.porian:
        return porian(args.porian)
    axes = dict(AXES)
    for text in args.only:
        key, _, vals = text.partition("=")
        if key not in axes:
            ap.error(f"--only {text!r}: KEY must be one of {', '.join(axes)}")
        want = vals.split(",")
        axes[key] = [v for v in axes[key] if str(v) in want]
        if not axes[key]:
            ap.error(f"--only {text!r}: no {key} among {AXES[key]}")
    warnings.simplefilter("ignore")
    t0, rows = time.time(), []
    cells = [dict(zip(axes, v)) for v in itertools.product(*axes.values())]
    for i, cell in enumerate(cells):
        rows += run_cell(cell, args.reps, args.approach, args.n_boot)
        print(f"\r{i + 1}/{len(cells)} cells, {time.time() - t0:.0f} s", end="", file=sys.stderr)
    print(file=sys.stderr)
    table = pd.DataFrame(rows)
    if args.out:
        table.to_csv(args.out, index=False)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 500)
    wide = table.pivot_table(index=list(axes), columns="estimator",
                             values=["bias", "cover", "refused"], sort=False)
    print(wide.round(3).to_string())
    for name, g in table.groupby("estimator", sort=False):
        bad_bias = g[g["bias"].abs() > 0.01]
        bad_cover = g[g["cover"] < 0.90]
        # beyond sampling error: the median's bootstrap se, the binomial se of the coverage
        sure_bias = g[g["bias"].abs() - 2 * g["bias_se"] > 0.01]
        n_ci = args.reps * (1 - g["refused"])
        sure_cover = g[g["cover"] + 2 * np.sqrt(0.9 * 0.1 / n_ci.clip(lower=1)) < 0.90]
        both = ((g["bias"].abs() <= 0.01) & (g["cover"] >= 0.90)).sum()
        print(f"\n{name}: {len(g)} cells, both targets met in {both}; |bias| > 0.01 in "
              f"{len(bad_bias)} ({len(sure_bias)} beyond 2 se), coverage < 0.90 in "
              f"{len(bad_cover)} ({len(sure_cover)} beyond 2 se); worst bias "
              f"{g['bias'].abs().max():.3f}, lowest coverage {g['cover'].min():.2f}, refused up "
              f"to {g['refused'].max():.0%}")
    print(f"{args.reps} studies a cell, {time.time() - t0:.0f} s; load "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
