"""Training one run: set up, the loop, the summary; the loop (`run`) is a fused group's too.

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
from typing import Any, Protocol, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from cgpt import record, rundir
from cgpt.config.run import RunConfig
from cgpt.errors import Preempted, TrainError
from cgpt.sharding import distributed
from cgpt.train import evaluation, optim, preempt, setup
from cgpt.train.launch import close_all
from cgpt.train.lifecycle import Lifecycle
from cgpt.train.mfu import Throughput
from cgpt.train.notice import Notice, candidates
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
        if writer:
            print(f"{out} is finished already ({rundir.SUMMARY_FILE}): nothing to train",
                  file=sys.stderr, flush=True)
        return life.finished
    # the micro-batch x accumulation and remat whose compiled step fits (cgpt.train.fit): that
    # compiled step is the one trained; stop here, before any file is written, if none fits
    name = life.saved.model.name
    with Notice(f"{name}: compiling candidate training steps to choose the micro-batch and "
                "remat that fit the device's memory (one compile each; minutes on a busy "
                "CPU, seconds from the compilation cache)", enabled=writer) as compiling:
        res, strategy, optimizer, step_fn, fitted, _ = setup.start_up(life.saved)
    if not fitted.fits:
        mesh = ",".join(f"{k}={v}" for k, v in res.mesh.items())
        raise TrainError(fitted.error(f"{res.cfg.name} ({res.cfg.num_params():,} params), "
                                      f"{res.mode} on {res.num_devices} device(s)"
                                      + (f" ({mesh})" if mesh else "")))
    if writer:
        print(f"{res.cfg.name}: {fitted.line()}; compiled in {compiling.seconds:.0f} s",
              file=sys.stderr, flush=True)
        if len(fitted.tried) > 1:  # each compiled candidate's result, in compile order
            print(candidates(res.cfg.name, fitted), file=sys.stderr, flush=True)
    with Notice(f"{name}: preparing the data ({res.run.data.source}: its tokenizer and token "
                "store, cached after the first time)", enabled=writer):
        life.commit(res, setup.run_data(res, out, life.fresh))  # before the fit
    with Notice(f"{name}: compiling the initialisation", enabled=writer):
        _, params, opt_state = strategy.compile_step(
            make_step(res.cfg, optimizer, strategy.loss, res.run.train.gns), optimizer,
            res.run.train.seed, res)
    start, params, opt_state = setup.start_state(
        res, strategy, life.ckpt, (params, opt_state), out, resume=resuming,
        from_step=from_step, branch_from=branch_from)
    life.begin(start)
    if writer and not life.fresh:  # resumed (by default for a run directory): say from where
        print(f"{res.cfg.name}: resuming the run in {out} from step {start} of "
              f"{res.total_steps} (its config matches; --no-resume refuses a run directory)",
              file=sys.stderr, flush=True)
    evaluate = _validation(res, strategy, life.data)

    # ---- the loop ----------------------------------------------------------------------------
    speed = Throughput.for_model(res.cfg, res.seq_len, res.num_devices)
    alone = Alone(res, strategy, step_fn, life.data, [params, opt_state], evaluate)
    # the rate and ETA: the mean over the steps after the first (smoothing=0), so that neither
    # the first step nor the first evaluation's compile is in them (`_log`)
    bar = tqdm(total=res.total_steps, initial=start, disable=not (progress and writer),
               unit="step", dynamic_ncols=True,
               desc=f"{res.cfg.name} {res.tokens / 1e6:.3g}M tok", smoothing=0)
    triggers = preempt.CheckpointTriggers(res.run.train.checkpoint_minutes).install()
    try:
        run([life], alone, start, speed, triggers, bar)
    finally:  # every closer runs even when a full disk fails several; the first error wins
        close_all(triggers.uninstall, bar.close, life.close)
    params = alone.state[0]

    # ---- the summary -------------------------------------------------------------------------
    val_loss = life.val_loss
    if math.isnan(val_loss):  # resumed at (or one step before) its end: no fresh evaluation
        val_loss = evaluate(params)
    return life.finish(val_loss, speed, time.perf_counter() - wall0,
                       {**strategy.describe(), **fitted.describe(), **distributed.job_layout()})


class Program(Protocol):
    """The device side of what `run` trains: a run alone (`Alone`) or a fused group of M
    members (`cgpt.train.fused_loop.Group`); a run alone is member 0 of one."""

    def batch(self, step: int) -> Any:
        """`step`'s batch on the host (a pure function of the step)."""

    def step(self, batch) -> dict:
        """Queue one step on `batch`, updating the state; its outputs (device arrays)."""

    def lr(self, k: int, step: int) -> float:
        """Member `k`'s logged learning rate at `step`, without a device call."""

    def evaluate(self) -> Sequence[float]:
        """Each member's validation loss at the current state."""

    def finite(self) -> Sequence[bool]:
        """Whether each member's state is finite: the last guard before disk."""

    def member_state(self, k: int) -> tuple:
        """Member `k`'s (params, opt_state), to save."""

    def fail(self, k: int, err: TrainError) -> None:
        """Member `k` failed with `err`: a run alone raises it; a member stops alone."""


