"""Fused training on a multi-device mesh (#21 item 3): the member axis beside a run's own
data/fsdp mesh. Each member equals the same run trained alone on that mesh (emulated CPU
devices, tests/conftest.py), the layouts put `member` in front of the run's own specs, and
members on different meshes are refused with one line naming the key (layer_pipelined groups:
tests/fused/test_fused_pipeline.py)."""
import json
import math

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from cgpt.errors import TrainError
from cgpt.sharding.axes import member_groups
from cgpt.sharding.members import Members
from cgpt.train import fused
from cgpt.train.fused_loop import train_fused
from cgpt.train.loop import train
from cgpt.train.resolve import resolve
from tests.fused.test_fused import _assert_close_params, _assert_same_run, _params, _run, \
    kill_fused_at

KW = dict(steps=6, eval_every=3, ckpt_every=3)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _members(run, members, spread):
    r = resolve(run, jax.devices())
    abstract = jax.eval_shape(lambda: fused.init_member(r.cfg, r.recipe, 0))
    return Members(r.mode, r.mesh, r.cfg, members, jax.devices(), abstract, spread=spread,
                   batch=r.batch_size, micro=r.micro_batch), r


def test_member_axis_layouts(corpus, cache):
    """`member` is the outermost mesh axis and the first dim of every stacked array; the run's
    own spec follows it unchanged. No training: layouts only."""
    assert [member_groups(m, n, 8, True) for m, n in ((2, 2), (4, 2), (3, 2), (8, 4))] == \
        [2, 4, 3, 2]
    assert member_groups(4, 2, 8, False) == 1 and member_groups(6, 1, 4, True) == 3
    ws, _ = _members(_run(corpus, cache, mode="weight_streaming", mesh="data=2,fsdp=2", **KW),
                     4, spread=True)
    assert dict(ws.mesh.shape) == {"member": 2, "data": 2, "fsdp": 2} and ws.groups == 2
    solo = ws.strategy.param_shardings()
    kernel = ws.params["h"]["mlp"]["c_fc"]["kernel"].spec
    assert kernel == P("member", *solo["h"]["mlp"]["c_fc"]["kernel"].spec)
    assert "fsdp" in jax.tree.leaves(tuple(kernel))  # the weights stay sharded inside a group
    assert ws.batch_sharding().spec == P("member", None, ("data", "fsdp"))
    assert ws.eval_sharding().spec == P(("data", "fsdp"))  # every group reads the eval batch
    counts = [s.spec for s in jax.tree.leaves(ws.opt_state) if len(s.spec) == 1]
    assert counts and all(s == P("member") for s in counts)  # Adam's count: one per member
    d = ws.describe()
    assert d["mesh"] == {"data": 2, "fsdp": 2} and d["devices"] == 4
    assert d["member_mesh"] == {"member": 2, "data": 2, "fsdp": 2} and d["member_devices"] == 8
    dp, _ = _members(_run(corpus, cache, mode="data_parallel", mesh="data=2", **KW), 2,
                     spread=False)
    assert dict(dp.mesh.shape) == {"member": 1, "data": 2}  # replicated over the run's mesh
    assert "member=1 x data=2 on 2 device(s)" in dp.line()


@pytest.mark.slow  # two init compiles on 8 devices (~25 s under load)
def test_member_init_is_the_solo_runs(corpus, cache):
    """A member's init is the solo run's, bit for bit, in the run's layout; stacked in place."""
    from cgpt.train import optim, setup
    from cgpt.train.step import make_step

    ws, r = _members(_run(corpus, cache, mode="weight_streaming", mesh="data=2,fsdp=2", **KW),
                     4, spread=True)
    kernel = ws.params["h"]["mlp"]["c_fc"]["kernel"].spec
    p, o = fused.init_member(r.cfg, r.recipe, 7, ws.member_state)
    alone = setup.place(r, jax.devices())
    opt = optim.make_optimizer(r.recipe, r.cfg)
    _, sp, so = alone.compile_step(make_step(r.cfg, opt, alone.loss), opt, 7, r)
    same = jax.tree.map(lambda a, b: bool((np.asarray(a) == np.asarray(b)).all()),
                        (p, o), (sp, so))
    assert all(jax.tree.leaves(same))
    sp_, _ = ws.stack([p] * 4, [o] * 4)
    k = sp_["h"]["mlp"]["c_fc"]["kernel"]
    assert k.sharding.spec == kernel
    assert (np.asarray(k[3]) == np.asarray(sp["h"]["mlp"]["c_fc"]["kernel"])).all()


