"""The Cerebras-GPT decoder in Flax NNX: a GPT-3-style pre-LN transformer.

Read top to bottom: the NNX module `GPT` owns the parameters (f32, published init), and the
pure functions below it (`embed`, `apply_layers`, `head`, `forward`) compute with a plain
nested dict of arrays. Layers are stacked on a leading `layers` axis and applied with
`jax.lax.scan`, so one compiled block serves every depth and every execution mode
(data parallel, weight streaming, layer pipelined) reuses the same functions.

Architecture (all seven published models): learned positions, pre-LN blocks with a final
LN, exact erf GELU, LayerNorm eps 1e-5, dense causal attention, biases everywhere except
the LM head, LM head tied to the token embedding, no dropout. μP (embedding x10,
logits x 1/m_w, QK^T / d_head, μP init) is a config switch.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from cgpt.config import ModelConfig

Params = dict  # nested dict of arrays, the layout of `nnx.state(GPT).to_pure_dict()`
# `constrain(x, logical_axes)` lets the sharding layer pin activations; identity by default.
Constrain = Callable[[jax.Array, tuple], jax.Array]


def _no_constraint(x, axes):
    return x


# ---- parameters ------------------------------------------------------------------------
def _tn(rngs: nnx.Rngs, shape: tuple, std: float) -> nnx.Param:
    """Truncated normal cut at +-2 sigma, as in the published init."""
    return nnx.Param(std * jax.random.truncated_normal(rngs.params(), -2.0, 2.0, shape, jnp.float32))


def _zeros(*shape) -> nnx.Param:
    return nnx.Param(jnp.zeros(shape, jnp.float32))


def _ones(*shape) -> nnx.Param:
    return nnx.Param(jnp.ones(shape, jnp.float32))


class LayerNorm(nnx.Module):
    def __init__(self, *lead: int, d: int):
        self.scale = _ones(*lead, d)
        self.bias = _zeros(*lead, d)


class Linear(nnx.Module):
    """Kernel stored [in, out] (the HF GPT-2 Conv1D layout), optionally stacked over layers."""

    def __init__(self, *lead: int, d_in: int, d_out: int, std: float, rngs: nnx.Rngs):
        self.kernel = _tn(rngs, (*lead, d_in, d_out), std)
        self.bias = _zeros(*lead, d_out)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, L: int, rngs: nnx.Rngs):
        inner = cfg.n_head * cfg.d_head
        self.c_attn = Linear(L, d_in=cfg.d_model, d_out=3 * inner, std=cfg.hidden_std, rngs=rngs)
        self.c_proj = Linear(L, d_in=inner, d_out=cfg.d_model, std=cfg.resid_out_std, rngs=rngs)


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, L: int, rngs: nnx.Rngs):
        self.c_fc = Linear(L, d_in=cfg.d_model, d_out=cfg.d_ffn, std=cfg.hidden_std, rngs=rngs)
        self.c_proj = Linear(L, d_in=cfg.d_ffn, d_out=cfg.d_model, std=cfg.resid_out_std, rngs=rngs)


class Blocks(nnx.Module):
    """All n_layer blocks, every parameter stacked on a leading `layers` axis."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        L = cfg.n_layer
        self.ln_1 = LayerNorm(L, d=cfg.d_model)
        self.attn = Attention(cfg, L, rngs)
        self.ln_2 = LayerNorm(L, d=cfg.d_model)
        self.mlp = MLP(cfg, L, rngs)


