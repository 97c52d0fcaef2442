"""Which runs of a sweep train together: fused groups of one shape (issue #21).

Runs that share everything a program is compiled from (model shape, data, sequence length,
batch, step count, execution mode) and differ only in what a fused member may differ in
(the keys with the "member" role, `cgpt.config.run.ROLES`: seed, data order, peak LR, warmup,
schedule, weight decay, clipping, init scales) become one job: one process trains them as one
vmapped program (`cgpt.train.fused_loop.train_fused`), each member still its own run
directory. How many members one program holds is decided where micro-batches are, at the
start of the job on its device: the fused step is compiled for the whole group and, if it
does not fit the device's memory, for fewer (`members_that_fit`); the group then trains in
consecutive chunks.

Where the members go (`cgpt.sharding.members`): a train.mode=single group spreads them over
the job's devices (each member's step on one device, no communication); a data_parallel,
weight_streaming or layer_pipelined group puts the member axis beside the runs' own mesh
(`{member: k, **mesh}`, e.g. member x stage x data, k groups of the run's devices, or k = 1:
every device holds its shard, or its stage, of every member).
Not fused: cooldown branches (they start from a parent's checkpoint), runs over several nodes
(a fused job is one process), and everything under `--no-fuse`.
"""
from __future__ import annotations

import json
import math
import sys

from cgpt.config.backend import forced_cpu_devices
from cgpt.sweep.executors import Job
from cgpt.sweep.spec import Run
from cgpt.config.run import without
from cgpt.config.units import fmt_bytes
from cgpt.sharding.axes import member_groups
from cgpt.train import fit
from cgpt.train.resolve import resolve


def fuse_key(run: Run) -> str | None:
    """The group a run can train in (None: it trains alone)."""
    if run.branch_from is not None or int(run.slurm.get("nodes", 1) or 1) > 1:
        return None
    return json.dumps(without(run.config.to_dict(), "member"), sort_keys=True, default=str)


def plan_groups(runs: list[Run], fuse: bool = True) -> list[list[Run]]:
    """`runs` split into groups (each trains as one job), in the order of each group's first
    run; without `fuse` every run is its own group."""
    groups: dict[object, list[Run]] = {}
    for k, r in enumerate(runs):
        key = fuse_key(r) if fuse else None
        groups.setdefault(key if key is not None else ("alone", k), []).append(r)
    return list(groups.values())


def group_jobs(groups: list[list[Run]], jobs: dict[str, Job]) -> list[Job]:
    """One Job per group: a lone run's own, or the first member's carrying all `members`."""
    out = []
    for g in groups:
        first = jobs[g[0].run_id]
        out.append(first if len(g) == 1 else Job(
            first.run_id, first.run_dir, any(jobs[r.run_id].resume for r in g), env=first.env,
            files=first.files, members=tuple(jobs[r.run_id] for r in g)))
    return out


def print_groups(groups: list[list[Run]], fuse: bool, fits: dict | None = None,
                 file=None) -> None:
    """The --dry-run's group table: which runs train as one program, and (`fits`, from
    `members_that_fit`) how many members one program holds on the device."""
    file = file or sys.stdout
    fused = [g for g in groups if len(g) > 1]
    if not fuse:
        print(f"\nfusion off (--no-fuse): {len(groups)} jobs, one run each", file=file)
        return
    print(f"\nfused groups: {len(groups)} jobs for {sum(map(len, groups))} runs "
          f"({len(fused)} fused group(s) of {sum(map(len, fused))} runs; --no-fuse: one job "
          "per run)", file=file)
    for g in groups:
        if len(g) == 1:
            continue
        fit = (fits or {}).get(g[0].run_id)
        if fit is None:
            how = "members per program: chosen at start from the compiled fused step's memory"
        elif "error" in fit:
            how = f"fit not checked: {fit['error']}"
        else:
            chunks = math.ceil(len(g) / fit["members"])
            how = (f"{fit['members']} member(s) per program fit ({fit['bytes_per_program']} of "
                   f"{fit['usable']} usable) -> {chunks} program(s) in the job")
        print(f"  {g[0].model}: {len(g)} runs, {g[0].steps} steps: "
              f"{', '.join(r.run_id for r in g)}\n    {how}\n    {placement_line(g)}",
              file=file)


def _local_cpu_devices() -> int:
    """The CPU devices a local job's process gets: XLA_FLAGS' emulated count (the sweep's
    workers inherit the environment), else one."""
    return forced_cpu_devices() or 1


def placement_line(g: list[Run]) -> str:
    """Where a group's members go on its job's devices (slurm nodes x gpus_per_node, one
    locally), as `cgpt.sharding.members` lays them out: arithmetic only (no JAX)."""
    run = g[0]
    spread = "gpus_per_node" in run.slurm  # accelerators: spread; CPU devices share cores
    n = run.devices if run.slurm else _local_cpu_devices()
    if run.config.train.mode == "single":
        k = member_groups(len(g), 1, n, spread)
        return f"placement: each member on one device, members on {k} of {n} device(s)"
    if run.config.train.mode == "auto":  # decided from the devices' memory at the start
        return ("placement: train.mode=auto is decided at the job's start (the member axis "
                "beside the mesh it chooses)")
    try:
        r = resolve(run.config, n, platform="gpu" if spread else "cpu")
    except Exception as e:  # noqa: BLE001 - a dry run reports it and goes on
        return f"placement: not resolved here ({type(e).__name__}: {e})"
    per = max(1, r.num_devices)
    k = member_groups(len(g), per, n, spread)
    mesh = " x ".join(f"{a}={v}" for a, v in {"member": k, **r.mesh}.items())
    return (f"placement: {r.mode} mesh {mesh} on {k * per} of {n} device(s)"
            + (" (every device holds its shard of every member)" if k == 1 else ""))


def fit_groups(groups: list[list[Run]], device_memory: int | None) -> dict[str, dict]:
    """For the dry run: each fused group's members per program, from its fused step compiled
    here (on this machine's backend, standing in for the devices) against `device_memory`
    (default: this machine's), with every member on the run's own devices (not split over a
    member axis: an upper bound on the bytes per device)."""
    from cgpt.sharding.mesh import device_memory_bytes  # loads JAX: only when this runs
    # loads JAX: only when this runs
    from cgpt.train.fused_loop import members_that_fit, resolve_member

    import jax  # loads JAX: only when this runs

    out = {}
    memory = device_memory or device_memory_bytes()
    for g in groups:
        if len(g) < 2:
            continue
        here = len(jax.devices())
        if g[0].config.train.mode != "single" and g[0].devices > here:
            out[g[0].run_id] = {"error": (
                f"the job has {g[0].devices} devices but this process {here}, too few to "
                "build the runs' mesh beside the member axis; the members per program are "
                "chosen from the compiled step at the job's start")}
            continue
        try:
            r = resolve_member(g[0].config, memory)
            m, b = members_that_fit(r, len(g), memory)
            out[g[0].run_id] = {"members": m, "bytes_per_program": fmt_bytes(b),
                                "usable": fmt_bytes(fit.usable_memory(memory))}
        except Exception as e:  # noqa: BLE001 - a dry run reports it and goes on
            out[g[0].run_id] = {"error": f"{type(e).__name__}: {e}"}
    return out


__all__ = ["fuse_key", "plan_groups", "group_jobs", "print_groups", "fit_groups"]
