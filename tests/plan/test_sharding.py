"""Execution modes on 8 emulated CPU devices: each must train exactly like one device.

One tiny model, one fixed batch, two optimizer steps (the published schedule has lr 0 at
step 0) in every mode, compared with `SingleDevice`. Adam's eps is raised to 1e-3 here: with
eps 1e-8 the first Adam update is lr * sign(g), which turns 1e-9 rounding differences in a
near-zero gradient into lr-sized parameter differences, hiding real bugs behind noise.
"""
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

from cgpt import sharding
from cgpt.model import gpt as model
from cgpt.train import optim
from cgpt.config.recipe import Recipe, published_defaults
from cgpt.sharding import pipeline
from cgpt.plan import command as plan
from cgpt.train.checkpoint import Checkpointer
from cgpt.config.model import ModelConfig, get_config
from cgpt.config.data import DataConfig
from cgpt.config.run import RunConfig, TrainConfig
from cgpt.train.resolve import resolve
from cgpt.train.step import make_step

CFG = ModelConfig(n_layer=4, d_model=64, n_head=2, vocab_size=256, n_ctx=32)
ACCUM, ROWS, T = 2, 16, 32
TOL = 1e-5


class _Plan:  # the fields of cgpt.train.resolve.Resolved that strategies read
    def __init__(self, replicas: int):
        self.replicas = replicas
        self.micro_batch = ROWS // replicas
        self.accum = ACCUM


def _optimizer():
    r = Recipe(peak_lr=1e-3, decay="linear", adam_eps=1e-3, batch_size=ACCUM * ROWS,
                     warmup_steps=1, total_steps=10)
    return optim.make_optimizer(r, CFG)


BATCHES = [np.random.default_rng(i).integers(0, CFG.vocab_size, (ACCUM, ROWS, T + 1))
           .astype(np.int32) for i in range(2)]
STATES: dict = {}


def _train(strategy):
    opt = _optimizer()
    step, params, opt_state = strategy.compile_step(make_step(CFG, opt, strategy.loss), opt, 0,
                                                    _Plan(strategy.data_replicas))
    losses = []
    for b in BATCHES:
        params, opt_state, m = step(params, opt_state, strategy.shard_batch(b))
        losses.append(float(m["loss"]))
    return losses, params, opt_state


@pytest.fixture(scope="module")
def reference():
    return _train(sharding.SingleDevice(CFG))


def _max_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


MODES = [("data_parallel", "", {"data": 8}),
         ("weight_streaming", "", {"data": 8}),
         ("weight_streaming", "data=2,fsdp=4", {"data": 2, "fsdp": 4}),  # batch over both
         ("layer_pipelined", "stage=4,data=2", {"stage": 4, "data": 2}),
         ("layer_pipelined", "stage=2", {"stage": 2}),
         ("auto", "", {"stage": 4, "data": 2})]
SLOW_MODES = {("layer_pipelined", "stage=2"): "stage=4,data=2 pipelines by default"}


@pytest.mark.parametrize("mode,spec,mesh", [
    pytest.param(m, s, x, id=f"{m}-{s or 'all'}", marks=[pytest.mark.slow(reason=SLOW_MODES[m, s])]
                 if (m, s) in SLOW_MODES else []) for m, s, x in MODES])
def test_one_step_matches_single_device(reference, mode, spec, mesh):
    strategy = sharding.make_strategy(mode, spec, CFG, TrainConfig(mode=mode))
    assert dict(strategy.mesh.shape) == mesh
    losses, params, opt_state = _train(strategy)
    ref_losses, ref_params, ref_opt = reference
    np.testing.assert_allclose(losses, ref_losses, atol=TOL, rtol=0)
    assert _max_diff(params, ref_params) < TOL
    assert _max_diff(opt_state, ref_opt) < TOL
    # the state stays in the mode's layout after the step
    specs = strategy.param_specs()
    for leaf, spec_ in zip(jax.tree.leaves(params), jax.tree.leaves(
            specs, is_leaf=lambda x: isinstance(x, P))):
        assert leaf.sharding.is_equivalent_to(NamedSharding(strategy.mesh, spec_), leaf.ndim)
    if strategy.mode == "layer_pipelined":
        M = strategy.micro_batches_for(ROWS)
        assert strategy.bubble_fraction == pytest.approx((mesh["stage"] - 1)
                                                         / (M + mesh["stage"] - 1))
    STATES[(mode, spec)] = (strategy, params, opt_state)


