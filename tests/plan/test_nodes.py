"""Meshes that know the node boundary (cgpt.sharding.nodes, mesh.build_mesh(nodes=...)),
`plan --nodes --gpus-per-node --no-compile`, and the cluster spec's derived resources.

The presets' placements are checked on the analytic plan (no compile, no devices); the hybrid
mesh on the 8 emulated CPU devices (one process: contiguous blocks stand for nodes) and with
real processes (jax.distributed + gloo) that report a host each (CGPT_HOST): 2 x 4 CPU
devices on 2 hosts, 4 x 2 placed cyclically on 2 hosts."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cgpt.config.model import get_config
from cgpt.sharding.axes import weight_streaming_axes
from cgpt.sharding.cost import axis_bytes, traffic
from cgpt.sharding.nodes import crossing_axes, split_axes, weight_axes

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "sweeps" / "cerebras_gpt.yaml"


def test_split_axes_gives_nodes_to_data_then_stage_then_fsdp():
    assert split_axes({"data": 16, "fsdp": 16}, 32) == {"data": (16, 1), "fsdp": (2, 8)}
    assert split_axes({"stage": 8, "data": 30}, 30) == {"stage": (1, 8), "data": (30, 1)}
    assert split_axes({"stage": 32, "data": 8}, 32) == {"stage": (4, 8), "data": (8, 1)}
    assert split_axes({"data": 4, "fsdp": 2}, 1) == {"data": (1, 4), "fsdp": (1, 2)}
    assert crossing_axes({"data": 8, "fsdp": 8}, 8) == ("data",)
    with pytest.raises(ValueError, match="cannot be laid over 2 nodes"):
        split_axes({"data": 3}, 2)


def test_weight_streaming_axes_keep_fsdp_inside_a_node():
    # a batch that splits over every device: HSDP, data = the nodes, fsdp = a node's devices
    # (13B's batch on 30 nodes x 8, 2.7B's on 2 x 8), the state sharded inside a node
    assert weight_streaming_axes(240, 720, None, 30)[0] == {"data": 30, "fsdp": 8}
    axes, why = weight_streaming_axes(16, 528, None, 2)
    assert axes == {"data": 2, "fsdp": 8} and why.startswith("HSDP")
    assert weight_axes("weight_streaming", axes, 2) == ("fsdp",)
    # a batch that splits over the nodes and part of each: data = nodes x k, fsdp inside
    assert weight_streaming_axes(16, 8, None, 2)[0] == {"data": 8, "fsdp": 2}
    assert split_axes({"data": 8, "fsdp": 2}, 2)["fsdp"] == (1, 2)
    # 720 does not split 32 ways: the old factoring, and the reason says fsdp crosses
    axes, why = weight_streaming_axes(256, 720, None, 32)
    assert axes == {"data": 16, "fsdp": 16} and "fsdp CROSSES NODES" in why
    # one node: unchanged
    assert weight_streaming_axes(64, 720) == weight_streaming_axes(64, 720, None, 1)
    # data crossing nodes is dropped from the weights; fsdp stays even where it must cross
    assert weight_axes("weight_streaming", {"data": 8, "fsdp": 2}, 2) == ("fsdp",)
    assert weight_axes("weight_streaming", {"data": 8, "fsdp": 2}, 1) == ("data", "fsdp")
    assert weight_axes("weight_streaming", {"data": 16, "fsdp": 16}, 32) == ("fsdp",)


def test_weight_streaming_mesh_without_fsdp_on_nodes_is_an_error():
    """A given weight-streaming mesh whose only axis crosses nodes would replicate every
    weight on every device: an error naming the mesh and the HSDP one to use instead."""
    from cgpt.sharding.auto import placement

    cfg = get_config("tiny-17k")
    with pytest.raises(ValueError, match=r"--mesh 'data=16' on 2 nodes.*data=2,fsdp=8"):
        placement("weight_streaming", "data=16", cfg, 16, num_devices=16, nodes=2)
    assert placement("weight_streaming", "data=2,fsdp=8", cfg, 16, num_devices=16,
                     nodes=2)[1] == {"data": 2, "fsdp": 8}
    assert placement("weight_streaming", "data=16", cfg, 16, num_devices=16)[1] == {"data": 16}


def test_axis_bytes_are_the_cost_models_traffic():
    """Per-axis bytes (`cost.axis_bytes`) are the cost model's collectives (`cost.traffic`,
    checked against the compiled HLO in tests/plan/test_plan.py) x their ring factor, a collective
    over several axes split hierarchically, node-crossing axes first."""
    cfg = get_config("1.3B").replace(remat=True)
    P, Vd = cfg.num_params(), cfg.vocab_size * cfg.d_model
    blocks = cfg.num_params(embedding=False) - 2 * cfg.d_model
    # data parallel: the f32 gradients (the tied embedding's twice) all-reduced per
    # accumulation step: 528 / 16 = 33 = 3 x 11
    b = axis_bytes(cfg, "data_parallel", {"data": 16}, 2, 528, 2048, 11, True)
    assert b == {"data": round(3 * 4 * (P + Vd) * 2 * 15 / 16)}
    # weight streaming, data across 2 nodes, fsdp=4 inside (HSDP): gathers (3 with remat) and
    # the gradient reduction over fsdp only, the 1/4 gradient shards all-reduced over data
    ws = axis_bytes(cfg, "weight_streaming", {"data": 4, "fsdp": 4}, 2, 16, 2048, 1, True)
    assert [(t.kind, t.axes) for t in traffic(cfg, "weight_streaming", {"data": 4, "fsdp": 4},
                                              16, 2048, 1, True, nodes=2)] == [
        ("all-gather", ("fsdp",)), ("reduce-scatter", ("fsdp",)), ("all-reduce", ("data",))]
    assert ws["data"] == round(2 * 3 / 4 * 4 * P / 4)
    assert ws["fsdp"] == round((3 + 1) * 4 * P * 3 / 4)
    one = axis_bytes(cfg, "weight_streaming", {"data": 4, "fsdp": 4}, 1, 16, 2048, 1, True)
    assert sum(one.values()) == round((3 + 1) * 4 * P * 15 / 16)  # one node: over all 16
    assert one["data"] == round((3 + 1) * 4 * P * 3 / 15 * 15 / 16)  # hierarchical: data first
    # layer_pipelined, data across the 2 nodes: M = 33 micro-batches of 2 rows on 8 stages
    # (66 rows x 4 accumulation steps): every tick's activations and gradients, the pipeline's
    # output and input gradient summed and the head's rows gathered over stage
    lp = axis_bytes(cfg, "layer_pipelined", {"stage": 8, "data": 2}, 2, 528, 2048, 66, True)
    act, emb = 4 * 2048 * cfg.d_model, 4 * 4 * (P - blocks + Vd)  # a row's f32 residual
    assert lp["stage"] == round(2 * 4 * 40 * 2 * act + (2 * 7 / 8 + 7 / 8) * 2 * 4 * 66 * act
                                + emb * 2 * 15 / 16 * 14 / 15)
    assert lp["data"] == round(4 * 4 * (blocks // 8) * 2 * 1 / 2 + emb * 2 * 15 / 16 * 1 / 15)


@pytest.fixture(scope="module")
def sweep():
    from cgpt.sweep.spec import load_sweep

    return load_sweep(SPEC)


def test_spec_presets_on_their_nodes_cross_only_data_and_fit(sweep):
    """Every preset of cerebras_gpt.yaml on its own node count: only data/stage cross nodes,
    the analytic plan fits the 72 GB pool of an 80 GB GPU (config/backend.py's 0.90), and the
    spec's nodes, time limit and checkpoint cadence are the derived ones."""
    from cgpt.config.backend import GPU_MEM_FRACTION
    from cgpt.plan.analytic import plan_analytic
    from cgpt.sweep.resources import derive, disagreements

    assert sweep.estimate.device_memory == 80 * 10**9
    readme = (REPO / "docs" / "cluster_plan.md").read_text()
    nodes = {}
    for run in sweep.runs:
        n = int(run.slurm["nodes"])
        nodes[run.model] = n
        r = plan_analytic(run.config, sweep.estimate.device_memory, run.devices, n)
        assert r["usable_memory"] == 68_400_000_000  # the pool, int(80e9 * GPU_MEM_FRACTION),
        # less 5% (cgpt.sharding.fitrule.POOL_MARGIN)
        assert int(80e9 * GPU_MEM_FRACTION) == 72 * 10**9
        assert r["fits"] and r["per_device_bytes"]["total"] <= 68.4e9, (run.model, r)
        assert set(r["crosses_nodes"]) <= {"data", "stage"}, (run.model, r["axes"])
        if n > 1:
            assert r["crosses_nodes"], run.model
        d = derive(sweep, run)
        assert disagreements(run, d) == [], run.model
        mesh = ",".join(f"{k}={v}" for k, v in d["plan"]["mesh"].items())
        gpus = n * int(run.slurm["gpus_per_node"])
        assert f"| {run.model} | {n} ({gpus}) | {mesh} |" in readme, (run.model, mesh)  # its table
    assert max(nodes.values()) >= 16  # the multi-node presets are among them


def test_readme_table_is_generated_and_flags_crossing_fsdp():
    """docs/cluster_plan.md's 1-32 node table is `python -m cgpt.plan.analytic`'s output; a
    cell where fsdp must cross nodes (the batch leaves no other layout) says so."""
    from cgpt.plan.analytic import NODE_COUNTS, PUBLISHED, node_table

    table = node_table(PUBLISHED, NODE_COUNTS)
    assert table in (REPO / "docs" / "cluster_plan.md").read_text()
    assert "32 nodes (256 GPUs)" in table and "16 nodes (128 GPUs)" in table
    assert "✗" not in table and "error" not in table  # every cell fits
    flagged = [c for line in table.splitlines()[2:] for c in line.split(" | ")[1:]
               if "crosses nodes" in c]
    assert flagged and all(c.startswith("WS ") and "**fsdp crosses nodes**" in c
                           for c in flagged)  # only fsdp is ever flagged, never hidden


def test_readme_table_picks_the_fastest_step_it_prints():
    """In every cell of the 1-32 node table the step printed is auto's top-ranked one (the
    same micro-batch, remat and seconds) and no slower than any other placement auto weighed
    that fits, each planned as the table plans it (`--mode M --mesh A --no-compile`): auto's
    ranking and the table size steps on one memory model (`auto.activation_itemsize`)."""
    from cgpt.config.data import DataConfig
    from cgpt.config.model import recomputes_forward
    from cgpt.config.run import RunConfig, TrainConfig
    from cgpt.plan.analytic import NODE_COUNTS, PUBLISHED, plan_analytic
    from cgpt.train.resolve import resolve

    def run(model, batch, mode="auto", mesh=""):
        return RunConfig(preset=model, model=get_config(model), data=DataConfig(seq_len=2048),
                         train=TrainConfig(batch_size=batch, mode=mode, mesh=mesh))

    alternatives = 0
    for model, batch in PUBLISHED:
        for n in NODE_COUNTS:
            r = plan_analytic(run(model, batch), "80GB", 8 * n, n)
            ranked = resolve(run(model, batch), 8 * n, platform="gpu",
                             device_memory=80 * 10**9, nodes=n).auto_ranking
            top, cell = ranked[0], (model, n)
            assert (top.mode, top.axes) == (r["mode"], r["mesh"]), cell
            assert (top.micro_batch, top.remat) == (r["micro_batch"], recomputes_forward(r["remat"])), cell
            assert r["step_s_predicted"] == pytest.approx(top.total_s, rel=1e-12), cell
            for c in ranked[1:]:
                if not c.fits:
                    continue
                mesh = ",".join(f"{k}={v}" for k, v in c.axes.items())
                alt = plan_analytic(run(model, batch, c.mode, mesh), "80GB", 8 * n, n)
                if alt["fits"]:
                    alternatives += 1
                    assert r["step_s_predicted"] <= alt["step_s_predicted"], (cell, c.label())
    assert alternatives >= 60  # rivals that fit: 73 in the 42 cells when written


def test_plan_no_compile_json_axes(capsys):
    from cgpt.plan.command import main

    assert main(["--model", "13B", "--mode", "auto", "--nodes", "30", "--gpus-per-node", "8",
                 "--no-compile", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["num_devices"] == 240 and r["nodes"] == 30 and r["compiled"] is False
    assert set(r["axes"]) == set(r["mesh"])
    for name, a in r["axes"].items():
        assert a["size"] == r["mesh"][name] and isinstance(a["crosses_nodes"], bool)
        assert a["bytes_per_step"] > 0
    assert r["axes"]["data"]["crosses_nodes"] and r["crosses_nodes"] == ["data"]
    assert main(["--model", "13B", "--mode", "auto", "--nodes", "32", "--gpus-per-node", "8",
                 "--no-compile"]) == 0
    assert "WARNING: fsdp crosses nodes" in capsys.readouterr().out
    assert main(["--model", "13B", "--mode", "auto", "--nodes", "2", "--no-compile"]) == 2
    assert "--gpus-per-node" in capsys.readouterr().err


def _fake_devices(n: int, per_process: int):
    return [SimpleNamespace(id=i, process_index=i // per_process, platform="cpu",
                            device_kind="cpu") for i in range(n)]


@pytest.mark.parametrize("axes", [{"data": 4, "fsdp": 2}, {"stage": 2, "data": 4},
                                  {"data": 2, "fsdp": 4}])
def test_hybrid_layout_matches_mesh_utils(axes):
    """The hand layout (processes are not nodes) equals create_hybrid_device_mesh's (each
    process a node) on the same devices; and each within-node factor stays in one node."""
    from jax.experimental import mesh_utils

    from cgpt.sharding.mesh import hybrid_devices

    devs = _fake_devices(8, 4)
    split = split_axes(axes, 2)
    ref = mesh_utils.create_hybrid_device_mesh(tuple(v[1] for v in split.values()),
                                               tuple(v[0] for v in split.values()), devs,
                                               process_is_granule=True)
    ours = hybrid_devices(axes, devs, 2, use_mesh_utils=False, hosts=["n0", "n1"])
    assert [[d.id for d in row] for row in ours.reshape(len(devs) // 2, -1)] == \
        [[d.id for d in row] for row in ref.reshape(len(devs) // 2, -1)]
    # one process per device (8 "GPU" processes on 2 nodes): grouped by node, not process
    per_gpu = _fake_devices(8, 1)
    block = [f"n{i // 4}" for i in range(8)]
    assert [d.id for d in hybrid_devices(axes, per_gpu, 2, hosts=block).flat] == \
        [d.id for d in ours.flat]


def test_nodes_are_the_hosts_processes_run_on():
    """Processes are grouped by the host each reported (`nodes.host_groups`), not by their
    numbering: cyclic task placement (node 0 runs processes 0, 2, 4, 6) keeps every
    within-node factor on one host; hosts with different process counts, or a mesh laid
    over another node count, are errors naming both."""
    from cgpt.sharding.mesh import hybrid_devices, job_nodes, node_groups
    from cgpt.sharding.nodes import host_groups

    cyclic = [f"n{i % 2}" for i in range(8)]
    assert host_groups(cyclic) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    per_gpu = _fake_devices(8, 1)
    assert job_nodes(per_gpu, cyclic) == 2
    assert [[d.id for d in g] for g in node_groups(per_gpu, 2, cyclic)] == \
        [[0, 2, 4, 6], [1, 3, 5, 7]]
    grid = hybrid_devices({"data": 2, "fsdp": 4}, per_gpu, 2, hosts=cyclic)
    for row in grid:  # each fsdp group on one host; data across the two
        assert len({cyclic[d.process_index] for d in row}) == 1
    assert {cyclic[d.process_index] for d in grid[:, 0]} == {"n0", "n1"}
    with pytest.raises(ValueError, match=r"n0: processes 0, 1, 2; n1: process 3"):
        job_nodes(_fake_devices(4, 1), ["n0", "n0", "n0", "n1"])
    with pytest.raises(ValueError, match=r"laid over 2 nodes but .* run on 1 hosts \(n0: "):
        node_groups(_fake_devices(8, 4), 2, ["n0", "n0"])
    with pytest.raises(ValueError, match=r"laid over 2 nodes but .* run on 4 hosts"):
        hybrid_devices({"data": 2, "fsdp": 4}, per_gpu, 2, hosts=[f"n{i // 2}" for i in range(8)])


def test_build_mesh_nodes_on_emulated_devices():
    import jax

    from cgpt.sharding.mesh import build_mesh
    from cgpt.sharding.strategies import strategy_on

    devs = jax.devices()[:8]
    mesh = build_mesh({"data": 4, "fsdp": 2}, devs, nodes=2)
    node = {d.id: i // 4 for i, d in enumerate(devs)}
    for row in mesh.devices:  # each fsdp group: one node
        assert len({node[d.id] for d in row}) == 1
    assert len({node[d.id] for d in mesh.devices[:, 0]}) == 2  # data crosses
    plain = build_mesh({"data": 4, "fsdp": 2}, devs)
    assert (plain.devices == jax.make_mesh((4, 2), ("data", "fsdp"), devices=devs).devices).all()
    cfg = get_config("tiny-17k")
    specs = lambda s: [p for p in jax.tree.leaves(  # noqa: E731
        s.param_specs(), is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))]
    used = lambda s: {a for p in specs(s) for d in p if d  # noqa: E731
                      for a in ((d,) if isinstance(d, str) else d)}
    two = strategy_on(mesh, "weight_streaming", cfg, 8, nodes=2)
    one = strategy_on(plain, "weight_streaming", cfg, 8)
    assert used(two) == {"fsdp"} and used(one) == {"data", "fsdp"}
    assert two.describe()["axes"]["data"]["crosses_nodes"]
    assert not two.describe()["axes"]["fsdp"]["crosses_nodes"]


_WORKER = r"""
import json, os
import numpy as np
from cgpt.sharding.mesh import build_mesh, emulate_cpu_devices, job_nodes
emulate_cpu_devices(int(os.environ["TEST_DEVICES"]))
from cgpt.sharding import distributed
distributed.initialize()
import jax, optax
from jax.experimental import multihost_utils
from cgpt.config.model import get_config
from cgpt.model import gpt as model
from cgpt.sharding.auto import placement
from cgpt.sharding.strategies import fresh_state, strategy_on
devs, me = jax.devices(), jax.process_index()
hosts = distributed.process_hosts()
try:
    nodes = job_nodes(devs)
except ValueError as e:
    print(json.dumps({"error": str(e)}), flush=True)
    raise SystemExit(3)
cfg, batch = get_config("tiny-17k"), 8
mode, axes, why, _ = placement("weight_streaming", "", cfg, batch, num_devices=len(devs),
                               num_processes=jax.process_count(), nodes=nodes)
mesh = build_mesh(axes, devs, nodes)
s = strategy_on(mesh, mode, cfg, batch, nodes=nodes)
opt = optax.adamw(1e-3)
ap = jax.eval_shape(lambda: model.init_params(cfg))
ao = jax.eval_shape(opt.init, ap)
params, state = fresh_state(cfg, opt, devs[0], out_shardings=(
    s.param_shardings(ap), s.opt_shardings(ao, ap)))(0)
# per array: how many copies each host's devices hold together, and the largest shard
copies, shard, same = [], [], True
for x in jax.tree.leaves((params, state)):
    if x.ndim == 0:
        continue
    where = x.sharding.devices_indices_map(x.shape)
    per_host = {}
    for d, idx in where.items():
        n = int(np.prod([len(range(*i.indices(m))) for i, m in zip(idx, x.shape)]))
        per_host.setdefault(hosts[d.process_index], []).append(n)
    copies.append(sorted({sum(v) / x.size for v in per_host.values()}))
    shard.append(max(max(v) for v in per_host.values()) / x.size)
    # each host's copy of the array, assembled from the shards of its processes
    local, held = np.zeros(x.shape, x.dtype), np.zeros(x.shape, bool)
    for sh in x.addressable_shards:
        local[sh.index], held[sh.index] = np.asarray(sh.data), True
    values = multihost_utils.process_allgather(local)
    masks = multihost_utils.process_allgather(held)
    copy = {}
    for p, h in enumerate(hosts):
        c = copy.setdefault(h, np.zeros(x.shape, x.dtype))
        c[masks[p]] = values[p][masks[p]]
    same &= all(np.array_equal(c, copy[hosts[0]]) for c in copy.values())
d = list(mesh.axis_names).index("fsdp")
groups = np.moveaxis(mesh.devices, d, -1).reshape(-1, mesh.shape["fsdp"])
tokens = (np.arange(batch * 17).reshape(batch, 17) * 7 % cfg.vocab_size).astype(np.int32)
loss = float(s.compile_eval(cfg)(params, s.shard_eval_batch(tokens)))
print(json.dumps({"process": me, "hosts": list(hosts), "nodes": nodes, "axes": axes,
                  "why": why, "copies": copies, "shard": shard, "same": bool(same),
                  "loss": loss, "groups": [[hosts[dv.process_index] for dv in g] for g in groups],
                  "placement_axes": s.describe()["axes"],
                  "weight_axes": s.describe()["weight_axes"]}), flush=True)
"""


def _job(n: int, devices: int, hosts: list[str], timeout: float = 420) -> list[tuple[int, dict]]:
    """`_WORKER` as `n` real processes of one JAX job (gloo collectives on localhost), each
    with `devices` CPU devices and reporting `hosts[i]` as its host (CGPT_HOST): (exit code,
    last JSON line) per process. A process that fails or hangs ends the whole job."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for i in range(n):
        env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
               "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": str(n),
               "JAX_PROCESS_ID": str(i), "TEST_DEVICES": str(devices), "CGPT_HOST": hosts[i]}
        procs.append(subprocess.Popen([sys.executable, "-c", _WORKER], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the {n}-process job did not finish in {timeout} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    got = []
    for p, (out, err) in zip(procs, outs):
        lines = [x for x in out.splitlines() if x.startswith("{")]
        assert lines, f"process exited {p.returncode} without a result:\n{err[-3000:]}"
        got.append((p.returncode, json.loads(lines[-1])))
    return got


@pytest.mark.slow(reason="test_build_mesh_nodes_on_emulated_devices")
def test_two_hosts_stream_weights_as_hsdp():
    """2 real processes x 4 CPU devices, each on its own host (CGPT_HOST): an empty mesh
    with a batch that splits over all 8 devices is HSDP, data=2 across the hosts x fsdp=4
    inside each; every weight and optimizer-state array is sharded within a process (its 4
    devices hold one copy between them, each a quarter) and replicated across (the two
    hosts' copies are equal), and the step's loss is computed on that layout."""
    got = _job(2, 4, ["node-a", "node-b"])
    assert [c for c, _ in got] == [0, 0], got
    r = got[0][1]
    assert r["hosts"] == ["node-a", "node-b"] and r["nodes"] == 2
    assert r["axes"] == {"data": 2, "fsdp": 4} and r["why"].startswith("HSDP")
    assert r["weight_axes"] == ["fsdp"]
    assert r["copies"] and all(c == [1.0] for c in r["copies"]), r["copies"]
    assert all(f == 0.25 for f in r["shard"]), r["shard"]
    assert r["same"] and got[1][1]["same"]
    assert all(len(set(g)) == 1 for g in r["groups"]), r["groups"]  # fsdp inside a host
    assert sorted(g[0] for g in r["groups"]) == ["node-a", "node-b"]
    assert r["placement_axes"]["data"]["crosses_nodes"]
    assert not r["placement_axes"]["fsdp"]["crosses_nodes"]
    assert got[1][1]["loss"] == r["loss"] and np.isfinite(r["loss"])


@pytest.mark.slow(reason="test_nodes_are_the_hosts_processes_run_on")
def test_cyclic_processes_are_grouped_by_host():
    """4 real processes x 2 CPU devices placed cyclically on 2 hosts (processes 0, 2 on one,
    1, 3 on the other, as a cyclic task distribution numbers them): the mesh reads the hosts,
    so each fsdp group is one host's 4 devices and each host holds one copy of the state
    (the same values on both hosts)."""
    hosts = ["node-a", "node-b", "node-a", "node-b"]
    got = _job(4, 2, hosts)
    assert [c for c, _ in got] == [0] * 4, got
    r = got[0][1]
    assert r["hosts"] == hosts and r["nodes"] == 2 and r["axes"] == {"data": 2, "fsdp": 4}
    assert all(len(set(g)) == 1 for g in r["groups"]), r["groups"]
    assert all(c == [1.0] for c in r["copies"]) and r["same"]


@pytest.mark.slow  # 3 more processes; test_nodes_are_the_hosts_processes_run_on checks the rule
def test_hosts_with_uneven_processes_are_an_error_naming_them():
    """3 processes, 2 on one host and 1 on another: no node-aware mesh; every process stops
    with one error naming each host's processes."""
    got = _job(3, 2, ["node-a", "node-a", "node-b"])
    assert [c for c, _ in got] == [3] * 3, got
    for _, r in got:
        assert "node-a: processes 0, 1; node-b: process 2" in r["error"], r


@pytest.mark.slow  # two compiles: ~70 s on 2 loaded cores
def test_compiled_plan_on_two_nodes():
    """The compiled plan (`plan --nodes 2 --gpus-per-node 4`): weight streaming's state is
    sharded over fsdp=4 inside a node, not over data (which crosses), and --json has axes."""
    from cgpt.plan.planning import plan

    kw = dict(batch=8, seq_len=16, platform="cpu", remat=False, micro_batch=4)
    two = plan("tiny-17k", "weight_streaming", "data=2,fsdp=4", 8, "80GB", nodes=2, **kw)
    one = plan("tiny-17k", "weight_streaming", "data=2,fsdp=4", 8, "80GB", **kw)
    assert two["axes"]["data"]["crosses_nodes"] and not two["axes"]["fsdp"]["crosses_nodes"]
    assert two["crosses_nodes"] == ["data"] and one["crosses_nodes"] == []
    # weights over 4 devices instead of 8: twice the parameter bytes per device
    assert two["per_device_bytes"]["params"] > 1.5 * one["per_device_bytes"]["params"]
    assert two["axes"]["data"]["bytes_per_step"] > 0 and two["axes"]["fsdp"]["bytes_per_step"] > 0
