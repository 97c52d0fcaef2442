"""The schedule laws (analysis.fit_schedule_law) on cgpt's own runs: per model size, fit each
form on two schedules' curves and predict the final loss and whole curve of the others.

The runs: sweeps/schedules.yaml (two tiny sizes x constant, cosine, linear, WSD 10%/20% with
linear and 1-sqrt cooldowns, cosine at seeds 0-2), run first with
`python -m cgpt sweep sweeps/schedules.yaml --out runs/schedules` (~20 min). Per held-out run: `final` the observed final loss (results.csv
train_loss: the mean logged loss over the summary's window), `pred` the law's mean over the
same steps with its bootstrap interval, `err` = pred / final - 1, `covers` whether the interval
holds the observed value, `curve` the mean |pred / observed - 1| over the steps after warmup
(observed: a centred 9-step rolling mean). Target (issue 41): |err| <= max(0.5%, the seed
scatter: the standard deviation of the cosine seeds' final losses over their mean).

--metric val_loss fits and predicts the evaluations on the fixed validation set instead
(sweeps/schedules_eval.yaml: every 10 steps; runs/schedules_eval): `final` is
results.csv's val_loss (the evaluation after the last step), `curve` compares with each
evaluation after warmup as logged, and the seed scatter is of the cosine seeds' val_loss.

    python bench/schedule_law.py                                # ~4 min at load 6-9
    python bench/schedule_law.py --metric val_loss --sweep runs/schedules_eval
    python bench/schedule_law.py --diagnose 6                   # why it misses, ~2 min
    python bench/schedule_law.py --sweep runs/schedules --fit constant,wsd_1sqrt20
    python bench/schedule_law.py --simulate 20                  # the intervals on known laws

--simulate R: R studies per form drawn from the law itself with random parameters (L0 2-3.5,
A 1-3, alpha 0.3-0.7; Tissue C 0.002-0.006; multi-power B 0.1-0.5, C 0.5-5, beta 0.3-0.9,
gamma 0.3-0.7) and AR(1) noise (sd 0.01, lag-1 correlation 0.5: unlike the tests' independent
noise), 300 steps, 30 warmup; fitted on constant + WSD 20% linear, each predicting cosine,
linear and WSD 10%: the bias and 95% coverage of the predicted final loss.
"""
from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import finished, fit_schedule_law, load_results, read_schedule_curves
from analysis.results import locate_run
from analysis.schedule_law import PARAMS as PARAMS_OF
from cgpt import rundir

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.005


def schedule_of(run_id: str) -> str:
    """The overrides entry's name: tiny-17k_d819k_s0_wsd_linear10 -> wsd_linear10."""
    m = re.search(r"_s\d+_(.+)$", run_id)
    if not m:
        raise ValueError(f"run {run_id!r}: no schedule name after its seed (_s<seed>_<name>); "
                         "run sweeps/schedules.yaml")
    return m.group(1)


def lrs(kind: str, steps: int = 300, warm: int = 30, frac: float = 0.2,
        end: float = 0.1) -> np.ndarray:
    """A simulated LR sequence in units of the peak: linear warmup, then constant, cosine,
    linear or WSD (linear cooldown over the last `frac`) to `end`."""
    s = np.arange(1, steps + 1, dtype=float)
    eta = np.ones(steps)
    eta[:warm] = s[:warm] / warm
    p = (s[warm:] - warm) / (steps - warm)
    if kind == "cosine":
        eta[warm:] = end + (1 - end) * 0.5 * (1 + np.cos(np.pi * p))
    elif kind == "linear":
        eta[warm:] = 1 - (1 - end) * p
    elif kind == "wsd":
        d = round(frac * steps)
        eta[steps - d:] = 1 - (1 - end) * (s[steps - d:] - (steps - d)) / d
    return eta