@pytest.mark.parametrize("axes,batch_axes", [
    ({"data": 2, "fsdp": 4}, ("data", "fsdp")),
    pytest.param({"data": 2, "fsdp": 4}, ("data",), marks=pytest.mark.slow(
        reason="data=2,fsdp=4 with the batch over both runs by default")),
    pytest.param({"fsdp": 8}, ("fsdp",), marks=pytest.mark.slow(
        reason="data=2,fsdp=4 with the batch over both runs by default"))])
def test_two_dim_weight_streaming_loss_equals_single_device(reference, axes, batch_axes):
    """data x fsdp: weights over all 8 devices, the batch over `batch_axes` (with ("data",)
    each fsdp group of 4 devices computes the same rows); loss within 1e-6 of one device."""
    s = sharding.WeightStreaming(CFG, sharding.build_mesh(axes), batch_axes)
    assert s.data_replicas == math.prod(axes[a] for a in batch_axes)
    assert s.batch_sharding(3).spec == P(None, batch_axes if len(batch_axes) > 1
                                         else batch_axes[0])
    assert s.describe()["weight_axes"] == sorted(axes) and s.describe()["unsharded"] == []
    losses, params, _ = _train(s)
    np.testing.assert_allclose(losses, reference[0], atol=1e-6, rtol=0)
    assert _max_diff(params, reference[1]) < TOL
    for leaf in jax.tree.leaves(params):  # 1/8 of every parameter on each device
        assert math.prod(leaf.sharding.shard_shape(leaf.shape)) * 8 == leaf.size


