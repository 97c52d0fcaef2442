"""`cgpt plan --no-compile`: a run's placement and analytic memory and traffic, in seconds.

Nothing is lowered or compiled: the run is resolved as `train` would (`cgpt.train.resolve`,
with `--mode auto` deciding by `cgpt.sharding.auto`'s memory model), its mesh laid over the
nodes (`cgpt.sharding.nodes`: which axes cross nodes), and the step sized with the same
footprints `auto` uses (16 bytes of state per parameter held, activations at the compute
dtype, `auto.activation_itemsize`: bf16 on a GPU; f32 logits): the micro-batch and remat are
the fit's rule (`cgpt.sharding.fitrule.choose_step`, as `cgpt.train.fit` runs it on compiled
steps) on those footprints, as `auto`'s cost ranking replays it, so a table cell's step is
the one auto ranked first; `fit.tried` lists the footprints it probed. Rough by design; the
compiled plan (without --no-compile) is the exact figure. So 13B on 32 nodes plans in about
a second.
"""
from __future__ import annotations

from cgpt.config import backend, flops
from cgpt.config.data import DataConfig
from cgpt.config.model import get_config, recomputes_forward
from cgpt.config.run import RunConfig, TrainConfig
from cgpt.config.units import fmt_bytes, parse_bytes
from cgpt.errors import TrainError
from cgpt.plan.costs import batch_advice
from cgpt.sharding import auto, cost
from cgpt.sharding.cost import axis_bytes
from cgpt.sharding.fitrule import choose_step, divisors_desc, usable_memory
from cgpt.sharding.nodes import node_axes, weight_shards
from cgpt.train.resolve import resolve


def footprint(cfg, mode: str, axes: dict[str, int], nodes: int, rows: int, seq_len: int,
              accum: int = 2) -> int:
    """Per-device bytes of `mode` on `axes` with `rows` sequences in flight per batch shard,
    `accum` accumulation steps (`cgpt.sharding.auto`'s model; weight streaming's state over
    its within-node weight axes)."""
    shards = weight_shards(mode, axes, nodes) if mode == "weight_streaming" else 1
    return auto.footprint(cfg, shards, seq_len, mode, axes, rows, None, accum)


