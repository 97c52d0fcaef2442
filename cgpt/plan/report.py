"""`cgpt plan`'s text report of one plan (the dict `cgpt.plan.planning.plan` returns)."""
from __future__ import annotations

from cgpt.config.model import remat_value
from cgpt.config.units import fmt_bytes, fmt_count
from cgpt.plan.analytic import crossing_note, fmt_axes
from cgpt.plan.costs import format_batch_advice, format_cost
from cgpt.train.fit import HEADROOM, POOL_MARGIN

ONE_NODE = 8  # GPUs of the usual node (DGX/HGX); more on one node is read as asked, said so


def format_plan(r: dict) -> str:
    """The plan as the lines `cgpt plan` prints (without --json)."""
    b = r["per_device_bytes"]
    mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items())
    searched = r["fit"]["searched"]
    tried = r["fit"]["tried"]
    # the probes' fit, not their bytes: the plan prints one memory figure, its step's
    # (`--json`'s fit.tried has each probe's)
    how = (f"searched {' and '.join(s.replace('_', '-') for s in searched)} over "
           f"{len(tried)} compiled step(s): "
           + ", ".join(f"{c['micro_batch']}/{remat_value(c['remat'])}" for c in tried)
           ) if searched else "as given"
    lines = [
        f"{r['model']} ({fmt_count(r['n_params'])} params), {r['mode']} on {mesh} "
        f"({r['num_devices']} devices of a {r['platform']}{_nodes(r)}); batch {r['batch']} x "
        f"{r['seq_len']} tokens, {r['dtype']}, {r['attention']} attention",
        f"step          train runs: micro-batch {r['micro_batch']} x {r['accum']} accumulation "
        f"steps, remat {remat_value(r['remat'])} ({how}); other lines that name a step are "
        "alternatives",
        "per device:",
        f"  params      {fmt_bytes(b['params'])}",
        f"  optimizer   {fmt_bytes(b['optimizer'])}",
        f"  temp        {fmt_bytes(b['temp'])}",
        f"  total       {fmt_bytes(b['total'])} of {fmt_bytes(r['usable_memory'])} usable "
        f"({fmt_bytes(r['device_memory'])} less {HEADROOM:.0%}, then {POOL_MARGIN:.0%}): "
        f"{'fits' if r['fits'] else 'does NOT fit'}",
        f"FLOPs/step    {r['flops_per_step']:.3e} (compiled HLO, all devices)   "
        f"{r['flops_per_step_analytic']:.3e} (analytic)",
        f"collectives   {fmt_bytes(r['collective_bytes_per_step'])} per device per step in all "
        "(the cost model's exposed comm is the time of the part not overlapped with compute)"
        + "".join(f"\n  {k:19s} {fmt_bytes(v)}"
                  for k, v in sorted(r["collective_bytes_by_kind"].items())),
    ]
    if r.get("collective_bytes_across_hosts") and r["nodes"] > 1:
        lines.append("across nodes  " + ", ".join(
            f"{k} {fmt_bytes(v)}" for k, v in sorted(r["collective_bytes_across_hosts"].items()))
            + " per device per step (the compiled collectives whose groups span hosts)")
    if r["bubble_fraction"] is not None:
        lines.append(f"bubble        {r['bubble_fraction']:.1%} ({r['micro_batches']} "
                     f"micro-batches, {r['mesh'].get('stage', 1)} stages)")
    for u in r.get("unsharded") or []:
        lines.append(f"unsharded     {u['array']} {u['logical']}={u['dim']} not over "
                     f"{','.join(a for a in u['wanted'] if a not in u['got'])}: {u['why']}")
    lines += format_cost(r.get("cost"))
    lines += format_batch_advice(r.get("batch_advice"), r["nodes"], r["num_devices"] // r["nodes"])
    if r.get("auto_reason"):
        lines.append(f"auto          {r['auto_reason']}")
    if r.get("cudnn_layout"):
        lines.append(f"cudnn         {r['platform']}'s attention kernel; compiled here as "
                     f"{r['attention']}; q/k/v split {r['cudnn_layout']}: cuDNN can partition it")
    lines += [f"nodes         {crossing_note(r)}", *fmt_axes(r)]
    lines.append(f"compile       {r['compile_s']:.1f} s, by the compiler of {r['compiled_for']}"
                 + "".join(f"\n  {k:19s} {v} calls per step"
                           for k, v in sorted(r.get("kernel_calls", {}).items())))
    if r.get("caveat"):
        lines.append(f"caveat        {r['caveat']}")
    return "\n".join(lines)


def format_analytic(r: dict) -> str:
    """`plan --no-compile`'s lines: placement, which axes cross nodes, analytic memory."""
    mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items())
    lines = [
        f"{r['model']} ({fmt_count(r['n_params'])} params), {r['mode']} on {mesh} "
        f"({r['num_devices']} devices{_nodes(r)}); batch "
        f"{r['batch']} x {r['seq_len']} tokens (analytic, not compiled: cgpt.plan.analytic)",
        f"step          train runs: micro-batch {r['micro_batch']} x {r['accum']} accumulation "
        f"steps, remat {r['remat']}",
        f"per device    ~{fmt_bytes(r['per_device_bytes']['total'])} of "
        f"{fmt_bytes(r['usable_memory'])} usable ({fmt_bytes(r['device_memory'])} less "
        f"{HEADROOM:.0%}, then {POOL_MARGIN:.0%}): {'fits' if r['fits'] else 'does NOT fit'}",
        f"nodes         {crossing_note(r)}", "axes (bytes: analytic, ring collectives):",
        *fmt_axes(r), f"mesh          {r['mesh_reason']}"]
    if r["bubble_fraction"] is not None:
        lines.append(f"bubble        {r['bubble_fraction']:.1%}")
    if r.get("auto_reason"):
        lines.append(f"auto          {r['auto_reason']}")
    lines += format_batch_advice(r.get("batch_advice"), r["nodes"], r["devices_per_node"])
    return "\n".join(lines)


def _nodes(r: dict) -> str:
    """How the devices were read: nodes x devices per node, and, for more devices than one
    GPU node holds read as one node, how to say otherwise."""
    n, per = r["nodes"], r["num_devices"] // r["nodes"]
    one = (" read as one node; for several give --nodes N --gpus-per-node G"
           if n == 1 and per > ONE_NODE and r["platform"] != "cpu" else "")
    return f" = {n} node(s) x {per}" + (f",{one}" if one else "")