def simulate(reps: int, forms: list[str], n_boot: int, steps: int = 300, sd: float = 0.01,
             lag1: float = 0.5, shared: float = 0.0) -> None:
    """`reps` studies per form: curves drawn from the law with random parameters plus noise of
    standard deviation `sd` (AR(1), lag-1 correlation `lag1`), of which the fraction `shared`
    of the variance is one series common to every run of a study (cgpt's runs of one seed
    read the same batches, so most of their step-to-step noise is shared: 97-99% measured)."""
    from analysis.schedule_law import _curve, _features
    rng = np.random.default_rng(0)
    warm = 30
    held = {"cosine": lrs("cosine", steps, warm), "linear": lrs("linear", steps, warm),
            "wsd10": lrs("wsd", steps, warm, frac=0.1)}
    fitted = {"constant": lrs("constant", steps, warm), "wsd20": lrs("wsd", steps, warm)}
    t0 = time.time()

    def ar1(n):
        e, z = np.zeros(n), rng.standard_normal(n)
        for i in range(n):
            e[i] = lag1 * (e[i - 1] if i else 0.0) + np.sqrt(1 - lag1 ** 2) * z[i]
        return e

    for form in forms:
        err, cover = {k: [] for k in held}, {k: [] for k in held}
        recovered = []
        for _ in range(reps):
            p = [rng.uniform(2, 3.5), rng.uniform(1, 3), rng.uniform(0.3, 0.7)]
            p += [rng.uniform(0.002, 0.006)] if form == "tissue" else [
                rng.uniform(0.1, 0.5), rng.uniform(0.5, 5), rng.uniform(0.3, 0.9),
                rng.uniform(0.3, 0.7)]

            def law(eta):
                y = _curve(form, np.array(p), _features(eta, np.arange(eta.size), 0.999))
                y[0] = y[1]
                return y
            common = ar1(steps)
            rows = []
            for name, eta in fitted.items():
                e = sd * (np.sqrt(shared) * common + np.sqrt(1 - shared) * ar1(steps))
                rows.append(pd.DataFrame({"run_id": name, "step": np.arange(1, eta.size + 1),
                                          "lr": eta, "loss": law(eta) + e}))
            fit = fit_schedule_law(pd.concat(rows), form, n_boot=n_boot, max_points=150)
            got = [fit.params[k] for k in PARAMS_OF[form]]
            recovered.append(np.abs(np.array(got) / np.array(p) - 1))
            for k, eta in held.items():
                want = law(eta)[-rundir.train_loss_window(eta.size):].mean()
                est, lo, hi = fit.final_loss(eta)
                err[k].append(est / want - 1)
                cover[k].append(lo <= want <= hi)
        rel = np.median(np.array(recovered), axis=0)
        print(f"{form}: {steps} steps, noise sd {sd:g} (lag-1 {lag1:g}, {shared:.0%} shared); "
              "median |relative error| of the parameters: " +
              ", ".join(f"{k} {v:.0%}" for k, v in zip(PARAMS_OF[form], rel)))
        for k in held:
            e = np.array(err[k])
            print(f"{form:10s} {k:7s}: median error {np.median(e):+.3%}, median |error| "
                  f"{np.median(np.abs(e)):.3%}, max |error| {np.abs(e).max():.3%}, "
                  f"95% coverage {np.mean(cover[k]):.0%} ({reps} studies)")
    print(f"{time.time() - t0:.0f} s, load average {os.getloadavg()[0]:.1f}")


