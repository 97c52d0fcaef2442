"""Does `analysis.suggest_runs` beat an isoFLOP grid on studies it was not tuned on? A family.

Every cell of the family is one simulated study design:
  law     Hoffmann's fit (unrounded), Epoch's refit, and a Llama-3-like law with
          alpha = beta = 0.31 (40 tokens per parameter at every compute);
  noise   0.5% or 2% log-normal run-to-run scatter of the loss;
  start   the runs already trained: 4 or 10 runs at small (1e-3 and 3e-3 of the grid's largest
          budget) or medium compute (1e-2 and 3e-2), spread over D/N;
  target  the compute to forecast, 30x or 1000x the grid's largest budget (1e18 FLOPs, 6ND).
In each study (start runs, then one of):
  grid     an isoFLOP grid centred on the TRUE optimum: 1e17, 3.2e17, 1e18 FLOPs x
           N_opt x 1/4 .. 4 (15 runs, 7.1e18 FLOPs);
  one-shot one `suggest_runs` call with half the grid's compute, no run above 1e18;
  rounds   the same compute in 3 rounds (suggest, train, refit, suggest...).
Every design is then read the same way: `fit_ls` (least squares on log L) and its 95%
fixed-design bootstrap interval (100 refits) of the compute-optimal loss at the target.
The table: per cell, the median |relative error| of that forecast for the grid and both uses
of the planner, the planner's compute as a share of the grid's, its interval coverage, and
`ok` when the planner's median error is at most the grid's (both uses). A planner that refuses
a cell (an error) is counted as failing it. `--planner before` is the planner as it was
(notebook 05's bootstrap-covariance criterion), `after` is `suggest_runs`' default.

    python bench/design.py                     # the whole family, 2 seeds a cell
    python bench/design.py --seeds 6           # steadier medians (3x the time)
    python bench/design.py --quick             # 4 corner cells x 2 seeds (a CI-size check)
    python bench/design.py --planner before    # the same family with the old planner
"""
from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import sys
import time
import warnings

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from analysis import CHINCHILLA_UNROUNDED, EPOCH, ChinchillaLaw  # noqa: E402
from analysis.design import fit_ls, predict_loss_opt, suggest_runs  # noqa: E402

# alpha = beta = 0.31 (Llama 3's isoFLOPs give N_opt ~ C^0.5); B / A = 40^0.31: D/N = 40.
LLAMA_LIKE = ChinchillaLaw(E=1.8, A=250.0, B=250.0 * 40 ** 0.31, alpha=0.31, beta=0.31,
                           name="Llama-3-like (alpha = beta = 0.31)")
LAWS = {"Hoffmann": CHINCHILLA_UNROUNDED, "Epoch": EPOCH, "Llama3-like": LLAMA_LIKE}
TOP = 1e18                                        # the grid's largest budget
GRID_BUDGETS = (TOP / 10, TOP / np.sqrt(10), TOP)
STARTS = {"small-4": ((1e-3, 3e-3), (8, 64)), "small-10": ((1e-3, 3e-3), (4, 10, 25, 60, 150)),
          "medium-4": ((1e-2, 3e-2), (8, 64)), "medium-10": ((1e-2, 3e-2), (4, 10, 25, 60, 150))}
NOISES = (0.005, 0.02)
TARGETS = (30, 1000)
ROUNDS = 3
# The family includes the short reaches suggest_runs warns about: the table is the measurement.
warnings.filterwarnings("ignore", message="target_flops=.* the largest run", category=UserWarning)
PLANNERS = {"before": dict(method="bootstrap", objective="loss", n_boot=400, seed=0),
            "after": {}}


def start_runs(name):
    levels, ratios = STARTS[name]
    return [(np.sqrt(f * TOP / 6 / r), np.sqrt(f * TOP / 6 * r)) for f in levels for r in ratios]


def grid_runs(law):
    out = []
    for c in GRID_BUDGETS:
        n0 = float(law.n_opt(c))
        out += [(n0 * f, c / (6 * n0 * f)) for f in (0.25, 0.5, 1, 2, 4)]
    return out


def cells(quick: bool):
    every = list(itertools.product(LAWS, STARTS, NOISES, TARGETS))
    if quick:     # the corners: fewest, smallest start runs and most noise; the largest start
        return [c for c in every if (c[1], c[2]) in (("small-4", 0.02), ("medium-10", 0.005))
                and c[0] != "Hoffmann" and c[3] == 1000]
    return every


