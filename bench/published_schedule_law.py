"""The multi-power law on Luo et al. 2025's released curves, with the paper's split: fit on its
three training curves per model size, predict the six held-out ones, beside the published law.

Data: /work/shared/data/external/luo2025_mpl/csv_{25,100,400}/*.csv (thu-yao-01-luo/
MultiPowerLaw, `loss_curve_repo/`, MIT): (step, lr, loss) every 128 steps from the end of
warmup. Their schedules, rebuilt as the repository's `src/data_loader.py` builds them: 2160
warmup steps from 0 to 3e-4 (np.linspace), then constant, cosine to 3e-5, WSD (geometric decay
from step 20000 to 3e-5), WSD-LD (linear decay), or two-stage (3e-4 to step 8000, then
lr_b = 3, 9 or 18 x 1e-5; 16000 steps); files that end at step 24000 lose that record.
Split (`src/config.py`): train cosine_24000, constant_24000, wsdcon_9; test the other six.

Their array index i is the LR of update i + 1, and their law evaluates the record at step s
with the LR sums over indices 0..s: cgpt's step s + 1 (the logged lr agrees there, which
`fit_schedule_law(schedules=...)` checks), fitted as metric="loss" with cgpt's convention (the
loss logged at step s is after s - 1 updates: one update's LR less in each sum than the
paper's code, 1 step in >= 2160). The published law is evaluated with their own formula
(`evaluate_mpl`, whose loss-drop sum also counts the warmup's rising LR, with the sign that
raises the loss) and their fitted parameters (`src/config.py` PARAMS).

Per size: PredE = mean |pred / loss - 1| over the held-out records (the paper's metric), for
cgpt and the published law; the 72k-step cosine's final record: its error and whether cgpt's
95% interval covers it.

    python bench/published_schedule_law.py                  # 3 sizes, 100 resamples, ~6 min
    python bench/published_schedule_law.py --sizes 25 --n-boot 20
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import fit_schedule_law

DATA = Path("/work/shared/data/external/luo2025_mpl")
TRAIN = ("cosine_24000", "constant_24000", "wsdcon_9")
TEST = ("constant_72000", "cosine_72000", "wsd_20000_24000", "wsdld_20000_24000", "wsdcon_3",
        "wsdcon_18")
PEAK, END, WARM = 3e-4, 3e-5, 2160
# src/config.py PARAMS: L0, A, alpha, B, C, beta, gamma
PUBLISHED = {"25": [3.04045406, 0.52468604, 0.50786857, 363.78751622, 2.06560812, 0.58279013,
                    0.64142257],
             "100": [2.6514477, 0.60115152, 0.45295811, 437.9464276, 2.13245612, 0.59785199,
                     0.65523644],
             "400": [2.37474466, 0.65421216, 0.42878731, 523.42464371, 2.02462735, 0.59350493,
                     0.63472457]}


def schedule(name: str) -> np.ndarray:
    """The LR of each update (index i: update i + 1), as src/data_loader.py builds it."""
    warm = np.linspace(0, PEAK, WARM)
    if name.startswith("cosine"):
        total = int(name.split("_")[1])
        s = np.arange(total)[WARM:]
        return np.r_[warm, END + 0.5 * (PEAK - END) * (1 + np.cos(np.pi * (s - WARM)
                                                                   / (total - WARM)))]
    if name.startswith("constant"):
        return np.r_[warm, np.full(int(name.split("_")[1]) - WARM, PEAK)]
    if name.startswith("wsdcon"):
        lr_b = int(name.split("_")[1]) * 1e-5
        return np.r_[warm, np.full(8000 - WARM, PEAK), np.full(16000 - 8000, lr_b)]
    total, decay = 24000, 20000
    s = np.arange(total)[decay:]
    if name.startswith("wsdld"):
        tail = PEAK * (1 - (s - decay) / (total - decay)) + END * (s - decay) / (total - decay)
    else:
        tail = PEAK ** ((total - s) / (total - decay)) * END ** ((s - decay) / (total - decay))
    return np.r_[warm, np.full(decay - WARM, PEAK), tail]


def curve(size: str, name: str) -> pd.DataFrame:
    d = pd.read_csv(DATA / f"csv_{size}" / f"{name}.csv")
    if d["step"].max() == 24000:
        d = d[d["step"] < 24000]
    return d.assign(run_id=name)


def published_law(p, eta: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """src/evaluation.py evaluate_mpl, vectorized per record (their steps, their sums)."""
    l0, a, alpha, b, c, beta, gamma = p
    lr_sum = np.cumsum(eta)
    gap = np.zeros_like(eta)
    gap[1:] = np.diff(eta)
    out = []
    for s in steps:
        ld = np.sum(gap[1:s + 1] * (1 - (1 + c * eta[1:s + 1] ** -gamma
                                         * (lr_sum[s] - lr_sum[:s])) ** -beta))
        out.append(l0 + a * lr_sum[s] ** -alpha + b * ld)
    return np.array(out)


def run(size: str, n_boot: int) -> list[dict]:
    t0 = time.time()
    train = pd.concat([curve(size, n) for n in TRAIN])
    cg = train.assign(step=train["step"] + 1)       # their index s -> cgpt's step s + 1
    fit = fit_schedule_law(cg, "multipower", metric="loss", n_boot=n_boot, max_points=1000,
                           schedules={n: schedule(n) for n in TRAIN})
    print(f"{size}M: fitted in {time.time() - t0:.0f} s; {fit.summary()}")
    print(fit.params_in("lr").round(4).to_string())
    rows = []
    for name in TEST:
        d = curve(size, name)
        eta = schedule(name)
        pred = fit.predict(eta, steps=d["step"].to_numpy() + 1)
        pub = published_law(PUBLISHED[size], eta, d["step"].to_numpy())
        y = d["loss"].to_numpy()
        rows.append({"size": f"{size}M", "curve": name,
                     "cgpt_prede": float(np.mean(np.abs(pred["loss"].to_numpy() / y - 1))),
                     "paper_prede": float(np.mean(np.abs(pub / y - 1))),
                     "final": y[-1], "cgpt_final": pred["loss"].iloc[-1],
                     "lo": pred["lo"].iloc[-1], "hi": pred["hi"].iloc[-1],
                     "paper_final": pub[-1]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="25,100,400")
    ap.add_argument("--n-boot", type=int, default=100)
    args = ap.parse_args()
    rows = [r for s in args.sizes.split(",") for r in run(s, args.n_boot)]
    t = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    print(t.round(5).to_string(index=False))
    print("\nper size: held-out mean PredE (cgpt / paper, ratio); 72k cosine final error, covered")
    for size, g in t.groupby("size", sort=False):
        c, p = g["cgpt_prede"].mean(), g["paper_prede"].mean()
        f = g[g["curve"] == "cosine_72000"].iloc[0]
        print(f"{size}: {c:.5f} / {p:.5f} ({c / p:.2f}x); cgpt {f.cgpt_final / f.final - 1:+.3%} "
              f"[{f.lo / f.final - 1:+.3%}, {f.hi / f.final - 1:+.3%}] "
              f"covers={f.lo <= f.final <= f.hi}; paper {f.paper_final / f.final - 1:+.3%}")


if __name__ == "__main__":
    main()
