"""The critical batch measured from a batch-size sweep, and how far to trust the fit behind it.

1. `--family` (default): `analysis.batch_tradeoff.fit_tradeoff` on simulated batch-size sweeps
   whose steps-to-target follow S = S_min + E_min / B exactly, scattered log-normally:
     grid   5 sizes (8..128), 6 sizes (4..128, the committed sweep's), 8 sizes (2..256)
     b_crit at the grid's low end, its middle (geometric), its high end
     noise  3%, 8%, 15% in log S
   Per cell: the median log-bias of B_crit and the 95% interval's coverage over `--studies`
   simulated sweeps (200 bootstrap refits each), with the median's Monte Carlo standard error.
   Target: |bias| <= 0.05 and coverage >= 90%.
2. `SWEEP_DIR` (a finished run of sweeps/critical_batch.yaml): per target loss the measured
   B_crit with its interval, the noise scale B_simple of the same runs, their ratio and
   whether it is within 2x.

    python bench/critical_batch.py                              # the family (~1 min)
    python bench/critical_batch.py runs/critical_batch --targets 3.9 3.8 3.7 3.6 3.5
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from analysis.batch_tradeoff import crossings, fit_tradeoff, measure_critical_batch  # noqa: E402

GRIDS = {"5 (8-128)": 2.0 ** np.arange(3, 8), "6 (4-128)": 2.0 ** np.arange(2, 8),
         "8 (2-256)": 2.0 ** np.arange(1, 9)}


def family(studies: int, seed: int) -> int:
    print(f"fit_tradeoff on simulated sweeps: {studies} studies a cell, 200 bootstrap refits, "
          "95% intervals")
    print(f"{'grid':10s} {'B_crit at':9s} {'noise':>5s} {'bias(log)':>9s} {'+-se':>6s} "
          f"{'coverage':>8s}  ok")
    fails = 0
    rng = np.random.default_rng(seed)
    for (gname, grid), where, noise in itertools.product(GRIDS.items(), ("low", "mid", "high"),
                                                         (0.03, 0.08, 0.15)):
        b_crit = {"low": grid.min(), "mid": np.sqrt(grid.min() * grid.max()),
                  "high": grid.max()}[where]
        s_min = 100.0
        hits, bias = 0, []
        for i in range(studies):
            steps = (s_min + s_min * b_crit / grid) * np.exp(noise * rng.standard_normal(grid.size))
            fit = fit_tradeoff(grid, steps, n_boot=200, seed=i)
            lo, hi = fit.ci["b_crit"]
            hits += lo <= b_crit <= hi
            bias.append(np.log(fit.b_crit / b_crit))
        med, cov = float(np.median(bias)), hits / studies
        se = 1.2533 * float(np.std(bias)) / np.sqrt(studies)   # the median's Monte Carlo error
        ok = abs(med) <= 0.05 and cov >= 0.9
        fails += not ok
        print(f"{gname:10s} {where:9s} {noise:5.0%} {med:+9.3f} {se:6.3f} {cov:8.0%}  "
              f"{'ok' if ok else 'NO'}")
    print(f"{27 - fails}/27 cells meet |bias| <= 0.05 and coverage >= 90%")
    return fails


def sweep(path: str, targets: list[float], n_boot: int) -> None:
    meas, _ = measure_critical_batch(crossings(path, targets), n_boot=n_boot)
    print(f"{path}: the critical batch per target loss (sequences), 95% intervals")
    for r in meas.itertuples():
        print(f"loss {r.target:.2f}: B_crit {r.b_crit:6.1f} "
              f"[{r.b_crit_lo:6.1f}, {r.b_crit_hi:6.1f}]"
              f"  B_simple {r.b_simple:6.1f} [{r.b_simple_lo:6.1f}, {r.b_simple_hi:6.1f}]"
              f"  ratio {r.ratio:5.2f} [{r.ratio_lo:5.2f}, {r.ratio_hi:5.2f}]"
              f"  within 2x: {'yes' if r.within_2x else 'NO'}"
              f"  (best LR at its grid's edge for {r.lr_at_edge} of {r.n_batch} batch sizes)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", nargs="?", help="a finished run of sweeps/critical_batch.yaml")
    ap.add_argument("--targets", type=float, nargs="+", default=[3.9, 3.8, 3.7, 3.6, 3.5])
    ap.add_argument("--studies", type=int, default=100, help="simulated sweeps per cell")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.time()
    if args.sweep_dir:
        sweep(args.sweep_dir, args.targets, args.n_boot)
        fails = 0
    else:
        fails = family(args.studies, args.seed)
    print(f"{time.time() - t0:.0f} s; load average {os.getloadavg()[0]:.1f}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
