"""A cluster spec's resources, derived: node count, time limit and checkpoint cadence per run.

`cgpt sweep SPEC --dry-run` prints, for every run of a spec with GPUs (`slurm.gpus_per_node`)
and a time model (`estimate.mfu`, `estimate.device_flops`), what these rules derive beside
what the spec says, and names each disagreement (`sweeps/cerebras_gpt.yaml` is written from
them; tests/plan/test_nodes.py keeps it so):

  nodes        the fewest nodes (1 .. MAX_NODES) on which the run's analytic plan
               (`cgpt.plan.analytic`: placement and memory without compiling) fits the GPUs'
               memory with only `data`/`stage` crossing nodes and the dry run's estimate
               (`cgpt.sweep.spec.Estimate`: FLOPs / (MFU x peak x GPUs) + startup) is at most
               TARGET_HOURS; when no count meets the target, the valid count with the
               shortest estimate.
  timeout_min  the estimate x 1.2, rounded up to whole hours, capped at MAX_LIMIT_MIN (a
               common SLURM partition limit); a longer run is requeued on the time-limit
               signal, resuming from the save made then.
  checkpoint   `train.checkpoint_minutes`: 20 x the save time (saves at most ~5% of the wall
               clock on the shared filesystem), kept within [10, 30] minutes so a crash
               loses at most 30 minutes.
  signal lead  `slurm.signal_delay_s` must leave the executor's grace (lead - 30 s) at least
               twice the save time.

The save time is the checkpoint's bytes (12 per parameter: f32 weights, Adam's mu and nu)
over ASSUMED_WRITE_BYTES_PER_S. That bandwidth is an ASSUMPTION, not a measurement: no
cluster is reachable here; a run prints its own measured save time (`checkpoint N: saved in
X s`), which is the figure to put back into these rules. Every time here is the dry run's
analytic estimate at the spec's stated MFU, never a timing taken on a GPU.
"""
from __future__ import annotations

import math
import sys

from cgpt.config.units import fmt_bytes
from cgpt.plan.analytic import plan_analytic
from cgpt.sweep.spec import Run, Sweep, fmt_time

ASSUMED_WRITE_BYTES_PER_S = 2.0e9  # per job, to the shared filesystem: an assumption
MAX_NODES = 32
TARGET_HOURS = 48.0
MAX_LIMIT_MIN = 2880  # 48 h
LIMIT_MARGIN = 1.2
CHECKPOINT_MIN_RANGE = (10, 30)
REQUEUE_MARGIN_S = 30  # the executor requeues this long before SLURM's kill (executors.py)
STATE_BYTES_PER_PARAM = 12


def save_seconds(n_params: int, write_bytes_per_s: float = ASSUMED_WRITE_BYTES_PER_S) -> float:
    """Estimated seconds to write a checkpoint of `n_params` (assumed bandwidth, see module)."""
    return STATE_BYTES_PER_PARAM * n_params / write_bytes_per_s


def checkpoint_minutes(save_s: float) -> int:
    """The cadence rule: 20 x the save time, within CHECKPOINT_MIN_RANGE minutes."""
    lo, hi = CHECKPOINT_MIN_RANGE
    return int(min(hi, max(lo, math.ceil(20 * save_s / 60))))


def timeout_minutes(estimate_s: float) -> int:
    """The time-limit rule: estimate x LIMIT_MARGIN in whole hours, capped at MAX_LIMIT_MIN."""
    return int(min(MAX_LIMIT_MIN, 60 * math.ceil(LIMIT_MARGIN * estimate_s / 3600)))


def plan_on(run: Run, nodes: int, gpus_per_node: int, memory: int) -> dict:
    """The run's analytic plan on `nodes` x `gpus_per_node` GPUs, or {"error": ...}."""
    try:
        return plan_analytic(run.config, memory, nodes * gpus_per_node, nodes, "gpu")
    except ValueError as e:
        return {"error": str(e)}


def valid(plan: dict) -> bool:
    """Fits, and only data/stage cross nodes."""
    return ("error" not in plan and plan["fits"]
            and set(plan["crosses_nodes"]) <= {"data", "stage"})


