"""The GPU target's pieces that need no CUDA plugin: its descriptions and errors, the HLO
reader on the GPU compiler's forms (async and combined collectives, cuBLAS and cuDNN calls),
the per-mode compile options, and gradients reduced in f32 under bf16 compute."""
import argparse

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cgpt.config import backend
from cgpt.plan import hlo, target
from cgpt.plan.command import add_arguments, cmd_plan

# Lines in the H100 compiler's form (111M, shortened): an async reduce-scatter whose start
# holds (unreduced input, shard), a combined all-gather of a tuple, a combined all-reduce of
# two buffers, cuBLAS and cuDNN attention calls, inside a 10-trip layer loop.
GPU_HLO = """HloModule m
%body (p: (s32[], bf16[8,2048,768])) -> (s32[], bf16[8,2048,768]) {
  %x = bf16[2,2304,768]{2,1,0} parameter(0)
  %w = bf16[2,768,768]{2,1,0} parameter(1)
  %rs = ((f32[50304,768]{0,1}), f32[50304,96]{0,1}) reduce-scatter-start(%g), channel_id=2, replica_groups=mesh['axis_0'=1,'axis_1'=8] {'axis_1'}, dimensions={1}, to_apply=%add
  %rsd = f32[50304,96]{0,1} reduce-scatter-done(%rs)
  %ag = ((bf16[96]{0}, bf16[96,2304]{1,0}), (bf16[768]{0}, /*index=1*/bf16[768,2304]{1,0})) all-gather-start(%a, %b), channel_id=3, replica_groups=[1,8]<=[8], dimensions={0}
  %agd = (bf16[768]{0}, bf16[768,2304]{1,0}) all-gather-done(%ag)
  %mm = (f32[2,2304,768]{1,2,0}, s8[4194304]{0}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["2"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":["0"],"rhs_batch_dimensions":["0"]}}}
  %fa = (bf16[8,12,2048,64]{3,1,2,0}, f32[8,12,2048]{2,1,0}, u8[0]{0}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax", operand_layout_constraints={bf16[8,2048,12,64]{3,2,1,0}, bf16[8,2048,12,64]{3,2,1,0}, bf16[8,2048,12,64]{3,2,1,0}}, api_version=API_VERSION_STATUS_RETURNING
  ROOT %fb = (bf16[8,2048,12,64]{3,2,1,0}, bf16[8,2048,12,64]{3,2,1,0}) custom-call(%q, %k, %v, %o, %do), custom_call_target="__cudnn$fmhaSoftmaxBackward", operand_layout_constraints={bf16[8,2048,12,64]{3,2,1,0}, bf16[8,2048,12,64]{3,2,1,0}, bf16[8,2048,12,64]{3,2,1,0}}, api_version=API_VERSION_STATUS_RETURNING
}
ENTRY %main (a: f32[8,4]) -> f32[8,4] {
  %w = (s32[], bf16[8,2048,768]{2,1,0}) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"10"}}
  %ar = (f32[7084800]{0}, bf16[3072]{0}) all-reduce-start(%c, %d), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  ROOT %ard = (f32[7084800]{0}, bf16[3072]{0}) all-reduce-done(%ar)
}
"""


def test_hlo_reader_sizes_the_gpu_compilers_collectives_and_kernels():
    t = hlo.hlo_totals(GPU_HLO)
    # the async reduce-scatter: its unreduced input once (not x 8); the combined gather: the
    # sum of its gathered results (not the largest); the combined all-reduce: both buffers
    assert t["collective_bytes"] == {
        "reduce-scatter": 10 * 50304 * 768 * 4,
        "all-gather": 10 * (768 + 768 * 2304) * 2,
        "all-reduce": 7084800 * 4 + 3072 * 2}
    assert t["collective_bytes_by_dtype"] == {
        "reduce-scatter f32": 10 * 50304 * 768 * 4, "all-gather bf16": 10 * (768 + 768 * 2304) * 2,
        "all-reduce f32": 7084800 * 4, "all-reduce bf16": 3072 * 2}
    assert t["kernel_calls"] == {"__cublas$lt$matmul": 10, "__cudnn$fmhaSoftmax": 10,
                                 "__cudnn$fmhaSoftmaxBackward": 10}
    matmul = 2 * (2 * 2304 * 768) * 768  # batched [2, 2304, 768] x [2, 768, 768]
    attn = 4 * 8 * 12 * 2048 * 2048 * 64  # q k^T and p v, forward
    assert t["dot_flops"] == 10 * (matmul + attn + 2 * attn)


def test_type_tree_reads_nested_tuples():
    tree = hlo._type_tree("((bf16[96]{0}, f32[8,4]{1,0}), /*index=2*/bf16[768]{0})")
    assert tree == [[("bf16", (96,)), ("f32", (8, 4))], ("bf16", (768,))]


