"""Training one run: set up, the loop, the summary.

The loop is written so that a SIGKILL at any moment loses at most the steps since the last
checkpoint: batches are a pure function of the step (`cgpt.data.batches`), checkpoints are
atomic (`cgpt.train.checkpoint`), and on `--resume` the metrics log is cut back to the
restored step, so the resumed run continues with exactly the losses an uninterrupted run would
have logged. What the run is (budget, batch split, recipe, dtype, mode and mesh) was decided
once by `cgpt.train.resolve`; the fit (`cgpt.train.fit`) compiled the step trained here.
"""
from __future__ import annotations

import contextlib
import math
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from cgpt import rundir
from cgpt.config.run import RunConfig
from cgpt.errors import Preempted, TrainError
from cgpt.sharding import distributed
from cgpt.train import ahead, evaluation, preempt, setup
from cgpt.train.launch import close_all
from cgpt.train.lifecycle import Lifecycle
from cgpt.train.mfu import Throughput
from cgpt.train.resolve import Resolved
from cgpt.train.step import make_step, state_finite


def train(run: RunConfig, out: str | Path, resume: bool = False, progress: bool = True,
          allow_changes: bool = False, from_step: int | None = None,
          branch_from: tuple[Path, int] | None = None) -> dict:
    """Train `run` into the run directory `out`; returns the summary (also `summary.json`).

    The directory is locked while this runs; a launch that fails before its config is written
    leaves nothing behind; storage errors end in one `RunDirError` saying what was kept.
    `allow_changes` and `from_step` (with `resume`) continue with changed train.* values
    (the "changeable" keys of `cgpt.config.run`) and from an earlier kept checkpoint.
    branch_from=(RUN, STEP): start from RUN's checkpoint at STEP, a cooldown branch of a WSD
    run (`cgpt.train.branch`).
    """
    distributed.initialize()  # a multi-process job: join it (no-op otherwise)
    # process 0 alone locks, writes and cleans the directory
    life = Lifecycle(run, out, resuming=resume, allow_changes=allow_changes,
                     writer=distributed.is_writer())
    with contextlib.ExitStack() as stack:
        life.open(stack)
        return _train(life, progress, from_step, branch_from)


