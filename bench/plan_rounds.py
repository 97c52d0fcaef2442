"""Plan the next runs for real: fit, suggest, TRAIN the suggestions with cgpt, refit, repeat.

Round 0 is a real run of sweeps/approaches.yaml (15 tiny models, 1e11-1e12 FLOPs; the runs in
tests/fixtures/analysis/approaches, trained with this recipe: retraining tiny-116k_c1e11_s0
today gave the same val_loss to 1e-7). Each round k >= 1 fits every finished run, asks
analysis.suggest_runs for runs within ROUND_BUDGET FLOPs (6ND) at the sweep's own model sizes,
writes the spec that trains them (round{k}.yaml: sweeps/approaches.yaml plus a `runs:` list, as
`cgpt sweep --suggest K --write` writes it, seed k), trains them with `python -m cgpt sweep
... --only <the new ids>`, and copies their results into notebooks/data/plan_rounds/round{k}.csv.
Notebook 05 reads these files, recomputes each round's suggestions and compares them with what
was trained. Rounds 1-2 fitted every run; from round 3 (plan.json's `from_round`) the fit leaves
out the 1e11-FLOP runs (35-241 steps, off the law: notebook 05) and no run reads past the
corpus (max_tokens, its 15.03M training tokens).

    python bench/plan_rounds.py --round 0        # round0.csv + plan.json from the fixture sweep
    python bench/plan_rounds.py --round 1        # suggest from rounds 0..0, train, round1.csv
    python bench/plan_rounds.py --simulate 6     # the same loop on stand-in losses (why the
                                                 # interval grew last time)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import analysis as A  # noqa: E402

DATA = ROOT / "notebooks" / "data" / "plan_rounds"
SPEC = ROOT / "sweeps" / "approaches.yaml"
FIXTURE = ROOT / "tests" / "fixtures" / "analysis" / "approaches"
COLUMNS = ["run_id", "model", "seed", "n_params", "tokens", "flops_6nd", "train_loss", "val_loss",
           "epochs", "wall_time_s", "tokens_per_s"]
# The planner's settings, written to plan.json and read back by the notebook.
PLAN = dict(round_budget_flops=4e12, objective="loss", method="bootstrap", n_boot=400, seed=0,
            target_multiple=100,
            # from round 3: the 1e11 runs (35-241 steps) left out of the fit, one pass at most
            from_round={"3": {"fit_min_flops": 2e11, "max_tokens": 15034880}})


def load_rounds(upto: int) -> pd.DataFrame:
    """Every run trained in rounds 0..upto (the files this script writes)."""
    return pd.concat([pd.read_csv(DATA / f"round{k}.csv") for k in range(upto + 1)],
                     ignore_index=True)


def settings(plan: dict, k: int) -> dict:
    """The planner's settings for round k: plan.json's, with `from_round` changes applied (round
    3 on: the fit leaves out runs below fit_min_flops, and no run reads past the corpus)."""
    out = dict(plan)
    for start, change in sorted((int(r), c) for r, c in plan.get("from_round", {}).items()):
        if k >= start:
            out.update(change)
    return out


def suggest(df: pd.DataFrame, plan: dict, k: int) -> pd.DataFrame:
    """The runs round k trains, from the runs of rounds 0..k-1 (the notebook does the same)."""
    p = settings(plan, k)
    s = A.suggest_runs(df, p["target_flops"], p["round_budget_flops"], sizes=p["sizes"],
                       objective=p["objective"], method=p["method"], n_boot=p["n_boot"],
                       seed=p["seed"], max_tokens=p.get("max_tokens"),
                       fit_min_flops=p.get("fit_min_flops"))
    s.insert(0, "model", [plan["models"][str(int(n))] for n in s["n_params"]])
    s["tokens"] = s["tokens"].round().astype(int)
    return s


def round0() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    res = A.load_results(FIXTURE, finished_only=True)
    res[COLUMNS].to_csv(DATA / "round0.csv", index=False)
    shutil.copy(SPEC, DATA / "round0.yaml")
    c = 6 * res["n_params"] * res["tokens"]
    plan = dict(PLAN, target_flops=float(PLAN["target_multiple"] * c.max()),
                sizes=sorted(int(n) for n in res["n_params"].unique()),
                models={str(int(n)): m for n, m in zip(res["n_params"], res["model"])})
    (DATA / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    print(f"round 0: {len(res)} runs, {c.sum():.3g} FLOPs; target {plan['target_flops']:.3g}")


def train_round(k: int, out: Path) -> None:
    plan = json.loads((DATA / "plan.json").read_text())
    s = suggest(load_rounds(k - 1), plan, k)
    print(f"round {k}: suggested\n{s.to_string(index=False)}", flush=True)
    raw = yaml.safe_load((DATA / f"round{k - 1}.yaml").read_text())
    raw["runs"] = list(raw.get("runs") or []) + [
        {"model": m, "tokens": int(t), "seed": k} for m, t in zip(s["model"], s["tokens"])]
    spec = DATA / f"round{k}.yaml"
    spec.write_text(f"# round {k} of bench/plan_rounds.py: sweeps/approaches.yaml plus the runs "
                    f"suggested after rounds 0..{k - 1}\n" + yaml.safe_dump(raw, sort_keys=False))
    from cgpt.sweep.spec import load_sweep
    new = [r.run_id for r in load_sweep(spec).runs if r.seed == k]
    t0 = time.time()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-m", "cgpt", "sweep", str(spec), "--out",
                    str(out / f"round{k}"), "--only", ",".join(new),
                    "--parallel", str(min(2, len(new)))], check=True, env=env, cwd=ROOT)
    res = A.load_results(out / f"round{k}", finished_only=True)
    res = res[res["run_id"].isin(new)]
    if len(res) != len(new):
        raise SystemExit(f"error: round {k}: {len(res)} of {len(new)} runs finished; see {out}")
    res[COLUMNS].to_csv(DATA / f"round{k}.csv", index=False)
    print(f"round {k}: trained {len(res)} runs in {time.time() - t0:.0f} s "
          f"({res['wall_time_s'].sum():.0f} s of training); wrote {DATA / f'round{k}.csv'}")


def simulate(draws: int) -> None:
    """Why the interval grew before: the same loop with stand-in losses (the round-0 fit plus
    its residual sd as log-normal noise), mean 95% width per round over `draws` noise draws,
    for last time's planner (method="linear", objective="both", 6 runs at the sweep's compute
    per round) and this one, each read with both bootstraps; and the scatter of the width itself
    over simulated repeats of round 0."""
    import numpy as np
    plan = json.loads((DATA / "plan.json").read_text())
    df0 = load_rounds(0)
    N, D, L = (df0[c].to_numpy(float) for c in ("n_params", "tokens", "val_loss"))
    theta, _ = A.fit_ls(N, D, L, n_boot=0)
    law = A.ChinchillaLaw(E=np.exp(theta[2]), A=np.exp(theta[0]), B=np.exp(theta[1]),
                          alpha=theta[3], beta=theta[4])
    sd = float(np.std(np.log(L / law(N, D)), ddof=5))
    C = plan["target_flops"]

    def width(df, kind, seed):
        th, b = A.fit_ls(df["n_params"], df["tokens"], df["val_loss"], n_boot=300, seed=seed,
                         resample=kind)
        _, lo, hi = A.predict_loss_opt(th, b, C)
        return hi - lo

    old = dict(budget=float((6 * N * D).sum()), max_runs=6, objective="both", method="linear")
    new = dict(budget=plan["round_budget_flops"], max_runs=None, objective=plan["objective"],
               method=plan["method"])
    print(f"stand-in truth: the round-0 fit (E = {np.exp(theta[2]):.3g}), noise sd {sd:.4f}; "
          f"{draws} draws, mean 95% width per round (rounds 0, 1, 2)")
    for name, cfg in (("last time", old), ("this plan", new)):
        w = {"runs": [], "residuals": []}
        for d in range(draws):
            rng, df = np.random.default_rng(d), df0[["n_params", "tokens", "val_loss"]]
            per = {"runs": [], "residuals": []}
            for k in range(3):
                for kind in per:
                    per[kind].append(width(df, kind, k))
                if k == 2:
                    break
                s = A.suggest_runs(df, C, cfg["budget"], sizes=plan["sizes"],
                                   max_runs=cfg["max_runs"], objective=cfg["objective"],
                                   method=cfg["method"], n_boot=plan["n_boot"], seed=plan["seed"])
                y = law(s["n_params"], s["tokens"]) * np.exp(sd * rng.standard_normal(len(s)))
                df = pd.concat([df, s[["n_params", "tokens"]].assign(val_loss=y)],
                               ignore_index=True)
            for kind in per:
                w[kind].append(per[kind])
        for kind in w:
            m = np.mean(w[kind], axis=0)
            up = int(np.sum(np.diff(np.array(w[kind]), axis=1)[:, 0] > 0))
            print(f"  {name:9s} resample={kind:9s}: " + " -> ".join(f"{v:.3f}" for v in m)
                  + f"  (round 1 wider than round 0 in {up}/{draws})")
    reps = []
    for d in range(20):
        y = law(N, D) * np.exp(sd * np.random.default_rng(100 + d).standard_normal(N.size))
        reps.append([width(df0.assign(val_loss=y), kind, 0) for kind in ("runs", "residuals")])
    q = np.percentile(reps, [10, 50, 90], axis=0)
    real = [width(df0, kind, 0) for kind in ("runs", "residuals")]
    for i, kind in enumerate(("runs", "residuals")):
        print(f"round 0 width, resample={kind}: real data {real[i]:.3f}; 20 simulated repeats "
              f"of its design: median {q[1, i]:.3f}, 10-90% {q[0, i]:.3f}-{q[2, i]:.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--round", type=int)
    p.add_argument("--simulate", type=int, metavar="DRAWS", help="the stand-in comparison")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "plan_rounds")
    a = p.parse_args()
    if a.simulate:
        simulate(a.simulate)
    elif a.round is None:
        p.error("give --round K or --simulate DRAWS")
    else:
        round0() if a.round == 0 else train_round(a.round, a.out)


if __name__ == "__main__":
    main()
