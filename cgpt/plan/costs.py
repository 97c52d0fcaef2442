"""`cgpt plan`'s cost-model section: the time `cgpt.sharding.cost` predicts for the compiled
step, the cheapest step on the same placement, under `--mode auto` every placement auto
weighed, and on several nodes, when the step's communication exceeds `cost.COMM_LIMIT`, the
nearest batches with a layout within it (GPU platforms only: there is no cost model for CPU
or TPU)."""
from __future__ import annotations

import math

from cgpt.config.model import recomputes_forward
from cgpt.sharding import auto, cost
from cgpt.sharding.nodes import weight_shards


def cost_report(cfg, remat_asked: bool | None, mode: str, mesh: dict[str, int], plan, seq_len: int,
                memory: int, platform: str, micro_batches: int | None,
                nodes: int = 1) -> dict | None:
    """The `cost` entry of a plan: `chosen` (the compiled step's micro-batch, remat and
    pipeline micro-batches, costed), `cheapest` (the fastest step the memory model allows
    on that placement) and `candidates` (auto's ranking as `resolve` computed it, fastest
    first: `plan.auto_ranking`; [] for other modes)."""
    n = math.prod(mesh.values())
    hw = cost.hardware_for(platform, None, n // nodes if nodes > 1 else None)
    if hw is None:
        return None
    model = cfg.replace(remat=remat_asked)  # what auto saw: remat as asked, not as fitted

    def need(m: str, axes: dict, rows: int, remat: str, accum: int) -> int:
        shards = weight_shards(m, axes, nodes) if m == "weight_streaming" else n
        return auto.footprint(model, shards, seq_len, m, axes, rows, remat, accum)

    chosen = cost.step_cost(model, mode, mesh, plan.batch_size, seq_len, plan.micro_batch,
                            recomputes_forward(cfg.remat), hw, micro_batches=micro_batches)
    best = cost.cheapest(model, mode, mesh, plan.batch_size, seq_len, memory, hw, need)
    ranking = plan.auto_ranking
    return {"hardware": hw.name, "peak_flops": hw.peak_flops, "nvlink_bytes_per_s": hw.nvlink,
            "network_bytes_per_s": hw.network, "gpus_per_node": hw.gpus_per_node,
            "chosen": chosen.to_dict(), "cheapest": best.to_dict() if best else None,
            "candidates": [c.to_dict() for c in ranking]}


def step_advice(cfg, remat_asked: bool | None, mode: str, mesh: dict[str, int], plan,
                seq_len: int, memory: int, platform: str, micro_batches: int | None,
                nodes: int = 1) -> dict | None:
    """`batch_advice` for a compiled plan's step (costed as `cost_report`'s `chosen`); None
    off the GPU (no cost model)."""
    n = math.prod(mesh.values()) if mesh else 1
    hw = cost.hardware_for(platform, None, n // nodes if nodes > 1 else None)
    if hw is None or not mesh:
        return None
    model = cfg.replace(remat=remat_asked)
    chosen = cost.step_cost(model, mode, mesh, plan.batch_size, seq_len, plan.micro_batch,
                            recomputes_forward(cfg.remat), hw, micro_batches=micro_batches)
    return batch_advice(model, chosen, plan.batch_size, seq_len, n, nodes, memory, hw)


def batch_advice(cfg, chosen: cost.StepCost, batch: int, seq_len: int, devices: int,
                 nodes: int, memory: int, hw: cost.Hardware) -> dict | None:
    """When the planned step spends more than `cost.COMM_LIMIT` of its time in exposed
    communication on several nodes: the nearest batches at which `--mode auto` finds a
    layout within it (`auto.nearest_batches`), each with its layout and step time; None
    when the step is within the limit (or on one node: a batch that does not split over
    the nodes is a multi-node problem)."""
    if nodes <= 1 or chosen.comm_fraction <= cost.COMM_LIMIT:
        return None
    near = auto.nearest_batches(cfg, batch, seq_len, num_devices=devices, nodes=nodes,
                                device_memory=memory, hardware=hw)
    return {"batch": batch, "comm_fraction": chosen.comm_fraction, "limit": cost.COMM_LIMIT,
            "nearest": [{"batch": b, **c.to_dict()} for b, c in near]}


def format_batch_advice(a: dict | None, nodes: int, per_node: int) -> list[str]:
    """The `batch` line: what the nearest batches within the communication limit cost."""
    if not a:
        return []
    near = a["nearest"]
    if near and near[0]["batch"] == a["batch"]:
        head = (f"batch         this step's modelled communication is {a['comm_fraction']:.0%} "
                f"of it (> {a['limit']:.0%}); --mode auto weighs one within it at this batch")
    else:
        head = (f"batch         {a['batch']} leaves no layout auto weighs on {nodes} nodes x "
                f"{per_node} whose modelled communication is <= {a['limit']:.0%} of its step "
                f"(this one: {a['comm_fraction']:.0%})")
    if not near:
        return [head + f"; nor does any batch up to {2 * a['batch']} that splits over them"]
    return [head + ("; the nearest that has one: " if near[0]["batch"] != a["batch"] else ": ")
            + "; ".join(
        f"--batch {c['batch']}: {c['mode']} on "
        f"{','.join(f'{k}={v}' for k, v in c['mesh'].items())}, ~{c['total_s']:.3g} s/step "
        f"(communication {c['comm_fraction']:.0%}; micro-batch {c['micro_batch']} x "
        f"{c['accum']}, remat {'on' if c['remat'] else 'off'})" for c in a["nearest"])]


def _line(c: dict) -> str:
    mesh = ",".join(f"{k}={v}" for k, v in c["mesh"].items())
    bub = f" ({c['bubble_fraction']:.1%})" if c["bubble_fraction"] is not None else ""
    return (f"{c['mode']} on {mesh}: {c['total_s']:.3g} s = compute {c['compute_s']:.3g} + remat "
            f"{c['remat_s']:.3g} + bubble {c['bubble_s']:.3g}{bub} + exposed comm "
            f"{c['comm_s']:.3g} "
            f"(micro-batch {c['micro_batch']} x {c['accum']}, remat "
            f"{'on' if c['remat'] else 'off'})" + ("" if c["fits"] else " - does not fit"))


def format_cost(r: dict | None) -> list[str]:
    """The cost section's lines for `format_plan` ([] when the plan has none)."""
    if not r:
        return []
    lines = [f"cost model    seconds per step at peak on {r['hardware']} "
             f"({r['peak_flops'] / 1e12:.0f} TFLOP/s; NVLink {r['nvlink_bytes_per_s'] / 1e9:.0f}"
             f" GB/s, network {r['network_bytes_per_s'] / 1e9:.0f} GB/s per GPU, assumed)",
             f"  train runs  {_line(r['chosen'])}"]
    if r["cheapest"] and r["cheapest"]["total_s"] < r["chosen"]["total_s"] * 0.99:
        c = r["cheapest"]
        lines.append(f"  alternative {_line(c)}, faster: --micro-batch {c['micro_batch']} --remat "
                     f"{'on' if c['remat'] else 'off'} (train.micro_batch, model.remat)")
    # auto's ranking, fastest first: its first is the step train runs, the rest alternatives
    lines += [f"  alternative {_line(c)} (auto ranked it {i + 1})"
              for i, c in enumerate(r["candidates"]) if i]
    return lines
