"""Meshes on real devices: joining a multi-process job, emulated CPU devices, the `Mesh` of a
placement's axes and a device's memory (the axes themselves: `cgpt.sharding.axes`).

Mesh axis names (MaxText's, where the role is the same):
  data   the batch is split over it (replicas). In weight_streaming the weights and
         optimizer state are sharded over it too, so they cover every device.
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
from jax.sharding import AxisType, Mesh

from cgpt.sharding import distributed



def maybe_initialize_distributed() -> bool:
    """Join a multi-host job when its environment says there is one (`cgpt.sharding.distributed`)."""
    return distributed.initialize()


def emulate_cpu_devices(n: int) -> None:
    """Ask JAX's CPU backend for n (emulated) devices. Only possible before any JAX
    computation starts; accelerator backends ignore it."""
    from jax._src import xla_bridge

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


def job_nodes(devices: Sequence) -> int:
    """The nodes `devices` span: 1 for one process; on CPU each process stands for a node
    (the multi-process tests); on accelerators the job's hosts (`distributed.job_layout`)."""
    procs = {d.process_index for d in devices}
    if len(procs) == 1:
        return 1
    if devices[0].platform == "cpu":
        return len(procs)
    n = int(distributed.job_layout().get("nodes") or 1)
    return n if len(procs) % n == 0 else 1


def node_groups(devices: Sequence, nodes: int) -> list[list]:
    """`devices` grouped by node, in node order. Devices of several processes: by process
    (`process_index` // processes per node, processes of a node being consecutive, as SLURM
    numbers its tasks); one process (plan's emulated devices): consecutive equal blocks."""
    procs = sorted({d.process_index for d in devices})
    if len(procs) > 1:
        if len(procs) % nodes:
            raise ValueError(f"{len(procs)} processes cannot be split over {nodes} nodes")
        per = len(procs) // nodes
        rank = {p: i for i, p in enumerate(procs)}
        groups: list[list] = [[] for _ in range(nodes)]
        for d in devices:
            groups[rank[d.process_index] // per].append(d)
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
                   use_mesh_utils: bool = True) -> np.ndarray:
    """The device array of a hybrid mesh: `jax.experimental.mesh_utils.create_hybrid_device_mesh`
    with each process a node (its granule); where processes are not nodes (one per GPU, or
    plan's one process emulating them) the same layout by hand: devices grouped by node
    (`node_groups`), shaped (dcn..., ici...) and each axis' dcn factor made its outer part."""
    from cgpt.sharding.nodes import split_axes

    split = split_axes(axes, nodes)
    dcn = tuple(split[a][0] for a in axes)
    ici = tuple(split[a][1] for a in axes)
    if use_mesh_utils and len({d.process_index for d in devices}) == nodes:
        from jax.experimental import mesh_utils

        return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=True)
    grid = np.array(node_groups(devices, nodes), dtype=object).reshape(dcn + ici)
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
            from cgpt.config.backend import device_memory

            return device_memory(int(stats["bytes_limit"]), os.environ)
        return int(stats["bytes_limit"])
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram // max(1, jax.local_device_count())
