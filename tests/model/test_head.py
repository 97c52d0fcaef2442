"""The head's cost (#24): chunked cross-entropy with its own VJP against the plain f32 path,
bf16 head matmuls forward and backward, the remat ladder, and weights gathered in bf16."""
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from cgpt.config.model import REMATS, ModelConfig, remat_value
from cgpt.model import gpt as model
from cgpt.model import remat
from cgpt.plan import hlo
from cgpt.train import fit

TINY = ModelConfig(n_layer=1, d_model=16, n_head=2, vocab_size=101, n_ctx=32,
                   compute_dtype="float32", attention="xla")
T = 13  # not a multiple of the chunks below


def _loss_and_grads(cfg, chunk, tokens, params):
    def loss(p):
        x = model.apply_layers(p["h"], model.embed(p, tokens[:, :-1], cfg), cfg)
        return model.head_loss(p, x, tokens[:, 1:], cfg, chunk=chunk)
    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("cfg", [pytest.param(TINY, marks=pytest.mark.slow),  # the padded case covers it
                                 TINY.replace(mup=True, mup_base_width=8, vocab_multiple=64)],
                         ids=["sp", "mup-padded-vocab"])
def test_chunked_cross_entropy_equals_the_f32_path(cfg):
    params = model.init_params(cfg, 0)
    tokens = jax.random.randint(jax.random.key(1), (3, T + 1), 0, cfg.vocab_size)
    ref_l, ref_g = _loss_and_grads(cfg, 0, tokens, params)
    # the unchunked path is exactly the old loss: cross_entropy(head(forward))
    old = model.cross_entropy(model.forward(params, tokens[:, :-1], cfg)[0], tokens[:, 1:])
    assert float(ref_l) == float(old)
    for chunk in (4, T, 32):  # 13 -> 4 chunks of 4 (3 padded), one chunk, one of 13 (not 32)
        l, g = _loss_and_grads(cfg, chunk, tokens, params)
        assert abs(float(l) - float(ref_l)) < 1e-5, chunk
        for path, a, b in zip(jax.tree_util.tree_leaves_with_path(g), jax.tree.leaves(g),
                              jax.tree.leaves(ref_g)):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0, err_msg=f"{chunk} {path[0]}")
        assert float(jnp.abs(g["wte"]).max()) > 0  # the tied head's gradient reaches wte


def _dots(jaxpr):
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out.append(eqn)
        for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else ():
            out += _dots(sub)
        for v in eqn.params.values():
            for j in (v if isinstance(v, (tuple, list)) else [v]):
                inner = getattr(j, "jaxpr", None)
                if inner is not None:
                    out += _dots(getattr(inner, "jaxpr", inner))
    return out


@pytest.mark.parametrize("chunk", [0, 4])
def test_head_matmuls_run_in_bf16_forward_and_backward(chunk):
    cfg = TINY.replace(compute_dtype="bfloat16", vocab_multiple=64)
    params = model.init_params(cfg, 0)
    x = jnp.ones((2, T, cfg.d_model), jnp.bfloat16)
    tgt = jnp.zeros((2, T), jnp.int32)
    jaxpr = jax.make_jaxpr(jax.grad(
        lambda p, x: model.head_loss(p, x, tgt, cfg, chunk=chunk), argnums=(0, 1)))(params, x)
    dots = _dots(jaxpr.jaxpr)
    assert len(dots) >= 3  # logits forward, and both backward products (recompute: one more)
    for eqn in dots:
        assert [v.aval.dtype for v in eqn.invars] == [jnp.bfloat16] * 2, eqn
        assert eqn.params["preferred_element_type"] == jnp.float32, eqn