def diagnose(sweep: str, forms: list[str], fit_on: list[str], reps: int, n_boot: int,
             metric: str = "loss") -> None:
    """Why a fit on `fit_on` misses, per size, in numbers: the noise (sd of a record about a
    centred rolling mean, lag-1 correlation, the correlation with the cosine run's: the
    fraction shared), how fast the loss still falls, the annealing signal (each schedule's
    final loss minus constant's), whether each form describes all seven curves at once (fitted
    on all of them from a third of the run), Tissue's lambda, and simulated truth at these
    lengths and noise: the all-curves fit taken as the truth, `reps` noise draws like the
    runs', fitted on `fit_on` as the table is. `metric`: the training loss (every step) or the
    fixed-set evaluations (every train.eval_every steps)."""
    df = finished(load_results(sweep))
    df = df[df["seed"] == 0].assign(schedule=lambda d: d["run_id"].map(schedule_of))
    rng = np.random.default_rng(0)
    for model, runs in df.groupby("model", sort=False):
        dirs = [locate_run(df, r, rundir.METRICS_FILE, "its loss curve is read")
                for r in runs.itertuples()]
        curves = read_schedule_curves(dirs)
        by = {s: curves[curves["run_id"] == d.name].reset_index(drop=True)
              for s, d in zip(runs["schedule"], dirs)}
        n = len(by["constant"])
        logged = by["constant"][metric].notna().to_numpy()   # the same steps in every run
        w = rundir.train_loss_window(n) if metric == "loss" else 1
        fin = {s: g[metric].dropna().iloc[-w:].mean() for s, g in by.items()}
        k = 15 if metric == "loss" else 5                     # records in the rolling mean

        def resid(s):
            x = by[s][metric].dropna().reset_index(drop=True)
            cut = len(x) - (10 if metric == "loss" else k)
            return (x - x.rolling(k, center=True).mean()).iloc[len(x) // 2:cut].to_numpy()
        r0, rc = resid("constant"), resid("cosine")
        sd, lag = r0.std(), np.corrcoef(r0[1:], r0[:-1])[0, 1]
        shared = np.corrcoef(r0, rc)[0, 1]
        sm = by["constant"][metric].dropna()
        sm = sm.rolling(w, min_periods=1).mean().to_numpy()
        print(f"{model}: {n} steps, {int(logged.sum())} {metric} records; noise sd {sd:.4f} "
              f"(lag-1 {lag:+.2f}), correlation with the cosine run's {shared:.2f}; the final "
              f"loss (mean of {w} records) varies ~{sd / np.sqrt(w) / fin['constant']:.2%} with "
              f"the noise; constant's loss fell {1 - sm[-1] / sm[int(0.9 * len(sm))]:.2%} over "
              "the last 10% of steps")
        print("  final minus constant's: " + ", ".join(
            f"{s} {fin[s] - fin['constant']:+.4f}" for s in sorted(fin) if s != "constant"))
        for form in forms:
            whole = fit_schedule_law(curves, form, metric=metric, n_boot=0, start=n // 3)
            errs = {s: whole.final_loss(g["lr"].to_numpy())[0] / fin[s] - 1
                    for s, g in by.items()}
            each = ", ".join(f"{s} {e:+.2%}" for s, e in errs.items())
            pinned = "NOT PINNED" if "NOT PINNED" in whole.summary() else "pinned"
            print(f"  {form} on all {len(by)} schedules from step {n // 3}: max |error| "
                  f"{max(map(abs, errs.values())):.2%} ({each}); {pinned}")
            if form == "tissue":
                two = pd.concat([by[s] for s in fit_on])
                for lam in (0.99, 0.995, 0.999):
                    f = fit_schedule_law(two, form, metric=metric, n_boot=0, lam=lam)
                    e = {s: f.final_loss(by[s]["lr"].to_numpy())[0] / fin[s] - 1
                         for s in ("cosine", "linear")}
                    print(f"  tissue lambda {lam}: cosine {e['cosine']:+.2%}, linear "
                          f"{e['linear']:+.2%}")
            truth = {s: whole.predict(g["lr"].to_numpy())["loss"].bfill().to_numpy()
                     for s, g in by.items()}   # the training loss's step 1 (no update): step 2's
            err = {s: [] for s in ("cosine", "linear")}
            cover = {s: [] for s in err}
            for _ in range(reps):
                common = rng.standard_normal(n)
                sim = pd.concat([by[s].assign(**{metric: np.where(logged, truth[s] + sd * (
                    np.sqrt(shared) * common + np.sqrt(1 - shared) * rng.standard_normal(n)),
                    np.nan)}) for s in fit_on])
                f = fit_schedule_law(sim, form, metric=metric, n_boot=n_boot)
                for s in err:
                    want = truth[s][-w:].mean()
                    est, lo, hi = f.final_loss(by[s]["lr"].to_numpy())
                    err[s].append(est / want - 1)
                    cover[s].append(lo <= want <= hi)
            print(f"  {form}, simulated truth (that fit), {reps} noise draws, fitted on "
                  f"{' + '.join(fit_on)}: " + "; ".join(
                      f"{s} median |error| {np.median(np.abs(err[s])):.2%}, max "
                      f"{np.max(np.abs(err[s])):.2%}, coverage {np.mean(cover[s]):.0%}"
                      for s in err))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sweep", default=str(ROOT / "runs/schedules"))
    ap.add_argument("--fit", default="constant,wsd_linear20",
                    help="the schedules fitted (comma-separated), the others predicted")
    ap.add_argument("--forms", default="tissue,multipower")
    ap.add_argument("--metric", default="loss", choices=("loss", "val_loss"),
                    help="fit the training loss at every step, or the fixed-set evaluations")
    ap.add_argument("--n-boot", type=int, default=100)
    ap.add_argument("--start", type=float, default=0.0,
                    help="fit from this fraction of each run (default: the end of warmup)")
    ap.add_argument("--simulate", type=int, default=0, metavar="R",
                    help="R simulated studies per form instead of the runs")
    ap.add_argument("--steps", type=int, default=300, help="--simulate: steps per run")
    ap.add_argument("--noise", type=float, default=0.01, help="--simulate: noise sd per step")
    ap.add_argument("--lag1", type=float, default=0.5, help="--simulate: noise lag-1 corr.")
    ap.add_argument("--shared", type=float, default=0.0,
                    help="--simulate: fraction of the noise variance common to a study's runs")
    ap.add_argument("--diagnose", type=int, default=0, metavar="R",
                    help="why the fit misses on the runs, in numbers (R simulated noise draws)")
    args = ap.parse_args()
    if args.diagnose:
        return diagnose(args.sweep, args.forms.split(","), args.fit.split(","), args.diagnose,
                        min(args.n_boot, 30), args.metric)
    if args.simulate:
        return simulate(args.simulate, args.forms.split(","), min(args.n_boot, 50), args.steps,
                        args.noise, args.lag1, args.shared)
    fit_on, metric = args.fit.split(","), args.metric
    final_col = {"loss": "train_loss", "val_loss": "val_loss"}[metric]
    if not (Path(args.sweep) / "results.csv").is_file():
        raise SystemExit(f"error: --sweep {args.sweep}: no results.csv; run the sweep first "
                         "(python -m cgpt sweep sweeps/schedules.yaml --out runs/schedules)")
    df = finished(load_results(args.sweep))
    df = df.assign(schedule=df["run_id"].map(schedule_of))
    rows, t0 = [], time.time()
    for model, runs in df.groupby("model", sort=False):
        dirs = {r.run_id: locate_run(df, r, rundir.METRICS_FILE, "its loss curve is read")
                for r in runs.itertuples()}
        curves = read_schedule_curves(list(dirs.values()))
        by_sched = {s: g.run_id.iloc[0] for s, g in runs[runs["seed"] == 0].groupby("schedule")}
        missing = [s for s in fit_on if s not in by_sched]
        if missing:
            raise SystemExit(f"{args.sweep}: no {missing[0]!r} run of {model} at seed 0; the "
                             f"schedules there are {sorted(by_sched)}")
        cos = runs[runs["schedule"].str.startswith("cosine")][final_col]
        scatter = float(cos.std(ddof=1) / cos.mean()) if len(cos) > 1 else float("nan")
        target = max(GOAL, scatter) if np.isfinite(scatter) else GOAL
        fitted = curves[curves["run_id"].isin([by_sched[s] for s in fit_on])]
        if metric == "val_loss":
            const = curves[curves["run_id"] == dirs[by_sched["constant"]].name]["val_loss"]
            half = const.dropna().to_numpy()
            half = half[half.size // 2:]
            sd = np.std(np.diff(half, 2)) / np.sqrt(6)  # white noise about a smooth trend
            print(f"{model}: val_loss noise (second differences, the constant run's second "
                  f"half): sd {sd:.5f} = {sd / half.mean():.3%} of the loss, {half.size} "
                  "evaluations")
        for form in args.forms.split(","):
            n = int(fitted["step"].max())
            fit = fit_schedule_law(fitted, form, metric=metric, n_boot=args.n_boot,
                                   start=round(args.start * n) if args.start else None)
            print(f"{model}: {fit.summary()}")
            for r in runs[runs["seed"] == 0].itertuples():
                if r.schedule in fit_on:
                    continue
                g = curves[curves["run_id"] == dirs[r.run_id].name].sort_values("step")
                pred = fit.predict(g["lr"].to_numpy())
                est, lo, hi = fit.final_loss(g["lr"].to_numpy())
                peak = int(np.argmax(g["lr"].to_numpy()))
                if metric == "loss":
                    obs = g["loss"].rolling(9, center=True, min_periods=1).mean().to_numpy()
                    after = np.arange(len(g)) > peak
                else:  # the evaluations as logged, from the one after the peak step's update
                    obs = g["val_loss"].to_numpy()
                    after = (np.arange(len(g)) >= peak) & np.isfinite(obs)
                curve = float(np.mean(np.abs(pred["loss"].to_numpy()[after] / obs[after] - 1)))
                final = getattr(r, final_col)
                err = est / final - 1
                rows.append(dict(model=model, form=form, schedule=r.schedule,
                                 final=final, pred=est, lo=lo, hi=hi, err=err,
                                 covers=lo <= final <= hi, curve=curve,
                                 scatter=scatter, meets=abs(err) <= target))
    out = pd.DataFrame(rows)
    load = os.getloadavg()[0]
    print(f"\n{metric} fitted on {' + '.join(fit_on)} from {args.start:.0%} of each run (0%: "
          f"the end of warmup); {args.n_boot} block-bootstrap resamples; "
          f"{time.time() - t0:.0f} s, load average {load:.1f}")
    print("| size | form | held-out schedule | final loss | predicted [95% interval] | error | "
          "covers | curve error | meets target |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in out.itertuples():
        print(f"| {r.model} | {r.form} | {r.schedule} | {r.final:.4f} | {r.pred:.4f} "
              f"[{r.lo:.4f}, {r.hi:.4f}] | {r.err:+.2%} | {'yes' if r.covers else 'no'} | "
              f"{r.curve:.2%} | {'yes' if r.meets else 'no'} (target {max(GOAL, r.scatter):.2%}) |")
    for (m, f), g in out.groupby(["model", "form"], sort=False):
        print(f"{m} {f}: max |err| {g['err'].abs().max():.2%}, {int(g['meets'].sum())}/{len(g)} "
              f"within target, {int(g['covers'].sum())}/{len(g)} covered; cosine seed scatter "
              f"{g['scatter'].iloc[0]:.2%}")


if __name__ == "__main__":
    main()
