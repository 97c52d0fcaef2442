"""Execution strategies: how the train step is placed on devices.

`make_strategy(mode, mesh_spec, cfg, train_cfg)` returns an object the training loop uses
without knowing the mode (its interface: `cgpt.sharding.strategies`).

Modes (Cerebras' two execution modes, plus plain data parallelism and a chooser):
  single            everything on one device: the reference the others must match.
  data_parallel     weights replicated, batch sharded over `data`; XLA all-reduces gradients.
  weight_streaming  activations stationary (batch over `data`, and `fsdp` where it divides);
                    weights and optimizer state sharded on their embed/heads/mlp dims over
                    every device (`fsdp` x `data`), the stand-in for MemoryX. Inside the
                    layer scan XLA all-gathers one layer's weights just before use and
                    reduces its gradients back (GSPMD FSDP; the gather sits in the while
                    loop, see tests/test_plan.py). An empty --mesh factors the devices into
                    data (the most the global batch splits over) x fsdp (the rest).
  layer_pipelined   contiguous groups of layers pinned to the stages of a `stage` axis,
                    weights stationary, micro-batches flow through a GPipe schedule
                    (`cgpt.sharding.pipeline`); combinable with `data`.
  auto              the first that fits the devices' memory (`cgpt.sharding.auto`).

Modules: `mesh` (process setup, --mesh, factorization), `rules` (the rules tables,
`logical_to_spec` and the unsharded-dims report), `strategies`, `auto` (memory model).
"""
from __future__ import annotations

import logging
import math
from typing import Sequence

import jax

from cgpt.config.model import ModelConfig
from cgpt.sharding.auto import (BYTES_PER_PARAM_STATE, activation_bytes, choose_auto,
                                data_parallel_bytes_per_device, device_memory_bytes,
                                logits_bytes, pipeline_bytes_per_device,
                                weight_streaming_bytes_per_device)
from cgpt.sharding.mesh import (MESH_AXES, SHARDED_MODES, build_mesh, emulate_cpu_devices,
                                maybe_initialize_distributed, mesh_size, parse_mesh,
                                weight_streaming_axes)
from cgpt.sharding.rules import (DATA_PARALLEL, LAYER_PIPELINED, RULES, WEIGHT_STREAMING, Rules,
                                 Unsharded, logical_to_spec)
from cgpt.sharding.strategies import (DataParallel, LayerPipelined, Sharded, SingleDevice,
                                      WeightStreaming)
from cgpt.sharding.pipeline import bubble_fraction

log = logging.getLogger(__name__)

HOST_OFFLOAD_REMOVED = (
    "train.host_offload (plan --host-offload) was removed: cgpt does not stream weights from "
    "pinned host memory (the pinned-host arrays were computed on directly, and CPU has no "
    "such memory to test a real stream on); set train.host_offload=false. weight_streaming "
    "already keeps 1/N of the weights and optimizer state on each of N devices")


def _batch_axes(axes: dict[str, int], batch: int, micro_batch: int | None) -> tuple[str, ...]:
    """weight_streaming's batch axes: `data`, plus `fsdp` when the global batch splits over
    data x fsdp (with `micro_batch` sequences per shard when it is set)."""
    n = axes.get("data", 1) * axes.get("fsdp", 1) * (micro_batch or 1)
    return ("data", "fsdp") if batch % n == 0 else ("data",)


def placement(mode: str, mesh_spec: str, cfg: ModelConfig, train_cfg=None, *,
              num_devices: int, device_memory: int | None = None,
              seq_len: int | None = None) -> tuple[str, dict[str, int], str, str | None]:
    """(mode, mesh axes, why the mesh has that shape, why auto chose the mode) for a sharded
    `--mode`/`--mesh` on `num_devices` devices: no devices needed, so a 64-device
    placement can be checked anywhere."""
    if mode not in SHARDED_MODES:
        raise ValueError(f"--mode {mode!r}; use one of single, {', '.join(SHARDED_MODES)}")
    from cgpt.train.optim import published_defaults

    batch = getattr(train_cfg, "batch_size", None) or published_defaults(cfg)["batch_size"]
    micro = getattr(train_cfg, "micro_batch", None)
    given = bool((mesh_spec or "").strip())
    axes = parse_mesh(mesh_spec, mode, num_devices)
    mesh_reason = "given by --mesh" if given else f"--mesh empty: every device on {next(iter(axes))}"
    auto_reason = None
    if mode == "auto":
        honoured = ({k: v for k, v in axes.items() if v > 1} or {"data": 1}) if given else None
        mode, axes, auto_reason = choose_auto(
            cfg, math.prod(axes.values()) if given else num_devices,
            device_memory or device_memory_bytes(), batch, seq_len or cfg.n_ctx, micro,
            honoured)
        log.info("--mode auto: %s", auto_reason)
    if mode == "weight_streaming" and not given:
        axes, mesh_reason = weight_streaming_axes(num_devices, batch, micro)
    elif auto_reason and not given:
        mesh_reason = "chosen by --mode auto"
    return mode, axes, mesh_reason, auto_reason


