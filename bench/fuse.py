"""Fused, --no-fuse and one process per run, and the demo's overhead (#21, item 5), in one run.

    python bench/fuse.py                       # (a), (b) and (c) at full size
    python bench/fuse.py --cases b --runs 4    # 4 seeds of tiny-45k only
    python bench/fuse.py --scale 0.25          # every token budget x 0.25 (a quick look)

(a) the learning-rate grid of sweeps/mup_transfer.yaml at its two smallest widths (w16, w32,
    μP and SP, 7 LRs: 28 runs in 4 groups of 7); (b) N seeds (init and batch order) of
    tiny-45k at its Chinchilla budget, f32; (c) sweeps/demo.yaml: its wall time against the
    sum of its training-step time (`train_time_s`, the steps after the first; the issue's
    target is at most 1.3x).

Each case is launched with `cgpt sweep` exactly as a user would (`cgpt.sweep.launcher`: its
process start, imports, data, compiles, evaluation and checkpoints included) three ways, into
fresh directories: fused; --no-fuse (one program per run, all runs in one worker process);
and one `python -m cgpt train` process per run (`executors.execute_run`, what `cgpt sweep`
did before #21). Each launch gets a fresh persistent compilation cache, so no arm reuses
another's compiles. The data are prepared before anything is timed. Prints wall-clock
seconds and CPU seconds (this process and its workers: on a shared machine a steadier
measure of an arm's work than its wall), the ratios, each arm's wall time against its own
training-step time (its overhead), the per-member step time fused and alone (on a
compute-bound CPU fusion cannot beat the sum of the members' steps), and the largest
|val_loss| difference between the arms.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rows(out: Path) -> dict[str, dict]:
    """The results.csv rows of the runs this launch trained (not those --only left out)."""
    with open(out / "results.csv", newline="") as f:
        return {r["run_id"]: r for r in csv.DictReader(f)
                if (out / r["run_id"] / "summary.json").exists()}


ARMS = {"fused": "fused", "nofuse": "--no-fuse", "procs": "a process per run"}


def _launch(sweep, out: Path, arm: str, only: str | None) -> tuple[float, dict]:
    """`cgpt sweep` of `sweep` into `out`; arm: 'fused', 'nofuse' (one program per run, one
    worker process) or 'procs' (one `cgpt train` process per run, as before #21)."""
    from unittest import mock

    from cgpt.sweep import executors, launch, worker

    def per_process(jobs, finished):  # the sequential local sweep as it was before #21
        for job in jobs:
            finished(executors.execute_run(job))

    t0 = time.perf_counter()
    with redirect_stdout(io.StringIO()), (mock.patch.object(worker, "run_one_process",
                                                            per_process)
                                          if arm == "procs" else contextlib.nullcontext()):
        rc = launch(sweep, out, only=only, fuse=arm == "fused")
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"bench/fuse.py: the sweep in {out} did not finish (rc {rc}); see its "
                         "results.csv and train.log files")
    return wall, _rows(out)


