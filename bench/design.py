"""Does planning runs with analysis.suggest_runs beat an isoFLOP grid? Simulated studies.

For each known law L(N, D) (Epoch's refit of Chinchilla; Hoffmann's unrounded fit) and each
simulated study: 6 seed runs (C = 1e18, 3e18 FLOPs x D/N = 5, 20, 80) with log-normal noise,
then either
  grid:    a standard isoFLOP grid centred on the TRUE optimum (C = 1e19, 3e19, 1e20 x
           N_opt x 1/4 .. 4, 15 runs, 7e20 FLOPs), or
  suggest: suggest_runs with half the grid's compute, in two rounds (fit, suggest, "train",
           refit, suggest), no run larger than the grid's largest (1e20).
The planner is notebook 05's (method="bootstrap", objective="loss"); both designs then fit
L(N, D) (analysis.design.fit_ls, 200 fixed-design bootstrap resamples) and predict the
compute-optimal loss at 100x the largest run (1e22). Reported per law and design: mean
|relative error| of that prediction, median width of its 95% interval (relative), coverage of
the true value, and compute spent beyond the seed runs.

    python bench/design.py --studies 100   # notebook 05's planner (1084 s on 2 busy cores)
    python bench/design.py --studies 20    # quick look
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from analysis import CHINCHILLA_UNROUNDED, EPOCH  # noqa: E402
from analysis.design import fit_ls, predict_loss_opt, suggest_runs  # noqa: E402

LAWS = {"Epoch 2024": EPOCH, "Hoffmann (unrounded)": CHINCHILLA_UNROUNDED}
GRID_BUDGETS = (1e19, 3e19, 1e20)
TARGET = 100 * max(GRID_BUDGETS)


def seed_runs():
    return [(np.sqrt(c / 6 / r), np.sqrt(c / 6 * r)) for c in (1e18, 3e18) for r in (5, 20, 80)]


def grid_runs(law):
    out = []
    for c in GRID_BUDGETS:
        n0 = float(law.n_opt(c))
        out += [(n0 * f, c / (6 * n0 * f)) for f in (0.25, 0.5, 1, 2, 4)]
    return out


def one_study(args):
    law_name, study, noise, rounds, n_boot, method, objective, resample, plan_boot = args
    law = LAWS[law_name]
    rng = np.random.default_rng(study)

    def train(runs):
        n, d = np.array(runs, float).T
        return pd.DataFrame({"n_params": n, "tokens": d,
                             "val_loss": law(n, d) * np.exp(noise * rng.standard_normal(n.size))})

    seed = train(seed_runs())
    grid = train(grid_runs(law))
    budget = 0.5 * float((6 * grid["n_params"] * grid["tokens"]).sum())
    runs = seed
    for _ in range(rounds):
        s = suggest_runs(runs, TARGET, budget / rounds, max_run_flops=max(GRID_BUDGETS),
                         method=method, objective=objective, seed=study,
                         n_boot=plan_boot)
        runs = pd.concat([runs, train(list(zip(s["n_params"], s["tokens"])))], ignore_index=True)
    truth = float(law.loss_opt(TARGET))
    out = []
    for design, df in (("grid", pd.concat([seed, grid], ignore_index=True)), ("suggest", runs)):
        theta, boot = fit_ls(df["n_params"], df["tokens"], df["val_loss"], n_boot=n_boot,
                             seed=study, resample=resample)
        pred, lo, hi = predict_loss_opt(theta, boot, TARGET)
        extra = df.iloc[len(seed):]
        out.append(dict(law=law_name, design=design, study=study, err=pred / truth - 1,
                        width=(hi - lo) / truth, covered=lo <= truth <= hi, runs=len(extra),
                        flops=float((6 * extra["n_params"] * extra["tokens"]).sum())))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--studies", type=int, default=200, help="simulated studies per law")
    ap.add_argument("--noise", type=float, default=0.01, help="sd of log loss per run")
    ap.add_argument("--rounds", type=int, default=2, help="suggest/train/refit rounds")
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--method", choices=("bootstrap", "linear"), default="bootstrap",
                    help="suggest_runs(method=): notebook 05's planner by default")
    ap.add_argument("--objective", choices=("loss", "n_opt", "both"), default="loss")
    ap.add_argument("--resample", choices=("residuals", "runs"), default="residuals",
                    help="the interval's bootstrap: fixed design (the runs were chosen) or runs")
    ap.add_argument("--plan-boot", type=int, default=400,
                    help="method=bootstrap: the planner's refits (notebook 05: 400)")
    a = ap.parse_args(argv)
    jobs = [(law, s, a.noise, a.rounds, a.n_boot, a.method, a.objective, a.resample, a.plan_boot)
            for law in LAWS for s in range(a.studies)]
    t0 = time.time()
    with mp.get_context("fork").Pool(a.procs) as pool:
        rows = [r for rs in pool.imap_unordered(one_study, jobs, chunksize=4) for r in rs]
    df = pd.DataFrame(rows)
    table = df.groupby(["law", "design"], sort=False).agg(
        studies=("study", "size"),
        mean_abs_err_pct=("err", lambda e: 100 * e.abs().mean()),
        median_width_pct=("width", lambda w: 100 * w.median()),
        coverage_pct=("covered", lambda c: 100 * c.mean()),
        runs=("runs", "median"),
        flops=("flops", "median"))
    print(f"predicted compute-optimal loss at C = {TARGET:.0e} (100x the largest run); "
          f"noise sd {a.noise} in log loss; 95% bootstrap intervals (resample={a.resample}); "
          f"{a.rounds} suggest rounds (method={a.method}, objective={a.objective})")
    print(table.to_string(float_format=lambda v: f"{v:.3g}"))
    print(f"{len(jobs)} studies in {time.time() - t0:.0f} s with {a.procs} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
