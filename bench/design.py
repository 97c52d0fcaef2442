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
`ok` when the planner's median error is at most the grid's (both uses), `worse` the studies
(of 2 x seeds plans) whose error exceeded the grid's in the same study, `warn USE` the share of
that use's plans where suggest_runs warned, and `lost unwarned` a use above the grid that never
warned (or a refusal). A planner that refuses a cell (an error) fails it. Planners:
`nb05` notebook 05's bootstrap-covariance criterion, `after` `suggest_runs`' default. Several
planners in one run (`--planner nb05,after`) share each study's start runs and grid draws; each
use of a planner draws its runs' noise from its own stream, so a planner's numbers do not
depend on the others run.

    python bench/design.py                     # the whole family, 2 seeds a cell
    python bench/design.py --seeds 6           # steadier medians (3x the time)
    python bench/design.py --quick             # 4 corner cells x 2 seeds (a CI-size check)
    python bench/design.py --only start=small-10 --only target=1000   # a slice of the family
    python bench/design.py --planner nb05,after  # two planners on the same studies
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
PLANNERS = {"nb05": dict(method="bootstrap", objective="loss", n_boot=400, seed=0),
            "after": {}}
USES = (("one-shot", 1), ("rounds", ROUNDS))
KEYS = ["law", "start", "noise", "target"]


def start_runs(name):
    levels, ratios = STARTS[name]
    return [(np.sqrt(f * TOP / 6 / r), np.sqrt(f * TOP / 6 * r)) for f in levels for r in ratios]


def grid_runs(law):
    out = []
    for c in GRID_BUDGETS:
        n0 = float(law.n_opt(c))
        out += [(n0 * f, c / (6 * n0 * f)) for f in (0.25, 0.5, 1, 2, 4)]
    return out


def cells(quick: bool, only=()) -> list[tuple[int, tuple]]:
    """(index in the whole family, cell) for the cells to run. The index seeds a cell's studies,
    so a cell gives the same numbers whichever subset of the family runs it."""
    every = list(enumerate(itertools.product(LAWS, STARTS, NOISES, TARGETS)))
    if quick:     # the corners: fewest, smallest start runs and most noise; the largest start
        every = [(i, c) for i, c in every if c[0] != "Hoffmann" and c[3] == 1000
                 and (c[1], c[2]) in (("small-4", 0.02), ("medium-10", 0.005))]
    for key, values in only:
        every = [(i, c) for i, c in every if str(c[KEYS.index(key)]) in values]
    return every


def parse_only(text: str) -> tuple[str, set[str]]:
    """--only KEY=V1,V2 -> (KEY, {V1, V2}); an error naming the flag and the choices."""
    key, _, values = text.partition("=")
    choices = {"law": LAWS, "start": STARTS, "noise": NOISES, "target": TARGETS}
    if key not in choices or not values:
        raise argparse.ArgumentTypeError(f"{text!r}: use KEY=VALUE[,VALUE...] with KEY one of "
                                         f"{', '.join(choices)}, e.g. start=small-10")
    got, known = set(values.split(",")), {str(v) for v in choices[key]}
    if got - known:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown {key} {sorted(got - known)}; "
                                         f"use {', '.join(sorted(known))}")
    return key, got


def one_study(args):
    cell_id, (law_name, start, noise, mult), study, planners, n_boot = args
    law = LAWS[law_name]
    target = mult * TOP
    truth = float(law.loss_opt(target))

    def train(runs, rng):
        n, d = np.array(runs, float).reshape(-1, 2).T
        return pd.DataFrame({"n_params": n, "tokens": d,
                             "val_loss": law(n, d) * np.exp(noise * rng.standard_normal(n.size))})

    rng = np.random.default_rng([cell_id, study])
    seed = train(start_runs(start), rng)
    grid = train(grid_runs(law), rng)
    budget = 0.5 * float((6 * grid["n_params"] * grid["tokens"]).sum())
    designs, warned = {"grid": pd.concat([seed, grid], ignore_index=True)}, {}
    for planner, (k, (use, rounds)) in itertools.product(planners, enumerate(USES)):
        rng, runs, name = np.random.default_rng([cell_id, study, k + 1]), seed, (planner, use)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                for _ in range(rounds):
                    s = suggest_runs(runs, target, budget / rounds, max_run_flops=TOP,
                                     **PLANNERS[planner])
                    runs = pd.concat([runs, train(list(zip(s["n_params"], s["tokens"])), rng)],
                                     ignore_index=True)
                designs[name] = runs
            except (ValueError, np.linalg.LinAlgError) as e:
                designs[name] = str(e).splitlines()[0]
        warned[name] = any(issubclass(w.category, UserWarning) for w in caught)
    out = []
    for name, df in designs.items():
        planner, design = ("", name) if name == "grid" else name
        row = dict(cell=cell_id, law=law_name, start=start, noise=noise, target=mult,
                   planner=planner, design=design, study=study, grid_flops=2 * budget,
                   warned=warned.get(name, False))
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


