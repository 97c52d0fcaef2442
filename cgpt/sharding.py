"""Execution strategies: how the train step is placed on devices.

`make_strategy(mode, mesh_spec, cfg, train_cfg)` returns an object the training loop uses
without knowing the mode:
  - `compile_step(step, optimizer, seed, plan)` -> (jitted step, params, opt_state)
  - `compile_eval(cfg)`, `shard_batch(batch)`, `shard_eval_batch(batch)`
  - `abstract_state(params, opt_state)` -> ShapeDtypeStructs (with shardings) for restore
  - `loss` (params, tokens, cfg) -> scalar; `data_replicas`, `num_devices`, `mesh`
"""
from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from cgpt import model
from cgpt.config import ModelConfig


class SingleDevice:
    """Everything on one device: the reference every other mode must match."""

    mode = "single"
    mesh = None
    data_replicas = 1
    num_devices = 1
    loss: Callable = staticmethod(model.loss_fn)

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    def compile_step(self, step, optimizer, seed: int, plan):
        params = jax.jit(model.init_params, static_argnums=0)(self.cfg, seed)
        opt_state = jax.jit(optimizer.init)(params)
        return jax.jit(step, donate_argnums=(0, 1)), params, opt_state

    def compile_eval(self, cfg: ModelConfig):
        return jax.jit(lambda params, tokens: self.loss(params, tokens, cfg))

    def abstract_state(self, params, opt_state):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (params, opt_state))

    def shard_batch(self, batch: np.ndarray) -> jax.Array:
        return jax.numpy.asarray(batch)

    shard_eval_batch = shard_batch


def make_strategy(mode: str, mesh_spec: str, cfg: ModelConfig, train_cfg=None):
    if mode == "single":
        if mesh_spec:
            raise ValueError(f"--mesh {mesh_spec!r} needs a sharded --mode (data_parallel, "
                             "weight_streaming, layer_pipelined or auto)")
        return SingleDevice(cfg)
    raise ValueError(f"--mode {mode!r} is not available in this build; use --mode single")