@pytest.mark.slow  # ~30 s quiet; test_fused.py's one-device equality and the layout tests run by default
def test_fused_on_data_mesh_equals_solo(corpus, cache, tmp_path):
    """2 members on 4 devices (member=2 x data=2): each equals its run alone on data=2."""
    lean = dict(KW, eval_every=6, ckpt_every=6)  # one evaluation and checkpoint: the last
    runs = [_run(corpus, cache, mode="data_parallel", mesh="data=2", seed=0, **lean),
            _run(corpus, cache, mode="data_parallel", mesh="data=2", seed=1, data_seed=2,
                 peak_lr=1e-2, **lean)]
    outs = [tmp_path / "f0", tmp_path / "f1"]
    results = train_fused(runs, outs, progress=False, spread=True)
    assert results[0]["train_loss"] != results[1]["train_loss"]
    p = results[0]["placement"]
    assert p["member_mesh"] == {"member": 2, "data": 2} and p["mesh"] == {"data": 2}
    assert p["mode"] == "data_parallel" and p["member_devices"] == 4 and p["fused"] == 2
    for i, run in enumerate(runs):
        train(run, tmp_path / f"solo{i}", progress=False)
        _assert_same_run(outs[i], tmp_path / f"solo{i}")


@pytest.mark.slow  # ~2 solo + 2 fused programs; the data mesh is tested by default
def test_fused_on_fsdp_mesh_equals_solo_and_resumes(corpus, cache, tmp_path, monkeypatch):
    """weight_streaming on fsdp=2, members held on the run's 2 devices (member=1): equal to
    the runs alone; killed, the group resumes on its mesh; one member resumes alone."""
    from cgpt import rundir

    runs = [_run(corpus, cache, mode="weight_streaming", mesh="fsdp=2", seed=0, **KW),
            _run(corpus, cache, mode="weight_streaming", mesh="fsdp=2", seed=3, peak_lr=6e-3,
                 warmup_steps=2, **KW)]
    outs = [tmp_path / "f0", tmp_path / "f1"]
    results = train_fused(runs, outs, progress=False)
    assert results[0]["placement"]["member_mesh"] == {"member": 1, "fsdp": 2}
    assert results[0]["placement"]["weight_axes"] == ["fsdp"]
    for i, run in enumerate(runs):
        train(run, tmp_path / f"solo{i}", progress=False)
        _assert_same_run(outs[i], tmp_path / f"solo{i}")

    killed = [tmp_path / "k0", tmp_path / "k1"]
    kill_fused_at(runs, killed, 6, monkeypatch)
    again = train_fused(runs, killed, resume=True, progress=False)  # the group, on its mesh
    assert again[0]["resumed_from_step"] == 3
    logged = lambda d: [(r["step"], r["loss"], r.get("val_loss"))  # noqa: E731
                        for r in rundir.read_metrics(d / "metrics.jsonl")]
    for k, o in zip(killed, outs):
        assert logged(k) == logged(o)  # bit-identical: the same program from the same state
    (killed[1] / "summary.json").unlink()  # one member alone, from its fused checkpoint
    s = train(runs[1], killed[1], resume=True, from_step=3, progress=False)
    assert s["resumed_from_step"] == 3
    _assert_close_params(_params(killed[1]), _params(tmp_path / "solo1"))


@pytest.mark.parametrize("other, key", [(dict(mesh="data=4"), "train.mesh"),
                                        (dict(mode="weight_streaming"), "train.mode")])
def test_members_on_different_meshes_are_refused(corpus, cache, tmp_path, other, key):
    runs = [_run(corpus, cache, mode="data_parallel", mesh="data=2", **KW),
            _run(corpus, cache, **{**dict(mode="data_parallel", mesh="data=2"), **other},
                 seed=1, **KW)]
    with pytest.raises(TrainError, match=f"must share {key}: .*another group"):
        train_fused(runs, [tmp_path / "a", tmp_path / "b"], progress=False)
    assert not (tmp_path / "a").exists()


