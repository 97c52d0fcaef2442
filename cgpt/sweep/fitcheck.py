"""The dry run's fit check: each run's train step compiled for the devices its spec names.

For a spec with accelerator resources (`slurm.gpus_per_node`) and `estimate.device_memory`,
every run's step is lowered and compiled exactly as `train` would on its devices (slurm.nodes
x gpus_per_node), choosing micro-batch x accumulation and remat the same way (`cgpt.train.fit`),
all runs in one process (`cgpt.plan.command.plan_many`): by the H100's own compiler where JAX's
CUDA plugin is installed (`cgpt.plan.target`), else on as many emulated CPU devices. A local
CPU spec is not compiled here: `train` runs the same search at startup, where for the tiny
and cpu presets the first candidate (no accumulation, remat off) fits.
"""
from __future__ import annotations

import sys

from cgpt.config.model import remat_value
from cgpt.config.units import fmt_bytes
from cgpt.plan import target
from cgpt.plan.command import plan_many
from cgpt.sweep.spec import Run, Sweep


def fit_results(sweep: Sweep, runs: list[Run]) -> tuple[list[dict] | None, str]:
    """(one plan result or {"error": ...} per run, or None when not checked; a note line)."""
    if not any("gpus_per_node" in r.slurm for r in runs):
        return None, ("fit: not compiled for a local CPU spec; train picks micro-batch x "
                      "accumulation and remat from its compiled step when it starts")
    memory = sweep.estimate.device_memory
    if memory is None:
        return None, (f"fit: not checked; set estimate.device_memory (e.g. 80GB) in "
                      f"{sweep.path} or --set estimate.device_memory=80GB to compile each "
                      "run's step for its devices")

    tgt = target.default_target()
    where = ("compile-only H100s" if tgt != "cpu" else
             f"emulated CPU devices, which overstate a GPU's memory; {target.INSTALL}")
    print(f"fit: compiling each run's train step for its devices ({len(runs)} runs, {where}, "
          "one process)...", file=sys.stderr, flush=True)
    return plan_many([{"run": r.config.to_dict(), "devices": r.devices,
                       "nodes": int(r.slurm.get("nodes", 1)) if "gpus_per_node" in r.slurm else 1,
                       "device_memory": int(memory)} for r in runs], tgt=tgt), ""


def print_fit(runs: list[Run], results: list[dict], file=None) -> None:
    """Per run: mode and mesh, micro-batch x accumulation, remat, memory per device, fits."""
    file = file or sys.stdout
    print("\nfit per run (train step compiled for its devices; cgpt.plan.command):", file=file)
    print(f"{'run_id':34s} {'devices':>7s} {'mode':17s} {'mesh':15s} {'micro x acc':>11s} "
          f"{'remat':>9s} {'per device':>10s} {'usable':>8s} {'fits':>4s}", file=file)
    errors = []
    for run, r in zip(runs, results):
        if "error" in r:
            errors.append((run.run_id, r["error"]))
            print(f"{run.run_id:34s} {run.devices:7d} {'-':17s} {'-':15s} {'-':>11s} {'-':>9s} "
                  f"{'-':>10s} {'-':>8s} {'no':>4s}  (error below)", file=file)
            continue
        mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items())
        print(
            f"{run.run_id:34s} {r['num_devices']:7d} {r['mode']:17s} {mesh:15s} "
            f"{r['micro_batch']:>5d} x {r['accum']:<3d} {remat_value(r['remat']):>9s} "
            f"{fmt_bytes(r['per_device_bytes']['total']):>10s} {fmt_bytes(r['usable_memory']):>8s} "
            f"{'yes' if r['fits'] else 'NO':>4s}", file=file)
    for rid, err in errors:
        print(f"  {rid}: {err}", file=file)
    n_fit = sum(1 for r in results if r.get("fits"))
    print(f"{n_fit}/{len(results)} runs fit ({sum(r.get('compile_s', 0) for r in results):.0f} s "
          "of compiles)", file=file)
