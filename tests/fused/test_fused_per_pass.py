"""The fused step's two forms (#21 item 5a): one vmapped pass over the members, or a loop of
passes (`per_pass`; on a CPU one member a pass, the solo step's own program). Both equal the
solo step; the loop of single members bit for bit."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cgpt.config.model import get_config
from cgpt.model import gpt as model
from cgpt.train import fused, optim
from cgpt.train.step import make_eval, make_step
from tests.fused.test_fused import _assert_close_params

M, STEPS = 3, 3


@pytest.fixture(scope="module")
def setup():
    from cgpt.config.data import DataConfig
    from cgpt.config.run import RunConfig, TrainConfig
    from cgpt.train.resolve import resolve

    cfg = get_config("tiny-17k").replace(compute_dtype="float32")
    run = RunConfig(preset="tiny-17k", model=cfg, data=DataConfig(seq_len=16, vocab_size=512),
                    train=TrainConfig(tokens=8 * 16 * 10, batch_size=8, peak_lr=3e-3))
    r = resolve(run, jax.devices()[:1])
    recipes = [dataclasses.replace(r.recipe, peak_lr=1e-3 * 3 ** i) for i in range(M)]
    rng = np.random.default_rng(0)
    batches = jnp.asarray(rng.integers(0, 512, (STEPS, M, 1, 8, 17)), jnp.int32)
    return r.cfg, recipes, batches


def _solo(cfg, recipe, seed, batches):
    opt = optim.make_optimizer(recipe, cfg)
    p = model.init_params(cfg, seed)
    o = opt.init(p)
    step = jax.jit(make_step(cfg, opt))
    losses = []
    for b in batches:
        p, o, m = step(p, o, b)
        losses.append(float(m["loss"]))
    return p, losses


def _fused(cfg, recipes, batches, per_pass):
    members = [fused.init_member(cfg, recipes[0], i) for i in range(M)]
    p, o = fused.stack([m[0] for m in members]), fused.stack([m[1] for m in members])
    step = fused.make_fused_step(cfg, recipes[0], per_pass=per_pass)
    hyper, active = fused.stack_hyper(recipes), jnp.ones((M,), bool).at[1].set(False)
    losses = []
    for b in batches:
        p, o, m = step(p, o, b, hyper, active)
        assert np.asarray(m["ok"]).tolist() == [True, False, True]
        losses.append(np.asarray(m["loss"]))
    return p, np.stack(losses)


def test_members_per_pass_loops_on_one_cpu_device():
    assert fused.members_per_pass() == (1 if jax.default_backend() == "cpu" else 0)
    sh = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    assert fused.members_per_pass(sh) == 0  # members spread over devices: one vmapped pass


@pytest.mark.parametrize("per_pass", [pytest.param(1, marks=pytest.mark.slow),  # test_fused's equality runs the loop by default
                                      pytest.param(2, marks=pytest.mark.slow),
                                      pytest.param(0, marks=pytest.mark.slow)])
def test_fused_step_forms_equal_the_solo_step(setup, per_pass):
    cfg, recipes, batches = setup
    p, losses = _fused(cfg, recipes, batches, per_pass)
    p0 = model.init_params(cfg, 1)
    inactive = jax.tree.map(lambda x: x[1], p)  # member 1 never active: its init, unchanged
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(inactive), jax.tree.leaves(p0)))
    for i in (0, 2) if per_pass != 1 else (0,):  # (one solo compile in the default suite)
        sp, sl = _solo(cfg, recipes[i], i, batches[:, i])
        mine = jax.tree.map(lambda x: x[i], p)
        if per_pass == 1:  # the solo program member after member: bit for bit
            assert losses[:, i].tolist() == sl
            assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(mine),
                                                            jax.tree.leaves(sp)))
        else:  # vmapped kernels: ulp-level differences (the key bias: see the helper)
            np.testing.assert_allclose(losses[:, i], sl, rtol=0, atol=1e-6)
            _assert_close_params(jax.tree.map(np.asarray, mine), jax.tree.map(np.asarray, sp))


def test_fused_eval_forms_equal_the_solo_eval(setup):
    cfg, _, batches = setup
    params = fused.stack([model.init_params(cfg, i) for i in range(M)])
    tokens = batches[0, 0, 0]
    solo = make_eval(cfg)
    want = [float(solo(jax.tree.map(lambda x: x[i], params), tokens)) for i in range(M)]
    assert np.asarray(fused.make_fused_eval(cfg, per_pass=1)(params, tokens)).tolist() == want
    np.testing.assert_allclose(fused.make_fused_eval(cfg, per_pass=0)(params, tokens), want,
                               rtol=0, atol=1e-6)