def test_dry_run_shows_the_member_axis(tmp_path, capsys, monkeypatch):
    """--dry-run: a sharded group's mesh with the member axis, on the job's devices."""
    from cgpt.commands import sweep as sw
    from tests.sweep.test_sweep import _spec

    spec = _spec(tmp_path, "m", {"model": ["tiny-17k"], "seed": [0, 1, 2, 3]},
                 base={"train": {"tokens": 4000, "mode": "weight_streaming", "mesh": "fsdp=2"}},
                 slurm={"gpus_per_node": 8})
    assert sw.main([str(spec), "--dry-run", "--no-fit"]) == 0
    out = capsys.readouterr().out
    assert "fused groups: 1 jobs for 4 runs" in out
    assert "placement: weight_streaming mesh member=4 x fsdp=2 on 8 of 8 device(s)" in out
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    local = _spec(tmp_path, "l", {"model": ["tiny-17k"], "seed": [0, 1]},
                  base={"train": {"tokens": 4000, "mode": "data_parallel", "mesh": "data=2"}})
    assert sw.main([str(local), "--dry-run", "--no-fit"]) == 0
    assert ("placement: data_parallel mesh member=1 x data=2 on 2 of 4 device(s) (every "
            "device holds its shard of every member)") in capsys.readouterr().out
    pipe = _spec(tmp_path, "p", {"model": ["tiny-17k"], "seed": [0, 1]},
                 base={"train": {"tokens": 4000, "mode": "layer_pipelined", "mesh": "stage=2"}})
    assert sw.main([str(pipe), "--dry-run", "--no-fit"]) == 0
    out = capsys.readouterr().out  # pipelined runs fuse too, the member axis beside `stage`
    assert "fused groups: 1 jobs for 2 runs" in out
    assert "placement: layer_pipelined mesh member=1 x stage=2 on 2 of 4 device(s)" in out


def _iota(dims: str, perm: str | None):
    shape = [int(x) for x in dims.split(",")]
    a = np.arange(math.prod(shape)).reshape(shape)
    return a.transpose([int(x) for x in perm.split(",")]) if perm else a


def _collective_groups(hlo: str) -> list[list[list[int]]]:
    """Every collective's device groups in a compiled HLO, as lists of device ids, from each
    form XLA prints: explicit ({{0,1},{2,3}}), iota ([2,2]<=[4], [2,4]<=[2,2,2]T(0,2,1)) and
    mesh axes (mesh['axis_0'=2,'axis_1'=4][, device_ids=(iota)] {'axis_1'})."""
    import re

    out = []
    for line in hlo.splitlines():
        if "replica_groups=" not in line:
            continue
        g = line[line.index("replica_groups=") + len("replica_groups="):]
        if g.startswith("{{"):
            out.append([[int(x) for x in grp.split(",") if x]
                        for grp in re.findall(r"\{([\d,]*)\}", g[1:g.index("}}") + 1])])
        elif g.startswith("["):
            shape, dims, perm = re.match(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?",
                                         g).groups()
            out.append(_iota(dims, perm).reshape([int(x) for x in shape.split(",")]).tolist())
        else:
            m = re.match(r"mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?"
                         r"\))? \{([^}]*)\}", g)
            assert m, f"an unknown replica_groups form: {g[:100]}"
            names_sizes = re.findall(r"'(\w+)'=(\d+)", m.group(1))
            sizes = [int(v) for _, v in names_sizes]
            ids = (_iota(m.group(2), m.group(3)) if m.group(2) else
                   np.arange(math.prod(sizes))).reshape(sizes)
            spans = set(re.findall(r"'(\w+)'", m.group(4)))
            inner = [i for i, (k, _) in enumerate(names_sizes) if k in spans]
            outer = [i for i in range(len(sizes)) if i not in inner]
            out.append(ids.transpose(outer + inner).reshape(
                -1, math.prod(sizes[i] for i in inner)).tolist())
    return out


