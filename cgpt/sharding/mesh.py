"""Meshes on real devices: joining a multi-process job, emulated CPU devices, the `Mesh` of a
placement's axes and a device's memory (the axes themselves: `cgpt.sharding.axes`).

Mesh axis names (MaxText's, where the role is the same):
  data   the batch is split over it (replicas). In weight_streaming on one node the
         weights and optimizer state are sharded over it too, so they cover every device;
         on several nodes it crosses them and the state is replicated over it (HSDP).
  fsdp   weight_streaming only: the weights and optimizer state are sharded over it; the
         batch is split over it as well where the global batch divides data x fsdp
         (MaxText's fsdp), otherwise its devices share a batch shard and split its MLP
         (tensor-parallel style). An empty `--mesh` uses it only for the part of the device
         count the batch cannot absorb.
  stage  layer_pipelined: contiguous groups of layers, one per stage.
"""
from __future__ import annotations

import math
import os
from typing import Sequence

import jax
import numpy as np
from jax._src import xla_bridge
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from cgpt.config.backend import device_memory
from cgpt.sharding import distributed
from cgpt.sharding.nodes import host_groups, split_axes



def maybe_initialize_distributed() -> bool:
    """Join a multi-host job when its environment says there is one
    (`cgpt.sharding.distributed`)."""
    return distributed.initialize()


MAX_EMULATED_DEVICES = 4096  # each costs host memory: `--mesh data=100000000` took 12 GB, rising


def emulate_cpu_devices(n: int) -> None:
    """Ask JAX's CPU backend for n (emulated) devices; the request wins over an inherited
    XLA_FLAGS count (a SLURM task's one device). Only possible before any JAX computation
    starts; accelerator backends ignore it."""
    if n > MAX_EMULATED_DEVICES:
        raise ValueError(f"--mesh/--devices: {n:,} devices is more than the "
                         f"{MAX_EMULATED_DEVICES} this host can emulate on its CPU; use a "
                         "smaller mesh (or `cgpt plan --no-compile` for the analytic plan)")
    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_num_cpu_devices", max(n, 1))


def build_mesh(axes: dict[str, int], devices: Sequence | None = None, nodes: int = 1) -> Mesh:
    """A mesh over the first prod(sizes) devices, with Auto axes (GSPMD + sharding rules).

    On `nodes` > 1 the mesh is hybrid (`hybrid_devices`): each axis' across-nodes factor
    (`cgpt.sharding.nodes.split_axes`) is its outer part, so only the axes that must cross
    nodes (`data`, then `stage`) hold devices of different nodes. One node keeps the plain
    layout (the single-node results are unchanged)."""
    devices = list(jax.devices() if devices is None else devices)
    n = math.prod(axes.values())
    names = tuple(axes)
    auto = (AxisType.Auto,) * len(names)
    if nodes > 1:
        return Mesh(hybrid_devices(axes, devices[:n], nodes), names, axis_types=auto)
    if n == len(devices):
        return jax.make_mesh(tuple(axes.values()), names, axis_types=auto, devices=devices)
    return Mesh(np.array(devices[:n]).reshape(tuple(axes.values())), names, axis_types=auto)


def _hosts(devices: Sequence) -> list[str]:
    """The host of each process index: the job's, as gathered at start-up; for the processes
    of a compile-only topology (`cgpt.plan.target`: process indices this job does not have)
    one host a process, as a multi-node GPU job runs."""
    top = max(d.process_index for d in devices)
    if top >= jax.process_count():
        return [f"topology host {p}" for p in range(top + 1)]
    return distributed.process_hosts()


def job_nodes(devices: Sequence, hosts: Sequence[str] | None = None) -> int:
    """The nodes `devices` span: the distinct hosts their processes run on (`hosts`, one per
    process index; default: those `cgpt.sharding.distributed` gathered when the job
    started), 1 for one process. ValueError naming every host's processes when the hosts
    hold different numbers of processes (`cgpt.sharding.nodes.host_groups`)."""
    if len({d.process_index for d in devices}) == 1:
        return 1
    return len(host_groups(_hosts(devices) if hosts is None else hosts))


