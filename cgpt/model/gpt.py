"""The Cerebras-GPT decoder in Flax NNX: a GPT-3-style pre-LN transformer.

Read top to bottom: the NNX module `GPT` owns the parameters (f32, published init), and the
pure functions below it (`embed`, `apply_layers`, `head`, `forward`) compute with a plain
nested dict of arrays. Layers are stacked on a leading `layers` axis and applied with
`jax.lax.scan`, so one compiled block serves every depth and every execution mode
(data parallel, weight streaming, layer pipelined) reuses the same functions.

Architecture (all seven published models): learned positions, pre-LN blocks with a final
LN, exact erf GELU, LayerNorm eps 1e-5, dense causal attention, biases everywhere except
the LM head, LM head tied to the token embedding, no dropout. μP (embedding x10,
logits x 1/m_w, QK^T / d_head, μP init) is a config switch. Kernels and dtypes per platform
(f32 and chunked attention on CPU; bf16, fused attention and a padded vocabulary on GPU/TPU)
are chosen in `cgpt.config.backend`; KV-cache decoding lives in `cgpt.model.decode`.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from cgpt.config import backend
from cgpt.config.model import ModelConfig, ParamSpec
from cgpt.model.remat import ATTENTION, MATMUL, NO_REMAT, remat_policy

Params = dict  # nested dict of arrays, the layout of `nnx.state(GPT).to_pure_dict()`
# `constrain(x, logical_axes)` lets the sharding layer pin activations; identity by default.
Constrain = Callable[[jax.Array, tuple], jax.Array]


def _no_constraint(x, axes):
    return x


# ---- parameters ------------------------------------------------------------------------
# The tree is written once, in `ModelConfig.param_tree` (cgpt.config.model): path -> shape,
# logical axis names and published init. `GPT` builds its nnx.Params from it, and `param_axes`
# (the sharding rules' input) and `param_specs` (the HF key map in `cgpt.model.hf`) read it.
# Weight axis names (`vocab`, `embed`, `heads`, `mlp`, `layers`, `pos`) are distinct from the
# activation names (`act_*`) so that a rules table can shard weights and activations
# differently (FSDP shards weights' embed dim while activations shard on batch).
def _param(spec: ParamSpec, rngs: nnx.Rngs) -> nnx.Param:
    """Truncated normal cut at +-2 sigma (the published init), or a constant (LayerNorm, biases)."""
    if spec.std is None:
        value = jnp.full(spec.shape, spec.fill, jnp.float32)
    else:
        value = spec.std * jax.random.truncated_normal(rngs.params(), -2.0, 2.0, spec.shape,
                                                       jnp.float32)
    return nnx.Param(value, axes=spec.axes)


class Node(nnx.Module):
    """One level of the parameter tree: `h` (the stacked blocks), `h.attn`, `h.attn.c_attn`..."""


class GPT(nnx.Module):
    """Cerebras-GPT. `GPT(cfg, rngs=nnx.Rngs(0))(ids)` returns float32 logits [B, T, V]."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        for path, spec in cfg.param_tree().items():  # in tree order: the init's random stream
            node = self
            for name in path[:-1]:
                if name not in vars(node):
                    setattr(node, name, Node())
                node = getattr(node, name)
            setattr(node, path[-1], _param(spec, rngs))

    def params(self) -> Params:
        return nnx.state(self, nnx.Param).to_pure_dict()

    def __call__(self, ids: jax.Array) -> jax.Array:
        return forward(self.params(), ids, self.config)[0]


def init_params(cfg: ModelConfig, seed: int | jax.Array = 0) -> Params:
    """Freshly initialized parameters as a nested dict (jit/eval_shape friendly)."""
    key = seed if jax.dtypes.issubdtype(getattr(seed, "dtype", None), jax.dtypes.prng_key) \
        else jax.random.key(seed)
    return GPT(cfg, rngs=nnx.Rngs(params=key)).params()


