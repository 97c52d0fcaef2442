"""`cgpt plan`: what one training step costs per device under a mode and mesh, without running it.

The real train step (`cgpt.train.loop.make_step` with the published optimizer) is lowered and
compiled for `jax.ShapeDtypeStruct` inputs that carry the mode's shardings, by the target
GPU's own compiler on compile-only devices (`--target`, `cgpt.plan.target`) or over emulated
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
import os
import subprocess
import sys
import tempfile

from tqdm.auto import tqdm

from cgpt.config import backend
from cgpt.config.model import REMATS
from cgpt.config.run import from_dict
from cgpt.config.units import parse_bytes
from cgpt.config.values import MAX_INT
from cgpt.plan import target
from cgpt.plan.planning import plan, plan_run, target_devices
from cgpt.plan.report import format_analytic, format_plan
from cgpt.sharding.allocation import gpus_present
from cgpt.sharding.axes import mesh_size
from cgpt.train.fit import HEADROOM, POOL_MARGIN

__all__ = ["add_arguments", "cmd_plan", "format_plan", "main", "plan", "plan_many", "plan_run",
           "register"]


# ---- arguments ----------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="preset name (see `cgpt list`); required")
    p.add_argument("--mode", default="auto",
                   help="data_parallel | weight_streaming | layer_pipelined | auto (default "
                        "auto, as in train: the placement train --mode auto picks)")
    p.add_argument("--mesh", default="", help="device mesh, e.g. data=16 or stage=8,data=2 "
                   "(default: empty, the mode's own layout over --devices)")
    p.add_argument("--devices", type=int,
                   help="emulated devices when --mesh is empty (default 8)")
    p.add_argument("--device-memory", help="memory per device (default: the --target GPU's "
                   "own, e.g. 79.1 GiB for h100; 80GB for --target cpu); a step fits in it "
                   f"less {100 * HEADROOM:.0f}%% headroom (outside the allocator's pool) and "
                   f"{100 * POOL_MARGIN:.0f}%% of the pool")  # %% for argparse
    p.add_argument("--target", choices=target.TARGETS,
                   help="the compiler the step is compiled with: a GPU's (h100, h200, a100: "
                        "compile-only devices of cgpt/plan/targets/NAME.txtpb, cuDNN attention; "
                        "needs JAX's CUDA plugin, requirements-gpu.txt) or cpu (emulated CPU "
                        "devices, XLA attention: overstates a GPU's memory). Default: h100 "
                        "when the plugin is installed and --platform is gpu, else cpu")
    p.add_argument("--batch", type=int, help="global batch in sequences (default: published)")
    p.add_argument("--micro-batch", type=int,
                   help="sequences per data replica per accumulation step (default: the "
                        "largest that fits, as train chooses)")
    p.add_argument("--micro-batches", type=int,
                   help="layer_pipelined: micro-batches per step (default: up to 4 x stages)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: n_ctx)")
    p.add_argument("--dtype", help="compute dtype: float32 | bfloat16 (default: the "
                   "--platform's, as train chooses there)")
    p.add_argument(
        "--platform", default="gpu", choices=("gpu", "tpu", "rocm", "cpu"),
        help="the devices planned for (default gpu): their dtype, attention and "
        "vocabulary padding (cgpt.config.backend); compiled on emulated CPU devices")
    p.add_argument("--remat", choices=("on", "off", *REMATS),
                   help="a rung of the remat ladder (on = full, off = save_dots; default: the "
                        "first of the platform's ladder whose step fits, as train chooses)")
    p.add_argument("--no-remat", action="store_true", help="the same as --remat off")
    p.add_argument("--host-offload", action="store_true", help=argparse.SUPPRESS)  # removed:
    # an error naming it, for a command line written before
    p.add_argument("--nodes", type=int, default=1,
                   help="nodes the devices are spread over (default 1): the mesh is hybrid, "
                        "only data (then stage) crosses nodes (cgpt.sharding.nodes); needs "
                        "--gpus-per-node")
    p.add_argument("--gpus-per-node", type=int,
                   help="devices per node; with --nodes the devices are nodes x this "
                        "(replaces --devices)")
    p.add_argument("--no-compile", action="store_true",
                   help="placement and analytic memory/traffic only (cgpt.sharding.auto's model, "
                        "cgpt.plan.analytic): seconds for any size, no JAX compile")
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
    n = _devices_of(args)
    if args.devices is not None and args.devices != n:  # never silently overridden
        raise ValueError(f"--devices {args.devices} disagrees with the {n} devices of --mesh "
                         "(or --nodes x --gpus-per-node); give one of them")
    return n


def _devices_of(args) -> int:
    spec = (args.mesh or "").strip()
    if args.nodes < 1:
        raise ValueError(f"--nodes {args.nodes} must be >= 1")
    if args.gpus_per_node is not None:
        if args.gpus_per_node < 1:
            raise ValueError(f"--gpus-per-node {args.gpus_per_node} must be >= 1")
        n = args.nodes * args.gpus_per_node
        if spec and mesh_size(spec) != n:
            raise ValueError(f"--mesh {spec!r} has {mesh_size(spec)} devices but --nodes "
                             f"{args.nodes} x --gpus-per-node {args.gpus_per_node} = {n}; make "
                             "the mesh sizes multiply to nodes x gpus-per-node")
        return n
    if args.nodes > 1:
        raise ValueError(f"--nodes {args.nodes} needs --gpus-per-node G (devices = nodes x G)")
    if not spec:
        if args.devices is not None and args.devices < 1:
            raise ValueError(f"--devices {args.devices} must be >= 1")
        return 8 if args.devices is None else args.devices
    return mesh_size(spec)


def _cpu_devices(n: int):
    """n CPU devices, emulated. Sets the count before JAX starts its backends; if they are
    already up with fewer devices, returns None (the caller re-runs itself in a subprocess)."""
    import jax  # loads JAX: only when this runs

    from cgpt.sharding import emulate_cpu_devices  # loads JAX: only when this runs

    emulate_cpu_devices(n)
    cpu = jax.devices("cpu")
    return cpu[:n] if len(cpu) >= n else None


def _remat(args) -> bool | str | None:
    if args.no_remat and args.remat == "on":
        raise ValueError("--no-remat contradicts --remat on; give one")
    return False if args.no_remat else {"on": True, "off": False}.get(args.remat, args.remat)


# ---- many runs in one process (the sweep's --dry-run) ---------------------------------------
def plan_many(requests: list[dict], progress: bool = True, tgt: str = "cpu") -> list[dict]:
    """`plan_run` of each request {"run": RunConfig dict, "devices": n, "device_memory":
    bytes, "nodes": k}, compiled for target `tgt` (`cgpt.plan.target`): a GPU's compile-only
    devices (in ONE fresh process with cgpt's GPU flags set before JAX starts), or emulated
    CPU devices, in this process if it can emulate enough of them, else in one fresh process
    (JAX fixes its device count at start). Each result is the plan's dict or {"error":
    message}, in request order."""
    if not requests:
        return []
    n = max(int(r["devices"]) for r in requests)
    devs = _cpu_devices(n) if tgt == "cpu" else None
    if devs is None:
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        if tgt == "cpu":
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n}"
        else:
            backend.gpu_xla_flags(env, "gpu")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "requests.json")
            with open(path, "w") as f:
                json.dump(requests, f)
            p = subprocess.run([sys.executable, "-m", "cgpt.plan", "--requests", path,
                                "--target", tgt], env=env, stdout=subprocess.PIPE, text=True)
        if p.returncode:
            raise RuntimeError(f"the dry run's plan process failed (exit {p.returncode}); "
                               "its error is printed above")
        return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    return _plan_each(requests, progress, lambda r: devs[:int(r["devices"])])


def _plan_each(requests: list[dict], progress: bool, devices_for) -> list[dict]:
    """`plan_run` of each request on `devices_for(request)`, errors as {"error": ...}."""
    out = []
    for r in tqdm(requests, desc="compiling each run's step", unit="run", disable=not progress,
                  file=sys.stderr, dynamic_ncols=True):
        try:
            run = from_dict(r["run"], "sweep run")
            out.append(plan_run(run, int(r["device_memory"]), devices_for(r),
                                nodes=int(r.get("nodes", 1))))
        except ValueError as e:
            out.append({"error": str(e)})
    return out


def _argv(args) -> list[str]:
    """The command line that reproduces `args` (for the re-run in a fresh process)."""
    out = []
    for key in ("model", "mode", "mesh", "devices", "device_memory", "batch", "micro_batch",
                "micro_batches", "seq_len", "dtype", "remat", "platform", "nodes",
                "gpus_per_node", "target"):
        v = getattr(args, key)
        if v is not None and v != "":
            out += [f"--{key.replace('_', '-')}", str(v)]
    out += [f"--{k.replace('_', '-')}" for k in ("no_remat", "host_offload", "json")
            if getattr(args, k)]
    return out


def cmd_plan(args) -> int:
    if args.requests:  # the sweep's dry run: JSON lines out, one per request
        with open(args.requests) as f:
            requests = json.load(f)
        tgt = args.target or "cpu"
        results = (plan_many(requests) if tgt == "cpu" else _plan_each(
            requests, True, lambda r: target_devices(tgt, int(r["devices"]),
                                                     int(r.get("nodes", 1)))))
        for r in results:
            print(json.dumps(r), flush=True)
        return 0
    if not args.model:
        raise ValueError("--model required, e.g. --model 1.3B (see `cgpt list`)")
    if args.seq_len is not None and args.seq_len < 1:  # 0 would read as "the default" below
        raise ValueError(f"--seq-len {args.seq_len} must be >= 1 (or leave it out: n_ctx)")

    for key in ("batch", "micro_batch", "micro_batches", "seq_len", "devices", "nodes",
                "gpus_per_node"):  # as train's values: a divisor search of 1e30 never ends
        v = getattr(args, key)
        if v is not None and v > MAX_INT:
            raise ValueError(f"--{key.replace('_', '-')} {v}: must be at most {MAX_INT:,}")
    n = _needed_devices(args)
    tgt = _target(args)
    memory = (parse_bytes(args.device_memory) if args.device_memory is not None
              else target.memory_bytes(tgt) if tgt != "cpu" else parse_bytes("80GB"))
    remat = _remat(args)
    if args.no_compile:  # arithmetic only: JAX is not started
        r = plan(args.model, args.mode, args.mesh, n, memory, args.batch, args.micro_batch,
                 args.micro_batches, args.seq_len, args.dtype, remat, args.host_offload,
                 platform=args.platform, nodes=args.nodes, compile=False)
        print(json.dumps(r) if args.json else format_analytic(r))
        return 0
    devs, env = _gpu_devices(args, tgt, n) if tgt != "cpu" else _emulated(args, n)
    if devs is None:  # JAX started before it could be set up for them: a fresh process
        return subprocess.run([sys.executable, "-m", "cgpt.plan", *_argv(args)],
                              env=env).returncode
    r = plan(args.model, args.mode, args.mesh, len(devs), memory, args.batch, args.micro_batch,
             args.micro_batches, args.seq_len, args.dtype, remat, args.host_offload,
             compile_devices=devs, platform=args.platform, nodes=args.nodes, log=_say)
    print(json.dumps(r) if args.json else format_plan(r))
    return 0


def _emulated(args, n: int) -> tuple[list | None, dict]:
    """(n emulated CPU devices, or None and the environment of a fresh process with them)."""
    from cgpt.sharding.mesh import MAX_EMULATED_DEVICES  # loads JAX: only when this runs

    if n > MAX_EMULATED_DEVICES:  # named as typed, before JAX allocates a device of them
        given = f"--mesh {args.mesh}" if (args.mesh or "").strip() else f"--devices {n}"
        raise ValueError(f"{given}: {n:,} devices is more than the {MAX_EMULATED_DEVICES} this "
                         "host can emulate on its CPU; plan a smaller mesh here, or add "
                         "--no-compile for the analytic plan")
    return _cpu_devices(n), dict(os.environ, JAX_PLATFORMS="cpu",
                                 XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")


def _gpu_devices(args, tgt: str, n: int) -> tuple[list | None, dict]:
    """(n compile-only devices of GPU `tgt`, cgpt's GPU flags in XLA_FLAGS before JAX starts
    and JAX on its CPU backend; or None and a fresh process's environment when JAX had
    read XLA_FLAGS already)."""
    flags = backend.gpu_xla_flags(os.environ, "gpu")
    if flags and "jax" in sys.modules:
        from jax._src import xla_bridge  # loads JAX: only when this runs

        if xla_bridge.backends_are_initialized():
            return None, dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS") or "cpu")
    if not os.environ.get("JAX_PLATFORMS") and not gpus_present():
        os.environ["JAX_PLATFORMS"] = "cpu"  # no GPU here: the plugin's backend would not start
    print(f"compiling {args.model}'s step for {n} x {tgt} ({args.nodes} node(s))...",
          file=sys.stderr, flush=True)
    return target_devices(tgt, n, args.nodes), {}


def _say(line: str) -> None:
    """A compile's progress, on stderr (stdout holds the plan, --json's object)."""
    print(line, file=sys.stderr, flush=True)


def _target(args) -> str:
    """--target, checked, or its default: the GPU's compiler when it is here."""
    if args.target is None:
        return target.default_target() if args.platform == "gpu" else "cpu"
    if args.target != "cpu" and args.platform != "gpu":
        raise ValueError(f"--target {args.target} compiles for an NVIDIA GPU but --platform is "
                         f"{args.platform}; give --platform gpu or --target cpu")
    return target.check(args.target)


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
