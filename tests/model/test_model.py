"""Model internals: μP switches against an independent numpy reference, init, remat, dtypes."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cgpt.model import decode, gpt as model
from cgpt.config.model import ModelConfig

TINY = ModelConfig(name="tiny", n_layer=2, d_model=32, n_head=4, vocab_size=97, n_ctx=16)


def _np_forward(p, ids, cfg):
    """A plain numpy GPT written independently of cgpt.model.gpt (loops over layers and heads)."""
    from scipy.special import erf

    def ln(x, s, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + cfg.ln_eps) * s + b

    P = jax.tree.map(np.asarray, p)
    T = ids.shape[1]
    x = (P["wte"][ids] + P["wpe"][:T]) * (10.0 if cfg.mup else 1.0)
    for i in range(cfg.n_layer):
        L = jax.tree.map(lambda a: a[i], P["h"])
        h = ln(x, L["ln_1"]["scale"], L["ln_1"]["bias"])
        qkv = h @ L["attn"]["c_attn"]["kernel"] + L["attn"]["c_attn"]["bias"]
        d = cfg.d_model
        heads = []
        for hd in range(cfg.n_head):
            sl = slice(hd * cfg.d_head, (hd + 1) * cfg.d_head)
            q, k, v = qkv[..., :d][..., sl], qkv[..., d:2 * d][..., sl], qkv[..., 2 * d:][..., sl]
            s = q @ k.transpose(0, 2, 1) / (cfg.d_head if cfg.mup else math.sqrt(cfg.d_head))
            s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
            w = np.exp(s - s.max(-1, keepdims=True))
            heads.append((w / w.sum(-1, keepdims=True)) @ v)
        x = x + np.concatenate(heads, -1) @ L["attn"]["c_proj"]["kernel"] + L["attn"]["c_proj"]["bias"]
        h = ln(x, L["ln_2"]["scale"], L["ln_2"]["bias"])
        h = h @ L["mlp"]["c_fc"]["kernel"] + L["mlp"]["c_fc"]["bias"]
        h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
        x = x + h @ L["mlp"]["c_proj"]["kernel"] + L["mlp"]["c_proj"]["bias"]
    x = ln(x, P["ln_f"]["scale"], P["ln_f"]["bias"])
    return (x @ P["wte"].T) / (cfg.d_model / cfg.mup_base_width if cfg.mup else 1.0)


@pytest.mark.parametrize("mup", [False, True])
def test_forward_matches_numpy_reference(mup):
    cfg = TINY.replace(mup=mup, mup_base_width=8)
    params = model.init_params(cfg, seed=3)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 12))
    out = np.asarray(model.forward(params, jnp.asarray(ids), cfg)[0])
    np.testing.assert_allclose(out, _np_forward(params, ids, cfg), atol=2e-5, rtol=1e-5)


def test_chunked_causal_attention_matches_numpy_reference():
    # T=200 runs attention in query chunks of 64 (the last one ragged); T=12 in one chunk.
    cfg = TINY.replace(n_ctx=256)
    params = model.init_params(cfg, seed=5)
    ids = np.random.default_rng(5).integers(0, cfg.vocab_size, (1, 200))
    out = np.asarray(model.forward(params, jnp.asarray(ids), cfg)[0])
    np.testing.assert_allclose(out, _np_forward(params, ids, cfg), atol=2e-5, rtol=1e-5)


def test_nnx_module_and_param_layout():
    m = model.GPT(TINY, rngs=nnx.Rngs(0))
    ids = jnp.zeros((1, 5), jnp.int32)
    assert m(ids).shape == (1, 5, TINY.vocab_size) and m(ids).dtype == jnp.float32
    params = m.params()
    assert params["h"]["attn"]["c_attn"]["kernel"].shape == (2, 32, 96)  # stacked on layers
    assert sum(x.size for x in jax.tree.leaves(params)) == TINY.num_params()
    axes = model.param_axes(TINY)
    shapes = jax.tree.map(lambda x: x.ndim, params)
    ranks = jax.tree.map(len, axes, is_leaf=lambda x: isinstance(x, tuple))
    assert shapes == ranks
    assert all(n is not None and not n.startswith("act_")
               for t in jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple)) for n in t)


def test_published_initialization_statistics():
    cfg = ModelConfig(n_layer=4, d_model=256, n_head=4, vocab_size=4096, n_ctx=64,
                      out_init_std=0.004)
    p = model.init_params(cfg, seed=0)
    tn = 0.8796  # std of a unit normal truncated at +-2
    assert float(jnp.std(p["wte"])) == pytest.approx(0.02 * tn, rel=0.02)
    assert float(jnp.abs(p["wte"]).max()) <= 0.04 + 1e-7  # cut at 2 sigma
    assert float(jnp.std(p["h"]["mlp"]["c_fc"]["kernel"])) == pytest.approx(0.02 * tn, rel=0.02)
    assert float(jnp.std(p["h"]["mlp"]["c_proj"]["kernel"])) == pytest.approx(0.004 * tn, rel=0.02)
    assert float(jnp.std(p["h"]["attn"]["c_proj"]["kernel"])) == pytest.approx(0.004 * tn, rel=0.03)
    assert float(jnp.abs(p["h"]["attn"]["c_attn"]["bias"]).max()) == 0.0
    assert float(p["h"]["ln_1"]["scale"].min()) == 1.0
    mup = cfg.replace(mup=True, mup_base_width=64)  # m_w = 4
    q = model.init_params(mup, seed=0)
    assert float(jnp.std(q["wte"])) == pytest.approx(0.08 * tn, rel=0.02)
    assert float(jnp.std(q["h"]["mlp"]["c_fc"]["kernel"])) == pytest.approx(0.04 * tn, rel=0.02)
    want_out = 0.08 / math.sqrt(2 * 4 * 4)
    assert float(jnp.std(q["h"]["mlp"]["c_proj"]["kernel"])) == pytest.approx(want_out * tn, rel=0.03)


def test_remat_changes_memory_not_numbers():
    params = model.init_params(TINY, seed=1)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, TINY.vocab_size, (2, 13)))
    grad = jax.jit(jax.value_and_grad(model.loss_fn), static_argnums=2)
    l0, g0 = grad(params, tokens, TINY)
    l1, g1 = grad(params, tokens, TINY.replace(remat=True))
    assert float(l0) == pytest.approx(float(l1), abs=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), g0, g1)


def test_bf16_compute_keeps_f32_params_and_logits():
    cfg = TINY.replace(compute_dtype="bfloat16")
    params = model.init_params(cfg, seed=2)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    ids = jnp.asarray(np.random.default_rng(2).integers(0, 97, (2, 10)))
    lo = model.forward(params, ids, cfg)[0]
    hi = model.forward(params, ids, TINY)[0]
    assert lo.dtype == jnp.float32
    np.testing.assert_allclose(lo, hi, atol=0.05)


@pytest.mark.parametrize("layout", ["stacked", "decode"])
def test_kv_cache_decode_equals_full_forward(layout):
    params = model.init_params(TINY, seed=4)
    ids = jnp.asarray(np.random.default_rng(4).integers(0, 97, (2, 9)))
    full = model.forward(params, ids, TINY)[0]
    if layout == "decode":
        params = decode.decode_layout(params)
        assert isinstance(params["h"], list) and len(params["h"]) == TINY.n_layer
        assert params["h"][0]["mlp"]["c_fc"]["kernel_t"].shape == (TINY.d_ffn, TINY.d_model)
    cache = decode.init_cache(TINY, 2, 16)
    step_logits = []
    logits, cache = decode.forward(params, ids[:, :5], TINY, cache, 0)
    step_logits.append(logits)
    for t in range(5, 9):
        logits, cache = decode.forward(params, ids[:, t:t + 1], TINY, cache, t)
        step_logits.append(logits)
    np.testing.assert_allclose(jnp.concatenate(step_logits, 1), full, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dense_backward_equals_autodiff(dtype):
    rng = np.random.default_rng(6)
    x, k, b, w = (jnp.asarray(rng.standard_normal(s), dtype)
                  for s in ((2, 5, 8), (8, 3), (3,), (2, 5, 3)))
    ours = jax.grad(lambda *a: jnp.sum(model.dense(*a) * w), argnums=(0, 1, 2))(x, k, b)
    ref = jax.grad(lambda x, k, b: jnp.sum((x @ k + b) * w), argnums=(0, 1, 2))(x, k, b)
    tol = 1e-6 if dtype == jnp.float32 else 5e-2
    for o, r in zip(ours, ref):
        assert o.dtype == r.dtype and o.shape == r.shape
        np.testing.assert_allclose(np.asarray(o, np.float32), np.asarray(r, np.float32),
                                   atol=tol, rtol=tol)


def test_generate_follows_replaced_params():
    # LM keeps a decode-layout copy of the weights; replacing `params` must drop it.
    from cgpt.eval.lm import LM
    ids = np.arange(5)[None] % TINY.vocab_size
    a, b = model.init_params(TINY, seed=7), model.init_params(TINY, seed=8)
    lm = LM(TINY, a)
    lm.generate(ids, 6)
    lm.params = b
    np.testing.assert_array_equal(lm.generate(ids, 6), LM(TINY, b).generate(ids, 6))
    assert not np.array_equal(LM(TINY, a).generate(ids, 6), LM(TINY, b).generate(ids, 6))


def test_axes_and_hf_names_derive_from_the_module():
    from cgpt.model import hf

    specs = model.param_specs(TINY)
    params = model.init_params(TINY, seed=0)
    flat = {tuple(k.key for k in path): a for path, a in jax.tree_util.tree_leaves_with_path(params)}
    assert {p: s for p, (s, _) in specs.items()} == {p: a.shape for p, a in flat.items()}
    top, layer = hf.key_map(TINY)
    assert list(top) == ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"]
    assert list(layer) == [f"{m}.{w}" for m in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2",
                                                 "mlp.c_fc", "mlp.c_proj") for w in ("weight", "bias")]
    assert len(top) + len(layer) == len(specs)  # every parameter named once
    sd = hf.state_dict_from_params(params, TINY)
    assert len(sd) == len(top) + TINY.n_layer * len(layer)
    back = hf.params_from_state_dict(sd, {}, TINY, "mem")
    jax.tree.map(np.testing.assert_array_equal, back, jax.tree.map(np.asarray, params))


def test_forward_points_cache_users_to_decode():
    params = model.init_params(TINY, seed=0)
    with pytest.raises(TypeError, match="cgpt.model.decode.forward"):
        model.forward(params, jnp.zeros((1, 2), jnp.int32), TINY, decode.init_cache(TINY, 1, 4), 0)