def param_specs(cfg: ModelConfig) -> dict[tuple[str, ...], tuple[tuple[int, ...], tuple[str, ...]]]:
    """{path in the parameter tree: (shape, logical axis names)} in HF's order (wte, wpe, h.*,
    ln_f; kernel before bias), without allocating."""
    return {path: (s.shape, s.axes) for path, s in cfg.param_tree().items()}


def param_axes(cfg: ModelConfig) -> Params:
    """Logical axis names of every parameter, same tree as `init_params`."""
    tree: dict = {}
    for path, (_, axes) in param_specs(cfg).items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = axes
    return tree


# ---- computation -----------------------------------------------------------------------
# Backend-dependent choices (dtype, attention kernel, vocabulary padding, dense backward) come
# from `cgpt.config.backend.kernels(cfg)`, read at trace time for the platform being compiled for.
def compute_dtype(cfg: ModelConfig) -> jnp.dtype:
    """The dtype the matmuls run in on this platform (parameters stay float32)."""
    return jnp.dtype(backend.kernels(cfg).compute_dtype)


def layer_norm(x: jax.Array, p: Params, eps: float) -> jax.Array:
    """LayerNorm: statistics in f32 whatever the compute dtype, the affine in the weights'
    dtype (bf16 once `in_dtype` cast them, so a sharded bf16 scale is gathered as bf16),
    with the scale's and bias's gradients summed over the tokens in f32 (`_affine`)."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps)
    return _affine(y.astype(p["scale"].dtype), p["scale"], p["bias"]).astype(x.dtype)


@jax.custom_vjp
def _affine(y: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    """y * scale + bias, whose backward sums the scale's and bias's gradients over every
    token in f32 (and so reduces them across replicas in f32): autodiff would sum them in
    the compute dtype. Only the summed gradient is rounded to the weights' dtype."""
    return y * scale + bias


def _affine_fwd(y, scale, bias):
    return y * scale + bias, (y, scale)


def _affine_bwd(res, g):
    y, scale = res
    f32, tokens = jnp.float32, tuple(range(g.ndim - 1))
    g32 = g.astype(f32)
    return ((g * scale).astype(y.dtype), (g32 * y.astype(f32)).sum(tokens).astype(scale.dtype),
            g32.sum(tokens).astype(scale.dtype))


_affine.defvjp(_affine_fwd, _affine_bwd)


@jax.custom_vjp
def _plus_rows(x: jax.Array, rows: jax.Array) -> jax.Array:
    """x + rows[None] (positions added to every sequence of the batch), the rows' gradient
    summed over the batch in f32 (autodiff would sum it in the compute dtype)."""
    return x + rows[None]


def _plus_rows_fwd(x, rows):
    return x + rows[None], None


def _plus_rows_bwd(_, g):
    return g, g.astype(jnp.float32).sum(0).astype(g.dtype)


_plus_rows.defvjp(_plus_rows_fwd, _plus_rows_bwd)


def in_dtype(p: Params, dtype) -> Params:
    """A layer's weights cast to the compute dtype where they lie, before anything gathers
    them: under weight streaming (and FSDP) the per-layer all-gathers then move bf16, half
    the bytes, while the f32 master stays sharded; the gradients come back through the cast
    as f32. Identity in f32."""
    if dtype == jnp.float32:
        return p
    return jax.tree.map(lambda a: a.astype(dtype), p)


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


def linear(x: jax.Array, p: Params) -> jax.Array:
    """x @ kernel + bias in x's dtype (kernel [in, out]); the hand-written backward where the
    platform measured it faster (`backend.Kernels.custom_dense_backward`)."""
    kernel, bias = p["kernel"].astype(x.dtype), p["bias"].astype(x.dtype)
    if backend.defaults(backend.current_platform()).custom_dense_backward:
        return checkpoint_name(dense(x, kernel, bias), MATMUL)
    return checkpoint_name(x @ kernel + bias, MATMUL)


LinearFn = Callable[[jax.Array, Params], jax.Array]


