"""Fused layer_pipelined groups (#21 item 3): the member axis beside the GPipe `stage` mesh.

On a CPU whose devices hold every member (member=1) the step loops over the members, each
the solo pipelined step (bit-identical to the run alone); with the members split over the
devices (member=2, as on accelerators) the pipeline's shard_map is vmapped over `member`.
Both equal the runs trained alone within 1e-6 in f32 on emulated CPU devices
(tests/conftest.py)."""
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import cgpt

from cgpt.errors import TrainError
from cgpt.model import gpt as model
from cgpt.sharding.members import Members
from cgpt.sharding.mesh import build_mesh
from cgpt.sharding.strategies import strategy_on
from cgpt import rundir
from cgpt.train import fused
from cgpt.rundir import FAILED_FILE
from cgpt.train.fused_loop import train_fused
from cgpt.train.loop import train
from tests.fused.test_fused import _assert_close_params, _assert_same_run, _params, _run, \
    kill_fused_at

KW = dict(steps=6, eval_every=3, ckpt_every=3)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _cfg():
    from cgpt.config.model import get_config

    return get_config("tiny-17k").replace(compute_dtype="float32", vocab_size=512)


def _lay(axes, members, spread, micro=8, micro_batches=None):
    cfg = _cfg()
    abstract = jax.eval_shape(lambda: model.init_params(cfg, 0))  # optimizer state: unused
    return Members("layer_pipelined", axes, cfg, members, jax.devices(), (abstract, abstract),
                   spread=spread, batch=8, micro=micro, micro_batches=micro_batches), cfg


def test_pipelined_member_layouts():
    """`member` in front of the run's `stage`/`data` specs; a CPU mesh holding every member
    loops over them (the solo loss), a split member axis vmaps (spmd_axis_name='member')."""
    held, cfg = _lay({"stage": 2}, 2, spread=False)
    assert dict(held.mesh.shape) == {"member": 1, "stage": 2}
    assert held.loop and held.spmd_axis_name is None and held.loss is held.strategy.loss
    assert fused.members_per_pass(held.member_sharding(), held.loop) == 1
    solo = held.strategy.param_shardings()
    kernel = held.params["h"]["mlp"]["c_fc"]["kernel"].spec
    assert kernel == P("member", *solo["h"]["mlp"]["c_fc"]["kernel"].spec)
    assert kernel[1] == "stage"  # each stage holds its layers of every member
    assert held.describe()["bubble_fraction"] == pytest.approx(1 / 9)  # M=8 micro-batches
    assert "member=1 x stage=2 on 2 device(s)" in held.line()

    split, _ = _lay({"stage": 2, "data": 2}, 4, spread=True, micro=4)
    assert dict(split.mesh.shape) == {"member": 2, "stage": 2, "data": 2}
    assert not split.loop and split.spmd_axis_name == "member"
    assert split.batch_sharding().spec == P("member", None, "data")
    assert fused.members_per_pass(split.member_sharding(), split.loop) == 0
    with pytest.raises(ValueError, match="train.micro_batches=3 must divide"):
        _lay({"stage": 2}, 2, spread=False, micro_batches=3)