def _steps(out: Path, rows: dict) -> tuple[float, float]:
    """(training-step seconds of a sweep, counting each program once: a fused group's members
    share theirs; seconds per step per run, averaged over the programs)."""
    seen, per = {}, {}
    for rid in rows:
        s = json.loads((out / rid / "summary.json").read_text())
        m = s["placement"].get("fused") or 1
        key = (m, round(s["train_time_s"], 6)) if m > 1 else rid
        seen[key] = s["train_time_s"]
        per[key] = s["train_time_s"] / max(1, s["steps"] - 1) / m  # the first step compiles
    return sum(seen.values()), sum(per.values()) / len(per)


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the sweep's worker processes):
    on a shared machine the wall clock measures the load as much as the arm, CPU seconds
    mostly the arm (a quiet machine's wall can still be lower, where threads overlap)."""
    import resource

    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def compare(name: str, sweep, root: Path, only: str | None = None,
            arms: str = "fused,nofuse,procs") -> None:
    """One spec launched each way; prints wall-clock times and ratios."""
    walls, rows, per, cpu = {}, {}, {}, {}
    for arm in arms.split(","):
        out = root / f"{name}-{arm}"
        c0 = _cpu()
        walls[arm], rows[arm] = _launch(sweep, out, arm, only)
        cpu[arm] = _cpu() - c0
        steps, per[arm] = _steps(out, rows[arm])
        steps = steps or float("nan")  # a run of 1 step times none after its compile
        print(f"  {ARMS[arm]:>17}: {walls[arm]:7.1f} s wall, training steps {steps:7.1f} s "
              f"(wall = {walls[arm] / steps:.2f}x the steps; {1e3 * per[arm]:.1f} ms per step "
              f"per run; {len(rows[arm])} runs; {cpu[arm]:.1f} CPU s, load "
              f"{os.getloadavg()[0]:.1f})", flush=True)
    if "fused" not in walls:
        return
    for arm in [a for a in walls if a != "fused"]:
        diff = max(abs(float(rows["fused"][k]["val_loss"]) - float(rows[arm][k]["val_loss"]))
                   for k in rows["fused"])
        print(f"  ({name}) fused is {walls[arm] / walls['fused']:.2f}x faster than "
              f"{ARMS[arm]} in wall-clock time ({cpu[arm] / cpu['fused']:.2f}x in CPU seconds; "
              f"per-run step time: fused "
              f"{1e3 * per['fused']:.1f} ms, alone {1e3 * per[arm]:.1f} ms); largest "
              f"|val_loss| difference {diff:.1e}", flush=True)


# (a)'s default: the issue's grid (7 LRs, one seed) inside today's wider mup_transfer.yaml
A_RUNS = ",".join(f"w{w}-*_s0_lr{lr}" for w in (16, 32)
                  for lr in ("0.00125", "0.0025", "0.005", "0.01", "0.02", "0.04", "0.08"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="abc", help="which of a, b, c to run (default: abc)")
    ap.add_argument("--runs", type=int, default=8, help="(b): seeds 0..runs-1")
    ap.add_argument("--preset", default="tiny-45k", help="(b): the model")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="token budgets x this (1: the specs' own; smaller: a quick look)")
    ap.add_argument("--arms", default="fused,nofuse,procs",
                    help="(a), (b): which launches, of fused, nofuse, procs (default: all three)")
    ap.add_argument("--only", default=A_RUNS,
                    help="(a): which runs of mup_transfer.yaml (default: widths 16 and 32, seed "
                         "0, the 7 LRs 1.25e-3..8e-2 the issue's grid had: 28 runs)")
    ap.add_argument("--out", help="where the sweeps go (default: a temporary directory)")
    a = ap.parse_args()

    import jax

    from cgpt.config.model import get_config
    from cgpt.data.batches import load_data
    from cgpt.sweep import load_sweep

    print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.out or tmp)
        root.mkdir(parents=True, exist_ok=True)
        if "a" in a.cases:
            sets = [f"train.tokens={int(160_000 * a.scale)}"] if a.scale != 1 else []
            s = load_sweep(REPO / "sweeps" / "mup_transfer.yaml", sets)
            load_data(s.runs[0].config.data)
            print(f"(a) mup_transfer.yaml, runs {a.only} ({s.runs[0].steps} steps each):",
                  flush=True)
            compare("a", s, root, only=a.only, arms=a.arms)
        if "b" in a.cases:
            tokens = get_config(a.preset).chinchilla_tokens() * a.scale
            spec = root / "b.yaml"
            spec.write_text(f"name: seeds\nbase:\n  model: {{compute_dtype: float32}}\n"
                            f"  train: {{tokens: {int(tokens)}}}\ngrid:\n  model: [{a.preset}]\n"
                            f"  seed: [{', '.join(map(str, range(a.runs)))}]\n")
            s = load_sweep(spec)
            load_data(s.runs[0].config.data)
            print(f"(b) {a.runs} seeds of {a.preset} ({s.runs[0].steps} steps of "
                  f"{s.runs[0].batch_size} x {s.runs[0].config.data.seq_len}, f32):", flush=True)
            compare("b", s, root, arms=a.arms)
        if "c" in a.cases:
            s = load_sweep(REPO / "sweeps" / "demo.yaml")
            load_data(s.runs[0].config.data)
            wall, rows = _launch(s, root / "demo", "fused", None)
            steps = _steps(root / "demo", rows)[0]
            runs = {r: json.loads((root / "demo" / r / "summary.json").read_text())
                    for r in rows}
            inside = sum(x["wall_time_s"] for x in runs.values())
            for r, x in runs.items():  # per shape: its start-up (compiles, data), evals, saves
                print(f"    {r}: {x['wall_time_s']:.1f} s in the run, steps "
                      f"{x['train_time_s']:.1f} s, {x['wall_time_s'] - x['train_time_s']:.1f} s "
                      "beyond them", flush=True)
            print(f"(c) demo.yaml, {len(rows)} runs: {wall:.1f} s wall, training steps "
                  f"{steps:.1f} s: wall = {wall / steps:.2f}x the training steps (target <= 1.3x)"
                  f"; of the {wall - steps:.1f} s beyond the steps, {inside - steps:.1f} s are "
                  "inside the runs (set-up, data, compiles, the first step, evaluations, "
                  f"checkpoints) and {wall - inside:.1f} s outside them (the worker's start and "
                  "imports, the sweep's bookkeeping)", flush=True)
        print(f"load average {os.getloadavg()[0]:.1f} at the end", flush=True)


if __name__ == "__main__":
    main()