def attend(q: jax.Array, k: jax.Array, v: jax.Array, q_pos: jax.Array,
           cfg: ModelConfig) -> jax.Array:
    """Softmax attention of q [B, H, T, Dh] at positions q_pos [T] (or per row [B, 1, T])
    over k, v [B, H, S, Dh] at positions 0..S-1, causally masked; scores and softmax in f32."""
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
    scores = scores * cfg.attn_scale
    mask = jnp.arange(k.shape[2]) <= q_pos[..., None]
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", probs, v)


def _chunked_attention(q: jax.Array, k: jax.Array, v: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Causal attention in up to 4 query chunks, each over only the keys up to its end: ~3/8
    fewer attention FLOPs, and XLA's CPU backward runs ~2x faster (cpu-19m block: 38 -> 19
    ms). Computed head-major [B, H, T, Dh]: XLA's CPU backward is ~2x faster than for
    [B, T, H, Dh]."""
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
    T = q.shape[2]
    pos, step = jnp.arange(T), max(64, -(-T // 4))
    att = jnp.concatenate([attend(q[:, :, i:i + step], k[:, :, :i + step], v[:, :, :i + step],
                                  pos[i:i + step], cfg) for i in range(0, T, step)], axis=2)
    return att.transpose(0, 2, 1, 3)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Causal self-attention of q, k, v [B, T, H, Dh] -> [B, T, H, Dh] with the platform's
    kernel: the chunked one above, or `jax.nn.dot_product_attention` (XLA's, or cuDNN's fused
    flash attention); scores and softmax in f32 in every one."""
    kind = backend.kernels(cfg).attention
    if kind == "chunked":
        return checkpoint_name(_chunked_attention(q, k, v, cfg), ATTENTION)
    return checkpoint_name(jax.nn.dot_product_attention(
        q, k, v, scale=cfg.attn_scale, is_causal=True, implementation=kind), ATTENTION)


def qkv_heads(p: Params, x: jax.Array, cfg: ModelConfig, lin: LinearFn = linear):
    """The block's first half up to attention: LN, then q, k, v [B, T, H, Dh]."""
    B, T, _ = x.shape
    h = layer_norm(x, p["ln_1"], cfg.ln_eps)
    qkv = lin(h, p["attn"]["c_attn"])  # columns ordered [Q | K | V], head-major inside
    return tuple(t.reshape(B, T, cfg.n_head, cfg.d_head) for t in jnp.split(qkv, 3, axis=-1))


def block_rest(p: Params, x: jax.Array, att: jax.Array, cfg: ModelConfig, lin: LinearFn = linear,
               constrain: Constrain = _no_constraint) -> jax.Array:
    """The block after attention (att [B, T, H, Dh]): projection, residual, LN, MLP, residual."""
    B, T, _ = x.shape
    att = att.reshape(B, T, cfg.n_head * cfg.d_head)
    x = x + constrain(lin(att, p["attn"]["c_proj"]), ("act_batch", "act_seq", "act_embed"))
    h = layer_norm(x, p["ln_2"], cfg.ln_eps)
    h = gelu(lin(h, p["mlp"]["c_fc"]))
    h = constrain(h, ("act_batch", "act_seq", "act_mlp"))
    return x + constrain(lin(h, p["mlp"]["c_proj"]), ("act_batch", "act_seq", "act_embed"))


def block(p: Params, x: jax.Array, cfg: ModelConfig,
          constrain: Constrain = _no_constraint) -> jax.Array:
    """One pre-LN transformer block on x [B, T, d] with causal self-attention over x.
    (KV-cache decoding reuses its two halves: `cgpt.model.decode`.)"""
    q, k, v = qkv_heads(p, x, cfg)
    return block_rest(p, x, causal_attention(q, k, v, cfg), cfg, constrain=constrain)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def lookup(table: jax.Array, ids: jax.Array, dtype, constrain: Constrain = _no_constraint
           ) -> jax.Array:
    """table[ids] gathered in `dtype` (a sharded table moves bf16 rows), with the gradient
    scatter-added into the table's own dtype (f32) and laid out as the table is: the
    autodiff of a bf16 gather would scatter-add, and all-reduce across replicas, in bf16."""
    return table.astype(dtype)[ids]