def test_compile_options_turn_off_the_pipelines_harmful_flag_only_there(monkeypatch):
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    backend.gpu_xla_flags(env, "gpu")
    off = backend.compile_options("layer_pipelined", "gpu", env)
    assert off == {"xla_gpu_enable_pipelined_all_gather": False}
    assert backend.compile_options("data_parallel", "gpu", env) == {}
    assert backend.compile_options("layer_pipelined", "cpu", env) == {}
    # a flag the user set is kept as set; CGPT_GPU_XLA_FLAGS=0 asks for XLA's defaults
    mine = {"XLA_FLAGS": "--xla_gpu_enable_pipelined_all_gather=true"}
    backend.gpu_xla_flags(mine, "gpu")
    assert backend.compile_options("layer_pipelined", "gpu", mine) == {}
    assert backend.compile_options("layer_pipelined", "gpu", {"CGPT_GPU_XLA_FLAGS": "0"}) == {}


def test_target_descriptions_and_their_errors(monkeypatch):
    assert target.memory_bytes("h100") == 84942979072
    assert target.memory_bytes("h200") > 140 * 10**9 > target.memory_bytes("a100")
    for name in target.GPU_TARGETS:
        text = (target.TARGET_DIR / f"{name}.txtpb").read_text()
        assert 'platform_name: "CUDA"' in text and "device_description_str" in text
    with pytest.raises(ValueError, match=r"--target 'v100': no target description; use one of"):
        target.check("v100")
    monkeypatch.setattr(target, "plugin_available", lambda: False)
    with pytest.raises(ValueError, match=r"--target h100: JAX's CUDA plugin .* pip install -r "
                                         r"requirements-gpu.txt.*or give --target cpu"):
        target.check("h100")
    assert target.default_target() == "cpu"


