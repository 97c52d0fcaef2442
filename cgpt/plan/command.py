"""`cgpt plan`: what one training step costs per device under a mode and mesh, without running it.

The real train step (`cgpt.train.step.make_step` with the published optimizer) is lowered and
compiled for `jax.ShapeDtypeStruct` inputs that carry the mode's shardings, over emulated
CPU devices: nothing is allocated, so a 13B model plans on a laptop. From the compiled
program it reports, per device:

  params / optimizer   bytes of this device's shards of the parameters and optimizer state
                       (from each array's sharding), and `temp`, XLA's scratch for one step
                       (`memory_analysis().temp_size_in_bytes`: activations, gradients,
                       gathered weights). total = arguments + outputs + temp - aliased
                       (donated) buffers, the peak estimate that also holds on CPU, where
                       XLA's own `peak_memory_in_bytes` leaves temp out.
  flops_per_step       the analytic count (`cgpt.config.flops`, whole step, all devices) beside
                       the count read from the compiled HLO: 2 x M x N x K of every `dot`,
                       multiplied by the trip counts of the while loops it sits in and
                       summed over devices (it includes remat recomputation and pipeline
                       bubbles). XLA's `cost_analysis()['flops']` is shown raw: it counts a
                       while-loop body once, so it undercounts scanned layers.
  collective bytes     every all-gather / all-reduce / reduce-scatter / collective-permute /
                       all-to-all in the compiled HLO, sized as the full buffer one device
                       holds (the gathered result of an all-gather, the unreduced input of
                       a reduce-scatter, the operand of the others), multiplied by the trip
                       counts (`known_trip_count`) of the loops enclosing it: the layer
                       scan, the accumulation scan and the pipeline's tick scan. It is the
                       volume each device sends or receives per step to first order; a ring
                       all-reduce moves up to 2(n-1)/n of it over each link.
  bubble               layer_pipelined's idle fraction (S-1)/(M+S-1).

CPU caveats: memory kinds are not modelled (host offload shows as device bytes), CPU XLA
all-reduces gradients where GPU/TPU XLA would reduce-scatter, and fusion decisions differ
from an accelerator's, so temp is an estimate of the same order, not a promise.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections import defaultdict

from cgpt.train import fit
from cgpt.config.run import parse_bytes  # noqa: F401 - `cgpt.plan.command.parse_bytes`, as before

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
                "c128": 16}
_SHAPE = re.compile(r"\b(pred|[sufc]\d+|bf16|f8\w*)\[([\d,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_OP = re.compile(r"(?:^|[\s}\])])([a-z][a-z0-9\-]*)\(")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s*\((.*)\)\s*->.*\{\s*$")


# ---- reading the compiled HLO ----------------------------------------------------------
def _shapes(text: str) -> list[tuple[str, tuple[int, ...]]]:
    return [(dt, tuple(int(d) for d in dims.split(",") if d)) for dt, dims in _SHAPE.findall(text)]


def _bytes(shape: tuple[str, tuple[int, ...]]) -> int:
    dt, dims = shape
    return _DTYPE_BYTES.get(dt, _DTYPE_BYTES.get(dt[:2], 4)) * math.prod(dims)


def _group_size(line: str) -> int:
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if m:
        sizes = dict((k.strip("' "), int(v)) for k, v in
                     (kv.split("=") for kv in m.group(1).split(",") if "=" in kv))
        return math.prod(sizes.get(a.strip("' "), 1) for a in m.group(2).split(",") if a.strip())
    m = re.search(r"replica_groups=\[([\d,]+)\]<=", line)
    if m:
        return int(m.group(1).split(",")[-1])
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    if m:
        return len([x for x in m.group(1).split(",") if x])
    return 1


def parse_hlo(text: str) -> dict:
    """Per computation: its collectives, dot FLOPs and the computations it calls (with the
    trip count for while bodies), from `compiled.as_text()`."""
    comps: dict[str, dict] = {}
    cur = None
    entry = None
    for raw in text.splitlines():
        h = _HEADER.match(raw)
        if h:
            cur = {"ops": [], "flops": 0, "calls": [], "types": {}}
            comps[h.group(1)] = cur
            if raw.startswith("ENTRY"):
                entry = h.group(1)
            for pname, ptype in re.findall(r"([\w.\-]+):\s*((?:pred|[sufc]\d+|bf16)\[[\d,]*\])",
                                           h.group(2)):
                cur["types"][pname] = _shapes(ptype)[0]
            continue
        m = _INSTR.match(raw) if cur is not None else None
        if not m:
            continue
        name, rest = m.groups()
        op_m = _OP.search(rest)
        if not op_m:
            continue
        op = op_m.group(1)
        result = _shapes(rest[:op_m.start(1)])
        if result:
            cur["types"][name] = result[0]
        base = op.removesuffix("-start")
        if base in COLLECTIVES and not op.endswith("-done"):
            sizes = [_bytes(s) for s in result]
            nbytes = max(sizes) if op.endswith("-start") else sum(sizes)
            if base == "reduce-scatter":
                nbytes *= _group_size(rest)
            cur["ops"].append((base, nbytes))
        elif op == "dot" and result:
            args = re.match(r"\s*%([\w.\-]+)", rest[op_m.end():])
            lhs = cur["types"].get(args.group(1)) if args else None
            cdims = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
            if lhs and cdims:
                k = math.prod(lhs[1][int(i)] for i in cdims.group(1).split(",") if i)
                cur["flops"] += 2 * math.prod(result[0][1]) * k
        if op == "while":
            trip = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', rest)
            body = re.search(r"body=%([\w.\-]+)", rest)
            if body:
                cur["calls"].append((body.group(1), int(trip.group(1)) if trip else 1, True))
        else:
            for callee in re.findall(r"(?:calls|to_apply|true_computation|false_computation)="
                                     r"%([\w.\-]+)", rest):
                cur["calls"].append((callee, 1, False))
            br = re.search(r"branch_computations=\{([^}]*)\}", rest)
            if br:
                for callee in re.findall(r"%([\w.\-]+)", br.group(1)):
                    cur["calls"].append((callee, 1, False))
    return {"computations": comps, "entry": entry}


def hlo_totals(text: str) -> dict:
    """Trip-count-weighted totals per device: collective bytes by kind (and how much of it
    sits inside while loops), collective op counts, and dot FLOPs."""
    parsed = parse_hlo(text)
    comps = parsed["computations"]
    by_kind: dict[str, int] = defaultdict(int)
    in_loop: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    flops = 0

    def walk(name: str, mult: int, looped: bool, depth: int = 0) -> None:
        nonlocal flops
        c = comps.get(name)
        if c is None or depth > 64:
            return
        flops += mult * c["flops"]
        for kind, nbytes in c["ops"]:
            by_kind[kind] += mult * nbytes
            count[kind] += 1
            if looped:
                in_loop[kind] += mult * nbytes
        for callee, trips, is_loop in c["calls"]:
            walk(callee, mult * trips, looped or is_loop, depth + 1)

    if parsed["entry"]:
        walk(parsed["entry"], 1, False)
    return {"collective_bytes": dict(by_kind), "collective_bytes_in_loops": dict(in_loop),
            "collective_ops": dict(count), "dot_flops": flops}


# ---- arguments ----------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="preset name (see `cgpt list`); required")
    p.add_argument("--mode", help="data_parallel | weight_streaming | layer_pipelined | auto; "
                   "required")
    p.add_argument("--mesh", default="", help="device mesh, e.g. data=16 or stage=8,data=2")
    p.add_argument("--devices", type=int, default=8,
                   help="emulated devices when --mesh is empty (default 8)")
    p.add_argument("--device-memory", default="80GB", help="memory per device (default 80GB); "
                   f"a step fits in it less {fit.HEADROOM:.0%} headroom")
    p.add_argument("--batch", type=int, help="global batch in sequences (default: published)")
    p.add_argument("--micro-batch", type=int,
                   help="sequences per data replica per accumulation step (default: the "
                        "largest that fits, as train chooses)")
    p.add_argument("--micro-batches", type=int,
                   help="layer_pipelined: micro-batches per step (default: up to 4 x stages)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: n_ctx)")
    p.add_argument("--dtype", help="compute dtype: float32 | bfloat16 (default: the "
                   "--platform's, as train chooses there)")
    p.add_argument("--platform", default="gpu", choices=("gpu", "tpu", "rocm", "cpu"),
                   help="the devices planned for (default gpu): their dtype, attention and "
                        "vocabulary padding (cgpt.config.backend); compiled on emulated CPU devices")
    p.add_argument("--remat", choices=("on", "off"),
                   help="recompute each layer in the backward pass (default: off if the step "
                        "fits, as train chooses)")
    p.add_argument("--no-remat", action="store_true", help="the same as --remat off")
    p.add_argument("--host-offload", action="store_true",
                   help="removed (weights are not streamed from pinned host memory): an error")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--requests", help=argparse.SUPPRESS)  # the sweep's dry run: a JSON file


def register(subparsers) -> argparse.ArgumentParser:
    """Add `plan` to the `cgpt` CLI's subparsers (handler in `args.func`)."""
    p = subparsers.add_parser("plan", help="per-device memory, FLOPs and communication of a "
                              "train step under a mode and mesh (compiled, not run)",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=cmd_plan)
    return p


