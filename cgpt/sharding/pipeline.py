"""GPipe layer pipelining: contiguous groups of layers pinned to the stages of a `stage` axis.

Layer-pipelined execution (Cerebras' LP mode): every layer's weights stay resident on the
stage that owns them and activations flow stage -> stage. The batch is cut into M
micro-batches; at tick t stage s works on micro-batch t - s, so the schedule is

    fill (S-1 ticks) | steady state (M-S+1 ticks, every stage busy) | drain (S-1 ticks)

M + S - 1 ticks in all, of which each stage idles S - 1: the bubble fraction
(S-1) / (M+S-1). Written with `jax.shard_map` + `lax.ppermute`: inside the map each
device sees only its own stage's layers ([n_layer/S, ...]) and its data shard; the
ppermute is the explicit stage-to-stage activation transfer. Autodiff of the schedule
gives the backward pipeline (ppermute transposes to the reverse shift), and gradients of
the layer weights stay on their stage. A `data` axis beside `stage` replicates the pipeline;
its weight gradients are all-reduced over `data` by the shard_map transpose.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from cgpt.model import gpt as model
from cgpt.config.model import ModelConfig


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """Fraction of the GPipe schedule each stage spends idle: (S-1) / (M+S-1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def gpipe(layers: model.Params, x: jax.Array, cfg: ModelConfig, mesh: Mesh,
          stage_axis: str = "stage", data_axis: str | None = "data",
          check_vma: bool = True) -> jax.Array:
    """Run micro-batches x [M, mb, T, d] through all stacked `layers`; returns [M, mb, T, d].

    `layers` is the stacked block tree ([n_layer, ...] leaves) sharded P(stage_axis) on the
    layer axis, so stage s holds layers [s*L/S, (s+1)*L/S): the contiguous slice that
    `model.apply_layers` scans. Numerically this is `apply_layers(layers, x[m])` for every m.

    `check_vma=False` when the pipeline is vmapped over a fused group's members
    (`cgpt.sharding.members`): jax 0.10's shard_map batching rule puts `member` in the
    inputs' specs, but a value it broadcasts to the batch (the zero carries, the stage masks)
    does not vary over `member`, and the varying-axes check then refuses the program (the
    error itself names check_vma=False as the workaround). Without the check the shard_map
    transpose sums the layer gradients over `data` itself, as the check's casts do here.
    """
    S = mesh.shape[stage_axis]
    M = x.shape[0]
    if data_axis is not None and data_axis not in mesh.shape:
        data_axis = None
    layer_specs = jax.tree.map(lambda _: P(stage_axis), layers)
    x_spec = P(None, data_axis)

    def run(local: model.Params, xs: jax.Array) -> jax.Array:
        if data_axis is not None:
            # Mark the weights data-varying once, here: their gradient is then all-reduced
            # over `data` once per call (the transpose of this cast), not once per tick.
            local = jax.tree.map(lambda a: jax.lax.pcast(a, (data_axis,), to="varying"), local)
        s = jax.lax.axis_index(stage_axis)
        first, last = s == 0, s == S - 1

        def tick(carry, t):
            state, outs = carry
            # stage 0 reads micro-batch t from the input; the others what came from s-1
            inp = jnp.where(first, xs[jnp.minimum(t, M - 1)], state)
            y = model.apply_layers(local, inp, cfg)
            # the last stage finishes micro-batch t - (S-1) at tick t
            j = t - (S - 1)
            jj = jnp.clip(j, 0, M - 1)
            outs = outs.at[jj].set(jnp.where(last & (j >= 0), y, outs[jj]))
            state = jax.lax.ppermute(y, stage_axis, [(i, i + 1) for i in range(S - 1)])
            return (state, outs), None

        # the carry varies over `stage` from the first ppermute on; say so up front
        varying = lambda a: jax.lax.pcast(a, (stage_axis,), to="varying")  # noqa: E731
        init = (varying(jnp.zeros_like(xs[0])), varying(jnp.zeros_like(xs)))
        (_, outs), _ = jax.lax.scan(tick, init, jnp.arange(M + S - 1))
        # only the last stage holds the outputs; hand them to every stage (one all-reduce)
        return jax.lax.psum(jnp.where(last, outs, jnp.zeros_like(outs)), stage_axis)

    return jax.shard_map(run, mesh=mesh, in_specs=(layer_specs, x_spec), out_specs=x_spec,
                         check_vma=check_vma)(layers, x)


def pipelined_loss(cfg: ModelConfig, mesh: Mesh, micro_batches: Callable[[int], int],
                   constrain: model.Constrain, check_vma: bool = True) -> Callable:
    """loss(params, tokens [B, T+1], cfg) with the layer stack run as a GPipe pipeline.

    Embedding and head run outside the pipeline (GSPMD, batch sharded over `data`). The
    batch rows are dealt round-robin into M micro-batches (row b -> micro-batch b % M),
    which keeps each device's rows on that device, and put back in order before the head,
    so the loss is exactly `model.loss_fn`'s mean cross-entropy over the whole batch.
    `check_vma`: as in `gpipe` (False for a fused group's vmapped step).
    """

    def loss(params: model.Params, tokens: jax.Array, cfg: ModelConfig = cfg) -> jax.Array:
        B, T = tokens.shape[0], tokens.shape[1] - 1
        M = micro_batches(B)
        x = model.embed(params, tokens[:, :-1], cfg, constrain=constrain)  # [B, T, d]
        d = x.shape[-1]
        x = x.reshape(B // M, M, T, d).swapaxes(0, 1)  # [M, B/M, T, d]
        y = gpipe(params["h"], x, cfg, mesh, check_vma=check_vma)
        y = y.swapaxes(0, 1).reshape(B, T, d)
        y = constrain(y, ("act_batch", "act_seq", "act_embed"))
        return model.head_loss(params, y, tokens[:, 1:], cfg, constrain=constrain)

    return loss