def test_auto_picks_by_memory():
    mode, axes, why = sharding.choose_auto(CFG, 8, 80 * 10**9, ROWS, T)
    assert (mode, axes) == ("layer_pipelined", {"stage": 4, "data": 2}), why
    six = CFG.replace(n_layer=6)  # 2 stages on 8 devices: each holds 3 layers
    lp = sharding.pipeline_bytes_per_device(six, 2, 1, T)
    ws = sharding.weight_streaming_bytes_per_device(six, 8, 1, T)
    assert ws < lp
    mode, axes, why = sharding.choose_auto(six, 8, (ws + lp) // 2, ROWS, T)
    assert (mode, axes) == ("weight_streaming", {"data": 8}), why
    # the skipped candidate is named; no memory figure (a plan prints one: its step's)
    assert "layer_pipelined on stage=2,data=4 does not" in why
    assert not re.search(r"\d (B|kB|MB|GB|TB)\b", why), why
    s = sharding.make_strategy("auto", "", six, None, device_memory=(ws + lp) // 2, seq_len=T)
    assert s.mode == "weight_streaming" and "fits" in s.auto_reason
    assert s.describe()["auto_reason"] == s.auto_reason
    # the weight-streaming fallback must fit too: else an error with the numbers and the fix
    with pytest.raises(ValueError, match=r"nothing fits.*weight_streaming on data=8 needs "
                                         r"~[0-9.]+ [kMGT]B.*more devices, a smaller train.micro_batch"):
        sharding.choose_auto(six, 8, ws // 2, ROWS, T, micro_batch=2)


def test_auto_counts_the_logits():
    """B x T x V f32 logits and their gradient: 8 bytes each, in every estimate."""
    big_vocab = CFG.replace(vocab_size=50257)
    extra = 8 * T * (50257 - CFG.vocab_size)
    for est in (lambda c, r: sharding.pipeline_bytes_per_device(c, 1, r, T),
                lambda c, r: sharding.weight_streaming_bytes_per_device(c, 8, r, T)):
        grow = (est(big_vocab, 3) - est(big_vocab, 1)) - (est(CFG, 3) - est(CFG, 1))
        assert grow == 2 * extra  # two more sequences in flight: two more rows of logits
    assert sharding.logits_bytes(CFG, 2, T) == 2 * 8 * T * CFG.vocab_size


def test_auto_never_pipelines_one_stage():
    """n_layer=5 on 8 devices: no stage count > 1 divides both, so data parallel (or
    weight streaming when it does not fit), never a 1-stage layer_pipelined."""
    odd = CFG.replace(n_layer=5)
    mode, axes, why = sharding.choose_auto(odd, 8, 80 * 10**9, ROWS, T)
    assert (mode, axes) == ("data_parallel", {"data": 8}), why
    dp = sharding.data_parallel_bytes_per_device(odd, 1, T)
    mode, axes, why = sharding.choose_auto(odd, 8, dp - 1, ROWS, T)
    assert mode == "weight_streaming", why
    s = sharding.make_strategy("auto", "", odd, None, device_memory=80 * 10**9, seq_len=T)
    assert s.mode == "data_parallel" and not isinstance(s, sharding.LayerPipelined)


@pytest.mark.parametrize("spec,mode,mesh", [
    ("stage=2,data=4", "layer_pipelined", {"stage": 2, "data": 4}),
    ("data=2,fsdp=4", "weight_streaming", {"data": 2, "fsdp": 4}),
    ("data=8", "data_parallel", {"data": 8}),
    ("data=4", "data_parallel", {"data": 4}),
])
def test_auto_honours_mesh_axes(spec, mode, mesh):
    s = sharding.make_strategy("auto", spec, CFG, None, device_memory=80 * 10**9, seq_len=T)
    assert (s.mode, dict(s.mesh.shape)) == (mode, mesh), s.auto_reason
    assert s.describe()["mesh_reason"] == "given by --mesh"


def test_auto_on_a_given_mesh_falls_back_only_within_it():
    # a --mesh with `data` only may still stream weights when replication does not fit
    ws = sharding.weight_streaming_bytes_per_device(CFG, 8, 1, T)
    s = sharding.make_strategy("auto", "data=8", CFG, None, device_memory=ws + 1, seq_len=T)
    assert (s.mode, dict(s.mesh.shape)) == ("weight_streaming", {"data": 8})
    # ... but a given stage axis is never traded away: an error when it does not fit
    with pytest.raises(ValueError, match="layer_pipelined on stage=2,data=4 needs"):
        sharding.make_strategy("auto", "stage=2,data=4", CFG, None, device_memory=ws + 1,
                               seq_len=T)


# ---- golden shardings (written out; a change here changes what every device holds) ------
LN = {"scale": P(None, "data"), "bias": P(None, "data")}
GOLDEN = {
    "data_parallel": {"wte": P(), "wpe": P(), "ln_f": {"scale": P(), "bias": P()},
                      "h": {"ln_1": {"scale": P(), "bias": P()},
                            "attn": {"c_attn": {"kernel": P(), "bias": P()},
                                     "c_proj": {"kernel": P(), "bias": P()}},
                            "ln_2": {"scale": P(), "bias": P()},
                            "mlp": {"c_fc": {"kernel": P(), "bias": P()},
                                    "c_proj": {"kernel": P(), "bias": P()}}}},
    # embed/heads/mlp over `data`, never `layers`; wte on embed (vocab is not in the rules)
    "weight_streaming": {"wte": P(None, "data"), "wpe": P(None, "data"),
                         "ln_f": {"scale": P("data"), "bias": P("data")},
                         "h": {"ln_1": LN,
                               "attn": {"c_attn": {"kernel": P(None, "data"),
                                                   "bias": P(None, "data")},
                                        "c_proj": {"kernel": P(None, "data"),
                                                   "bias": P(None, "data")}},
                               "ln_2": LN,
                               "mlp": {"c_fc": {"kernel": P(None, "data"),
                                                "bias": P(None, "data")},
                                       "c_proj": {"kernel": P(None, "data"),
                                                  "bias": P(None, "data")}}}},
    # contiguous layer groups on `stage`; embeddings and final LN on every device
    "layer_pipelined": {"wte": P(), "wpe": P(), "ln_f": {"scale": P(), "bias": P()},
                        "h": {"ln_1": {"scale": P("stage"), "bias": P("stage")},
                              "attn": {"c_attn": {"kernel": P("stage"), "bias": P("stage")},
                                       "c_proj": {"kernel": P("stage"), "bias": P("stage")}},
                              "ln_2": {"scale": P("stage"), "bias": P("stage")},
                              "mlp": {"c_fc": {"kernel": P("stage"), "bias": P("stage")},
                                      "c_proj": {"kernel": P("stage"), "bias": P("stage")}}}},
}
GOLDEN_MESH = {"data_parallel": "data=8", "weight_streaming": "data=8",
               "layer_pipelined": "stage=4,data=2"}
GOLDEN_ACT = {"data_parallel": P("data"), "weight_streaming": P("data"),
              "layer_pipelined": P(("data", "stage"))}


@pytest.mark.parametrize("mode", list(GOLDEN))
def test_golden_param_shardings(mode):
    s = sharding.make_strategy(mode, GOLDEN_MESH[mode], CFG)
    assert s.param_specs() == GOLDEN[mode]
    assert s.spec(("act_batch", "act_seq", "act_embed"), (ROWS, T, CFG.d_model)) == GOLDEN_ACT[mode]
    # Adam moments follow the parameters
    opt = _optimizer()
    abstract = jax.eval_shape(opt.init, jax.eval_shape(lambda: model.init_params(CFG)))
    shardings = s.opt_shardings(abstract)
    mu = [x for x in jax.tree.leaves(shardings) if x.spec != P()]
    expect = [x for x in jax.tree.leaves(GOLDEN[mode], is_leaf=lambda x: isinstance(x, P))
              if x != P()]
    assert [x.spec for x in mu] == expect * 2  # mu and nu


def test_host_offload_is_removed_with_a_clear_error():
    for kwargs, train in (({"host_offload": True}, None), ({}, TrainConfig(host_offload=True))):
        with pytest.raises(ValueError, match="train.host_offload.*was removed"):
            sharding.make_strategy("weight_streaming", "data=8", CFG, train, **kwargs)


@pytest.mark.parametrize("mode,spec,match", [
    ("weight_streaming", "data=16", "needs 16 devices"),
    ("weight_streaming", "stage=8", "axis 'stage' is not used by --mode weight_streaming"),
    ("layer_pipelined", "stage=4,stage=2", "given twice"),
    ("layer_pipelined", "stage:4", "axis=size"),
    ("layer_pipelined", "stage=8", r"stage=8 does not divide n_layer=4.*\[1, 2, 4\]"),
    ("layer_pipelined", "", r"stage=8 does not divide"),
    ("pipelined", "", "--mode 'pipelined'"),
    ("single", "data=8", "needs a sharded --mode"),
])
def test_bad_mesh_and_mode_are_clear(mode, spec, match):
    with pytest.raises(ValueError, match=match):
        sharding.make_strategy(mode, spec, CFG)


def test_micro_batches_must_divide_micro_batch():
    s = sharding.make_strategy("layer_pipelined", "stage=2", CFG, TrainConfig(micro_batches=3))
    with pytest.raises(ValueError, match="train.micro_batches=3"):
        s.prepare(_Plan(1))
    assert pipeline.bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert pipeline.bubble_fraction(1, 5) == 0


def test_checkpoint_restores_across_modes(tmp_path):
    """A weight-streaming checkpoint restores into the pipelined and single-device layouts."""
    if ("weight_streaming", "") not in STATES:
        pytest.skip("needs the weight_streaming equivalence run")
    ws, params, opt_state = STATES[("weight_streaming", "")]
    ck = Checkpointer(tmp_path, keep=1)
    ck.save(2, params, opt_state)
    for target in (sharding.make_strategy("layer_pipelined", "stage=4,data=2", CFG),
                   sharding.SingleDevice(CFG)):
        step, p2, o2 = ck.restore_latest(*target.abstract_state(params, opt_state))
        assert step == 2
        assert _max_diff(p2, params) == 0 and _max_diff(o2, opt_state) == 0
        want = target.abstract_state(params, opt_state)
        for got, w in zip(jax.tree.leaves((p2, o2)), jax.tree.leaves(want)):
            assert got.sharding.is_equivalent_to(w.sharding, got.ndim)
    ck.close()


# ---- weight streaming on 8-64 devices: meshes that divide the published batches ----------
PUBLISHED_BATCH = {"111M": 120, "256M": 264, "590M": 264, "1.3B": 528, "2.7B": 528,
                   "6.7B": 1040, "13B": 720}


def _abstract(axes: dict) -> AbstractMesh:
    return AbstractMesh(tuple(axes.values()), tuple(axes), axis_types=(AxisType.Auto,) * len(axes))


def _devices_per_param(s) -> list[int]:
    sizes = dict(s.mesh.shape)
    return [math.prod(sizes[a] for d in spec if d for a in ((d,) if isinstance(d, str) else d))
            for spec in jax.tree.leaves(s.param_specs(), is_leaf=lambda x: isinstance(x, P))]


@pytest.mark.parametrize("devices", [8, 16, 32, 64])
@pytest.mark.parametrize("preset", list(PUBLISHED_BATCH))
def test_published_batches_split_under_weight_streaming(preset, devices):
    """Every published global batch trains unchanged: the batch over the most devices that
    divide it (`data`), the weights over all of them (`fsdp` x `data`). Abstract mesh and
    shapes only: no arrays are made."""
    cfg, batch = get_config(preset), PUBLISHED_BATCH[preset]
    assert published_defaults(cfg)["batch_size"] == batch
    mode, axes, why, _ = sharding.placement("weight_streaming", "", cfg, batch, num_devices=devices)
    s = sharding.strategy_on(_abstract(axes), mode, cfg, batch, mesh_reason=why)
    best = max(d for d in range(1, devices + 1) if devices % d == 0 and batch % d == 0)
    assert math.prod(axes.values()) == devices and s.data_replicas == best
    assert ("fsdp" in axes) == (best < devices) and "split" in s.describe()["mesh_reason"]
    assert set(_devices_per_param(s)) == {devices}  # every weight on every device, 1/N each
    run = RunConfig(preset=preset, model=cfg, data=DataConfig(seq_len=cfg.n_ctx),
                    train=TrainConfig(mode="weight_streaming"))
    p = resolve(run, devices)  # the run places itself as the strategy was placed
    assert p.mesh == axes and p.replicas == s.data_replicas
    assert p.batch_size == batch and p.micro_batch * p.accum * p.replicas == batch
    # the only thing not split as the rules ask is the batch over fsdp, and it is reported
    assert [u["array"] for u in s.describe()["unsharded"]] == \
        (["batch (every activation)"] if best < devices else [])


def test_explicit_two_dim_mesh_is_honoured():
    cfg = get_config("1.3B")  # batch 528 = 16 x 33: splits over data=2 x fsdp=8
    mode, axes, why, _ = sharding.placement("weight_streaming", "data=2,fsdp=8", cfg, 528,
                                            num_devices=16)
    s = sharding.strategy_on(_abstract(axes), mode, cfg, 528, mesh_reason=why)
    assert axes == {"data": 2, "fsdp": 8} and s.batch_axes == ("data", "fsdp")
    assert s.data_replicas == 16 and s.describe()["mesh_reason"] == "given by --mesh"
    # 590M's 264 does not split 16 ways: over data=2 only, the fsdp groups share rows
    cfg = get_config("590M")
    s = sharding.strategy_on(_abstract(axes), mode, cfg, 264, mesh_reason=why)
    assert s.batch_axes == ("data",) and s.data_replicas == 2
    [u] = s.describe()["unsharded"]
    assert u["logical"] == "act_batch" and "264 is not a multiple of data=2 x fsdp=8" in u["why"]


def test_dims_that_do_not_divide_are_reported(caplog):
    """256M on 128 devices: batch 264 -> data=8 x fsdp=16; d_model=1088 splits 8 but not
    128 ways, so 1-D embed-only weights stay replicated over `fsdp`: reported, warned about,
    never silent. The kernels still cover all 128 devices: embed over data, heads over fsdp."""
    cfg = get_config("256M")
    mode, axes, why, _ = sharding.placement("weight_streaming", "", cfg, 264, num_devices=128)
    assert axes == {"data": 8, "fsdp": 16}
    with caplog.at_level("WARNING"):
        s = sharding.strategy_on(_abstract(axes), mode, cfg, 264, mesh_reason=why)
    assert "cannot be split as the rules ask" in caplog.text
    report = {(u["array"], u["logical"]): u for u in s.describe()["unsharded"]}
    ln = report[("ln_f/scale", "embed")]
    assert ln["dim"] == 1088 and ln["wanted"] == ["data", "fsdp"] and ln["got"] == ["data"]
    assert "1088 is not a multiple of data=8 x fsdp=16" in ln["why"]
    assert not any(a.startswith("h/attn/c_attn/kernel") for a, _ in report)
    assert s.param_specs()["h"]["attn"]["c_attn"]["kernel"] == P(None, "data", "fsdp")
    assert s.param_specs()["h"]["mlp"]["c_proj"]["kernel"] == P(None, "fsdp", "data")
    assert {a for a, _ in report} >= {"wte", "wpe", "ln_f/bias", "h/ln_1/scale"}


def test_nothing_shardable_is_an_error():
    with pytest.raises(ValueError, match=r"no parameter of .* can be sharded.*not a multiple "
                                         r"of data=7"):
        sharding.make_strategy("weight_streaming", "data=7", CFG)


@pytest.mark.slow(reason=(
    "the same report without a compile: test_dims_that_do_not_divide_are_reported"))
def test_plan_shows_the_unsharded_dims():
    """d_model=80 over 6 devices: the fused QKV dim (240) splits, d_model and d_ffn do not."""
    r = plan.plan("tiny-518k", "weight_streaming", "data=6", devices=6, batch=12, seq_len=16,
                  compile_devices=jax.devices()[:6])
    got = {(u["array"], u["logical"]) for u in r["unsharded"]}
    assert ("h/mlp/c_fc/kernel", "embed") in got and ("ln_f/scale", "embed") in got
    assert not any(a == "h/attn/c_attn/kernel" for a, _ in got)
    assert "unsharded     ln_f/scale embed=80 not over data: 80 is not a multiple" in \
        plan.format_plan(r)


def test_auto_pipelines_only_where_the_batch_splits_over_data():
    """111M on 64 devices: 2 stages would leave data=32, which 120 sequences do not split
    over, so auto streams weights on data=8 x fsdp=8; 13B pipelines on stage=8,data=8."""
    mode, axes, why = sharding.choose_auto(get_config("111M"), 64, 80 * 10**9, 120, 2048)
    assert (mode, axes) == ("weight_streaming", {"data": 8, "fsdp": 8}), why
    mode, axes, why = sharding.choose_auto(get_config("13B"), 64, 80 * 10**9, 720, 2048)
    assert (mode, axes) == ("layer_pipelined", {"stage": 8, "data": 8}), why