def table(df: pd.DataFrame, planner: str) -> pd.DataFrame:
    """One row per cell for one planner: median |error| (%) of the grid and each use, the
    planner's compute share and coverage (%), worse (its plans less accurate than the grid in
    the same study), warn USE (% of that use's plans warned), ok (each use's median error <=
    the grid's, nothing refused) and lost unwarned (a use above the grid, never warned)."""
    grid = df[df["design"] == "grid"]
    plan = df[df["planner"] == planner]
    by = lambda d: d.groupby(KEYS, sort=False)                          # noqa: E731
    out = pd.DataFrame({"grid": 100 * by(grid)["err"].apply(lambda e: np.median(np.abs(e)))})
    for use, _ in USES:
        d = plan[plan["design"] == use]
        out[use] = 100 * by(d)["err"].apply(
            lambda e: np.median(np.abs(e)) if e.notna().all() else np.nan)
    out["share"] = 100 * by(plan).apply(lambda d: (d["flops"] / d["grid_flops"]).max())
    out["cover"] = 100 * by(plan)["covered"].mean()
    g = grid.set_index(["cell", "study"])["err"].abs()
    worse = plan["err"].abs().to_numpy() > g.loc[list(zip(plan["cell"], plan["study"]))].to_numpy()
    out["worse"] = by(plan.assign(w=worse | plan["err"].isna())).apply(
        lambda d: f"{int(d['w'].sum())}/{len(d)}")
    lost = pd.Series(False, index=out.index)
    for use, _ in USES:
        out[f"warn {use}"] = 100 * by(plan[plan["design"] == use])["warned"].mean()
        lost |= (out[use] > out["grid"]) & (out[f"warn {use}"] == 0)
    out["ok"] = (out["one-shot"] <= out["grid"]) & (out["rounds"] <= out["grid"])
    out["lost unwarned"] = lost | out["one-shot"].isna() | out["rounds"].isna()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=2, help="studies per cell")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds first-seed .. first-seed + seeds - 1 (more seeds in a later run)")
    ap.add_argument("--quick", action="store_true", help="4 corner cells only")
    ap.add_argument("--only", type=parse_only, action="append", default=[],
                    metavar="KEY=V[,V...]", help="only the cells with these values (repeat to "
                    "combine), e.g. --only start=small-10 --only target=1000")
    ap.add_argument("--planner", default="after",
                    help=f"one or more of {', '.join(PLANNERS)}, comma-separated")
    ap.add_argument("--n-boot", type=int, default=100, help="the interval's bootstrap refits")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--csv", help="also write every study's row here")
    a = ap.parse_args(argv)
    planners = a.planner.split(",")
    bad = [p for p in planners if p not in PLANNERS]
    if bad:
        ap.error(f"--planner {a.planner}: unknown {bad}; use one or more of {', '.join(PLANNERS)}")
    jobs = [(i, c, s, planners, a.n_boot) for i, c in cells(a.quick, a.only)
            for s in range(a.first_seed, a.first_seed + a.seeds)]
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
    df = pd.DataFrame(rows).sort_values(["cell", "study", "planner", "design"])
    grid_cover = 100 * df[df["design"] == "grid"]["covered"].mean()
    for p in planners:
        t = table(df, p)
        plan = df[df["planner"] == p]
        refused = plan[plan["refused"] != ""]
        print(f"\nplanner {p!r} ({PLANNERS[p] or 'suggest_runs defaults'}); forecast of the "
              f"compute-optimal loss at target x {TOP:.0e}; median |error| (%) over {a.seeds} "
              "seeds a cell; share: the planner's compute / the grid's (%), the largest study's;"
              " cover: its 95% intervals covering the truth (%), both uses; worse: its plans "
              "less accurate than the grid in the same study; warn USE: that use's plans "
              "warned (%)")
        print(t.to_string(float_format=lambda v: f"{v:.2f}"))
        print(f"cells ok: {int(t['ok'].sum())} of {len(t)} ({int(t['lost unwarned'].sum())} "
              "lost unwarned: a use above the grid that never warned); coverage over the family: "
              f"{100 * plan['covered'].mean():.1f}% "
              f"(grid {grid_cover:.1f}%); median |error| over the family: one-shot "
              f"{t['one-shot'].median():.2f}%, rounds {t['rounds'].median():.2f}%, grid "
              f"{t['grid'].median():.2f}%; refused: {len(refused)} of {len(plan)} plans"
              + (f" (e.g. {refused['refused'].iloc[0]!r})" if len(refused) else ""))
    print(f"{len(jobs)} studies in {time.time() - t0:.0f} s with {a.procs} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