def _train(life: Lifecycle, progress: bool, from_step: int | None,
           branch_from: tuple[Path, int] | None) -> dict:
    # ---- set up: the resolved run, its compiled step, data, state --------------------------
    wall0 = time.perf_counter()
    out, writer, resuming = life.out, life.writer, life.resuming
    if from_step is not None and not resuming:
        raise TrainError("--from-step continues a run: use it with --resume")
    life.check()
    distributed.barrier("config-read")  # every process has read config.yaml before it is written
    if life.finished is not None and from_step is not None:  # never a silent no-op
        raise TrainError(
            f"--from-step {from_step}: {out} is finished ({rundir.SUMMARY_FILE}); a rewind "
            f"would replace its result. To retrain from step {from_step}, move "
            f"{out / rundir.SUMMARY_FILE} away and rerun the same command")
    if life.finished is not None:  # finished already: nothing to redo
        return life.finished
    # the micro-batch x accumulation and remat whose compiled step fits (cgpt.train.fit): that
    # compiled step is the one trained; stop here, before any file is written, if none fits
    res, strategy, optimizer, step_fn, fitted, _ = setup.start_up(life.saved)
    if not fitted.fits:
        mesh = ",".join(f"{k}={v}" for k, v in res.mesh.items())
        raise TrainError(fitted.error(f"{res.cfg.name} ({res.cfg.num_params():,} params), "
                                      f"{res.mode} on {res.num_devices} device(s)"
                                      + (f" ({mesh})" if mesh else "")))
    if writer:
        print(f"{res.cfg.name}: {fitted.line()}", file=sys.stderr, flush=True)
    life.commit(res, setup.run_data(res, out, life.fresh))  # before the fit

    _, params, opt_state = strategy.compile_step(
        make_step(res.cfg, optimizer, strategy.loss, res.run.train.gns), optimizer,
        res.run.train.seed, res)
    start, params, opt_state = setup.start_state(
        res, strategy, life.ckpt, (params, opt_state), out, resume=resuming,
        from_step=from_step, branch_from=branch_from)
    life.begin(start)
    evaluate = _validation(res, strategy, life.data)

    # ---- the loop ----------------------------------------------------------------------------
    total = res.total_steps
    speed = Throughput.for_model(res.cfg, res.seq_len, res.num_devices)
    shape = (res.accum, res.micro_batch * res.replicas, res.seq_len + 1)  # a global batch
    rows = strategy.batch_rows(shape)  # the rows this process loads
    bar = tqdm(total=total, initial=start, disable=not (progress and writer), unit="step",
               dynamic_ncols=True, desc=f"{res.cfg.name} {res.tokens / 1e6:.3g}M tok")
    triggers = preempt.CheckpointTriggers(res.run.train.checkpoint_minutes).install()
    reader = ahead.Reader(speed, res.tokens_per_step, start)
    lrs = ahead.LearningRates(res.recipe, life)
    state = [params, opt_state]

    def dispatch(step: int, idle: bool):
        batch = life.data.train_batch(step, res.batch_size, rows=rows).reshape(
            res.accum, -1, res.seq_len + 1)
        if idle:  # the device is idle: the rates until the next read-at-once
            lrs.fill(step)
        state[0], state[1], m = step_fn(*state, strategy.shard_batch(batch, shape))
        return m

    def finish(step: int, m: dict, dispatched: float, at_once: bool) -> bool:
        """Read `step`'s scalars, stop on a non-finite one before any write, log it (with an
        evaluation when `at_once`: the state is this step's)."""
        values = reader.read(step, m, dispatched)
        loss, grad_norm = float(values["loss"]), float(values["grad_norm"])
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):  # before any write
            raise life.nonfinite(step, loss, grad_norm)
        done = step + 1
        if life.logged(done):
            evaluated = at_once and life.evaluates(done)
            life.record(done, values, lrs.pop(step), speed,
                        evaluate(state[0]) if evaluated else None)
        bar.set_postfix(loss=f"{loss:.3f}", val=f"{life.val_loss:.3f}",
                        tok_s=f"{speed.tokens_per_s:,.0f}", mfu=f"{speed.mfu():.1%}",
                        refresh=False)
        bar.update(1)
        return True

    def at_state(done: int, save_now: bool, stop_signal: int) -> None:
        if life.saves(done, save_now):
            if not state_finite(tuple(state)):  # the last guard before disk
                raise life.unsafe_state(done)
            life.save(done, *state)
            triggers.saved()
        if stop_signal and done < total:
            raise Preempted(stop_signal, done, out)

    def needs_state(done: int, save_now: bool, stop_signal: int) -> bool:
        # (or the learning rates must be refilled while the device is idle)
        return life.needs_state(done, save_now, stop_signal) or done == lrs.filled

    try:
        ahead.run(start, total, triggers, dispatch, finish, needs_state, at_state)
    finally:  # every closer runs even when a full disk fails several; the first error wins
        close_all(triggers.uninstall, bar.close, life.close)
    params = state[0]

    # ---- the summary -------------------------------------------------------------------------
    val_loss = life.val_loss
    if math.isnan(val_loss):  # resumed at (or one step before) its end: no fresh evaluation
        val_loss = evaluate(params)
    return life.finish(val_loss, speed, time.perf_counter() - wall0,
                       {**strategy.describe(), **fitted.describe(), **distributed.job_layout()})


def _validation(res: Resolved, strategy, data):
    """evaluate(params) -> the run's validation loss (`cgpt.train.evaluation`)."""
    eval_fn = strategy.compile_eval(res.cfg)
    bs = evaluation.eval_batch_size(res, data.num_val_sequences)
    evaluate = evaluation.validation(
        res, data, lambda p, batch, shape: eval_fn(p, strategy.shard_eval_batch(batch, shape)),
        rows=strategy.batch_rows((bs, res.seq_len + 1)) if bs else slice(None))
    return lambda params: float(evaluate(params))