class GPT(nnx.Module):
    """Cerebras-GPT. `GPT(cfg, rngs=nnx.Rngs(0))(ids)` returns float32 logits [B, T, V]."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.wte = _tn(rngs, (cfg.vocab_size, cfg.d_model), cfg.embed_std)
        self.wpe = _tn(rngs, (cfg.n_ctx, cfg.d_model), cfg.embed_std)
        self.h = Blocks(cfg, rngs)
        self.ln_f = LayerNorm(d=cfg.d_model)

    def params(self) -> Params:
        return nnx.state(self, nnx.Param).to_pure_dict()

    def __call__(self, ids: jax.Array) -> jax.Array:
        return forward(self.params(), ids, self.config)[0]


def init_params(cfg: ModelConfig, seed: int | jax.Array = 0) -> Params:
    """Freshly initialized parameters as a nested dict (jit/eval_shape friendly)."""
    key = seed if jax.dtypes.issubdtype(getattr(seed, "dtype", None), jax.dtypes.prng_key) \
        else jax.random.key(seed)
    return GPT(cfg, rngs=nnx.Rngs(params=key)).params()


def param_axes(cfg: ModelConfig) -> Params:
    """Logical axis names of every parameter, same tree as `init_params`.

    Weight names (`vocab`, `embed`, `heads`, `mlp`, `layers`, `pos`) are distinct from the
    activation names (`act_*`) so that a rules table can shard weights and activations
    differently (FSDP shards weights' embed dim while activations shard on batch).
    """
    ln = {"scale": ("layers", "embed"), "bias": ("layers", "embed")}
    return {
        "wte": ("vocab", "embed"),
        "wpe": ("pos", "embed"),
        "h": {
            "ln_1": ln,
            "attn": {
                "c_attn": {"kernel": ("layers", "embed", "heads"), "bias": ("layers", "heads")},
                "c_proj": {"kernel": ("layers", "heads", "embed"), "bias": ("layers", "embed")},
            },
            "ln_2": ln,
            "mlp": {
                "c_fc": {"kernel": ("layers", "embed", "mlp"), "bias": ("layers", "mlp")},
                "c_proj": {"kernel": ("layers", "mlp", "embed"), "bias": ("layers", "embed")},
            },
        },
        "ln_f": {"scale": ("embed",), "bias": ("embed",)},
    }


# ---- computation -----------------------------------------------------------------------
def _dtype(cfg: ModelConfig):
    return jnp.bfloat16 if cfg.compute_dtype == "bfloat16" else jnp.float32


def layer_norm(x: jax.Array, p: Params, eps: float) -> jax.Array:
    """LayerNorm computed in f32 whatever the compute dtype."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]
    return y.astype(x.dtype)


def gelu(x: jax.Array) -> jax.Array:
    """Exact GELU, x * Phi(x), through erf: jax.nn.gelu(approximate=False) goes through erfc,
    which XLA's CPU backend computes ~4x slower (same values to 1e-6)."""
    return 0.5 * x * (1 + jax.lax.erf(x * jnp.asarray(0.7071067811865476, x.dtype)))


@jax.custom_vjp
def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
    """x [..., in] @ kernel [in, out] + bias, with a hand-written backward (below)."""
    return x @ kernel + bias


def _dense_fwd(x, kernel, bias):
    return x @ kernel + bias, (x, kernel)


def _dense_bwd(res, dy):
    # As 2-D products with the weight gradient computed transposed: XLA's CPU backend runs
    # this ~9% faster per training step than the backward autodiff derives (cpu-19m).
    x, kernel = res
    dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
    f32 = jnp.float32
    dx = jnp.matmul(dy2, kernel.T, preferred_element_type=f32).astype(x.dtype)
    dk = jnp.matmul(dy2.T, x2, preferred_element_type=f32).T.astype(kernel.dtype)
    return dx.reshape(x.shape), dk, dy2.sum(0, dtype=f32).astype(kernel.dtype)


dense.defvjp(_dense_fwd, _dense_bwd)


def _linear(x: jax.Array, p: Params) -> jax.Array:
    if "kernel_t" in p:  # output-major decode layout, see `decode_layout`
        return (jnp.einsum("...i,oi->...o", x, p["kernel_t"].astype(x.dtype))
                + p["bias"].astype(x.dtype))
    return dense(x, p["kernel"].astype(x.dtype), p["bias"].astype(x.dtype))


def attend(q: jax.Array, k: jax.Array, v: jax.Array, q_pos: jax.Array,
           cfg: ModelConfig) -> jax.Array:
    """Softmax attention of q [B, H, T, Dh] at positions q_pos over k, v [B, H, S, Dh] at
    positions 0..S-1, causally masked; scores and softmax in f32."""
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
    scores = scores * cfg.attn_scale
    mask = jnp.arange(k.shape[2])[None, :] <= q_pos[:, None]
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", probs, v)


def block(p: Params, x: jax.Array, cfg: ModelConfig, cache: dict | None = None,
          layer: int = 0, start: jax.Array | int = 0, constrain: Constrain = _no_constraint):
    """One pre-LN transformer block on x [B, T, d].

    With a KV `cache` ({"k", "v"}: [L, B, H, S, Dh]) the new keys/values are written at
    (`layer`, `start`) and queries attend over that layer's whole cache (KV-cache decoding);
    otherwise plain causal self-attention over x. Returns (x, updated cache or None).
    """
    B, T, _ = x.shape
    H, Dh = cfg.n_head, cfg.d_head
    h = layer_norm(x, p["ln_1"], cfg.ln_eps)
    qkv = _linear(h, p["attn"]["c_attn"])  # columns ordered [Q | K | V], head-major inside
    q, k, v = jnp.split(qkv, 3, axis=-1)
    # Head-major [B, H, T, Dh]: XLA's CPU backward is ~2x faster than for [B, T, H, Dh], and
    # the KV cache is kept in the same layout so decoding never transposes it.
    q, k, v = (t.reshape(B, T, H, Dh).transpose(0, 2, 1, 3) for t in (q, k, v))
    q_pos = start + jnp.arange(T)
    if cache is not None:
        # One buffer for all layers, written in place: XLA's CPU backend copies every
        # per-layer cache array on each step of the decode loop (about 4x slower).
        at = (layer, 0, 0, start, 0)
        cache = {n: jax.lax.dynamic_update_slice(cache[n], t[None].astype(cache[n].dtype), at)
                 for n, t in (("k", k), ("v", v))}
        k, v = cache["k"][layer].astype(x.dtype), cache["v"][layer].astype(x.dtype)
        att = attend(q, k, v, q_pos, cfg)
    else:
        # Causal, in up to 4 query chunks, each over only the keys up to its end: ~3/8 fewer
        # attention FLOPs, and XLA's CPU backward runs ~2x faster (cpu-19m block: 38 -> 19 ms).
        step = max(64, -(-T // 4))
        att = jnp.concatenate([attend(q[:, :, i:i + step], k[:, :, :i + step],
                                      v[:, :, :i + step], q_pos[i:i + step], cfg)
                               for i in range(0, T, step)], axis=2)
    att = att.transpose(0, 2, 1, 3).reshape(B, T, H * Dh)
    x = x + constrain(_linear(att, p["attn"]["c_proj"]), ("act_batch", "act_seq", "act_embed"))
    h = layer_norm(x, p["ln_2"], cfg.ln_eps)
    h = gelu(_linear(h, p["mlp"]["c_fc"]))
    h = constrain(h, ("act_batch", "act_seq", "act_mlp"))
    x = x + constrain(_linear(h, p["mlp"]["c_proj"]), ("act_batch", "act_seq", "act_embed"))
    return x, cache


def embed(params: Params, ids: jax.Array, cfg: ModelConfig, start: jax.Array | int = 0,
          constrain: Constrain = _no_constraint) -> jax.Array:
    T = ids.shape[1]
    pos = jax.lax.dynamic_slice_in_dim(params["wpe"], start, T, axis=0)
    x = (params["wte"][ids] + pos[None]) * cfg.embed_mult
    return constrain(x.astype(_dtype(cfg)), ("act_batch", "act_seq", "act_embed"))


def apply_layers(layers: Params, x: jax.Array, cfg: ModelConfig,
                 constrain: Constrain = _no_constraint) -> jax.Array:
    """Scan the stacked blocks over x. `layers` may hold any contiguous slice of the stack."""

    def body(x, p):
        return block(p, x, cfg, constrain=constrain)[0], None

    # remat=True keeps only each layer's input. remat=False keeps the weight matmuls' outputs
    # and recomputes the elementwise ops and attention in the backward pass: less memory than
    # keeping everything, and faster on XLA's CPU backend, where writing and re-reading the
    # stacked residuals cost more than recomputing them (cpu-19m step 2.02 -> 1.73 s).
    policy = None if cfg.remat else jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    body = jax.checkpoint(body, policy=policy, prevent_cse=False)
    return jax.lax.scan(body, x, layers)[0]


def unstack(layers: Params) -> list:
    """The stacked blocks as a list of per-layer parameter dicts."""
    n = jax.tree.leaves(layers)[0].shape[0]
    return [jax.tree.map(lambda a, i=i: a[i], layers) for i in range(n)]


def apply_layers_cached(layers: Params | list, x: jax.Array, cfg: ModelConfig, cache: dict,
                        start: jax.Array | int):
    """The blocks one by one (unrolled) over x, reading and writing the KV cache.

    Unrolled rather than scanned because slicing a layer out of the stacked weights inside
    the decode loop costs more than the matrix-vector products themselves on CPU; pass
    `decode_layout(params)["h"]` (a list, one dict per layer) for the fast path.
    """
    if not isinstance(layers, list):
        layers = unstack(layers)
    for i, p in enumerate(layers):
        x, cache = block(p, x, cfg, cache, i, start)
    return x, cache


def head(params: Params, x: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Final LN and the tied LM head (no bias); float32 logits."""
    x = layer_norm(x, params["ln_f"], cfg.ln_eps)
    logits = jnp.einsum("btd,vd->btv", x, params["wte"].astype(x.dtype),
                        preferred_element_type=jnp.float32)
    return logits * cfg.logits_mult


def forward(params: Params, ids: jax.Array, cfg: ModelConfig, cache: dict | None = None,
            start: jax.Array | int = 0, constrain: Constrain = _no_constraint):
    """ids [B, T] -> (float32 logits [B, T, V], updated cache or None).

    With a `cache` (from `init_cache`) the tokens are placed at positions start..start+T-1
    and attend to everything cached before them.
    """
    x = embed(params, ids, cfg, start, constrain)
    if cache is None:
        return head(params, apply_layers(params["h"], x, cfg, constrain), cfg), None
    x, cache = apply_layers_cached(params["h"], x, cfg, cache, start)
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


def init_cache(cfg: ModelConfig, batch: int, length: int | None = None) -> dict:
    """Empty KV cache [L, B, H, S, Dh] in the compute dtype."""
    S = length or cfg.n_ctx
    shape = (cfg.n_layer, batch, cfg.n_head, S, cfg.d_head)
    return {"k": jnp.zeros(shape, _dtype(cfg)), "v": jnp.zeros(shape, _dtype(cfg))}


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy in nats (logits [..., V] float32, targets int)."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(logz - tgt)


def loss_fn(params: Params, tokens: jax.Array, cfg: ModelConfig,
            constrain: Constrain = _no_constraint) -> jax.Array:
    """tokens [B, T+1]: predict tokens[:, 1:] from tokens[:, :-1]."""
    logits, _ = forward(params, tokens[:, :-1], cfg, constrain=constrain)
    return cross_entropy(logits, tokens[:, 1:])
