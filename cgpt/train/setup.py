"""A run's inputs before step 0: its resolved, placed and fitted step (`start_up`, shared by
`train` and the sweep's compile-ahead, `cgpt.train.warm`), its data (prepared once per job)
and its starting state (fresh, restored from its own checkpoint, or a branch's parent)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import jax

from cgpt import rundir
from cgpt.config.run import RunConfig, parse_bytes
from cgpt.data.batches import TokenData, load_data
from cgpt.errors import TrainError
from cgpt.sharding import distributed
from cgpt.sharding.mesh import build_mesh, device_memory_bytes, job_nodes
from cgpt.sharding.strategies import SingleDevice, strategy_on
from cgpt.train import branch, checkpoint, fit, optim
from cgpt.train.resolve import Resolved, resolve
from cgpt.train.step import state_finite


class StartUp(NamedTuple):
    """What a run trains with, decided before any file is written."""

    res: Resolved  # fitted: its micro-batch, accumulation and remat chosen
    strategy: Any  # its devices' strategy (`cgpt.sharding.strategies`)
    optimizer: Any  # optax.GradientTransformation
    step: Any  # the compiled step (jax.stages.Compiled) the fit chose
    fitted: fit.Choice  # the fit's choice; `fitted.fits` False: nothing fits
    memory: int  # bytes per device the fit assumed


def start_up(run: RunConfig) -> StartUp:
    """Resolve `run` on this job's devices, place it, build its optimizer and compile the step
    that fits (`cgpt.train.fit`): `train`'s start-up, and the compile-ahead's, so both compile
    the same program. Every process of a multi-process job takes the smallest memory."""
    memory = distributed.smallest_mib(device_memory(run.train))  # one step for every process
    devices = jax.devices()
    res = resolve(run, devices, device_memory=memory, num_processes=jax.process_count(),
                  nodes=job_nodes(devices))
    strategy = place(res, devices)
    optimizer = optim.make_optimizer(res.recipe, res.cfg)
    res, step, fitted = fit.fit_step(res, strategy, optimizer, memory)
    return StartUp(res, strategy, optimizer, step, fitted, memory)


def device_memory(train) -> int:
    """Bytes per device a run's step must fit: `train.device_memory` when set, else what this
    process's first device reports."""
    return (parse_bytes(train.device_memory, "train.device_memory") if train.device_memory
            else device_memory_bytes())


def place(res, devices):
    """The strategy of a resolved run (`cgpt.train.resolve.Resolved`) on `devices`."""
    if res.mode == "single":
        return SingleDevice(res.cfg, devices[0] if devices else None)
    t = res.run.train
    return strategy_on(build_mesh(res.mesh, devices, res.nodes), res.mode, res.cfg,
                       res.batch_size, t.micro_batch, t.micro_batches, res.mesh_reason,
                       res.auto_reason, res.nodes)


def run_data(res, out: Path, fresh: bool) -> TokenData:
    """The run's tokens: process 0 prepares them once, the others then read them; a fresh run
    never takes a failed launch's tokenizer from `out`."""
    data = distributed.first("data preparation",
                             lambda: load_data(res.run.data, None if fresh else out))
    cfg = res.cfg
    if data.vocab_size != cfg.vocab_size:  # unused rows would inflate N, D and FLOPs
        raise TrainError(f"the tokenizer has {data.vocab_size} tokens but model.vocab_size is "
                         f"{cfg.vocab_size}; set model.vocab_size={data.vocab_size} (or a "
                         f"tokenizer of {cfg.vocab_size} tokens, e.g. data.vocab_size="
                         f"{cfg.vocab_size} with more text)")
    return data


def start_state(res, strategy, ckpt: checkpoint.Checkpointer, state, out: Path, *,
                resume: bool, from_step: int | None, branch_from: tuple[Path, int] | None):
    """(first step, params, optimizer state): the fresh `state` (params, optimizer state)
    given, the run's newest good checkpoint (`--resume`, optionally rewound to `from_step`),
    or a cooldown branch's parent state at its step."""
    start, (params, opt_state) = 0, state
    if resume:
        if from_step is not None:
            if from_step not in ckpt.steps():
                raise TrainError(f"--from-step {from_step}: no kept checkpoint at step "
                                 f"{from_step}; kept: {ckpt.steps()}")
            ckpt.discard_after(from_step)
        got = ckpt.restore_latest(*strategy.abstract_state(params, opt_state))
        if got is not None:
            start, params, opt_state = got
            if not state_finite((params, opt_state)):
                raise TrainError(f"checkpoint {start} in {out / rundir.CKPT_DIR} holds "
                                 "non-finite values; resume from an earlier one with "
                                 f"--from-step (kept: {ckpt.steps()}), or start over")
    if branch_from is not None and start == 0:  # a cooldown branch of a WSD run
        params, opt_state = branch.begin(branch_from, res.run, res.recipe, out,
                                         *strategy.abstract_state(params, opt_state))
        start = branch_from[1]
    return start, params, opt_state
