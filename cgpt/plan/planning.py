"""The plan of one run: its train step compiled (not run) for the target GPU's compiler
(`cgpt.plan.target`) or on emulated CPU devices, and what that step costs per device. See
`cgpt.plan.command` for what each number means."""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, NamedTuple

from cgpt import sharding
from cgpt.config import backend, flops
from cgpt.config.data import DataConfig
from cgpt.config.model import get_config, recomputes_forward, remat_value
from cgpt.config.run import MODES, RunConfig, TrainConfig
from cgpt.config.units import parse_bytes
from cgpt.config.values import MAX_INT
from cgpt.errors import TrainError
from cgpt.plan import cudnn, target
from cgpt.plan.analytic import plan_analytic
from cgpt.plan.costs import cost_report, step_advice
from cgpt.plan.hlo import hlo_totals
from cgpt.sharding.cost import axis_bytes
from cgpt.sharding.nodes import node_axes
from cgpt.train.resolve import resolve


def plan(model: str, mode: str, mesh: str = "", devices: int = 8,
         device_memory: int | str = "80GB", batch: int | None = None,
         micro_batch: int | None = None, micro_batches: int | None = None,
         seq_len: int | None = None, dtype: str | None = None, remat: bool | None = None,
         host_offload: bool = False, compile_devices=None, platform: str = "gpu", nodes: int = 1,
         compile: bool = True, log=None) -> dict:
    """Compile one train step on abstract arrays and report its per-device costs, on
    `compile_devices` (`target_devices`: a GPU target's or emulated CPU devices). Unset
    micro_batch / remat / dtype default as in `train` on `platform` (`cgpt.train.fit` chooses the
    first two, `cgpt.config.backend` the dtype). `nodes`: the devices' nodes (a hybrid mesh,
    `cgpt.sharding.nodes`); compile=False: the analytic plan (`cgpt.plan.analytic`), no JAX."""
    if mode not in MODES or mode == "single":
        raise ValueError(f"--mode {mode!r}; use one of {', '.join(sharding.SHARDED_MODES)}")
    cfg = get_config(model).replace(remat=remat)
    if dtype is not None:
        cfg = cfg.replace(compute_dtype=dtype)
    T = seq_len or cfg.n_ctx
    if not 1 <= T <= cfg.n_ctx:
        raise ValueError(f"--seq-len {T}: must be between 1 and the model's n_ctx={cfg.n_ctx}")
    budget = cfg.chinchilla_tokens()
    if batch and batch * T > budget:  # the run a plan times: one step at least
        raise ValueError(f"--batch {batch}: one step of {batch:,} x {T} tokens is more than "
                         f"{model}'s Chinchilla budget of {budget:,} tokens, the run a plan "
                         f"times; give --batch at most {budget // T:,} (at --seq-len {T})")
    run = RunConfig(preset=model, model=cfg, data=DataConfig(seq_len=T), train=TrainConfig(
        batch_size=batch, micro_batch=micro_batch, micro_batches=micro_batches, mode=mode,
        mesh=mesh, host_offload=host_offload))
    if not compile:
        return plan_analytic(run, device_memory, devices, nodes, platform)
    if batch and batch * T > MAX_INT:  # the compiled step counts its tokens in int32 (JAX's
        # OverflowError from deep inside the loss, after seconds of tracing)
        raise ValueError(f"--batch {batch}: {batch:,} sequences x {T} tokens is "
                         f"{batch * T:,} tokens per step, more than the {MAX_INT:,} a compiled "
                         f"step counts; give --batch at most {MAX_INT // T:,} (at --seq-len "
                         f"{T}), or add --no-compile for the analytic plan")
    if compile_devices is None:
        import jax  # loads JAX: only when this runs
        compile_devices = jax.devices("cpu")[:devices]
    return plan_run(run, device_memory, compile_devices, mode_flags=True, platform=platform,
                    nodes=nodes, log=log)


