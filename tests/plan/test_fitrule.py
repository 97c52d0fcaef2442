"""The fit's rule (`cgpt.sharding.fitrule.choose_step`) and its three callers: train's compiled
search (`cgpt.train.fit.search`), the cost model's replay (`cgpt.sharding.cost.predict_fit`)
and the analytic plan (`cgpt.plan.analytic`) pick the same step from the same memory and cost.
Arithmetic only: the compiled steps are stand-ins whose bytes are the analytic footprints."""
from types import SimpleNamespace

import pytest

from cgpt.config.data import DataConfig
from cgpt.config.model import get_config, recomputes_forward
from cgpt.config.run import RunConfig, TrainConfig
from cgpt.plan.analytic import footprint, plan_analytic
from cgpt.sharding import cost
from cgpt.sharding import fitrule
from cgpt.sharding.fitrule import choose_step
from cgpt.train import fit

H100 = cost.hardware_for("gpu", None)


def _fits(limits: dict):
    """fits(m, rung) for a memory whose largest micro-batch per rung is `limits[rung]`,
    recording the probes."""
    probes = []

    def fits(m, r):
        probes.append((m, r))
        return m <= limits[r]
    return fits, probes


def test_a_margin_inside_the_pool():
    """The allocator's pool is the device's memory less HEADROOM (a GPU run sets the pool to
    exactly that: `cgpt.config.backend.GPU_MEM_FRACTION`); a step may use all of it but
    POOL_MARGIN, never the whole pool."""
    from cgpt.config.backend import GPU_MEM_FRACTION

    assert GPU_MEM_FRACTION == pytest.approx(1 - fitrule.HEADROOM)
    assert fitrule.pool_memory(80 * 10**9) == 72 * 10**9
    assert fitrule.usable_memory(80 * 10**9) == 68_400_000_000  # 72 GB less 5%
    assert 0 < fitrule.POOL_MARGIN < fitrule.HEADROOM
    c = fit.Choice(1, 1, "none", {"total": 69 * 10**9}, 80 * 10**9)
    assert not c.fits  # below the pool (72 GB) but inside its margin
    for n in (1, 999, 10**6, 68_400_000_000):
        m = fitrule.memory_for(n)
        assert fitrule.usable_memory(m) >= n > fitrule.usable_memory(m - 1)


def test_rule_on_a_table():
    micros = [12, 6, 4, 3, 2, 1]
    rungs = ["none", "save_attn", "full"]
    fits, _ = _fits({"none": 12, "save_attn": 12, "full": 12})
    assert choose_step(micros, rungs, fits) == (12, "none")
    fits, _ = _fits({"none": 4, "save_attn": 6, "full": 12})  # full batch only on the top
    assert choose_step(micros, rungs, fits) == (12, "full")  # no cost: memory only
    slow_full = lambda m, r: 4 / 3 if r == "full" else 1.0  # noqa: E731 - the recompute
    slow_small = lambda m, r: 1.0 if r == "full" else 2.0  # noqa: E731 - e.g. re-gathers
    assert choose_step(micros, rungs, fits, slow_full) == (6, "save_attn")
    assert choose_step(micros, rungs, fits, slow_small) == (12, "full")
    fits, _ = _fits({"none": 2, "save_attn": 3, "full": 4})  # accumulating
    assert choose_step(micros, rungs, fits) == (4, "full")
    assert choose_step(micros, rungs, fits, slow_full) == (3, "save_attn")
    fits, _ = _fits({"none": 2, "save_attn": 4, "full": 6})  # a lower rung at the same m
    assert choose_step(micros, rungs, fits, slow_full) == (4, "save_attn")
    fits, _ = _fits({"none": 0, "save_attn": 0, "full": 0})
    assert choose_step(micros, rungs, fits) is None
    fits, _ = _fits({"full": 3})
    assert choose_step(micros, ["full"], fits, slow_full) == (3, "full")  # a rung as set
    fits, _ = _fits({"none": 5})
    assert choose_step([12], ["none"], fits) is None  # a micro-batch as set: only checked


def test_rule_bisects():
    """A compile per probe: log2 of the divisors, not one per divisor."""
    micros = sorted((d for d in range(1, 5041) if 5040 % d == 0), reverse=True)  # 60 divisors
    fits, probes = _fits({"save_dots": 7, "full": 14})
    assert choose_step(micros, ["save_dots", "full"], fits) == (14, "full")
    assert len(set(probes)) <= 2 + 1 + 6 + 1


def _run(model: str, batch: int, **train) -> RunConfig:
    return RunConfig(preset=model, model=get_config(model), data=DataConfig(seq_len=2048),
                     train=TrainConfig(batch_size=batch, **train))


# (model, batch, device memory, nodes, mode, the analytic plan's step today; bf16 activations)
CASES = [
    ("256M", 264, "56GB", 1, "auto", (33, "save_attn")),  # the full batch, matmuls kept
    ("590M", 264, "80GB", 1, "auto", (33, "save_attn")),
    ("1.3B", 64, "56GB", 1, "layer_pipelined", (64, "save_attn")),
    ("256M", 264, "80GB", 1, "auto", (33, "save_attn")),
    ("111M", 120, "16GB", 1, "auto", (15, "save_attn")),  # the full batch needs remat
    ("111M", 120, "80GB", 1, "auto", (15, "none")),  # the full batch fits without remat
    ("1.3B", 528, "80GB", 2, "auto", None),
    ("13B", 720, "80GB", 4, "auto", None),
    ("2.7B", 528, "40GB", 1, "weight_streaming", None),
]


@pytest.mark.parametrize("model,batch,memory,nodes,mode,today", CASES)
def test_three_callers_agree(model, batch, memory, nodes, mode, today):
    r = plan_analytic(_run(model, batch, mode=mode), memory, 8 * nodes, nodes)
    step = (r["micro_batch"], r["remat"])
    if today:
        assert step == today
    res = SimpleNamespace(cfg=get_config(model), mode=r["mode"], mesh=r["mesh"])
    from cgpt.config import backend

    cfg = backend.for_platform(res.cfg, "gpu")
    hw = cost.hardware_for("gpu", None, 8)
    ladder = backend.defaults("gpu").remat_ladder  # as the analytic plan and the fit climb it

    per = r["micro_batch"] * r["accum"]

    def need(m: int, rung: str) -> int:
        return footprint(cfg.replace(remat=rung), r["mode"], r["mesh"], nodes, m, 2048, per // m)

    def seconds(m: int, rung) -> float:
        return cost.step_cost(cfg, r["mode"], r["mesh"], batch, 2048, m,
                              recomputes_forward(rung), hw).total_s

    replay = cost.predict_fit(r["mode"], r["mesh"], batch, r["device_memory"],
                              lambda mode, axes, m, on, accum: need(m, on), None, None, seconds)
    assert replay == step

    def compile_fn(m: int, rung: str):  # the footprint as temporaries: a real step's
        total = need(m, rung)            # arguments (state, batch) are the same for every m
        return SimpleNamespace(memory_analysis=lambda: SimpleNamespace(
            argument_size_in_bytes=0, output_size_in_bytes=0, temp_size_in_bytes=total,
            alias_size_in_bytes=0))

    choice, _ = fit.search(fit.divisors_desc(per), per, compile_fn, r["device_memory"],
                           ladder=ladder, models=fit.Models(seconds=seconds))
    assert (choice.micro_batch, choice.remat) == step and choice.fits == r["fits"]