def node_groups(devices: Sequence, nodes: int,
                hosts: Sequence[str] | None = None) -> list[list]:
    """`devices` grouped by node, in node order. Devices of several processes: by the host
    each process runs on (`hosts`, default the job's as gathered at start-up: a node's
    processes need not be numbered consecutively); one process (plan's emulated devices):
    consecutive equal blocks. ValueError naming both when the hosts are not `nodes`."""
    procs = {d.process_index for d in devices}
    if len(procs) > 1:
        hosts = _hosts(devices) if hosts is None else hosts
        groups_of = [g for g in host_groups(hosts) if procs & set(g)]
        if len(groups_of) != nodes:
            where = "; ".join(f"{hosts[g[0]]}: processes {', '.join(map(str, g))}"
                              for g in groups_of)
            raise ValueError(f"the mesh is laid over {nodes} nodes but the job's {len(procs)} "
                             f"processes run on {len(groups_of)} hosts ({where}); plan and "
                             "train for the nodes the job has")
        node_of = {p: i for i, g in enumerate(groups_of) for p in g}
        groups: list[list] = [[] for _ in range(nodes)]
        for d in devices:
            groups[node_of[d.process_index]].append(d)
    else:
        if len(devices) % nodes:
            raise ValueError(f"{len(devices)} devices cannot be split over {nodes} nodes")
        k = len(devices) // nodes
        groups = [list(devices[i * k:(i + 1) * k]) for i in range(nodes)]
    if len({len(g) for g in groups}) != 1:
        raise ValueError(f"the nodes hold different device counts ({[len(g) for g in groups]}); "
                         "a hybrid mesh needs the same number on every node")
    return [sorted(g, key=lambda d: d.id) for g in groups]


def hybrid_devices(axes: dict[str, int], devices: Sequence, nodes: int,
                   use_mesh_utils: bool = True, hosts: Sequence[str] | None = None
                   ) -> np.ndarray:
    """The device array of a hybrid mesh: devices grouped by node (`node_groups`: by the
    host of their process), shaped (dcn..., ici...) and each axis' dcn factor made its outer
    part. Where each node is one process this is
    `jax.experimental.mesh_utils.create_hybrid_device_mesh` with the process as granule (it
    also orders a node's devices by their physical links); otherwise (one process per GPU,
    or plan's one process emulating the nodes) the same layout by hand."""
    split = split_axes(axes, nodes)
    dcn = tuple(split[a][0] for a in axes)
    ici = tuple(split[a][1] for a in axes)
    groups = node_groups(devices, nodes, hosts)
    if use_mesh_utils and all(len({d.process_index for d in g}) == 1 for g in groups) and \
            len({d.process_index for d in devices}) == nodes:
        return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=True)
    grid = np.array(groups, dtype=object).reshape(dcn + ici)
    k = len(axes)
    order = [i for pair in zip(range(k), range(k, 2 * k)) for i in pair]  # d0, i0, d1, i1 ...
    return grid.transpose(order).reshape(tuple(axes.values()))


def device_memory_bytes(device=None) -> int:
    """Memory of one device as `plan --device-memory` means it: on a GPU the physical memory
    whose 90% the allocator pool holds (`cgpt.config.backend.device_memory`), on TPU the
    allocator's limit, on CPU RAM / device count."""
    device = device or jax.devices()[0]
    stats = None
    try:
        stats = device.memory_stats()
    except Exception:
        pass
    if stats and stats.get("bytes_limit"):
        if device.platform in ("gpu", "cuda", "rocm"):
            return device_memory(int(stats["bytes_limit"]), os.environ)
        return int(stats["bytes_limit"])
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram // max(1, jax.local_device_count())
