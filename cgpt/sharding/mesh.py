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


def build_mesh(axes: dict[str, int], devices: Sequence | None = None) -> Mesh:
    """A mesh over the first prod(sizes) devices, with Auto axes (GSPMD + sharding rules)."""
    devices = list(jax.devices() if devices is None else devices)
    n = math.prod(axes.values())
    names = tuple(axes)
    auto = (AxisType.Auto,) * len(names)
    if n == len(devices):
        return jax.make_mesh(tuple(axes.values()), names, axis_types=auto, devices=devices)
    return Mesh(np.array(devices[:n]).reshape(tuple(axes.values())), names, axis_types=auto)


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