def strategy_on(mesh, mode: str, cfg: ModelConfig, train_cfg=None, mesh_reason: str = "",
                auto_reason: str | None = None) -> Sharded:
    """The strategy of a resolved `placement` on `mesh` (a real Mesh, or an AbstractMesh
    to inspect shardings and the unsharded report without devices)."""
    from cgpt.train.optim import published_defaults

    batch = getattr(train_cfg, "batch_size", None) or published_defaults(cfg)["batch_size"]
    micro = getattr(train_cfg, "micro_batch", None)
    axes = dict(mesh.shape)
    if mode == "data_parallel":
        s: Sharded = DataParallel(cfg, mesh, ("data",), mesh_reason)
    elif mode == "weight_streaming":
        batch_axes = _batch_axes(axes, batch, micro)
        s = WeightStreaming(cfg, mesh, batch_axes, mesh_reason)
        if "fsdp" not in batch_axes and axes.get("fsdp", 1) > 1:
            s.unsharded.add(Unsharded(
                "batch (every activation)", "act_batch", batch, ("data", "fsdp"), ("data",),
                f"the global batch {batch} is not a multiple of data={axes.get('data', 1)} x "
                f"fsdp={axes['fsdp']}" + (f" x micro-batch {micro}" if micro else "")))
            log.warning("weight_streaming: the batch of %d splits over data=%d only; the "
                        "fsdp=%d devices of each group share its rows and split their MLP "
                        "instead (the weights are still sharded over all %d)", batch,
                        axes.get("data", 1), axes["fsdp"], mesh.size)
    else:
        s = LayerPipelined(cfg, mesh, getattr(train_cfg, "micro_batches", None), mesh_reason)
    s.auto_reason = auto_reason
    return s


def make_strategy(mode: str, mesh_spec: str, cfg: ModelConfig, train_cfg=None, *,
                  devices: Sequence | None = None, device_memory: int | None = None,
                  seq_len: int | None = None, host_offload: bool | None = None):
    """The strategy for `--mode`/`--mesh`. `devices` defaults to all of JAX's devices
    (joining a multi-host job first if the environment describes one)."""
    if host_offload or getattr(train_cfg, "host_offload", False):
        raise ValueError(HOST_OFFLOAD_REMOVED)
    if mode == "single":
        if jax.process_count() > 1:
            raise ValueError(f"--mode single runs on one device, but this job has "
                             f"{jax.process_count()} processes; use a sharded --mode "
                             "(data_parallel, weight_streaming, layer_pipelined or auto)")
        if mesh_spec:
            raise ValueError(f"--mesh {mesh_spec!r} needs a sharded --mode (data_parallel, "
                             "weight_streaming, layer_pipelined or auto)")
        return SingleDevice(cfg)
    if mode not in SHARDED_MODES:
        raise ValueError(f"--mode {mode!r}; use one of single, {', '.join(SHARDED_MODES)}")
    if devices is None:
        maybe_initialize_distributed()
        devices = jax.devices()
    if mode == "auto" and device_memory is None:
        device_memory = device_memory_bytes(devices[0])
    mode, axes, mesh_reason, auto_reason = placement(
        mode, mesh_spec, cfg, train_cfg, num_devices=len(devices),
        device_memory=device_memory, seq_len=seq_len)
    return strategy_on(build_mesh(axes, devices), mode, cfg, train_cfg, mesh_reason,
                       auto_reason)


__all__ = [
    "BYTES_PER_PARAM_STATE", "DATA_PARALLEL", "HOST_OFFLOAD_REMOVED", "LAYER_PIPELINED",
    "MESH_AXES", "RULES", "SHARDED_MODES", "WEIGHT_STREAMING", "DataParallel",
    "LayerPipelined", "Rules", "Sharded", "SingleDevice", "Unsharded", "WeightStreaming",
    "activation_bytes", "bubble_fraction", "build_mesh", "choose_auto",
    "data_parallel_bytes_per_device", "device_memory_bytes", "emulate_cpu_devices",
    "logical_to_spec", "logits_bytes", "make_strategy", "maybe_initialize_distributed",
    "mesh_size", "parse_mesh", "pipeline_bytes_per_device", "placement", "strategy_on", "weight_streaming_axes",
    "weight_streaming_bytes_per_device",
]