@pytest.mark.slow  # one compile of an 8-device program (~30 s under load)
def test_member_groups_never_communicate(corpus, cache):
    """member=2 x data=2 x fsdp=2 on 8 devices: every collective of the compiled fused step
    stays inside one member group's 4 devices (each group runs the solo run's step)."""
    from cgpt.train import fused_loop

    run = _run(corpus, cache, mode="weight_streaming", mesh="data=2,fsdp=2", **KW)
    r = fused_loop.resolve_member(run, 2**33)
    compiled, _ = fused_loop._compiled(r, 2, spread=True)
    mesh = fused_loop.layout(r, 2, spread=True).mesh
    assert dict(mesh.shape) == {"member": 2, "data": 2, "fsdp": 2}
    groups = _collective_groups(compiled.as_text())
    assert len(groups) > 10  # gathers of the weights, gradient reductions
    for g in groups:  # devices 0-3 hold member group 0, 4-7 group 1
        assert all(len({d // 4 for d in grp}) == 1 for grp in g), g
    assert _collective_groups("x = all-reduce(y), replica_groups={{0,4}}") == [[[0, 4]]]
    assert _collective_groups("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}") == \
        [[[0, 4], [1, 5], [2, 6], [3, 7]]]  # what a member-spanning collective would read


def sweep_fused_and_alone(tmp_path, train: dict) -> tuple[dict, dict]:
    """Two seeds of tiny-17k with `train` swept fused and --no-fuse: ({run: summary}, the
    same unfused); both sweeps finished, the same two runs."""
    from cgpt.commands import sweep as sw
    from tests.sweep.test_sweep import _spec

    spec = _spec(tmp_path, "s", {"model": ["tiny-17k"], "seed": [0, 1]},
                 base={"train": {"tokens": 4000, **train}})
    assert sw.main([str(spec), "--out", str(tmp_path / "f")]) == 0
    assert sw.main([str(spec), "--out", str(tmp_path / "u"), "--no-fuse"]) == 0
    read = lambda d: {p.parent.name: json.loads(p.read_text())  # noqa: E731
                      for p in d.glob("*/summary.json")}
    fused_, alone = read(tmp_path / "f"), read(tmp_path / "u")
    assert sorted(fused_) == sorted(alone) and len(fused_) == 2
    return fused_, alone


@pytest.mark.slow  # two sweeps of 2 runs (~2 min under load)
def test_sweep_fuses_sharded_runs_as_unfused(tmp_path):
    """`cgpt sweep` fuses data_parallel runs on data=2 (the worker inherits the 8 emulated
    devices): one program, each run's summary as the same sweep's under --no-fuse."""
    fused_, alone = sweep_fused_and_alone(tmp_path, {"mode": "data_parallel", "mesh": "data=2"})
    for rid, s in fused_.items():
        assert s["placement"]["fused"] == 2 and s["placement"]["mesh"] == {"data": 2}
        assert s["placement"]["member_mesh"] == {"member": 1, "data": 2}  # CPU: not spread
        assert alone[rid]["placement"]["mesh"] == {"data": 2}
        assert abs(s["val_loss"] - alone[rid]["val_loss"]) <= 1e-6
        assert abs(s["train_loss"] - alone[rid]["train_loss"]) <= 1e-6


@pytest.mark.slow  # a fused group and one solo run on data=2 (~1.5 min under load)
def test_nonfinite_member_stops_alone_on_a_mesh(corpus, cache, tmp_path):
    """On member=2 x data=2 a diverging member is masked and fails alone; the other is its
    solo run."""
    from cgpt.rundir import FAILED_FILE

    lean = dict(KW, eval_every=6, ckpt_every=6)
    good = _run(corpus, cache, mode="data_parallel", mesh="data=2", seed=0, **lean)
    bad = _run(corpus, cache, mode="data_parallel", mesh="data=2", seed=1, peak_lr=1e9,
               warmup_steps=2, clip_norm=1e9, **lean)
    outs = [tmp_path / "good", tmp_path / "bad"]
    results = train_fused([good, bad], outs, progress=False, spread=True)
    assert isinstance(results[0], dict) and isinstance(results[1], TrainError)
    assert "training stopped" in str(results[1]) and (outs[1] / FAILED_FILE).exists()
    assert not (outs[1] / "summary.json").exists()
    train(good, tmp_path / "solo", progress=False)
    _assert_same_run(outs[0], tmp_path / "solo")
