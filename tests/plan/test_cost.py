"""auto's cost model (`cgpt.sharding.cost`): its terms, where it applies, and the published
presets' placements on one 8 x 80 GB GPU node. Arithmetic only (no compile), except the
pipeline micro-batch rule, checked against the strategy's own on an abstract mesh."""
import math

import pytest

from cgpt.config import backend
from cgpt.config.model import ModelConfig, get_config
from cgpt.sharding import auto, cost

H100 = cost.hardware_for("gpu", "NVIDIA H100 80GB HBM3")
GB80 = 80 * 10**9
PUBLISHED_BATCH = {"111M": 120, "256M": 264, "590M": 264, "1.3B": 528}


def _gpu(name: str) -> ModelConfig:
    return backend.for_platform(get_config(name), "gpu", compile_on="cpu")


def test_hardware_only_for_gpus():
    """CPU, TPU and ROCm keep the memory-only first fit; GPU kinds map to their rows and an
    unknown kind is costed as an H100 SXM that says it was assumed."""
    assert cost.hardware_for("cpu") is None and cost.hardware_for("tpu") is None
    assert cost.hardware_for("rocm", "MI300X") is None
    assert H100.name == "H100 SXM" and H100.peak_flops == 989.5e12
    assert cost.hardware_for("gpu", "NVIDIA H100 PCIe").name == "H100 PCIe"
    assert cost.hardware_for("gpu", "NVIDIA A100-SXM4-80GB").peak_flops == 312e12
    guess = cost.hardware_for("gpu", "cpu")
    assert "assumed" in guess.name and guess.peak_flops == H100.peak_flops
    assert cost.hardware_for("gpu", None, gpus_per_node=4).gpus_per_node == 4


def test_fit_headroom_is_the_fits():
    from cgpt.train.fit import HEADROOM

    assert cost.FIT_HEADROOM == HEADROOM


def test_pipeline_micro_batches_match_the_strategy():
    from jax.sharding import AbstractMesh

    from cgpt.sharding import strategies

    cfg = ModelConfig(n_layer=8, d_model=64, n_head=2, vocab_size=256, n_ctx=32)
    for stages, data in ((2, 4), (4, 2), (8, 1)):
        mesh = AbstractMesh((stages, data), ("stage", "data"))
        for rows, configured in ((48, None), (66, None), (7, None), (48, 5), (528, None)):
            s = strategies.strategy_on(mesh, "layer_pipelined", cfg, rows * data,
                                       micro_batches=configured)
            assert cost.pipeline_micro_batches(rows, stages, configured) == \
                s.micro_batches_for(rows * data), (stages, rows, configured)


def test_terms():
    """compute = FLOPs / (devices x peak); remat adds a third of the layers' FLOPs; the
    bubble stretches the layers by (S-1)/M; a group across nodes runs at network speed."""
    cfg = _gpu("1.3B")
    dp = cost.step_cost(cfg, "data_parallel", {"data": 8}, 528, 2048, 66, False, H100)
    from cgpt.config import flops

    assert dp.compute_s == pytest.approx(
        flops.train_flops_per_token(cfg, 2048) * 528 * 2048 / (8 * 989.5e12))
    assert dp.remat_s == 0 and dp.bubble_s == 0 and dp.bubble_fraction is None
    on = cost.step_cost(cfg, "data_parallel", {"data": 8}, 528, 2048, 66, True, H100)
    layers = flops.train_flops_per_token(cfg, 2048) - 6 * cfg.vocab_size * cfg.d_model
    assert on.remat_s == pytest.approx(layers / 3 * 528 * 2048 / (8 * 989.5e12))
    assert 0.25 < on.remat_s / on.compute_s < 1 / 3
    # gradients all-reduced once per accumulation step, ring 2(n-1)/n over NVLink: the
    # layers' inside the backward (hidden by its compute), the embeddings' after it exposed
    # (the tied one twice)
    wte = cfg.vocab_size * cfg.d_model
    blocks = cfg.num_params(embedding=False) - 2 * cfg.d_model
    assert dp.comm_s == pytest.approx(
        4 * (cfg.num_params() - blocks + wte) * 2 * 7 / 8 / 450e9)
    assert sum(t.bytes for t in dp.traffic) == 4 * (cfg.num_params() + wte)
    lp = cost.step_cost(cfg, "layer_pipelined", {"stage": 8}, 528, 2048, 48, False, H100)
    # the 12.7%: 48 one-sequence micro-batches on 8 stages
    assert lp.micro_batches == 48 and lp.bubble_fraction == pytest.approx(7 / 55)
    assert lp.bubble_s == pytest.approx(layers * 528 * 2048 / (8 * 989.5e12) * 7 / 48)
    two = cost.step_cost(cfg, "data_parallel", {"data": 16}, 528, 2048, 33, False, H100)
    assert two.comm_s / dp.comm_s == pytest.approx(450 / 50 * (15 / 16) / (7 / 8))
    # the node-aware mesh (cgpt.sharding.nodes): data takes the node count, stage stays inside
    assert cost.crosses_nodes({"stage": 2, "data": 8}, ("data",), 8) is True
    assert cost.crosses_nodes({"stage": 2, "data": 8}, ("stage",), 8) is False
    assert cost.crosses_nodes({"stage": 16, "data": 2}, ("stage",), 8) is True
    assert cost.crosses_nodes({"data": 8}, ("data",), 8) is False


