"""`cgpt plan`'s text report of one plan (the dict `cgpt.plan.planning.plan` returns)."""
from __future__ import annotations

from cgpt.config.model import remat_value
from cgpt.config.units import fmt_bytes
from cgpt.train.fit import HEADROOM


def format_plan(r: dict) -> str:
    """The plan as the lines `cgpt plan` prints (without --json)."""
    b = r["per_device_bytes"]
    mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items())
    searched = r["fit"]["searched"]
    tried = r["fit"]["tried"]
    how = (f"searched {' and '.join(s.replace('_', '-') for s in searched)} over "
           f"{len(tried)} compiled step(s): "
           + ", ".join(f"{c['micro_batch']}/{remat_value(c['remat'])} "
                       f"{fmt_bytes(c['total'])}" for c in tried)) if searched else "as given"
    lines = [
        f"{r['model']} ({r['n_params'] / 1e9:.3g}B params), {r['mode']} on {mesh} "
        f"({r['num_devices']} devices of a {r['platform']}); batch {r['batch']} x "
        f"{r['seq_len']} tokens, {r['dtype']}, {r['attention']} attention",
        f"step          micro-batch {r['micro_batch']} x {r['accum']} accumulation steps, "
        f"remat {remat_value(r['remat'])} ({how})",
        "per device:",
        f"  params      {fmt_bytes(b['params'])}",
        f"  optimizer   {fmt_bytes(b['optimizer'])}",
        f"  temp        {fmt_bytes(b['temp'])}",
        f"  total       {fmt_bytes(b['total'])} of {fmt_bytes(r['usable_memory'])} usable "
        f"({fmt_bytes(r['device_memory'])} less {HEADROOM:.0%}): "
        f"{'fits' if r['fits'] else 'does NOT fit'}",
        f"FLOPs/step    {r['flops_per_step']:.3e} (compiled HLO, all devices)   "
        f"{r['flops_per_step_analytic']:.3e} (analytic)",
        f"collectives   {fmt_bytes(r['collective_bytes_per_step'])} per device per step"
        + "".join(f"\n  {k:19s} {fmt_bytes(v)}"
                  for k, v in sorted(r["collective_bytes_by_kind"].items())),
    ]
    if r["bubble_fraction"] is not None:
        lines.append(f"bubble        {r['bubble_fraction']:.1%} ({r['micro_batches']} "
                     f"micro-batches, {r['mesh'].get('stage', 1)} stages)")
    for u in r.get("unsharded") or []:
        lines.append(f"unsharded     {u['array']} {u['logical']}={u['dim']} not over "
                     f"{','.join(a for a in u['wanted'] if a not in u['got'])}: {u['why']}")
    if r.get("auto_reason"):
        lines.append(f"auto          {r['auto_reason']}")
    lines.append(f"compile       {r['compile_s']:.1f} s")
    return "\n".join(lines)
