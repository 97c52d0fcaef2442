"""Downstream accuracy in two steps (compute -> loss -> accuracy) against the one-step power law
in compute, on Cerebras-GPT's published table (7 tasks, SP, 0-shot): fit on 111M-2.7B,
predict 6.7B and 13B per task; the errors side by side, with the two-step 95% interval.

    python bench/downstream_two_step.py            # ~1 min
"""
from __future__ import annotations

import argparse

import numpy as np

from analysis import cerebras_gpt_downstream, fit_downstream, fit_downstream_two_step
from analysis.downstream import TASKS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shots", type=int, default=0)
    ap.add_argument("--n-boot", type=int, default=1000)
    args = ap.parse_args()
    sp = cerebras_gpt_downstream(args.shots)
    train, test = sp.iloc[:5], sp.iloc[5:]
    x = test["flops"].to_numpy()
    print("| task | size | published | two-step [95% interval] | error | one-step | error |")
    print("|---|---|---|---|---|---|---|")
    mean_err = {"two": [], "one": []}
    for task in (*TASKS, "average"):
        two = fit_downstream_two_step(train, task, n_boot=args.n_boot)
        one = 1 - fit_downstream(train, task, n_boot=0).predict(x)
        p2 = two.predict(x)
        lo, hi = two.predict_interval(x)
        for i, model in enumerate(test["model"]):
            y = test[task].iloc[i]
            mean_err["two"].append(abs(p2[i] - y))
            mean_err["one"].append(abs(one[i] - y))
            print(f"| {task}{' (floor fitted)' if two.floor_fitted and i == 0 else ''} | "
                  f"{model} | {y:.3f} | {p2[i]:.3f} [{lo[i]:.3f}, {hi[i]:.3f}]"
                  f"{'' if lo[i] <= y <= hi[i] else ' (misses)'} | {100 * (p2[i] - y):+.1f} | "
                  f"{one[i]:.3f} | {100 * (one[i] - y):+.1f} |")
    print(f"\nmean |error| over the 16 predictions (points of accuracy): two-step "
          f"{100 * np.mean(mean_err['two']):.1f}, one-step {100 * np.mean(mean_err['one']):.1f}")


if __name__ == "__main__":
    main()