def test_chunked_loss_holds_one_chunk_of_logits():
    cfg = ModelConfig(n_layer=1, d_model=32, n_head=2, vocab_size=8192, n_ctx=256,
                      compute_dtype="float32", attention="xla")
    params = jax.eval_shape(lambda: model.init_params(cfg, 0))
    x = jax.ShapeDtypeStruct((2, 256, 32), jnp.float32)
    tgt = jax.ShapeDtypeStruct((2, 256), jnp.int32)
    logits = 2 * 256 * 8192 * 4

    def temp(chunk):
        f = jax.jit(jax.grad(lambda p, x, t: model.head_loss(p, x, t, cfg, chunk=chunk),
                             argnums=(0, 1)))
        return fit.step_bytes(f.lower(params, x, tgt).compile())["temp"]

    full, chunked = temp(0), temp(32)
    assert full >= 2 * logits  # autodiff keeps the logits and their gradient
    assert chunked < logits / 2, (full, chunked)  # one 32-position chunk is 1/8 of them


# ---- the remat ladder ---------------------------------------------------------------------
def test_remat_values_and_the_old_booleans():
    assert ModelConfig(remat=True).remat == "full"
    assert ModelConfig(remat=False).remat == "save_dots"
    assert ModelConfig.from_dict({"remat": False}).remat == "save_dots"  # old config.yaml
    assert ModelConfig(remat=None).remat is None and remat_value(None) == "save_dots"
    assert [ModelConfig(remat=r).remat for r in REMATS] == list(REMATS)
    with pytest.raises(ValueError, match="model.remat='some'.*none, save_attn"):
        ModelConfig(remat="some")
    with pytest.raises(ValueError, match="loss_chunk"):
        ModelConfig(loss_chunk=-1)


def test_policies_keep_the_named_values():
    cfg = TINY.replace(n_layer=2)
    params = model.init_params(cfg, 0)
    x = jnp.ones((2, T, cfg.d_model))

    layer = jax.tree.map(lambda a: a[0], params["h"])

    def kept(r):  # what one checkpointed block keeps for the backward (as apply_layers does)
        block = jax.checkpoint(lambda p, x: model.block(p, x, cfg),
                               policy=remat.remat_policy(r), prevent_cse=False)
        return " ".join(str(why) for _, why in saved_residuals(block, layer, x))

    save_attn, save_dots, full = kept("save_attn"), kept("save_dots"), kept("full")
    assert f"named '{remat.ATTENTION}'" in save_attn and f"named '{remat.MATMUL}'" in save_attn
    assert "named" not in save_dots and "named" not in full
    assert "dot_general" in save_dots and "dot_general" not in full
    # cuDNN's fused attention forward (output and softmax statistics) is kept by save_attn
    cudnn = type("P", (), {"name": "dot_product_attention_fwd_wrapper"})()
    assert remat.remat_policy("save_attn")(cudnn) is True
    assert remat.remat_policy("none") is remat.NO_REMAT and remat.remat_policy(True) is None
    # every rung computes the same loss and gradients
    tokens = jax.random.randint(jax.random.key(2), (2, T + 1), 0, cfg.vocab_size)
    grad = jax.jit(jax.value_and_grad(model.loss_fn), static_argnums=2)
    ref = grad(params, tokens, cfg.replace(remat="none"))
    for r in ("save_attn", "save_dots", "full"):
        l, g = grad(params, tokens, cfg.replace(remat=r))
        assert abs(float(l - ref[0])) < 1e-6
        for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref[1])):
            np.testing.assert_allclose(a, b, atol=1e-6)


def test_fit_climbs_the_ladder():
    calls = []

    def compile_fn(m, r):  # memory falls one step per rung
        calls.append((m, r))
        need = {"none": 400, "save_attn": 300, "save_dots": 250, "full": 200}[r] * m
        return type("C", (), {"memory_analysis": lambda self: type("M", (), dict(
            argument_size_in_bytes=0, output_size_in_bytes=0, temp_size_in_bytes=need,
            alias_size_in_bytes=0))()})()

    ladder = ("none", "save_attn", "full")
    usable = fit.memory_for
    choice, _ = fit.search([4, 2, 1], 4, compile_fn, usable(1600), ladder=ladder)
    assert (choice.micro_batch, choice.remat, len(calls)) == (4, "none", 1)
    calls.clear()
    choice, _ = fit.search([4, 2, 1], 4, compile_fn, usable(1200), ladder=ladder)
    assert (choice.micro_batch, choice.remat) == (4, "save_attn") and len(calls) == 2
    calls.clear()  # nothing fits at 4: bisect with full, then the lower rungs at that size
    choice, _ = fit.search([4, 2, 1], 4, compile_fn, usable(600), ladder=ladder)
    assert (choice.micro_batch, choice.accum, choice.remat) == (2, 2, "save_attn")
    assert choice.describe()["remat"] == "save_attn" and "remat save_attn" in choice.line()