def run(lives: list[Lifecycle], program: Program, start: int, speed: Throughput, triggers,
        bar) -> None:
    """Train from `start` to the end: the one loop of a run alone (`lives`: its Lifecycle,
    `program`: `Alone`) and of a fused group (one Lifecycle per member, `program`: a
    `cgpt.train.fused_loop.Group`). The Lifecycles say when a step is logged, evaluated and
    saved; `program` holds the device state and does the device work. A member whose step k
    is not finite fails there before anything of k is written (`program.fail`: a run alone
    stops with the error; a fused member stops alone, masked in the step after next); k+1,
    queued already, is never logged or saved for it. `triggers.poll` runs once a step, in
    every process of a job (`cgpt.train.preempt`); `bar`: the progress bar."""
    total = lives[0].res.total_steps
    reader = Reader(speed, lives[0].res.tokens_per_step, start)
    late = None  # (step, outputs, dispatch time): the step to read once the next is queued
    for step in range(start, total):
        t0 = time.perf_counter()
        batch = program.batch(step)  # fetch the batch
        out = program.step(batch)  # queue the step
        # One step late: the record of the step before is read only now that this one is
        # queued, so the device computes while the host reads, logs and loads the next batch
        # (reading first would leave the device idle for the transfer and all that host work).
        # A step whose state is used at once (evaluated, saved, a stop, the last) is read and
        # logged before the next one is queued, below.
        if late is not None and not _log(lives, program, reader, bar, *late, at_once=False):
            return  # every member failed
        late = None
        done = step + 1
        save_now, stop_signal = triggers.poll(step)  # a scheduler's signal, or the interval
        if not any(lives[k].needs_state(done, save_now, stop_signal) for k in _running(lives)):
            late = (step, out, t0)  # read once the next step is queued
            continue
        if not _log(lives, program, reader, bar, step, out, t0, at_once=True):
            return
        saves = [k for k in _running(lives) if lives[k].saves(done, save_now)]  # checkpoint
        if saves:
            finite = program.finite()  # the last guard before disk
            for k in saves:
                if finite[k]:
                    lives[k].save(done, *program.member_state(k))
                else:
                    program.fail(k, lives[k].unsafe_state(done))
            triggers.saved()
        if stop_signal and done < total:  # stop
            raise Preempted(stop_signal, done, ", ".join(str(life.out) for life in lives))


def _running(lives: list[Lifecycle]) -> list[int]:
    """The members still training (a failed one has its result)."""
    return [k for k, life in enumerate(lives) if life.result is None]