@pytest.mark.slow  # two compiles on 4 devices (~20 s under load); layouts run by default
@pytest.mark.parametrize("spread", [True, False])
def test_vmapped_pipeline_equals_solo(spread, monkeypatch):
    """The vmapped GPipe loss and gradient on member=2 x stage=2 (4 devices; spread) or on
    member=1 x stage=2 (an accelerator holding every member: vmapped, not looped) are each
    member's solo loss and gradient on stage=2."""
    if not spread:
        import cgpt.sharding.members as members_mod

        monkeypatch.setattr(members_mod, "platform_of", lambda d: "gpu")
    lay, cfg = _lay({"stage": 2}, 2, spread=spread)
    assert lay.groups == (2 if spread else 1) and not lay.loop
    rng = np.random.default_rng(0)  # random params of the model's shapes: no init compile
    shapes = jax.eval_shape(lambda: model.init_params(cfg, 0))
    ps = [jax.tree_util.tree_map_with_path(lambda path, x: (rng.normal(0, 0.1, x.shape) + (
        "scale" in jax.tree_util.keystr(path))).astype(np.float32), shapes)  # LN scales ~1
          for _ in (0, 1)]
    tokens = rng.integers(0, 512, (8, 17)).astype(np.int32)
    stacked = jax.device_put(jax.tree.map(lambda *x: np.stack(x), *ps), lay.params)
    fn = jax.value_and_grad(lambda p, t: lay.loss(p, t, cfg))
    loss, grad = jax.jit(fused._over_members(fn, "member", 0, in_axes=(0, None)))(
        stacked, jax.device_put(tokens, lay.eval_sharding()))
    solo = strategy_on(build_mesh({"stage": 2}, jax.devices()[:2]), "layer_pipelined", cfg, 8,
                       8)
    solo_fn = jax.jit(jax.value_and_grad(lambda p, t: solo.loss(p, t, cfg)))
    for i, p in enumerate(ps):
        sl, sg = solo_fn(jax.device_put(p, solo.param_shardings()),
                         jax.device_put(tokens, solo.batch_sharding(2)))
        assert abs(float(loss[i]) - float(sl)) <= 1e-6
        diff = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a[i]) - np.asarray(b)).max()),
                            grad, sg)
        assert max(jax.tree.leaves(diff)) <= 1e-6, diff
    assert float(loss[0]) != float(loss[1])  # really two members


@pytest.mark.slow  # 2 fused + 3 solo pipelined runs (~2.5 min under load)
def test_fused_pipelined_equals_solo_and_resumes(corpus, cache, tmp_path, monkeypatch):
    """member=1 x stage=2 (the CPU loop): each member logs exactly what its run alone logs;
    killed mid-save, the group resumes bit-identically; one member resumes alone."""
    runs = [_run(corpus, cache, mode="layer_pipelined", mesh="stage=2", seed=0, **KW),
            _run(corpus, cache, mode="layer_pipelined", mesh="stage=2", seed=1, data_seed=2,
                 peak_lr=1e-2, warmup_steps=2, **KW)]
    outs = [tmp_path / "f0", tmp_path / "f1"]
    results = train_fused(runs, outs, progress=False)
    p = results[0]["placement"]
    assert p["member_mesh"] == {"member": 1, "stage": 2} and p["mesh"] == {"stage": 2}
    assert p["mode"] == "layer_pipelined" and p["fused"] == 2 and p["bubble_fraction"] > 0
    logged = lambda d: [(r["step"], r["loss"], r["grad_norm"], r.get("val_loss"))  # noqa: E731
                        for r in rundir.read_metrics(d / "metrics.jsonl")]
    for i, run in enumerate(runs):
        train(run, tmp_path / f"solo{i}", progress=False)
        _assert_same_run(outs[i], tmp_path / f"solo{i}")
        assert logged(outs[i]) == logged(tmp_path / f"solo{i}")  # the solo step's program

    killed = [tmp_path / "k0", tmp_path / "k1"]
    kill_fused_at(runs, killed, 6, monkeypatch)
    again = train_fused(runs, killed, resume=True, progress=False)
    assert again[0]["resumed_from_step"] == 3
    for k, o in zip(killed, outs):
        assert logged(k) == logged(o)
    (killed[1] / "summary.json").unlink()  # one member alone, from its fused checkpoint
    s = train(runs[1], killed[1], resume=True, from_step=3, progress=False)
    assert s["resumed_from_step"] == 3
    _assert_close_params(_params(killed[1]), _params(tmp_path / "solo1"))
    assert cgpt.load(outs[0]).config.n_layer == 2  # a member directory is an ordinary run