def one_study(args):
    cell_id, (law_name, start, noise, mult), study, planner, n_boot = args
    law = LAWS[law_name]
    rng = np.random.default_rng([cell_id, study])
    target = mult * TOP
    truth = float(law.loss_opt(target))

    def train(runs):
        n, d = np.array(runs, float).reshape(-1, 2).T
        return pd.DataFrame({"n_params": n, "tokens": d,
                             "val_loss": law(n, d) * np.exp(noise * rng.standard_normal(n.size))})

    seed = train(start_runs(start))
    grid = train(grid_runs(law))
    budget = 0.5 * float((6 * grid["n_params"] * grid["tokens"]).sum())
    designs = {"grid": pd.concat([seed, grid], ignore_index=True)}
    for use, rounds in (("one-shot", 1), ("rounds", ROUNDS)):
        runs = seed
        try:
            for _ in range(rounds):
                s = suggest_runs(runs, target, budget / rounds, max_run_flops=TOP,
                                 **PLANNERS[planner])
                runs = pd.concat([runs, train(list(zip(s["n_params"], s["tokens"])))],
                                 ignore_index=True)
            designs[use] = runs
        except (ValueError, np.linalg.LinAlgError) as e:
            designs[use] = str(e).splitlines()[0]
    out = []
    for design, df in designs.items():
        row = dict(cell=cell_id, law=law_name, start=start, noise=noise, target=mult,
                   design=design, study=study, grid_flops=2 * budget)
        if isinstance(df, str):
            out.append(dict(row, err=np.nan, covered=False, flops=np.nan, refused=df))
            continue
        theta, boot = fit_ls(df["n_params"], df["tokens"], df["val_loss"], n_boot=n_boot,
                             seed=study, resample="residuals")
        pred, lo, hi = predict_loss_opt(theta, boot, target)
        extra = df.iloc[len(seed):]
        out.append(dict(row, err=pred / truth - 1, covered=bool(lo <= truth <= hi),
                        runs=len(extra), refused="",
                        flops=float((6 * extra["n_params"] * extra["tokens"]).sum())))
    return out


def table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: median |error| (%) per design, the planner's compute share and
    coverage (%), and ok (each use's median error <= the grid's, nothing refused)."""
    keys = ["law", "start", "noise", "target"]
    med = df.groupby(keys + ["design"], sort=False)["err"].apply(
        lambda e: 100 * np.median(np.abs(e)) if e.notna().all() else np.nan).unstack()
    plan = df[df["design"] != "grid"]
    out = med[["grid", "one-shot", "rounds"]].copy()
    out["share"] = 100 * (plan["flops"] / plan["grid_flops"]).groupby(
        [plan[k] for k in keys], sort=False).max()
    out["cover"] = 100 * plan.groupby(keys, sort=False)["covered"].mean()
    out["ok"] = (out["one-shot"] <= out["grid"]) & (out["rounds"] <= out["grid"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=2, help="studies per cell")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds first-seed .. first-seed + seeds - 1 (more seeds in a later run)")
    ap.add_argument("--quick", action="store_true", help="4 corner cells only")
    ap.add_argument("--planner", choices=tuple(PLANNERS), default="after")
    ap.add_argument("--n-boot", type=int, default=100, help="the interval's bootstrap refits")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--csv", help="also write every study's row here")
    a = ap.parse_args(argv)
    seeds = a.seeds
    jobs = [(i, c, s, a.planner, a.n_boot) for i, c in enumerate(cells(a.quick))
            for s in range(a.first_seed, a.first_seed + seeds)]
    t0 = time.time()
    rows = []
    with mp.get_context("fork").Pool(a.procs) as pool:
        for i, rs in enumerate(pool.imap_unordered(one_study, jobs)):
            rows += rs
            print(f"\r{i + 1}/{len(jobs)} studies, {time.time() - t0:.0f} s", end="",
                  file=sys.stderr, flush=True)
            if a.csv:                             # every study so far: a partial run survives
                pd.DataFrame(rows).to_csv(a.csv, index=False)
    print(file=sys.stderr)
    df = pd.DataFrame(rows).sort_values(["cell", "study", "design"])
    t = table(df)
    print(f"planner {a.planner!r} ({PLANNERS[a.planner] or 'suggest_runs defaults'}); forecast "
          f"of the compute-optimal loss at target x {TOP:.0e}; median |error| (%) over "
          f"{seeds} seeds a cell; share: the planner's compute / the grid's (%), the largest "
          f"study's; cover: the planner's 95% intervals covering the truth (%), both uses")
    print(t.to_string(float_format=lambda v: f"{v:.2f}"))
    plan = df[df["design"] != "grid"]
    refused = plan[plan["refused"] != ""]
    grid_cover = 100 * df[df["design"] == "grid"]["covered"].mean()
    print(f"cells ok: {int(t['ok'].sum())} of {len(t)}; coverage over the family: "
          f"{100 * plan['covered'].mean():.1f}% (grid {grid_cover:.1f}%); "
          f"refused: {len(refused)} of {len(plan)} plans"
          + (f" (e.g. {refused['refused'].iloc[0]!r})" if len(refused) else ""))
    print(f"{len(jobs)} studies in {time.time() - t0:.0f} s with {a.procs} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