def _needed_devices(args) -> int:
    from cgpt.sharding import mesh_size

    spec = (args.mesh or "").strip()
    if not spec:
        if args.devices < 1:
            raise ValueError(f"--devices {args.devices} must be >= 1")
        return args.devices
    return mesh_size(spec)


def _cpu_devices(n: int):
    """n CPU devices, emulated. Sets the count before JAX starts its backends; if they are
    already up with fewer devices, returns None (the caller re-runs itself in a subprocess)."""
    import jax

    from cgpt.sharding import emulate_cpu_devices

    emulate_cpu_devices(n)
    cpu = jax.devices("cpu")
    return cpu[:n] if len(cpu) >= n else None


def _remat(args) -> bool | None:
    if args.no_remat and args.remat == "on":
        raise ValueError("--no-remat contradicts --remat on; give one")
    return False if args.no_remat else {"on": True, "off": False}.get(args.remat)


# ---- the plan -----------------------------------------------------------------------------
def plan(model: str, mode: str, mesh: str = "", devices: int = 8,
         device_memory: int | str = "80GB", batch: int | None = None,
         micro_batch: int | None = None, micro_batches: int | None = None,
         seq_len: int | None = None, dtype: str | None = None, remat: bool | None = None,
         host_offload: bool = False, cpu_devices=None, platform: str = "gpu") -> dict:
    """Compile one train step on abstract arrays and report its per-device costs. Unset
    micro_batch / remat / dtype default as in `train` on `platform` (`cgpt.train.fit` chooses the
    first two, `cgpt.config.backend` the dtype)."""
    from cgpt import sharding
    from cgpt.config.model import get_config
    from cgpt.config.data import DataConfig
    from cgpt.config.run import MODES, RunConfig, TrainConfig

    if mode not in MODES or mode == "single":
        raise ValueError(f"--mode {mode!r}; use one of {', '.join(sharding.SHARDED_MODES)}")
    cfg = get_config(model).replace(remat=remat)
    if dtype is not None:
        cfg = cfg.replace(compute_dtype=dtype)
    T = seq_len or cfg.n_ctx
    if not 1 <= T <= cfg.n_ctx:
        raise ValueError(f"--seq-len {T}: must be between 1 and the model's n_ctx={cfg.n_ctx}")
    run = RunConfig(preset=model, model=cfg, data=DataConfig(seq_len=T), train=TrainConfig(
        batch_size=batch, micro_batch=micro_batch, micro_batches=micro_batches, mode=mode,
        mesh=mesh, host_offload=host_offload))
    if cpu_devices is None:
        import jax
        cpu_devices = jax.devices("cpu")[:devices]
    return plan_run(run, device_memory, cpu_devices, mode_flags=True, platform=platform)