def test_traffic_counts_what_the_step_moves():
    """Weight streaming gathers each layer's weights 2x per accumulation step (3x with
    remat), in the compute dtype (bf16 here), and reduces the gradients once in f32; a pipeline moves one activation per tick each
    way. (Against the compiled tiny-956k step on 4 devices, accum 2: data-parallel
    all-reduce 7.99 MB compiled vs 8.04 MB here; weight-streaming all-gather 14.7 vs 15.3 MB,
    gradient reduce 7.60 vs 7.65 MB.)"""
    cfg = _gpu("111M")
    P = cfg.num_params()
    ws = cost.traffic(cfg, "weight_streaming", {"data": 8}, 120, 2048, 5, True)
    assert [t.kind for t in ws] == ["all-gather", "reduce-scatter"]
    assert ws[0].bytes == 3 * 3 * 2 * P and ws[1].bytes == 3 * 4 * P and ws[0].overlapped
    lp = cost.traffic(cfg, "layer_pipelined", {"stage": 2, "data": 4}, 120, 2048, 30, False)
    hop = lp[0]
    assert hop.kind == "permute" and not hop.overlapped
    assert hop.bytes == 2 * 1 * (10 + 1) * 3 * 2048 * cfg.d_model * 4  # M=10 of 3 rows, f32


def test_cpu_and_no_hardware_keep_first_fit():
    """Without hardware (CPU, TPU) choose_auto is today's rule exactly."""
    cfg = ModelConfig(n_layer=4, d_model=64, n_head=2, vocab_size=256, n_ctx=32)
    assert auto.choose_auto(cfg, 8, GB80, 16, 32)[:2] == ("layer_pipelined",
                                                          {"stage": 4, "data": 2})
    for name, batch in PUBLISHED_BATCH.items():
        mode, axes, _ = auto.choose_auto(_gpu(name), 8, GB80, batch, 2048)
        assert mode == "layer_pipelined", name  # what README's table showed before


@pytest.mark.parametrize("name", ["111M", "256M", "590M"])
def test_one_node_small_presets_do_not_pipeline(name):
    """On one 8 x 80 GB H100 node, 111M-590M run data-parallel or FSDP: no pipeline with a
    bubble over 5% where either fits."""
    ranking: list = []
    mode, axes, why = auto.choose_auto(_gpu(name), 8, GB80, PUBLISHED_BATCH[name], 2048,
                                       hardware=H100, ranking=ranking)
    assert mode in ("data_parallel", "weight_streaming"), why
    assert "fastest by the cost model on H100 SXM" in why
    assert ranking[0].mode == mode and ranking[0].total_s == min(c.total_s for c in ranking
                                                                if c.fits)


def test_one_node_1p3b_trades_remat_for_a_smaller_micro_batch():
    """1.3B: FSDP's largest micro-batch needs full remat (+31% FLOPs); the fit on a GPU (and
    the cost model replaying it) takes a smaller micro-batch without it where that is faster,
    so no 13.7%-bubble pipeline is chosen on one node."""
    cfg = _gpu("1.3B")
    ranking: list = []
    mode, axes, why = auto.choose_auto(cfg, 8, GB80, 528, 2048, hardware=H100, ranking=ranking)
    assert mode in ("data_parallel", "weight_streaming"), why
    best = ranking[0]
    assert not best.remat and best.micro_batch < 66
    pipe = next(c for c in ranking if c.mode == "layer_pipelined" and c.axes == {"stage": 8})
    assert pipe.bubble_fraction > 0.05 and pipe.total_s > best.total_s
    need = lambda *a: auto.footprint(cfg, 8, 2048, *a)  # noqa: E731
    cheap = cost.cheapest(cfg, best.mode, best.axes, 528, 2048, GB80, H100, need)
    assert cheap.total_s == pytest.approx(best.total_s)


