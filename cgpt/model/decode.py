"""KV-cache decoding: the inference-only layout and layers behind `cgpt.eval.lm`'s `generate`.

Training never runs this code. It reuses the block's two halves from `cgpt.model.gpt`
(`qkv_heads`, `block_rest`) around attention over a KV cache, and adds the tricks that make
batch-1 decoding fast on a CPU: output-major kernels, unstacked (unrolled) layers, one cache
buffer written in place.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from cgpt.config.model import ModelConfig
from cgpt.model.gpt import Params, attend, block_rest, compute_dtype, embed, head, in_dtype, \
    linear, qkv_heads


def _linear(x: jax.Array, p: Params) -> jax.Array:
    """`model.linear`, or its output-major form for a `decode_layout` kernel (`kernel_t`)."""
    if "kernel_t" in p:
        return (jnp.einsum("...i,oi->...o", x, p["kernel_t"].astype(x.dtype))
                + p["bias"].astype(x.dtype))
    return linear(x, p)


def init_cache(cfg: ModelConfig, batch: int, length: int | None = None) -> dict:
    """Empty KV cache [L, B, H, S, Dh] in the compute dtype."""
    S = length or cfg.n_ctx
    shape = (cfg.n_layer, batch, cfg.n_head, S, cfg.d_head)
    dtype = compute_dtype(cfg)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def block(p: Params, x: jax.Array, cfg: ModelConfig, cache: dict, layer: int,
          start: jax.Array | int) -> tuple[jax.Array, dict]:
    """One block on x [B, T, d] at positions start..start+T-1: the new keys/values are written
    into `cache` at (`layer`, `start`) and the queries attend over that layer's whole cache."""
    q, k, v = (t.transpose(0, 2, 1, 3) for t in qkv_heads(p, x, cfg, _linear))  # [B, H, T, Dh]
    # Head-major, as the cache is kept, so decoding never transposes the cache. One buffer for
    # all layers, written in place: XLA's CPU backend copies every per-layer cache array on
    # each step of the decode loop (about 4x slower).
    at = (layer, 0, 0, start, 0)
    cache = {n: jax.lax.dynamic_update_slice(cache[n], t[None].astype(cache[n].dtype), at)
             for n, t in (("k", k), ("v", v))}
    k, v = cache["k"][layer].astype(x.dtype), cache["v"][layer].astype(x.dtype)
    att = attend(q, k, v, start + jnp.arange(x.shape[1]), cfg).transpose(0, 2, 1, 3)
    return block_rest(p, x, att, cfg, _linear), cache


def unstack(layers: Params) -> list:
    """The stacked blocks as a list of per-layer parameter dicts."""
    n = jax.tree.leaves(layers)[0].shape[0]
    return [jax.tree.map(lambda a, i=i: a[i], layers) for i in range(n)]


def apply_layers(layers: Params | list, x: jax.Array, cfg: ModelConfig, cache: dict,
                 start: jax.Array | int) -> tuple[jax.Array, dict]:
    """The blocks one by one (unrolled) over x, reading and writing the KV cache.

    Unrolled rather than scanned because slicing a layer out of the stacked weights inside
    the decode loop costs more than the matrix-vector products themselves on CPU; pass
    `decode_layout(params)["h"]` (a list, one dict per layer) for the fast path.
    """
    if not isinstance(layers, list):
        layers = unstack(layers)
    for i, p in enumerate(layers):
        x, cache = block(in_dtype(p, x.dtype), x, cfg, cache, i, start)  # as gpt.apply_layers
    return x, cache


def forward(params: Params, ids: jax.Array, cfg: ModelConfig, cache: dict,
            start: jax.Array | int) -> tuple[jax.Array, dict]:
    """ids [B, T] placed at positions start..start+T-1, attending to everything cached before
    them -> (float32 logits [B, T, V], updated cache). `params` as trained or `decode_layout`."""
    x = embed(params, ids, cfg, start)
    x, cache = apply_layers(params["h"], x, cfg, cache, start)
    return head(params, x, cfg), cache


def forward_rows(params: Params, ids: jax.Array, cfg: ModelConfig, cache: dict,
                 pos: jax.Array) -> tuple[jax.Array, dict]:
    """One token per row, ids [B, 1], row b at its own position pos[b]: for right-padded
    prompts of different lengths decoded as one batch. Row b's keys/values go to cache slot
    pos[b] and its query attends to slots 0..pos[b] (the padding past a row's prompt is
    overwritten by its own tokens before it is ever attended to)."""
    x = ((params["wte"][ids] + params["wpe"][pos][:, None]) * cfg.embed_mult
         ).astype(compute_dtype(cfg))
    layers = params["h"] if isinstance(params["h"], list) else unstack(params["h"])
    rows = jnp.arange(ids.shape[0])
    for i, p in enumerate(layers):
        q, k, v = (t.transpose(0, 2, 1, 3) for t in qkv_heads(p, x, cfg, _linear))
        cache = {n: cache[n].at[i, rows, :, pos].set(t[:, :, 0].astype(cache[n].dtype))
                 for n, t in (("k", k), ("v", v))}
        k, v = cache["k"][i].astype(x.dtype), cache["v"][i].astype(x.dtype)
        att = attend(q, k, v, pos[:, None, None], cfg).transpose(0, 2, 1, 3)
        x = block_rest(p, x, att, cfg, _linear)
    return head(params, x, cfg), cache


@jax.jit
def decode_layout(params: Params) -> Params:
    """The weights re-laid out for batch-1 decoding: one dict per layer (a list under "h")
    with output-major kernels (`kernel_t` [out, in]).

    Decoding is bound by reading the weights; XLA's CPU matrix-vector product streams an
    [out, in] matrix ~15% faster than [in, out], and unstacked layers avoid slicing the
    stack in the loop (111M: 36 -> 68 tokens/s). Costs one extra copy of the weights.
    """
    def output_major(p):
        if isinstance(p, dict) and "kernel" in p:
            return {"kernel_t": p["kernel"].T, "bias": p["bias"]}
        return {k: output_major(v) for k, v in p.items()} if isinstance(p, dict) else p

    layers = [output_major(p) for p in unstack(params["h"])]
    return {**{k: v for k, v in params.items() if k != "h"}, "h": layers}
