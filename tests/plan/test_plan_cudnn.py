"""`plan --platform gpu` checks cuDNN flash attention's dtype, head-dim and partitioning rules
(cgpt.plan.cudnn, reproduced from JAX's own checks) before a GPU job starts."""
from types import SimpleNamespace

import pytest

from cgpt.config.data import DataConfig
from cgpt.config.model import get_config
from cgpt.config.run import RunConfig, TrainConfig
from cgpt.plan import cudnn, planning
from cgpt.sharding.rules import DATA_PARALLEL, with_rule


def test_shape_rules():
    cudnn.check_shapes("bfloat16", 16, 128)  # 1.3B
    cudnn.check_shapes("bfloat16", 32, 80)  # 2.7B
    cudnn.check_shapes("float16", 1, 256)
    with pytest.raises(ValueError, match="multiple of 8 and at most 256.*d_head=12.*"
                                         "model.attention=xla"):
        cudnn.check_shapes("bfloat16", 8, 12)
    with pytest.raises(ValueError, match="d_head=264"):
        cudnn.check_shapes("bfloat16", 8, 264)
    with pytest.raises(ValueError, match="at most 128.*d_head=256"):
        cudnn.check_shapes("bfloat16", 8, 256, max_head_dim=cudnn.HEAD_DIM_MAX_PRE_HOPPER)
    with pytest.raises(ValueError, match="bfloat16 or float16, got float32"):
        cudnn.check_shapes("float32", 12, 64)


def test_partitioning_rules():
    mesh = {"data": 4, "fsdp": 2, "stage": 1}
    assert cudnn.check_partitioning([("data", "fsdp"), (), ("stage",), ()], mesh) == \
        "batch over dataxfsdp, seq over -, heads over -, head_dim over -"  # stage=1 splits nothing
    assert "heads over fsdp" in cudnn.check_partitioning([("data",), (), ("fsdp",), ()], mesh)
    with pytest.raises(ValueError, match=r"split on seq over fsdp \(2 devices\).*only the "
                                         "batch and heads"):
        cudnn.check_partitioning([("data",), ("fsdp",), (), ()], mesh)
    with pytest.raises(ValueError, match=r"head_dim over data \(4 devices\)"):
        cudnn.check_partitioning([(), (), (), ("data",)], mesh)


def test_plan_applies_the_rules_of_the_strategy():
    cfg = get_config("cpu-870k")
    p = SimpleNamespace(micro_batch=2, replicas=4)
    mesh = SimpleNamespace(shape={"data": 4})
    ok = SimpleNamespace(mesh=mesh, rules=DATA_PARALLEL)
    assert planning._check_cudnn_placement(ok, p, cfg, 32).startswith("batch over data, seq over -")
    seq_rules = with_rule(with_rule(DATA_PARALLEL, "act_batch", ()), "act_seq", ("data",))
    seq_parallel = SimpleNamespace(mesh=mesh, rules=seq_rules)  # a sequence-parallel layout
    with pytest.raises(ValueError, match="split on seq over data"):
        planning._check_cudnn_placement(seq_parallel, p, cfg, 32)


def test_plan_refuses_a_head_dim_cudnn_cannot_run_before_compiling():
    cfg = get_config("cpu-870k", n_head=16)  # d_model 96 / 16 heads = head dim 6
    run = RunConfig(preset="cpu-870k", model=cfg, data=DataConfig(seq_len=32),
                    train=TrainConfig(batch_size=8, mode="data_parallel"))
    with pytest.raises(ValueError, match="d_head=6"):
        planning.plan_run(run, "80GB", devices=None, platform="gpu")  # before any compile