def _plan_args(*argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_plan_refuses_a_gpu_target_for_another_platform(capsys):
    with pytest.raises(ValueError, match="--target h100 compiles for an NVIDIA GPU but "
                                         "--platform is tpu"):
        cmd_plan(_plan_args("--model", "tiny-240k", "--platform", "tpu", "--target", "h100"))


def test_cpu_fallback_says_it_overstates():
    """Compiled on CPU devices for a GPU: the plan names the compiler and the caveat."""
    from cgpt.plan.planning import plan
    r = plan("tiny-240k", "data_parallel", "data=2", 2, "80GB", batch=4, seq_len=64,
                  compile_devices=jax.devices("cpu")[:2])
    assert r["compiled_for"] == "cpu" and "overstates a GPU's memory" in r["caveat"]
    assert "kernel_calls" in r and "collective_bytes_by_dtype" in r


def test_embedding_lookup_scatters_its_gradient_in_the_tables_dtype():
    """The bf16 gather's gradient is an f32 scatter-add: repeated ids (1 twice, 3 three times)
    sum exactly, where the autodiff of a bf16 gather rounds each partial sum to bf16."""
    from cgpt.model.gpt import lookup
    table = jax.random.normal(jax.random.key(0), (50, 8), jnp.float32)
    ids = jnp.array([[1, 3, 3, 7], [0, 1, 49, 3]])
    g = jax.random.normal(jax.random.key(1), (2, 4, 8), jnp.float32)

    def loss(t, lk):
        return jnp.sum(lk(t).astype(jnp.float32) * g)

    ours = jax.grad(loss)(table, lambda t: lookup(t, ids, jnp.bfloat16))
    exact = jnp.zeros_like(table).at[ids].add(g.astype(jnp.bfloat16).astype(jnp.float32))
    assert ours.dtype == jnp.float32
    np.testing.assert_array_equal(ours, exact)
    bf16_autodiff = jax.grad(loss)(table, lambda t: t.astype(jnp.bfloat16)[ids])
    assert not np.array_equal(bf16_autodiff, exact)  # what the fix is for


def test_bf16_data_parallel_step_reduces_every_gradient_in_f32():
    """After SPMD partitioning (before the CPU compiler widens anything), the bf16 step's
    cross-replica reductions are all f32: embeddings, positions, LayerNorms and biases too."""
    from cgpt.config.data import DataConfig
    from cgpt.config.model import get_config
    from cgpt.config.run import RunConfig, TrainConfig
    from cgpt.plan.planning import compile_step
    from cgpt.train import fit

    captured = {}
    orig = fit.compile_step

    def keep_lowered(strategy, step, cfg, optimizer, plan):
        import jax.numpy as jnp  # noqa: F811
        from cgpt.model import gpt
        a_p = jax.eval_shape(lambda: gpt.init_params(cfg))
        a_o = jax.eval_shape(optimizer.init, a_p)
        params, opt = strategy.abstract_state(a_p, a_o)
        batch = jax.ShapeDtypeStruct((plan.accum, plan.micro_batch * plan.replicas,
                                      plan.seq_len + 1), jnp.int32,
                                     sharding=strategy.batch_sharding(3))
        # read before the step is compiled: a cached executable would dump nothing
        captured["hlo"] = hlo.partitioned_hlo(
            strategy.jit_step(step, a_p, a_o).lower(params, opt, batch))
        return orig(strategy, step, cfg, optimizer, plan)

    cfg = get_config("tiny-240k").replace(compute_dtype="bfloat16", remat="none")
    run = RunConfig(preset="tiny-240k", model=cfg, data=DataConfig(seq_len=64),
                    train=TrainConfig(batch_size=4, micro_batch=2, mode="data_parallel",
                                      mesh="data=2"))
    try:
        fit.compile_step = keep_lowered
        compile_step(run, jax.devices("cpu")[:2], 10**10, platform="cpu")
    finally:
        fit.compile_step = orig
    kinds = hlo.collective_dtypes(captured["hlo"])
    reduced = {dt for (kind, dt) in kinds if kind in ("all-reduce", "reduce-scatter")}
    assert reduced and reduced <= {"f32", "s32", "u32"}, kinds


class _Compiled:
    def __init__(self, total):
        self.total = total

    def memory_analysis(self):
        from types import SimpleNamespace
        return SimpleNamespace(argument_size_in_bytes=10, output_size_in_bytes=0,
                               temp_size_in_bytes=self.total - 10, alias_size_in_bytes=0)


@pytest.mark.parametrize("bias", [0.5, 1.0, 1.3, 2.5])
def test_ranked_search_compiles_at_most_three_and_picks_what_fits(bias):
    """A GPU's fit ranks the candidates by the memory model (off by `bias` from the compiler)
    and compiles at most 3; the step it takes fits, and where the model is only off by a
    constant it is the exhaustive search's step."""
    from cgpt.train import fit
    memory = fit.memory_for(1000)  # 1,000 bytes usable
    true = {(m, r): 40 + m * {"none": 100, "save_attn": 60, "full": 20}[r]
            for m in (16, 8, 4, 2, 1) for r in ("none", "save_attn", "full")}
    compiles = []

    def compile_fn(m, r):
        compiles.append((m, r))
        return _Compiled(true[(m, r)])

    ladder = ("none", "save_attn", "full")
    choice, _ = fit.search([16, 8, 4, 2, 1], 16, compile_fn, memory, ladder=ladder,
                           models=fit.Models(bytes=lambda m, r: true[(m, r)] / bias))
    assert len(compiles) <= fit.MAX_RANKED_COMPILES and choice.fits
    exhaustive, _ = fit.search([16, 8, 4, 2, 1], 16, lambda m, r: _Compiled(true[(m, r)]),
                               memory, ladder=ladder)
    assert (choice.micro_batch, choice.remat) == (exhaustive.micro_batch, exhaustive.remat)


def test_ranked_search_tries_the_rung_the_model_cannot_tell_apart():
    """A memory model that gives none and save_attn one figure (as cgpt's did) still finds
    save_attn between a none that does not fit and a full that does, within 3 compiles."""
    from cgpt.train import fit
    memory = fit.memory_for(1000)
    true = {(m, r): 40 + m * {"none": 100, "save_attn": 60, "full": 20}[r]
            for m in (16, 8) for r in ("none", "save_attn", "full")}
    model = {k: (40 + k[0] * (20 if k[1] == "full" else 50)) for k in true}
    compiled = []
    choice, _ = fit.search([16, 8], 16, lambda m, r: compiled.append((m, r)) or _Compiled(
        true[(m, r)]), memory, ladder=("none", "save_attn", "full"),
        models=fit.Models(bytes=lambda m, r: model[(m, r)]))
    assert (choice.micro_batch, choice.remat) == (16, "save_attn") and len(compiled) == 3


@pytest.mark.parametrize("line, groups", [
    ("replica_groups=[2,4]<=[8], dimensions={0}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups={{0,4},{1,5}}, use_global_device_ids=true", [[0, 4], [1, 5]]),
    ("source_target_pairs={{0,4},{1,5}}, metadata={}", [[0, 4], [1, 5]]),
    ("replica_groups=mesh['axis_0'=1,'axis_1'=4,'axis_2'=2], device_ids=([2,4]T(1,0)) "
     "{'axis_1'}, use", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}, use",
     [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=mesh['axis_0'=8,'axis_1'=1] {'axis_0'}, u", [list(range(8))]),
])
def test_replica_groups_in_every_form_xla_prints(line, groups):
    assert hlo.replica_groups(line) == groups


def test_collectives_across_hosts():
    """Bytes of the collectives whose groups span hosts (devices 0-3 on one, 4-7 on the other)."""
    text = GPU_HLO.replace("[1,8]<=[8]", "[2,4]<=[8]")  # the gather within each host
    t = hlo.hlo_totals(text, hosts=[0, 0, 0, 0, 1, 1, 1, 1])
    assert t["collective_bytes_across_hosts"] == {"reduce-scatter": 10 * 50304 * 768 * 4,
                                                  "all-reduce": 7084800 * 4 + 3072 * 2}
    assert hlo.hlo_totals(text)["collective_bytes_across_hosts"] is None
