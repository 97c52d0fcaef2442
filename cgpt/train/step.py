"""The pure, jitted pieces of a step: the update with gradient accumulation, the eval loss and
the finiteness check that guards every write. `cgpt.train.fit` compiles them for the devices."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cgpt.config.model import ModelConfig
from cgpt.errors import TrainError
from cgpt.model import gpt as model
from cgpt.train import noise


def make_step(cfg: ModelConfig, optimizer: optax.GradientTransformation,
              loss: Callable = model.loss_fn, gns: bool = False) -> Callable:
    """step(params, opt_state, batch [accum, micro, T+1]) -> (params, opt_state, metrics).

    Gradients of the `accum` micro-batches are averaged before one optimizer update, so the
    update equals that of one big batch (tested: 4 x 2 == 8 within 1e-5). `gns`: also measure
    the gradient noise scale (`cgpt.train.noise`: the micro-batch gradients' squared norms,
    a single micro-batch split in halves); off, the program is the one without it.
    """

    def step(params, opt_state, batch):
        grad_fn = jax.value_and_grad(loss)
        if gns:
            batch = _two_or_more(batch)

        def micro(acc, tokens):
            l, g = grad_fn(params, tokens, cfg)
            new = jax.tree.map(jnp.add, acc[:2], (l, g))
            return (*new, acc[2] + noise.sq_norm(g)) if gns else new, None

        zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
        acc, _ = jax.lax.scan(micro, (*zeros, jnp.zeros((), jnp.float32)) if gns else zeros,
                              batch)
        n = batch.shape[0]
        l, g = acc[0] / n, jax.tree.map(lambda x: x / n, acc[1])
        updates, opt_state = optimizer.update(g, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {"loss": l, "grad_norm": optax.global_norm(g)}
        if gns:
            metrics.update(noise.step_metrics(acc[2] / n, jnp.square(metrics["grad_norm"]),
                                              batch.shape[1], n * batch.shape[1]))
        return params, opt_state, metrics

    return step


def _two_or_more(batch: jax.Array) -> jax.Array:
    """The batch as at least two micro-batches (two sizes for the noise scale's estimator)."""
    if batch.shape[0] > 1:
        return batch
    if batch.shape[1] % 2:
        raise TrainError(f"train.gns measures the gradient noise scale from two batch sizes, "
                         f"but this step has one micro-batch of {batch.shape[1]} sequences, "
                         "which does not split in halves; use an even train.batch_size, "
                         "a train.micro_batch below it, or train.gns=false")
    return noise.halves(batch)


def make_eval(cfg: ModelConfig, loss: Callable = model.loss_fn) -> Callable:
    return jax.jit(lambda params, tokens: loss(params, tokens, cfg))


@jax.jit
def all_finite(tree) -> jax.Array:
    """True when every float leaf of `tree` is finite: checked before a checkpoint is written."""
    leaves = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree)
              if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def state_finite(tree) -> bool:
    """`all_finite(tree)` as a bool. On a CPU in one process the arrays already live in host
    memory, so numpy reads them there: the same answer without compiling `all_finite` for
    every model shape (~1 s of XLA per shape on the 2-core CPU); elsewhere the jitted check
    runs on the devices (and agrees across a job's processes)."""
    leaves = jax.tree.leaves(tree)
    if jax.process_count() == 1 and all(
            isinstance(x, jax.Array) and x.is_fully_addressable
            and all(d.platform == "cpu" for d in x.sharding.device_set) for x in leaves):
        return all(bool(np.isfinite(np.asarray(x)).all()) for x in leaves
                   if jnp.issubdtype(x.dtype, jnp.inexact))
    return bool(all_finite(tree))