def target_devices(name: str, n: int, nodes: int = 1) -> list:
    """The devices a plan compiles on for target `name`: compile-only GPUs of its description
    (`cgpt.plan.target`), or this host's emulated CPU devices for "cpu"."""
    if name != "cpu":
        return target.devices(name, n, nodes)
    import jax  # loads JAX: only when this runs

    devs = jax.devices("cpu")
    if len(devs) < n:
        raise ValueError(f"{n} devices asked of the CPU target, {len(devs)} emulated here")
    return devs[:n]


class Step(NamedTuple):
    """A run's train step as `train` would build it, compiled."""

    strategy: Any  # cgpt.sharding strategy
    optimizer: Any  # optax.GradientTransformation
    plan: Any  # the fitted run: batch / micro-batch / accumulation (cgpt.train.resolve.Resolved)
    cfg: Any  # the ModelConfig it compiled with (remat and dtype resolved)
    compiled: Any  # jax.stages.Compiled
    choice: Any  # cgpt.train.fit.Choice: the bytes of the step and whether it fits
    compile_s: float


def compile_step(run, devices, memory: int, mode_flags: bool = False,
                 platform: str | None = None, nodes: int = 1, log=None) -> Step:
    """The resolved run (`cgpt.train.resolve`) placed on `devices`, its optimizer and its
    fitted, compiled step: the calls `train` makes. mode_flags: errors name plan's flags
    (--batch) rather than config keys (train.batch_size)."""
    from cgpt.train import fit, optim, setup  # loads JAX: only when this runs

    try:
        res = resolve(run, devices, platform=platform, device_memory=memory, nodes=nodes)
        strategy = setup.place(res, devices)
        optimizer = optim.make_optimizer(res.recipe, res.cfg)
        t0 = time.perf_counter()
        p, compiled, choice = fit.fit_step(res, strategy, optimizer, memory, log)
        compile_s = time.perf_counter() - t0
    except TrainError as e:
        msg = str(e)
        if mode_flags:
            msg = msg.replace("train.batch_size", "--batch").replace("train.micro_batch",
                                                                     "--micro-batch")
        raise ValueError(msg) from None
    return Step(strategy, optimizer, p, p.cfg, compiled, choice, compile_s)


