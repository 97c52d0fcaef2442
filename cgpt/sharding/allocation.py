"""What the scheduler allocated, and the JAX process setup that uses all of it (JAX-free).

cgpt's layout: **one process per node, driving every GPU of its node** (`slurm.tasks_per_node:
1`, `slurm.gpus_per_node: 8` in sweeps/cerebras_gpt.yaml): fewer processes to coordinate, and
the node's GPUs share one address space. One process per GPU (`tasks_per_node` = GPUs per
node) is set up just as correctly. Either way each process must be told its GPUs: JAX's own
SLURM detection gives a process only `[SLURM_LOCALID]`, so one task per node would train on
GPU 0 of each node while MFU (divided by the devices JAX sees) looks normal.

`allocation_from_env(environ)` reads the allocation, `init_args` gives the arguments of
`jax.distributed.initialize` (with `local_device_ids`), and `check_devices` compares what JAX
then sees with the allocation and raises one `AllocationError` naming both numbers. All three
are pure functions of their arguments: the unit tests need no GPU and no scheduler.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

from cgpt.errors import AllocationError

GPU_PLATFORMS = ("gpu", "cuda", "rocm")
INSTALL_HINT = ("install JAX's CUDA wheels (`pip install -r requirements-gpu.txt`, "
                "README: GPU clusters), or set JAX_PLATFORMS=cpu to train on the CPU on purpose")


@dataclass(frozen=True)
class Allocation:
    """One process's view of its job: what the scheduler (or the JAX_* variables) gave it."""

    source: str  # "slurm" | "jax_env" | "local"
    nodes: int | None  # None: not stated (JAX_* variables without SLURM)
    processes: int
    process_id: int
    local_id: int  # this process's index among the processes of its node
    tasks_per_node: int
    gpus_per_node: int | None  # None: unknown (no SLURM GPU variables, no CUDA_VISIBLE_DEVICES)
    visible: tuple[str, ...] | None  # CUDA_VISIBLE_DEVICES, None when unset
    where: str  # the variables the numbers came from, for error messages

    @property
    def gpus_per_process(self) -> int | None:
        return None if self.gpus_per_node is None else self.gpus_per_node // self.tasks_per_node

    def local_device_ids(self) -> list[int] | None:
        """The GPU ordinals (after CUDA_VISIBLE_DEVICES) this process drives; None without GPUs.

        With every task of a node seeing all of its GPUs, task k of T takes the k-th block of
        G/T; a task already bound to its own GPUs (`--gpus-per-task`, `--gpu-bind`) takes
        all it sees.
        """
        g, k = self.gpus_per_node, self.gpus_per_process
        if not g:
            return None
        if g % self.tasks_per_node:
            raise AllocationError(
                f"{self.where}: {g} GPUs per node cannot be split evenly over "
                f"{self.tasks_per_node} tasks per node; use 1 task per node (cgpt's layout) "
                f"or {g} (one per GPU)")
        seen = g if self.visible is None else len(self.visible)
        if seen == k:
            return list(range(k))
        if seen == g:
            return list(range(self.local_id * k, (self.local_id + 1) * k))
        raise AllocationError(
            f"{self.where}: this task sees {seen} GPU(s) (CUDA_VISIBLE_DEVICES="
            f"{','.join(self.visible or ())}) but should drive {k} of the node's {g}; let "
            f"every task see its node's GPUs or bind each task to its own")


def _int(environ: Mapping[str, str], *names: str) -> tuple[int | None, str]:
    for n in names:
        v = (environ.get(n) or "").strip()
        if v:
            m = re.search(r"(\d+)", v.split(",")[0].split(":")[-1])  # "h100:8", "8(x2)"
            if m:
                return int(m.group(1)), f"{n}={v}"
    return None, ""