def derive(sweep: Sweep, run: Run) -> dict:
    """The derived resources of one run (see module) with the plan they rest on."""
    gpn = int(run.slurm.get("gpus_per_node") or 1)
    memory = sweep.estimate.device_memory
    if memory is None:
        raise ValueError(f"{sweep.path}: set estimate.device_memory (e.g. 80GB) to derive nodes")
    e = sweep.estimate
    options = []
    for n in range(1, MAX_NODES + 1):
        plan = plan_on(run, n, gpn, memory)
        if valid(plan):
            options.append((n, e.seconds(run.steps, run.flops, n * gpn), plan))
    if not options:
        raise ValueError(f"{run.run_id}: no node count in 1..{MAX_NODES} fits {fmt_bytes(memory)} "
                         "GPUs with only data/stage crossing nodes (cgpt plan --no-compile "
                         "--nodes N shows why)")
    meet = [o for o in options if o[1] <= TARGET_HOURS * 3600]
    n, est, plan = meet[0] if meet else min(options, key=lambda o: o[1])
    save_s = save_seconds(run.n_params)
    return {"run_id": run.run_id, "nodes": n, "estimate_s": est,
            "timeout_min": timeout_minutes(est), "save_s": save_s,
            "checkpoint_minutes": checkpoint_minutes(save_s),
            "min_signal_delay_s": math.ceil(REQUEUE_MARGIN_S + 2 * save_s), "plan": plan}


def disagreements(run: Run, d: dict) -> list[str]:
    """Where the spec's values differ from the derived ones (empty: the spec agrees)."""
    out = []
    for key, want in (("slurm.nodes", d["nodes"]), ("slurm.timeout_min", d["timeout_min"]),
                      ("train.checkpoint_minutes", d["checkpoint_minutes"])):
        have = (run.config.train.checkpoint_minutes if key.startswith("train.")
                else run.slurm.get(key.split(".", 1)[1]))
        if have is None or float(have) != float(want):
            out.append(f"{key}: spec {have}, derived {want}")
    lead = float(run.slurm.get("signal_delay_s", 0) or 0)
    if lead < d["min_signal_delay_s"]:
        out.append(f"slurm.signal_delay_s: spec {lead:g}, needs >= {d['min_signal_delay_s']} "
                   f"(grace {REQUEUE_MARGIN_S} s + 2 x the {d['save_s']:.0f} s save)")
    return out


def print_resources(sweep: Sweep, runs: list[Run], file=None) -> None:
    """The dry run's resources section (spec with GPUs and an MFU time model only)."""
    file = file or sys.stdout
    e = sweep.estimate
    if (e.mfu is None or e.device_flops is None or e.device_memory is None
            or not any("gpus_per_node" in r.slurm for r in runs)):
        return
    print(f"\nresources per run (cgpt.sweep.resources: the fewest of 1..{MAX_NODES} nodes whose "
          f"analytic plan fits with only data/stage across nodes and whose estimate is <= "
          f"{TARGET_HOURS:g} h; saves at an ASSUMED {ASSUMED_WRITE_BYTES_PER_S / 1e9:g} GB/s, "
          "times are analytic estimates, not GPU timings):", file=file)
    print(f"{'run_id':34s} {'nodes':>5s} {'mesh':22s} {'across':>10s} {'est':>7s} "
          f"{'limit':>6s} {'save':>6s} {'ckpt':>5s}  spec", file=file)
    for r in runs:
        try:
            d = derive(sweep, r)
        except ValueError as err:
            print(f"{r.run_id:34s} error: {err}", file=file)
            continue
        p = d["plan"]
        mesh = ",".join(f"{k}={v}" for k, v in p["mesh"].items())
        diff = disagreements(r, d)
        print(f"{r.run_id:34s} {d['nodes']:5d} {mesh:22s} "
              f"{','.join(p['crosses_nodes']) or '-':>10s} {fmt_time(d['estimate_s']):>7s} "
              f"{d['timeout_min'] / 60:5.0f}h {d['save_s']:5.0f}s {d['checkpoint_minutes']:4d}m  "
              + ("agrees" if not diff else "; ".join(diff)), file=file)
