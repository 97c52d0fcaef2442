"""Execution strategies: how the train step is placed on devices.

A resolved run's mode and mesh (`cgpt.train.resolve`, through `auto.placement`) become a
strategy with `strategy_on(mesh, mode, cfg, batch, ...)`: an object the training loop uses
without knowing the mode (its interface: `cgpt.sharding.strategies`). `make_strategy(mode,
mesh_spec, cfg, train_cfg)` does both steps for the sharding tests and tools.

Modes (Cerebras' two execution modes, plus plain data parallelism and a chooser):
  single            everything on one device: the reference the others must match.
  data_parallel     weights replicated, batch sharded over `data`; XLA all-reduces gradients.
  weight_streaming  activations stationary (batch over `data`, and `fsdp` where it divides);
                    weights and optimizer state sharded on their embed/heads/mlp dims over
                    every device (`fsdp` x `data`), the stand-in for MemoryX; on several
                    nodes over `fsdp` (inside a node) only, replicated over `data` (HSDP).
                    Inside the layer scan XLA all-gathers one layer's weights just before
                    use and reduces its gradients back (GSPMD FSDP; the gather sits in the while
                    loop, see tests/plan/test_plan.py). An empty --mesh factors the devices into
                    data (the most the global batch splits over) x fsdp (the rest); on N
                    nodes x G devices data=N x fsdp=G when the batch splits over all.
  layer_pipelined   contiguous groups of layers pinned to the stages of a `stage` axis,
                    weights stationary, micro-batches flow through a GPipe schedule
                    (`cgpt.sharding.pipeline`); combinable with `data`.
  auto              the first that fits the devices' memory (`cgpt.sharding.auto`); on a GPU
                    the fastest of those by a cost model (`cgpt.sharding.cost`).

Modules: `axes` (--mesh parsing and factoring, batch axes; JAX-free), `auto` (the memory
model and the mode/mesh decision; JAX-free), `nodes` (which axes cross nodes, analytic bytes
per axis; JAX-free), `cost` (auto's cost model on GPUs;
JAX-free), `mesh` (devices: emulated CPUs, the Mesh, hybrid node-aware meshes, device
memory), `rules` (the rules tables, `logical_to_spec`, the unsharded-dims report), `strategies`
(the placed step), `pipeline` (GPipe), `distributed` (processes of a multi-host job).
"""

from __future__ import annotations

import importlib

# public names -> the module that defines them; imported on first use, so that the JAX-free
# modules (`axes`, `auto`) load without JAX (`cgpt.train.resolve` reads them)
_EXPORTS = {
    "auto": ("BYTES_PER_PARAM_STATE", "activation_bytes", "activation_itemsize", "choose_auto",
             "data_parallel_bytes_per_device", "logits_bytes", "pipeline_bytes_per_device",
             "placement", "weight_streaming_bytes_per_device"),
    "mesh": ("build_mesh", "device_memory_bytes", "emulate_cpu_devices",
             "maybe_initialize_distributed"),
    "axes": ("HOST_OFFLOAD_REMOVED", "MESH_AXES", "SHARDED_MODES", "batch_axes", "mesh_size",
             "parse_mesh", "replica_axes", "weight_streaming_axes"),
    "rules": ("DATA_PARALLEL", "LAYER_PIPELINED", "RULES", "WEIGHT_STREAMING", "Rules", "Unsharded",
              "logical_to_spec"),
    "strategies": ("DataParallel", "LayerPipelined", "Sharded", "SingleDevice", "WeightStreaming",
                   "make_strategy", "strategy_on"),
    "pipeline": ("bubble_fraction", ),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"cgpt.sharding.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'cgpt.sharding' has no attribute {name!r}")