def _lookup_fwd(table, ids, dtype, constrain):
    return lookup(table, ids, dtype, constrain), (table, ids)


def _lookup_bwd(dtype, constrain, res, g):
    table, ids = res
    grad = jnp.zeros_like(table).at[ids].add(g.astype(table.dtype))
    return constrain(grad, ("vocab", "embed")), None


lookup.defvjp(_lookup_fwd, _lookup_bwd)


def embed(params: Params, ids: jax.Array, cfg: ModelConfig, start: jax.Array | int = 0,
          constrain: Constrain = _no_constraint) -> jax.Array:
    """Token rows plus position rows, both gathered in the compute dtype; the position table's
    gradient, a sum over the batch, is summed (and reduced across replicas) in f32."""
    T, dtype = ids.shape[1], compute_dtype(cfg)
    pos = jax.lax.dynamic_slice_in_dim(in_dtype(params["wpe"], dtype), start, T, axis=0)
    x = _plus_rows(lookup(params["wte"], ids, dtype, constrain), pos) * cfg.embed_mult
    return constrain(x.astype(dtype), ("act_batch", "act_seq", "act_embed"))


def apply_layers(layers: Params, x: jax.Array, cfg: ModelConfig,
                 constrain: Constrain = _no_constraint) -> jax.Array:
    """Scan the stacked blocks over x. `layers` may hold any contiguous slice of the stack;
    one of at most `backend.Kernels.unroll_layers` layers is unrolled (the CPU's shallow ones)
    unless the step constrains its activations: a sharded step keeps its per-layer loop (weight
    streaming gathers each layer's weights inside it)."""

    def body(x, p):
        return block(in_dtype(p, x.dtype), x, cfg, constrain=constrain), None

    policy = remat_policy(cfg.remat)
    if policy is not NO_REMAT:
        body = jax.checkpoint(body, policy=policy, prevent_cse=False)
    n = jax.tree.leaves(layers)[0].shape[0]
    unroll = constrain is _no_constraint and n <= backend.kernels(cfg).unroll_layers
    return jax.lax.scan(body, x, layers, unroll=True if unroll else 1)[0]


def _head_weight(params: Params, cfg: ModelConfig) -> jax.Array:
    """The tied LM head's weight [padded vocab, d] (still in the parameters' dtype).

    On accelerators the vocabulary is padded with zero rows to a multiple of 128
    (`backend.Kernels.vocab_multiple`: 50257 -> 50304 fills the tensor-core tiles); the
    padded columns of the logits are dropped (`head`) or masked out of the loss."""
    wte = params["wte"]
    padded = backend.padded_vocab(cfg)
    return wte if padded == wte.shape[0] else jnp.pad(wte, ((0, padded - wte.shape[0]), (0, 0)))


def _logits(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., d] @ w [V, d]^T in x's dtype with f32 accumulation: f32 logits."""
    return jnp.einsum("...d,vd->...v", x, w.astype(x.dtype), preferred_element_type=jnp.float32)


@jax.custom_vjp
def _head_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """`_logits` whose backward also runs in x's dtype (bf16) with f32 accumulation:
    autodiff would multiply the f32 cotangent by the bf16 operands in f32."""
    return _logits(x, w)


def _head_matmul_fwd(x, w):
    return _logits(x, w), (x, w)


def _head_matmul_bwd(res, g):
    x, w = res
    g = g.astype(x.dtype)
    dx = jnp.einsum("...v,vd->...d", g, w.astype(x.dtype), preferred_element_type=jnp.float32)
    dw = jnp.einsum("...v,...d->vd", g, x, preferred_element_type=jnp.float32)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_head_matmul.defvjp(_head_matmul_fwd, _head_matmul_bwd)


