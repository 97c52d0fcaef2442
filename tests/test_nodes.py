"""Meshes that know the node boundary (cgpt.sharding.nodes, mesh.build_mesh(nodes=...)),
`plan --nodes --gpus-per-node --no-compile`, and the cluster spec's derived resources.

The presets' placements are checked on the analytic plan (no compile, no devices); the hybrid
mesh on the 8 emulated CPU devices (one process: contiguous blocks stand for nodes) and with
2 real processes x 4 CPU devices (each process a node, jax.distributed + gloo)."""
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

REPO = Path(__file__).resolve().parents[1]
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
    # 13B's batch on 30 nodes x 8: data is a multiple of the node count, fsdp inside
    assert weight_streaming_axes(240, 720, None, 30)[0] == {"data": 240}
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


def test_axis_bytes_are_the_cost_models_traffic():
    """Per-axis bytes (`cost.axis_bytes`) are the cost model's collectives (`cost.traffic`,
    checked against the compiled HLO in tests/test_plan.py) x their ring factor, a collective
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
    ours = hybrid_devices(axes, devs, 2, use_mesh_utils=False)
    assert [[d.id for d in row] for row in ours.reshape(len(devs) // 2, -1)] == \
        [[d.id for d in row] for row in ref.reshape(len(devs) // 2, -1)]
    # one process per device (8 "GPU" processes on 2 nodes): grouped by node, not process
    per_gpu = _fake_devices(8, 1)
    assert [d.id for d in hybrid_devices(axes, per_gpu, 2).flat] == [d.id for d in ours.flat]


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
import json, sys
import numpy as np
from cgpt.sharding.mesh import build_mesh, emulate_cpu_devices, job_nodes
emulate_cpu_devices(4)
from cgpt.sharding import distributed
distributed.initialize()
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from cgpt.config.model import get_config
from cgpt.sharding.auto import placement
from cgpt.sharding.strategies import strategy_on
devs = jax.devices()
nodes = job_nodes(devs)
cfg = get_config("tiny-17k")
mode, axes, why, _ = placement("weight_streaming", "", cfg, 2, num_devices=len(devs),
                               num_processes=jax.process_count(), nodes=nodes)
mesh = build_mesh(axes, devs, nodes)
s = strategy_on(mesh, mode, cfg, 2, nodes=nodes)
d = list(mesh.axis_names).index("fsdp")
groups = np.moveaxis(mesh.devices, d, -1).reshape(-1, mesh.shape["fsdp"])
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data", "fsdp")),
                                           np.ones((1, 4), np.float32), (2, 4))
total = float(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x))
if jax.process_index() == 0:
    print(json.dumps({"nodes": nodes, "axes": axes, "total": total,
                      "groups": [[dv.process_index for dv in g] for g in groups],
                      "placement_axes": s.describe()["axes"]}), flush=True)
"""


def test_two_processes_fsdp_groups_one_process(tmp_path):
    """2 real processes x 4 CPU devices (each process a node): weight streaming's fsdp axis
    groups the devices of one process, data crosses processes, a collective runs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for i in range(2):
        env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
               "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2",
               "JAX_PROCESS_ID": str(i)}
        procs.append(subprocess.Popen([sys.executable, "-c", _WORKER], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=300))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the 2-process job did not finish in 300 s")
    assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-2000:] for _, e in outs)
    r = json.loads(outs[0][0].strip().splitlines()[-1])
    assert r["nodes"] == 2 and r["axes"] == {"data": 2, "fsdp": 4}
    assert all(len(set(g)) == 1 for g in r["groups"]), r["groups"]
    assert sorted(g[0] for g in r["groups"]) == [0, 1]
    assert r["placement_axes"]["data"]["crosses_nodes"]
    assert not r["placement_axes"]["fsdp"]["crosses_nodes"]
    assert r["total"] == 8.0


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