def plan_run(run, device_memory: int | str, cpu_devices, mode_flags: bool = False,
             platform: str = "gpu") -> dict:
    """`plan` of a full RunConfig (its mode, mesh, batch, micro-batch, remat) on `cpu_devices`,
    with `platform`'s kernels and dtype where the config says "auto" (as `train` there).
    mode_flags: errors name plan's flags (--batch) rather than config keys (train.batch_size)."""
    import dataclasses

    import jax

    from cgpt.config import backend, flops
    from cgpt.config.run import parse_bytes
    from cgpt.errors import TrainError
    from cgpt.train import fit, optim, setup
    from cgpt.train.resolve import resolve

    memory = parse_bytes(device_memory) if isinstance(device_memory, str) else int(device_memory)
    run = dataclasses.replace(run, model=backend.for_platform(run.model, platform,
                                                              compile_on="cpu"))
    T, t = run.data.seq_len, run.train
    try:
        res = resolve(run, cpu_devices, platform=platform, device_memory=memory)
        strategy = setup.place(res, cpu_devices)
        optimizer = optim.make_optimizer(res.recipe, res.cfg)
        t0 = time.perf_counter()
        p, compiled, choice = fit.fit_step(res, strategy, optimizer, memory)
        compile_s = time.perf_counter() - t0
    except TrainError as e:
        msg = str(e)
        if mode_flags:
            msg = msg.replace("train.batch_size", "--batch").replace("train.micro_batch",
                                                                     "--micro-batch")
        raise ValueError(msg) from None
    cfg = p.cfg

    def shard_bytes(tree) -> int:
        return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
                   for x in jax.tree.leaves(tree))

    from cgpt.model.gpt import init_params

    abstract_p = jax.eval_shape(lambda: init_params(cfg))
    a_params, a_opt = strategy.abstract_state(abstract_p,
                                              jax.eval_shape(optimizer.init, abstract_p))
    b = choice.bytes
    hlo = hlo_totals(compiled.as_text())
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    n = strategy.num_devices
    return {
        "model": cfg.name, "mode": strategy.mode, "requested_mode": t.mode,
        "auto_reason": getattr(strategy, "auto_reason", None),
        "mesh": dict(strategy.mesh.shape) if strategy.mesh is not None else {},
        "num_devices": n,
        "n_params": cfg.num_params(), "batch": p.batch_size, "seq_len": T,
        "micro_batch": p.micro_batch, "accum": p.accum, "remat": bool(cfg.remat),
        "dtype": cfg.compute_dtype, "platform": platform, "attention": cfg.attention,
        "per_device_bytes": {
            "params": shard_bytes(a_params), "optimizer": shard_bytes(a_opt), "temp": b["temp"],
            "total": b["total"], "argument": b["argument"], "output": b["output"],
            "alias": b["alias"]},
        "device_memory": memory, "usable_memory": choice.usable, "fits": choice.fits,
        "fit": {"searched": [k for k, given in (("micro_batch", choice.micro_given),
                                                ("remat", choice.remat_given)) if not given],
                "tried": [{"micro_batch": c.micro_batch, "remat": c.remat,
                           "total": c.bytes["total"]} for c in choice.tried]},
        "flops_per_step": hlo["dot_flops"] * n,
        "flops_per_step_analytic": flops.train_flops_per_token(cfg, T) * p.batch_size * T,
        "xla_cost_analysis_flops_per_device": float((cost or {}).get("flops", 0.0)),
        "collective_bytes_per_step": sum(hlo["collective_bytes"].values()),
        "collective_bytes_by_kind": hlo["collective_bytes"],
        "collective_bytes_in_loops": hlo["collective_bytes_in_loops"],
        "collective_ops": hlo["collective_ops"],
        "bubble_fraction": strategy.bubble_fraction,
        "micro_batches": (strategy._micro(p.micro_batch * p.replicas)
                          if strategy.mode == "layer_pipelined" else None),
        "compile_s": round(compile_s, 2),
        # dims the mode's rules could not split (replicated over those mesh axes instead)
        "unsharded": strategy.describe()["unsharded"],
    }


