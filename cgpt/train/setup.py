"""A run's inputs before step 0: its devices' strategy, its data (prepared once per job) and its
starting state (fresh, restored from its own checkpoint, or a branch's parent)."""
from __future__ import annotations

from pathlib import Path

from cgpt.data.batches import TokenData, load_data
from cgpt.errors import TrainError
from cgpt.sharding import distributed
from cgpt.sharding.mesh import build_mesh
from cgpt.sharding.strategies import SingleDevice, strategy_on
from cgpt.train import branch, checkpoint
from cgpt.train.step import all_finite


def place(res, devices):
    """The strategy of a resolved run (`cgpt.train.resolve.Resolved`) on `devices`."""
    if res.mode == "single":
        return SingleDevice(res.cfg)
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


def start_state(res, strategy, ckpt: checkpoint.Checkpointer, params, opt_state, out: Path, *,
                resume: bool, from_step: int | None, branch_from: tuple[Path, int] | None):
    """(first step, params, optimizer state): the fresh state given, the run's newest good
    checkpoint (`--resume`, optionally rewound to `from_step`), or a cooldown branch's parent
    state at its step."""
    start = 0
    if resume:
        if from_step is not None:
            if from_step not in ckpt.steps():
                raise TrainError(f"--from-step {from_step}: no kept checkpoint at step "
                                 f"{from_step}; kept: {ckpt.steps()}")
            ckpt.discard_after(from_step)
        got = ckpt.restore_latest(*strategy.abstract_state(params, opt_state))
        if got is not None:
            start, params, opt_state = got
            if not bool(all_finite((params, opt_state))):
                raise TrainError(f"checkpoint {start} in {out / checkpoint.CKPT_DIR} holds "
                                 "non-finite values; resume from an earlier one with "
                                 f"--from-step (kept: {ckpt.steps()}), or start over")
    if branch_from is not None and start == 0:  # a cooldown branch of a WSD run
        params, opt_state = branch.begin(branch_from, res.run, res.recipe, out,
                                         *strategy.abstract_state(params, opt_state))
        start = branch_from[1]
    return start, params, opt_state