def plan_run(run, device_memory: int | str, devices, mode_flags: bool = False,
             platform: str = "gpu", nodes: int = 1, log=None) -> dict:
    """`plan` of a full RunConfig (its mode, mesh, batch, micro-batch, remat) on `devices`,
    with `platform`'s kernels and dtype where the config says "auto" (as `train` there).
    mode_flags: errors name plan's flags (--batch) rather than config keys (train.batch_size)."""
    import jax  # loads JAX: only when this runs

    from cgpt.model.gpt import init_params  # loads JAX: only when this runs

    memory = parse_bytes(device_memory) if isinstance(device_memory, str) else int(device_memory)
    kernels = backend.kernels(run.model, platform)
    kernel = kernels.attention  # cuDNN's lowers only on a GPU
    if kernel == "cudnn":
        cudnn.check_shapes(kernels.compute_dtype, run.model.n_head, run.model.d_head)
    compiled_on = devices[0].platform  # "gpu" for a GPU target's compile-only devices
    run = dataclasses.replace(run, model=backend.for_platform(run.model, platform,
                                                              compile_on=compiled_on))
    T, t = run.data.seq_len, run.train
    strategy, optimizer, p, cfg, compiled, choice, compile_s = compile_step(
        run, devices, memory, mode_flags, platform, nodes, log)
    cudnn_layout = _check_cudnn_placement(strategy, p, cfg, T) if kernel == "cudnn" else None

    def shard_bytes(tree) -> int:
        return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
                   for x in jax.tree.leaves(tree))

    abstract_p = jax.eval_shape(lambda: init_params(cfg))
    a_params, a_opt = strategy.abstract_state(abstract_p,
                                              jax.eval_shape(optimizer.init, abstract_p))
    b = choice.bytes
    # the host of each device of the program, in its device assignment's (the mesh's) order
    hosts = ([d.process_index for d in strategy.mesh.devices.flat]
             if strategy.mesh is not None else None)
    hlo = hlo_totals(compiled.as_text(), hosts)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    n = strategy.num_devices
    mesh = dict(strategy.mesh.shape) if strategy.mesh is not None else {}  # None: one device
    axes = node_axes(mesh, nodes, strategy.mode)
    micro_batches = (strategy.micro_batches_for(p.micro_batch * p.replicas)
                     if strategy.mode == "layer_pipelined" else None)
    moved = axis_bytes(cfg, strategy.mode, mesh, nodes, p.batch_size, T,
                       p.micro_batch, recomputes_forward(cfg.remat), micro_batches)
    for a in axes:  # analytic, beside the compiled collective bytes (all axes together)
        axes[a]["bytes_per_step"] = moved.get(a, 0)
    return {
        "model": cfg.name, "mode": strategy.mode, "requested_mode": t.mode,
        "auto_reason": getattr(strategy, "auto_reason", None),
        "mesh": dict(strategy.mesh.shape) if strategy.mesh is not None else {},
        "num_devices": n,
        "n_params": cfg.num_params(), "batch": p.batch_size, "seq_len": T,
        "micro_batch": p.micro_batch, "accum": p.accum, "remat": remat_value(cfg.remat),
        "dtype": cfg.compute_dtype, "platform": platform, "attention": cfg.attention,
        # the device kind whose compiler produced every compiled figure below
        "compiled_for": devices[0].device_kind,
        "caveat": target.CPU_CAVEAT if compiled_on != "gpu" and platform == "gpu" else None,
        # the platform's attention kernel (cuDNN's is checked by rule: cgpt.plan.cudnn)
        "platform_attention": kernel, "cudnn_layout": cudnn_layout,
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
        "collective_bytes_by_dtype": hlo["collective_bytes_by_dtype"],
        # the compiled collectives whose device groups span processes (hosts: a compile-only
        # GPU topology's nodes), by kind; {} on one host
        "collective_bytes_across_hosts": hlo["collective_bytes_across_hosts"],
        # custom-call kernels (cuBLAS, cuDNN attention) and how often each runs per step
        "kernel_calls": hlo["kernel_calls"],
        "bubble_fraction": strategy.bubble_fraction,
        "micro_batches": micro_batches,
        "compile_s": round(compile_s, 2),
        "cost": cost_report(cfg, run.model.remat, strategy.mode, dict(strategy.mesh.shape)
                            if strategy.mesh is not None else {}, p, T, memory, platform,
                            micro_batches, nodes),
        # dims the mode's rules could not split (replicated over those mesh axes instead)
        "unsharded": strategy.describe()["unsharded"],
        "nodes": nodes, "axes": axes,
        "crosses_nodes": [a for a, v in axes.items() if v["crosses_nodes"]],
        # the nearest batches with a layout within cost.COMM_LIMIT, when this one has none
        "batch_advice": step_advice(cfg, run.model.remat, strategy.mode,
                                    dict(strategy.mesh.shape) if strategy.mesh is not None
                                    else {}, p, T, memory, platform, micro_batches, nodes),
    }


def _check_cudnn_placement(strategy, p, cfg, T: int) -> str:
    """q/k/v's layout under the strategy's activation rules (their batch, sequence, heads and
    head_dim as the model's constraints place them), checked against cuDNN's partitioning."""
    from cgpt.sharding.rules import logical_to_spec  # loads JAX: only when this runs

    mesh = strategy.mesh
    if mesh is None:
        return "one device: nothing split"
    shape = (p.micro_batch * p.replicas, T, cfg.n_head, cfg.d_head)
    spec = logical_to_spec(("act_batch", "act_seq", "act_heads", "act_head_dim"), shape,
                           strategy.rules, mesh)
    per_dim = [() if a is None else ((a,) if isinstance(a, str) else tuple(a))
               for a in (*spec, *(None,) * (4 - len(spec)))]
    return cudnn.check_partitioning(per_dim, dict(mesh.shape))