def _visible(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    v = environ.get("CUDA_VISIBLE_DEVICES")
    if v is None:
        return None
    return tuple(g.strip() for g in v.split(",") if g.strip() and g.strip() not in ("-1",
                                                                                    "NoDevFiles"))


def allocation_from_env(environ: Mapping[str, str], gpus_present: int = 0) -> Allocation:
    """The allocation this process belongs to, from its environment.

    `gpus_present`: NVIDIA devices the node exposes (/dev/nvidiaN), the evidence of GPUs when
    neither SLURM nor CUDA_VISIBLE_DEVICES states them.
    """
    visible = _visible(environ)
    if environ.get("SLURM_JOB_ID") and environ.get("SLURM_NTASKS"):
        procs, p_src = _int(environ, "SLURM_NTASKS")
        nodes, n_src = _int(environ, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
        nodes = nodes or 1
        per_node, t_src = _int(environ, "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
        per_node = per_node or max(1, procs // nodes)
        gpus, g_src = _int(environ, "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE")
        if gpus is None and visible is not None:
            gpus, g_src = len(visible) * per_node, "CUDA_VISIBLE_DEVICES"
        where = ", ".join(x for x in (n_src or "1 node", p_src, t_src, g_src) if x)
        return Allocation("slurm", nodes, procs, int(environ.get("SLURM_PROCID") or 0),
                          int(environ.get("SLURM_LOCALID") or 0), per_node, gpus, visible,
                          f"SLURM allocation ({where})")
    gpus = len(visible) if visible is not None else (gpus_present or None)
    g_src = ("CUDA_VISIBLE_DEVICES=" + environ["CUDA_VISIBLE_DEVICES"] if visible is not None
             else f"{gpus_present} /dev/nvidia* devices" if gpus_present else "")
    if environ.get("JAX_COORDINATOR_ADDRESS"):
        procs = int(environ.get("JAX_NUM_PROCESSES") or 1)
        where = ", ".join(x for x in (f"JAX_NUM_PROCESSES={procs}", g_src) if x)
        return Allocation("jax_env", None, procs, int(environ.get("JAX_PROCESS_ID") or 0), 0,
                          1, gpus, visible, f"JAX_* environment ({where})")
    return Allocation("local", 1, 1, 0, 0, 1, gpus, visible,
                      f"this machine ({g_src or 'no GPU stated'})")


def init_args(alloc: Allocation, environ: Mapping[str, str]) -> dict | None:
    """Keyword arguments for `jax.distributed.initialize`, or None for a one-process job.

    SLURM: JAX reads the coordinator, process count and id itself; cgpt adds
    `local_device_ids`, every GPU this process was given. JAX_*: the coordinator, count and
    id from those variables (JAX_PROCESS_ID is required).
    """
    if alloc.processes <= 1 and environ.get("CGPT_DISTRIBUTED") != "1":
        return None
    kw: dict = {}
    if alloc.source == "jax_env":
        if "JAX_PROCESS_ID" not in environ:
            raise ValueError("JAX_COORDINATOR_ADDRESS is set but JAX_PROCESS_ID is not; set "
                             "JAX_PROCESS_ID (0 .. JAX_NUM_PROCESSES-1) for every process")
        kw.update(coordinator_address=environ["JAX_COORDINATOR_ADDRESS"],
                  num_processes=alloc.processes, process_id=alloc.process_id)
    ids = alloc.local_device_ids()
    if ids is not None:
        kw["local_device_ids"] = ids
    return kw


def check_devices(alloc: Allocation, platform: str, global_count: int, local_count: int,
                  process_count: int, nodes: int | None = None,
                  cpu_on_purpose: bool = False) -> None:
    """Stop before training unless JAX sees what was allocated: the processes (and nodes),
    the GPUs of every process, and a GPU platform wherever GPUs were allocated.

    `platform`: JAX's default backend; `global_count`/`local_count`: jax.device_count() and
    jax.local_device_count(); `nodes`: the distinct hosts the processes run on;
    `cpu_on_purpose`: JAX_PLATFORMS=cpu was set, so allocated GPUs go unused knowingly.
    """
    if process_count != alloc.processes:
        raise AllocationError(f"the {alloc.where} has {alloc.processes} process(es) but JAX "
                              f"joined {process_count}; start one process per task (srun)")
    if nodes is not None and alloc.nodes is not None and nodes != alloc.nodes:
        raise AllocationError(f"the {alloc.where} spans {alloc.nodes} node(s) but the "
                              f"{process_count} processes run on {nodes} host(s)")
    want = alloc.gpus_per_process
    if not want:
        return
    if platform not in GPU_PLATFORMS:
        if cpu_on_purpose:
            return
        raise AllocationError(
            f"the {alloc.where} gives each process {want} GPU(s) but JAX found none and fell "
            f"back to {platform.upper()} ({local_count} device(s)): {INSTALL_HINT}")
    if local_count != want or global_count != want * alloc.processes:
        raise AllocationError(
            f"the {alloc.where} gives each of {alloc.processes} process(es) {want} GPU(s), "
            f"{want * alloc.processes} in all, but JAX sees {local_count} in this process "
            f"and {global_count} in all; check CUDA_VISIBLE_DEVICES and the GPUs' health "
            "(nvidia-smi)")


def layout(alloc: Allocation, nodes: int | None, processes: int, local_count: int,
           global_count: int) -> dict:
    """The job's layout as summary.json's `placement` records it."""
    return {"nodes": nodes if nodes is not None else alloc.nodes, "processes": processes,
            "devices_per_process": local_count, "devices_total": global_count,
            "allocation": alloc.source}


def gpus_present(dev: str = "/dev") -> int:
    """NVIDIA GPUs this node exposes (/dev/nvidia0, /dev/nvidia1, ...), read without CUDA."""
    try:
        return sum(bool(re.fullmatch(r"nvidia\d+", n)) for n in os.listdir(dev))
    except OSError:
        return 0
