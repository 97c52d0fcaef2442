"""Meshes: joining a multi-process job, emulated CPU devices, `--mesh` parsing, and how a
weight-streaming mesh factors into batch shards x weight shards.

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
from typing import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from cgpt.sharding import distributed

# mesh axes each mode accepts; the first is where an empty --mesh puts every device
MESH_AXES: dict[str, tuple[str, ...]] = {"data_parallel": ("data",),
                                         "weight_streaming": ("data", "fsdp"),
                                         "layer_pipelined": ("stage", "data"),
                                         "auto": ("stage", "data", "fsdp")}
SHARDED_MODES = ("data_parallel", "weight_streaming", "layer_pipelined", "auto")


def maybe_initialize_distributed() -> bool:
    """Join a multi-host job when its environment says there is one (`cgpt.sharding.distributed`)."""
    return distributed.initialize()


def mesh_size(spec: str) -> int:
    """Devices a `--mesh` spec asks for (the product of its sizes), checking only its syntax."""
    n = 1
    for item in spec.split(","):
        _, eq, size = item.partition("=")
        if not eq or not size.strip().isdigit() or int(size) < 1:
            raise ValueError(f"--mesh {spec!r}: expected axis=size pairs separated by commas, "
                             "e.g. --mesh data=16 or --mesh stage=4,data=2")
        n *= int(size)
    return n


def emulate_cpu_devices(n: int) -> None:
    """Ask JAX's CPU backend for n (emulated) devices. Only possible before any JAX
    computation starts; accelerator backends ignore it."""
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_num_cpu_devices", max(n, 1))


def parse_mesh(spec: str, mode: str, num_devices: int) -> dict[str, int]:
    """`"data=2,stage=4"` -> {"data": 2, "stage": 4}; empty -> every device on the main axis
    (weight_streaming's empty mesh is factored by `weight_streaming_axes` instead)."""
    allowed = MESH_AXES[mode]
    spec = (spec or "").strip()
    if not spec:
        return {allowed[0]: num_devices}
    axes: dict[str, int] = {}
    for item in spec.split(","):
        name, eq, size = item.strip().partition("=")
        name = name.strip()
        if not eq or not size.strip().isdigit():
            raise ValueError(f"--mesh {spec!r}: expected axis=size pairs separated by commas, "
                             f"e.g. --mesh {','.join(f'{a}=2' for a in allowed)}")
        if name not in allowed:
            raise ValueError(f"--mesh {spec!r}: axis {name!r} is not used by --mode {mode}; "
                             f"its axes are {', '.join(allowed)}")
        if name in axes:
            raise ValueError(f"--mesh {spec!r}: axis {name!r} is given twice")
        if int(size) < 1:
            raise ValueError(f"--mesh {spec!r}: axis {name} must have size >= 1")
        axes[name] = int(size)
    if axes.get("stage", 1) > 1 and axes.get("fsdp", 1) > 1:
        raise ValueError(f"--mesh {spec!r}: stage and fsdp belong to different modes "
                         "(layer_pipelined, weight_streaming); give one of them")
    n = math.prod(axes.values())
    if n > num_devices:
        raise ValueError(f"--mesh {spec!r} needs {n} devices but only {num_devices} are "
                         f"available; shrink the mesh so the sizes multiply to <= {num_devices}")
    if n < num_devices and jax.process_count() > 1:
        raise ValueError(f"--mesh {spec!r} uses {n} of {num_devices} devices; on several hosts "
                         "the sizes must multiply to the global device count")
    return axes


def weight_streaming_axes(num_devices: int, batch: int,
                          micro_batch: int | None = None) -> tuple[dict[str, int], str]:
    """(axes, why) for weight streaming on `num_devices` with an empty `--mesh`: `data` =
    the most devices the global batch splits over (the largest divisor of the device count
    that divides `batch`, and `batch / micro_batch` when a micro-batch is set), `fsdp` = the
    rest. The weights are sharded over both, i.e. over every device."""
    step = batch // micro_batch if micro_batch and batch % micro_batch == 0 else batch
    data = max(d for d in range(1, num_devices + 1) if num_devices % d == 0 and step % d == 0)
    fsdp = num_devices // data
    if fsdp == 1:
        return {"data": data}, (f"the global batch of {batch} splits over all {num_devices} "
                                f"devices: data={data}, weights sharded over the same devices")
    return {"data": data, "fsdp": fsdp}, (
        f"the global batch of {batch}{f' (micro-batch {micro_batch})' if micro_batch else ''}"
        f" splits over at most {data} of the {num_devices} devices (the largest divisor of "
        f"{num_devices} that divides it): data={data} batch shards x fsdp={fsdp}; weights "
        f"sharded over all {num_devices}, each fsdp group shares a batch shard")


def build_mesh(axes: dict[str, int], devices: Sequence | None = None) -> Mesh:
    """A mesh over the first prod(sizes) devices, with Auto axes (GSPMD + sharding rules)."""
    devices = list(jax.devices() if devices is None else devices)
    n = math.prod(axes.values())
    names = tuple(axes)
    auto = (AxisType.Auto,) * len(names)
    if n == len(devices):
        return jax.make_mesh(tuple(axes.values()), names, axis_types=auto, devices=devices)
    return Mesh(np.array(devices[:n]).reshape(tuple(axes.values())), names, axis_types=auto)