def _log(lives: list[Lifecycle], program: Program, reader: "Reader", bar, step: int, out: dict,
         dispatched: float, at_once: bool) -> bool:
    """Read `step`'s record (the step's one host sync) and log it: a member not finite there
    fails before anything of it is written; the others' logged steps are logged, with an
    evaluation when `at_once` (the state is this step's). False when no member is left."""
    values = reader.read(step, out, dispatched)
    got = [member(values, k) for k in range(len(lives))]
    for k in _running(lives):
        loss, grad_norm = float(got[k]["loss"]), float(got[k]["grad_norm"])
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):  # before any write
            program.fail(k, lives[k].nonfinite(step, loss, grad_norm))
    running = _running(lives)
    if not running:
        return False
    done = step + 1
    evals = [k for k in running if at_once and lives[k].evaluates(done)]
    t0 = time.perf_counter()
    val = program.evaluate() if evals else None
    if evals and not reader.evaluated:  # the first evaluation compiles: not a step's cost
        reader.evaluated = True
        if not bar.disable:
            bar.start_t += time.perf_counter() - t0
    for k in running:
        if lives[k].logged(done):
            lives[k].record(done, got[k], program.lr(k, step), reader.speed,
                            float(val[k]) if k in evals else None)
    losses = [float(got[k]["loss"]) for k in running]
    bar.set_postfix(loss=f"{sum(losses) / len(losses):.3f}",
                    val=f"{sum(lives[k].val_loss for k in running) / len(running):.3f}",
                    tok_s=f"{reader.speed.tokens_per_s * len(running):,.0f}",
                    mfu=f"{reader.speed.mfu():.1%}", refresh=False)
    if step == reader.first and not bar.disable:  # the rate from the next step on: no ETA
        bar.start_t, bar.initial = time.time(), bar.n + 1  # from a step that compiled
    bar.update(1)
    return True


class Alone:
    """A run alone's `Program`: its state, its compiled step, its evaluation."""

    def __init__(self, res: Resolved, strategy, step_fn, data, state: list, evaluate):
        self.res, self.strategy, self.step_fn, self.data = res, strategy, step_fn, data
        self.state, self._evaluate = state, evaluate
        self.shape = (res.accum, res.micro_batch * res.replicas, res.seq_len + 1)  # global
        self.rows = strategy.batch_rows(self.shape)  # the rows this process loads

    def batch(self, step: int):
        res = self.res
        return self.data.train_batch(step, res.batch_size, rows=self.rows).reshape(
            res.accum, -1, res.seq_len + 1)

    def step(self, batch) -> dict:
        self.state[0], self.state[1], m = self.step_fn(
            *self.state, self.strategy.shard_batch(batch, self.shape))
        return m

    def lr(self, k: int, step: int) -> float:
        return optim.lr_at(self.res.recipe, step)

    def evaluate(self) -> list[float]:
        return [self._evaluate(self.state[0])]

    def finite(self) -> list[bool]:
        return [state_finite(tuple(self.state))]

    def member_state(self, k: int):
        return self.state

    def fail(self, k: int, err: TrainError):
        raise err


class Reader:
    """Reads queued steps' scalars and times the steps for `speed`.

    A step's time runs from when the device could start it (its dispatch, or the end of the
    step before it when that was still running) to when its scalars arrived: with a queue that
    is the device's step time, host work included only where the device waited on it."""

    def __init__(self, speed: Throughput, tokens_per_step: int, first_step: int):
        self.speed, self.tokens, self.first = speed, tokens_per_step, first_step
        self.ready = None  # when the last read step's scalars arrived
        self.evaluated = False  # an evaluation ran (and so was compiled)

    def read(self, step: int, metrics: dict, dispatched: float) -> dict:
        """The step record's device fields (`cgpt.record`) that `step`'s output `metrics`
        holds, on the host (scalars, or [M] arrays for a fused group: `member`), dispatched at
        perf_counter() time `dispatched`; the one host sync of a step."""
        got = jax.device_get({k: metrics[k] for k in record.names(source="device")
                              if k in metrics})
        now = time.perf_counter()
        began = dispatched if self.ready is None else max(dispatched, self.ready)
        self.ready = now
        if step > self.first:  # the first step includes compilation
            self.speed.add(now - began, self.tokens)
        return got


def member(values: dict, k: int) -> dict:
    """Member `k`'s values of `Reader.read` (a run alone's scalars are member 0's)."""
    return {name: np.reshape(v, -1)[k] for name, v in values.items()}


def _validation(res: Resolved, strategy, data):
    """evaluate(params) -> the run's validation loss (`cgpt.train.evaluation`)."""
    eval_fn = strategy.compile_eval(res.cfg)
    bs = evaluation.eval_batch_size(res, data.num_val_sequences)
    evaluate = evaluation.validation(
        res, data, lambda p, batch, shape: eval_fn(p, strategy.shard_eval_batch(batch, shape)),
        rows=strategy.batch_rows((bs, res.seq_len + 1)) if bs else slice(None))
    return lambda params: float(evaluate(params))