def _gb(x: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"


def format_plan(r: dict) -> str:
    b = r["per_device_bytes"]
    mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items())
    searched = r["fit"]["searched"]
    tried = r["fit"]["tried"]
    how = (f"searched {' and '.join(s.replace('_', '-') for s in searched)} over "
           f"{len(tried)} compiled step(s): "
           + ", ".join(f"{c['micro_batch']}/{'on' if c['remat'] else 'off'} "
                       f"{_gb(c['total'])}" for c in tried)) if searched else "as given"
    lines = [
        f"{r['model']} ({r['n_params'] / 1e9:.3g}B params), {r['mode']} on {mesh} "
        f"({r['num_devices']} devices of a {r['platform']}); batch {r['batch']} x "
        f"{r['seq_len']} tokens, {r['dtype']}, {r['attention']} attention",
        f"step          micro-batch {r['micro_batch']} x {r['accum']} accumulation steps, "
        f"remat {'on' if r['remat'] else 'off'} ({how})",
        "per device:",
        f"  params      {_gb(b['params'])}",
        f"  optimizer   {_gb(b['optimizer'])}",
        f"  temp        {_gb(b['temp'])}",
        f"  total       {_gb(b['total'])} of {_gb(r['usable_memory'])} usable "
        f"({_gb(r['device_memory'])} less {fit.HEADROOM:.0%}): "
        f"{'fits' if r['fits'] else 'does NOT fit'}",
        f"FLOPs/step    {r['flops_per_step']:.3e} (compiled HLO, all devices)   "
        f"{r['flops_per_step_analytic']:.3e} (analytic)",
        f"collectives   {_gb(r['collective_bytes_per_step'])} per device per step"
        + "".join(f"\n  {k:19s} {_gb(v)}" for k, v in sorted(r["collective_bytes_by_kind"].items())),
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


# ---- many runs in one process (the sweep's --dry-run) ---------------------------------------
def plan_many(requests: list[dict], progress: bool = True) -> list[dict]:
    """`plan_run` of each request {"run": RunConfig dict, "devices": n, "device_memory":
    bytes}, in this process if it can emulate enough CPU devices, else in ONE fresh
    subprocess (JAX fixes its device count at start). Each result is the plan's dict or
    {"error": message}, in request order."""
    if not requests:
        return []
    n = max(int(r["devices"]) for r in requests)
    devs = _cpu_devices(n)
    if devs is None:
        import tempfile

        env = dict(os.environ, JAX_PLATFORMS="cpu",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "requests.json")
            with open(path, "w") as f:
                json.dump(requests, f)
            p = subprocess.run([sys.executable, "-m", "cgpt.plan", "--requests", path],
                               env=env, stdout=subprocess.PIPE, text=True)
        if p.returncode:
            raise RuntimeError(f"the dry run's plan process failed (exit {p.returncode}); "
                               "its error is printed above")
        return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    from tqdm.auto import tqdm

    from cgpt.config.run import from_dict

    out = []
    for r in tqdm(requests, desc="compiling each run's step", unit="run", disable=not progress,
                  file=sys.stderr, dynamic_ncols=True):
        try:
            run = from_dict(r["run"], "sweep run")
            out.append(plan_run(run, int(r["device_memory"]), devs[:int(r["devices"])]))
        except ValueError as e:
            out.append({"error": str(e)})
    return out


def _argv(args) -> list[str]:
    """The command line that reproduces `args` (for the re-run in a fresh process)."""
    out = []
    for key in ("model", "mode", "mesh", "devices", "device_memory", "batch", "micro_batch",
                "micro_batches", "seq_len", "dtype", "remat", "platform"):
        v = getattr(args, key)
        if v is not None and v != "":
            out += [f"--{key.replace('_', '-')}", str(v)]
    out += [f"--{k.replace('_', '-')}" for k in ("no_remat", "host_offload", "json")
            if getattr(args, k)]
    return out


def cmd_plan(args) -> int:
    if args.requests:  # the sweep's dry run: JSON lines out, one per request
        with open(args.requests) as f:
            for r in plan_many(json.load(f)):
                print(json.dumps(r), flush=True)
        return 0
    missing = [f for f in ("model", "mode") if not getattr(args, f)]
    if missing:
        raise ValueError(f"{' and '.join('--' + m for m in missing)} required, e.g. --model 1.3B "
                         "--mode weight_streaming")
    n = _needed_devices(args)
    memory = parse_bytes(args.device_memory)
    remat = _remat(args)
    devs = _cpu_devices(n)
    if devs is None:  # JAX already started with fewer CPU devices: run in a fresh process
        env = dict(os.environ, JAX_PLATFORMS="cpu",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")
        return subprocess.run([sys.executable, "-m", "cgpt.plan", *_argv(args)], env=env).returncode
    r = plan(args.model, args.mode, args.mesh, len(devs), memory, args.batch, args.micro_batch,
             args.micro_batches, args.seq_len, args.dtype, remat, args.host_offload,
             cpu_devices=devs, platform=args.platform)
    print(json.dumps(r) if args.json else format_plan(r))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m cgpt.plan ...`, the same as `python -m cgpt plan ...` (errors: one line, 2)."""
    ap = argparse.ArgumentParser(prog="cgpt plan", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return cmd_plan(args)
    except ValueError as e:
        print(f"cgpt plan: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