@pytest.mark.slow  # a vmapped group on 8 devices and one solo run (~1.5 min under load)
def test_vmapped_pipelined_group_equals_solo_and_faults_stay_per_member(corpus, cache,
                                                                         tmp_path):
    """member=2 x stage=2 x data=2 (the members split over the devices, the pipeline vmapped):
    a diverging member fails alone; the other equals its run alone on stage=2 x data=2."""
    lean = dict(KW, eval_every=6, ckpt_every=6)
    mesh = dict(mode="layer_pipelined", mesh="stage=2,data=2")
    good = _run(corpus, cache, seed=0, **mesh, **lean)
    bad = _run(corpus, cache, seed=1, peak_lr=1e9, warmup_steps=2, clip_norm=1e9, **mesh,
               **lean)
    outs = [tmp_path / "good", tmp_path / "bad"]
    results = train_fused([good, bad], outs, progress=False, spread=True)
    assert isinstance(results[0], dict) and isinstance(results[1], TrainError)
    assert "training stopped" in str(results[1]) and (outs[1] / FAILED_FILE).exists()
    assert not (outs[1] / "summary.json").exists()
    assert results[0]["placement"]["member_mesh"] == {"member": 2, "stage": 2, "data": 2}
    train(good, tmp_path / "solo", progress=False)
    _assert_same_run(outs[0], tmp_path / "solo")


@pytest.mark.slow  # two sweeps of 2 pipelined runs (~2.5 min under load)
def test_sweep_fuses_pipelined_runs_as_unfused(tmp_path):
    """`cgpt sweep` fuses layer_pipelined runs on stage=2 into one job (the worker inherits
    the 8 emulated devices): each run's summary as the same sweep's under --no-fuse."""
    from tests.fused.test_fused_mesh import sweep_fused_and_alone

    fused_, alone = sweep_fused_and_alone(tmp_path, {"mode": "layer_pipelined",
                                                     "mesh": "stage=2"})
    for rid, s in fused_.items():
        assert s["placement"]["fused"] == 2 and s["placement"]["mode"] == "layer_pipelined"
        assert s["placement"]["member_mesh"] == {"member": 1, "stage": 2}
        assert "fused" not in alone[rid]["placement"]
        assert s["val_loss"] == alone[rid]["val_loss"]  # the loop: the solo step's program
        assert s["train_loss"] == alone[rid]["train_loss"]


@pytest.mark.slow  # one compile of an 8-device program (~40 s under load)
def test_pipelined_member_groups_never_communicate(corpus, cache):
    """member=2 x stage=2 x data=2: every collective of the compiled fused step (the stage
    ppermutes, the psums over stage, the gradient all-reduces over data) stays inside one
    member group's 4 devices: each group runs its own pipeline."""
    import re

    from cgpt.train import fused_loop
    from tests.fused.test_fused_mesh import _collective_groups

    run = _run(corpus, cache, mode="layer_pipelined", mesh="stage=2,data=2", **KW)
    r = fused_loop.resolve_member(run, 2**33)
    compiled, _ = fused_loop._compiled(r, 2, spread=True)
    mesh = fused_loop.layout(r, 2, spread=True).mesh
    assert dict(mesh.shape) == {"member": 2, "stage": 2, "data": 2}
    group = {d.id: m for m in range(2) for d in mesh.devices[m].flat}
    hlo = compiled.as_text()
    pairs = [[int(a), int(b)] for line in hlo.splitlines() if "source_target_pairs=" in line
             for a, b in re.findall(r"\{(\d+),(\d+)\}", line.split("source_target_pairs=")[1])]
    assert pairs  # the stage-to-stage transfers
    assert all(group[a] == group[b] for a, b in pairs), pairs
    groups = _collective_groups(hlo)
    assert groups  # psums over stage, gradient reductions over data
    for g in groups:
        assert all(len({group[d] for d in grp}) == 1 for grp in g), g


def test_sweep_groups_pipelined_runs_by_mesh(tmp_path):
    """Pipelined runs of one shape are one group per mesh (stage=2 and stage=2,data=2 are two
    programs); no JAX: the grouping reads the configs."""
    from cgpt import sweep as sw
    from cgpt.sweep.groups import plan_groups
    from tests.sweep_helpers import make_spec

    spec = make_spec(tmp_path, "g", {"model": ["tiny-17k"], "seed": [0, 1, 2]},
                     base={"train": {"tokens": 4000, "mode": "layer_pipelined",
                                     "mesh": "stage=2"}})
    runs = sw.load_sweep(spec).runs
    assert [len(g) for g in plan_groups(runs)] == [3]
    other = sw.load_sweep(spec, ["train.mesh=stage=2,data=2"]).runs
    assert sorted(len(g) for g in plan_groups(runs[:2] + other[:2])) == [2, 2]
    assert len(plan_groups(runs, fuse=False)) == 3