def plan_analytic(run, device_memory: int | str, devices: int, nodes: int = 1,
                  platform: str = "gpu") -> dict:
    """The analytic plan of a RunConfig on `devices` devices over `nodes` nodes (see module)."""
    memory = parse_bytes(device_memory) if isinstance(device_memory, str) else int(device_memory)
    if nodes < 1 or devices % nodes:
        raise ValueError(f"--nodes {nodes}: the {devices} devices must split evenly over the "
                         "nodes; give --gpus-per-node G (devices = nodes x G)")
    try:
        res = resolve(run, devices, platform=platform, device_memory=memory, nodes=nodes)
    except TrainError as e:
        raise ValueError(str(e)) from None
    cfg = backend.for_platform(res.cfg, platform)
    usable = usable_memory(memory)
    T, t = res.seq_len, run.train
    per_replica = res.batch_size // res.replicas
    micros = ([t.micro_batch] if t.micro_batch else
              divisors_desc(per_replica))
    ladder = backend.kernels(cfg, platform).remat_ladder  # as train's fit climbs it
    remats = [cfg.remat] if cfg.remat is not None else list(ladder)
    tried: list[dict] = []

    def fits(m: int, r: str) -> bool:
        c = next((c for c in tried if (c["micro_batch"], c["remat"]) == (m, r)), None)
        if c is None:
            c = {"micro_batch": m, "remat": r,
                 "total": footprint(cfg.replace(remat=r), res.mode, res.mesh, nodes, m, T,
                                    per_replica // m)}
            tried.append(c)
        return c["total"] <= usable

    seconds = (lambda m, r: _predicted_s(cfg, res, m, r, platform, devices // nodes)
               ) if platform == "gpu" else None  # `_predicted_s`: None off the GPU
    chosen = choose_step(micros, remats, fits, seconds)  # as `train`'s fit (cgpt.train.fit)
    pick = (next(c for c in tried if (c["micro_batch"], c["remat"]) == chosen) if chosen
            else min(tried, key=lambda c: c["total"]))
    m, remat = pick["micro_batch"], pick["remat"]
    step, hw = _step(cfg, res, m, remat, platform, devices // nodes)
    n_params = cfg.num_params()
    axes = node_axes(res.mesh, nodes, res.mode)
    moved = axis_bytes(cfg, res.mode, res.mesh, nodes, res.batch_size, T, m,
                       recomputes_forward(remat))
    for a in axes:
        axes[a]["bytes_per_step"] = moved.get(a, 0)
    return {
        "model": cfg.name, "mode": res.mode, "requested_mode": t.mode, "compiled": False,
        "auto_reason": res.auto_reason, "mesh_reason": res.mesh_reason, "mesh": res.mesh,
        "num_devices": devices, "nodes": nodes, "devices_per_node": devices // nodes,
        "axes": axes, "crosses_nodes": [a for a, v in axes.items() if v["crosses_nodes"]],
        "n_params": n_params, "batch": res.batch_size, "seq_len": T, "micro_batch": m,
        "accum": per_replica // m, "remat": remat, "dtype": cfg.compute_dtype,
        "platform": platform, "attention": cfg.attention,
        "per_device_bytes": {"total": pick["total"]},
        "state_bytes": 12 * n_params,  # what a checkpoint holds: f32 weights, Adam mu and nu
        "device_memory": memory, "usable_memory": usable, "fits": chosen is not None,
        "fit": {"searched": [k for k, given in (("micro_batch", bool(t.micro_batch)),
                                                ("remat", cfg.remat is not None)) if not given],
                "tried": tried},
        "flops_per_step_analytic": flops.train_flops_per_token(cfg, T) * res.batch_size * T,
        "bubble_fraction": _bubble(res.mode, res.mesh, m),
        "step_s_predicted": step.total_s if step else None,
        # the nearest batches with a layout within cost.COMM_LIMIT, when this one has none
        "batch_advice": batch_advice(res.cfg, step, res.batch_size, T, devices, nodes, memory,
                                     hw) if step else None,
    }


def _step(cfg, res, micro: int, remat: bool, platform: str, gpus_per_node: int):
    """(the cost model's step at the device's peak, its hardware) (`cgpt.sharding.cost`; an
    H100 SXM is assumed in a plan), or (None, None) off the GPU: a prediction, never a
    measurement."""
    hw = cost.hardware_for(platform, None, gpus_per_node)
    if hw is None:
        return None, None
    return cost.step_cost(cfg, res.mode, res.mesh, res.batch_size, res.seq_len, micro,
                          recomputes_forward(remat), hw), hw


def _predicted_s(cfg, res, micro: int, remat: bool, platform: str, gpus_per_node: int):
    """The cost model's seconds per step (`_step`), or None off the GPU."""
    step = _step(cfg, res, micro, remat, platform, gpus_per_node)[0]
    return step.total_s if step else None


def _bubble(mode: str, mesh: dict[str, int], micro: int) -> float | None:
    """GPipe's (S-1)/(M+S-1) with the default micro-batch count (up to 4 x stages)."""
    if mode != "layer_pipelined":
        return None
    from cgpt.sharding.pipeline import bubble_fraction  # loads JAX: only when this runs

    s = mesh.get("stage", 1)
    divisors = divisors_desc(micro)
    return bubble_fraction(s, min([k for k in divisors if k >= 4 * s] or [micro]))


def crossing_note(r: dict) -> str:
    """One line: which axes cross nodes, flagging any but data/stage (the plan "says so")."""
    cross = r.get("crosses_nodes") or []
    if r.get("nodes", 1) <= 1:
        return "one node: no axis crosses nodes"
    bad = [a for a in cross if a not in ("data", "stage")]
    verb = "crosses" if len(cross) == 1 else "cross"
    text = f"{', '.join(cross) or 'none'} {verb} the {r['nodes']} nodes"
    if bad:
        text += (f"; WARNING: {', '.join(bad)} crosses nodes (its gathers/reductions use the "
                 "inter-node network every layer): the batch leaves no layout with only "
                 "data/stage across nodes")
    return text


def fmt_axes(r: dict) -> list[str]:
    """Lines per mesh axis: size (across x within a node) and the bytes it moves per step."""
    out = []
    for a, v in r["axes"].items():
        moved = v.get("bytes_per_step")
        out.append(f"  {a:6s} {v['size']:4d} = {v['across_nodes']} across x {v['within_node']} "
                   f"within a node{' (crosses nodes)' if v['crosses_nodes'] else ''}"
                   + (f", {fmt_bytes(moved)} per device per step (analytic)"
                      if moved is not None else ""))
    return out


def node_table(models: list[tuple[str, int]], node_counts: list[int], gpus_per_node: int = 8,
               device_memory: str = "80GB") -> str:
    """The README's plan table: every (preset, published batch) on each node count, placed by
    `--mode auto` with the analytic plan (`python -m cgpt.plan.analytic` prints it)."""
    short = {"layer_pipelined": "LP", "weight_streaming": "WS", "data_parallel": "DP"}
    head = ["model"] + [f"{n} node{'s' if n > 1 else ''} ({n * gpus_per_node} GPUs)"
                        for n in node_counts]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, batch in models:
        run = RunConfig(preset=model, model=get_config(model), data=DataConfig(seq_len=2048),
                        train=TrainConfig(batch_size=batch, mode="auto"))
        cells = [model]
        for n in node_counts:
            try:
                r = plan_analytic(run, device_memory, n * gpus_per_node, n)
            except ValueError as e:
                cells.append(f"error: {str(e)[:60]}")
                continue
            mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items())
            bad = [a for a in r["crosses_nodes"] if a not in ("data", "stage")]
            cells.append(f"{short[r['mode']]} {mesh}: {r['micro_batch']} × {r['accum']}, remat "
                         f"{r['remat']}, ~{fmt_bytes(r['per_device_bytes']['total'])} "
                         f"{'✓' if r['fits'] else '✗'}"
                         + (f", {r['step_s_predicted']:.3g} s" if r["step_s_predicted"] else "")
                         + (f", **{'+'.join(bad)} crosses nodes**" if bad else ""))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


PUBLISHED = [("111M", 120), ("256M", 264), ("590M", 264), ("1.3B", 528), ("2.7B", 528),
             ("6.7B", 1040), ("13B", 720)]
NODE_COUNTS = [1, 2, 4, 8, 16, 32]

if __name__ == "__main__":
    print(node_table(PUBLISHED, NODE_COUNTS))