@pytest.mark.parametrize("name", ["111M", "256M", "590M", "1.3B"])
def test_one_node_no_pipeline_with_a_bubble_over_5_percent(name):
    """The issue's target, on the analytic plan `cgpt plan --no-compile` prints."""
    from cgpt.config.data import DataConfig
    from cgpt.config.model import get_config
    from cgpt.config.run import RunConfig, TrainConfig
    from cgpt.plan.analytic import plan_analytic

    run = RunConfig(preset=name, model=get_config(name), data=DataConfig(seq_len=2048),
                    train=TrainConfig(batch_size=PUBLISHED_BATCH[name], mode="auto"))
    r = plan_analytic(run, "80GB", 8, 1)
    assert r["fits"] and (r["bubble_fraction"] or 0) <= 0.05, (r["mode"], r["mesh"])


def test_activations_at_the_compute_dtype():
    """One activation size (`auto.activation_itemsize`): a GPU's bf16 step holds half of the
    f32 step's activations; state and logits (f32 on every platform) do not change."""
    gpu, f32 = _gpu("256M"), _gpu("256M").replace(compute_dtype="float32")
    assert (auto.activation_itemsize(gpu), auto.activation_itemsize(f32)) == (2, 4)
    assert auto.activation_itemsize(get_config("256M")) == 4  # unresolved ("auto"): f32
    for remat in ("none", "full"):
        a, b = (auto.activation_bytes(c.replace(remat=remat), gpu.n_layer, 11, 2048)
                for c in (gpu, f32))
        assert 2 * a == b
        ws = [auto.weight_streaming_bytes_per_device(c.replace(remat=remat), 8, 11, 2048)
              for c in (gpu, f32)]
        assert ws[1] - ws[0] == a
        assert auto.footprint(gpu, 8, 2048, "weight_streaming", {"data": 8}, 11, remat) == ws[0]


def test_ties_keep_todays_order():
    cfg = ModelConfig(n_layer=4, d_model=64, n_head=2, vocab_size=256, n_ctx=32)
    cands = [("data_parallel", {"data": 8}, 2), ("data_parallel", {"data": 8}, 1),
             ("data_parallel", {"data": 8}, GB80 + 1)]  # the last does not fit: ranked last
    ranked = cost.rank(cfg, cands, 16, 32, GB80, H100, lambda *a: 1)
    assert [c.need for c in ranked] == [2, 1, GB80 + 1] and ranked[0].total_s == ranked[1].total_s
    assert [c.fits for c in ranked] == [True, True, False]


def test_nothing_fits_is_still_an_error():
    cfg = _gpu("13B")
    with pytest.raises(ValueError, match="nothing fits"):
        auto.choose_auto(cfg, 8, 10 * 10**9, 720, 2048, hardware=H100)


def test_step_cost_dict_is_plan_json():
    c = cost.step_cost(_gpu("111M"), "layer_pipelined", {"stage": 2, "data": 4}, 120, 2048, 30,
                       False, H100)
    d = c.to_dict()
    assert math.isclose(d["total_s"], d["compute_s"] + d["remat_s"] + d["bubble_s"] + d["comm_s"])
    assert d["bubble_fraction"] == pytest.approx(1 / 11) and d["traffic"][0]["kind"] == "permute"


def test_resolve_costs_on_gpus_only():
    """`train`'s resolve: a GPU run's `auto` is costed (an unknown kind as an H100), a CPU
    run's is first-fit exactly as before."""
    from cgpt.config.data import DataConfig
    from cgpt.config.run import RunConfig, TrainConfig
    from cgpt.train.resolve import resolve

    run = RunConfig(preset="111M", model=get_config("111M"), data=DataConfig(seq_len=2048),
                    train=TrainConfig(mode="auto"))
    gpu = resolve(run, 8, platform="gpu", device_memory=GB80)
    assert (gpu.mode, gpu.mesh) == ("weight_streaming", {"data": 8}), gpu.auto_reason
    assert "H100 SXM (assumed" in gpu.auto_reason
    cpu = resolve(run, 8, platform="cpu", device_memory=GB80)
    assert (cpu.mode, cpu.mesh) == ("layer_pipelined", {"stage": 2, "data": 4})
    assert "cost model" not in cpu.auto_reason