# ---- weights gathered in the compute dtype ------------------------------------------------
def _ws_step(dtype, loss_chunk):
    """weight_streaming's step over data=2 x fsdp=4 (2 layers, a vocabulary padded 250 -> 256)
    lowered on abstract state, with the strategy and the abstract parameters."""
    from cgpt.config.recipe import Recipe
    from cgpt.sharding.strategies import make_strategy
    from cgpt.train import optim
    from cgpt.train.step import make_step

    cfg = ModelConfig(n_layer=2, d_model=64, n_head=2, vocab_size=250, n_ctx=32,
                      compute_dtype=dtype, attention="xla", vocab_multiple=128,
                      loss_chunk=loss_chunk)
    train = type("T", (), {"batch_size": 16, "micro_batch": None, "micro_batches": None})
    s = make_strategy("weight_streaming", "data=2,fsdp=4", cfg, train, devices=jax.devices()[:8])
    opt = optim.make_optimizer(Recipe(peak_lr=1e-3, decay="linear", adam_eps=1e-8,
                                      batch_size=16, warmup_steps=1, total_steps=10), cfg)
    p = jax.eval_shape(lambda: model.init_params(cfg))
    o = jax.eval_shape(opt.init, p)
    a_p, a_o = s.abstract_state(p, o)
    batch = jax.ShapeDtypeStruct((1, 16, 33), jnp.int32, sharding=s.batch_sharding(3))
    return s.jit_step(make_step(cfg, opt, s.loss), p, o).lower(a_p, a_o, batch), s, a_p


def _gathers(text: str) -> dict[str, int]:
    return {dt: n for (kind, dt), n in hlo.collective_dtypes(text).items()
            if kind == "all-gather"}


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 emulated CPU devices")
def test_weight_streaming_gathers_bf16_weights():
    """Read after SPMD partitioning (`hlo.partitioned_hlo`), before the CPU compiler widens
    bf16 collectives to f32: what an accelerator's step would gather (the CPU's loss)."""
    bf16 = _gathers(hlo.partitioned_hlo(_ws_step("bfloat16", 0)[0]))
    assert bf16.get("bf16", 0) >= 2 * 2 * 4  # 2 layers x 4 kernels, forward and backward
    assert "f32" not in bf16, bf16  # the f32 master never leaves its shards
    f32 = _gathers(hlo.partitioned_hlo(_ws_step("float32", 0)[0]))
    assert f32.get("f32", 0) >= 2 * 2 * 4  # the count sees f32 gathers


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 emulated CPU devices")
def test_chunked_loss_gathers_the_head_weight_in_bf16():
    """The GPU's loss (`chunked_cross_entropy`): the tied head weight [256, 64] is cast where
    its shards lie and gathered as bf16, not gathered as the f32 master and then cast; its
    gradient is still f32 (accumulated in f32 over the chunks)."""
    low, s, a_p = _ws_step("bfloat16", 16)
    text = hlo.partitioned_hlo(low)
    assert "f32" not in _gathers(text), _gathers(text)
    head = [ln for ln in text.splitlines() if " all-gather(" in ln and "[256,64]" in ln]
    assert head and all("= bf16[256,64]" in ln for ln in head), head
    tokens = jax.ShapeDtypeStruct((16, 33), jnp.int32)
    g = jax.eval_shape(jax.grad(lambda p, t: model.loss_fn(p, t, s.cfg, s.constrain)),
                       a_p, tokens)
    assert g["wte"].dtype == jnp.float32