def head(params: Params, x: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Final LN and the tied LM head (no bias); float32 logits [..., vocab_size] (the padded
    vocabulary's extra columns sliced off, so no loss, gradient or returned logit sees them).
    In bf16 the matmuls run in bf16 with f32 accumulation, forward and backward."""
    x = layer_norm(x, in_dtype(params["ln_f"], x.dtype), cfg.ln_eps)
    w = _head_weight(params, cfg)
    logits = _logits(x, w) if x.dtype == jnp.float32 else _head_matmul(x, w)
    return logits[..., :cfg.vocab_size] * cfg.logits_mult


def forward(params: Params, ids: jax.Array, cfg: ModelConfig, cache: dict | None = None,
            start: jax.Array | int = 0, constrain: Constrain = _no_constraint):
    """ids [B, T] at positions start..start+T-1 -> (float32 logits [B, T, V], None).

    KV-cache decoding lives in `cgpt.model.decode` (`decode.forward`); `cache` is kept in this
    signature only to point there.
    """
    if cache is not None:
        raise TypeError("cgpt.model.gpt.forward no longer decodes with a KV cache; use "
                        "cgpt.model.decode.forward(params, ids, cfg, cache, start)")
    x = embed(params, ids, cfg, start, constrain)
    return head(params, apply_layers(params["h"], x, cfg, constrain), cfg), None


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy in nats (logits [..., V] float32, targets int)."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(logz - tgt)


# ---- the loss: the head and cross-entropy chunked over the sequence ---------------------
# The [B, T, V] f32 logits are the step's largest buffer (3.3 GB for 8 x 2048 tokens at a
# 50k vocabulary), and autodiff of `cross_entropy(head(...))` holds them three times (padded
# matmul output, sliced copy, gradient). `chunked_cross_entropy` computes them C sequence
# positions at a time and, when differentiated, takes each chunk's gradients right there
# (softmax - onehot: the loss is a scalar, so only the cotangent's scale is left for the
# backward), as levanter's blockwise and Liger's fused cross-entropy do: one chunk's
# [B, C, V] logits live at a time, nothing is recomputed, and the residuals are dx [B, T, d]
# and dw [V, d].
def _chunks(x: jax.Array, targets: jax.Array, chunk: int):
    """x [B, T, d], targets [B, T] -> [n, B, C, ...] chunks of at most `chunk` positions, as
    even as they come (T padded to n x C, C <= chunk), and the mask of real ones [n, 1, C]."""
    B, T = targets.shape
    n = -(-T // chunk)
    chunk = -(-T // n)
    pad = n * chunk - T
    xs = jnp.pad(x, ((0, 0), (0, pad), (0, 0))).reshape(B, n, chunk, -1).swapaxes(0, 1)
    ts = jnp.pad(targets, ((0, 0), (0, pad))).reshape(B, n, chunk).swapaxes(0, 1)
    valid = (jnp.arange(n * chunk) < T).reshape(n, 1, chunk)
    return xs, ts, valid


def _chunked_ce(x, w, targets, vocab: int, mult: float, chunk: int, constrain: Constrain,
                grads: bool):
    """(mean loss, (dx, dw) of the mean loss, or None): the logits (x @ w^T) x mult over the
    first `vocab` columns, `chunk` positions at a time, matmuls in x's dtype, f32 accumulation.
    `constrain` pins the layouts in the loop, where GSPMD's propagation is weak: the weight
    cast once where its shards lie (the tied `wte`'s own layout, so a sharded weight is
    gathered in the compute dtype; unpinned, GSPMD gathers the f32 weight, then casts), then
    gathered whole; each chunk split over the batch like x. `dw` is accumulated in f32."""
    xs, ts, valid = _chunks(x, targets, chunk)
    wc = constrain(w.astype(x.dtype), ("vocab", "embed"))
    wc = constrain(wc, ("act_vocab", "act_embed"))
    rows = ("act_batch", "act_seq", "act_embed")
    cols = jnp.arange(w.shape[0])
    scale = mult / targets.size

    def body(carry, c):
        total, dw = carry
        xc, tc, vc = c
        xc = constrain(xc, rows)
        z = constrain(_logits(xc, wc) * mult, ("act_batch", "act_seq", "act_vocab"))
        if w.shape[0] != vocab:  # the padded columns out of the softmax
            z = jnp.where(cols < vocab, z, -jnp.inf)
        lse = jax.nn.logsumexp(z, axis=-1)
        tgt = jnp.take_along_axis(z, tc[..., None], axis=-1)[..., 0]
        total = total + jnp.sum(jnp.where(vc, lse - tgt, 0.0))
        if not grads:
            return (total, dw), None
        p = jnp.exp(z - lse[..., None])  # softmax; d loss / d z = (p - onehot) / N
        dz = jnp.where(vc[..., None], jnp.where(cols == tc[..., None], p - 1.0, p), 0.0)
        dz = (dz * scale).astype(x.dtype)
        dxc = jnp.einsum("bcv,vd->bcd", dz, wc, preferred_element_type=jnp.float32)
        dw = dw + jnp.einsum("bcv,bcd->vd", dz, xc, preferred_element_type=jnp.float32)
        return (total, dw), constrain(dxc.astype(x.dtype), rows)

    dw0 = jnp.zeros(w.shape if grads else (), jnp.float32)
    (total, dw), dxs = jax.lax.scan(body, (jnp.zeros((), jnp.float32), dw0), (xs, ts, valid))
    if not grads:
        return total / targets.size, None
    B, T = targets.shape
    dx = dxs.swapaxes(0, 1).reshape(B, -1, x.shape[-1])[:, :T]
    return total / targets.size, (dx, dw.astype(w.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def chunked_cross_entropy(x: jax.Array, w: jax.Array, targets: jax.Array, vocab: int,
                          mult: float, chunk: int,
                          constrain: Constrain = _no_constraint) -> jax.Array:
    """Mean cross-entropy of the logits (x @ w^T) x mult over the first `vocab` columns, for
    x [B, T, d] (compute dtype), w [padded V, d], targets [B, T]: `chunk` positions at a time."""
    return _chunked_ce(x, w, targets, vocab, mult, chunk, constrain, grads=False)[0]


def _chunked_ce_fwd(x, w, targets, vocab, mult, chunk, constrain=_no_constraint):
    return _chunked_ce(x, w, targets, vocab, mult, chunk, constrain, grads=True)


def _chunked_ce_bwd(vocab, mult, chunk, constrain, res, g):
    dx, dw = res
    return (dx * g).astype(dx.dtype), (dw * g).astype(dw.dtype), None


chunked_cross_entropy.defvjp(_chunked_ce_fwd, _chunked_ce_bwd)


def head_loss(params: Params, x: jax.Array, targets: jax.Array, cfg: ModelConfig,
              chunk: int | None = None, constrain: Constrain = _no_constraint) -> jax.Array:
    """Mean cross-entropy of `head(params, x)` against targets [B, T]. `chunk` (default the
    platform's `backend.Kernels.loss_chunk`; 0: unchunked, the CPU's) positions at a time
    through `chunked_cross_entropy`, else `cross_entropy(head(...))` as written."""
    chunk = backend.kernels(cfg).loss_chunk if chunk is None else chunk
    if not chunk:
        return cross_entropy(head(params, x, cfg), targets)
    h = layer_norm(x, in_dtype(params["ln_f"], x.dtype), cfg.ln_eps)
    return chunked_cross_entropy(h, _head_weight(params, cfg), targets, cfg.vocab_size,
                                 cfg.logits_mult, chunk, constrain)


def loss_fn(params: Params, tokens: jax.Array, cfg: ModelConfig,
            constrain: Constrain = _no_constraint) -> jax.Array:
    """tokens [B, T+1]: predict tokens[:, 1:] from tokens[:, :-1]."""
    x = embed(params, tokens[:, :-1], cfg, 0, constrain)
    x = apply_layers(params["h"], x, cfg, constrain)
    return head_loss(params, x, tokens[:, 1:], cfg, constrain=constrain)
