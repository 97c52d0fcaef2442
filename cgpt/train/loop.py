"""Training one run: set up, the loop, the summary.

The loop is written so that a SIGKILL at any moment loses at most the steps since the last
checkpoint: batches are a pure function of the step (`cgpt.data.batches`), checkpoints are
atomic (`cgpt.train.checkpoint`), and on `--resume` the metrics log is cut back to the
restored step, so the resumed run continues with exactly the losses an uninterrupted run would
have logged. What the run is (budget, batch split, recipe, dtype, mode and mesh) was decided
once by `cgpt.train.resolve`; the fit (`cgpt.train.fit`) compiled the step trained here.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from cgpt.config.run import RunConfig
from cgpt.errors import TrainError
from cgpt.fileio import atomic_write_text, probe_writable
from cgpt.sharding import distributed
from cgpt.train import ahead, checkpoint, metrics, preempt, resume, rundir, setup, summary
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
    (`cgpt.train.resume.CHANGEABLE_KEYS`) and from an earlier kept checkpoint.
    branch_from=(RUN, STEP): start from RUN's checkpoint at STEP, a cooldown branch of a WSD
    run (`cgpt.train.branch`).
    """
    out = Path(out)
    distributed.initialize()  # a multi-process job: join it (no-op otherwise)
    owner = distributed.is_writer()  # process 0 alone locks, writes and cleans the directory
    new_dirs = rundir.first_missing(out) if owner else None
    if owner:
        try:
            probe_writable(out)
        except OSError as e:
            raise TrainError(f"output directory {out} is not writable ({e.strerror or e}); "
                             "choose another --out") from e
    with rundir.Launch(out, new_dirs, lock=owner) as launch:
        return _train(run, out, resume, progress, launch, allow_changes, from_step, branch_from)


def _train(run: RunConfig, out: Path, resuming: bool, progress: bool, launch: rundir.Launch,
           allow_changes: bool, from_step: int | None,
           branch_from: tuple[Path, int] | None) -> dict:
    from tqdm.auto import tqdm

    # ---- set up: the resolved run, its compiled step, data, state --------------------------
    wall0 = time.perf_counter()
    writer = distributed.is_writer()  # process 0 alone writes the run directory's files
    fresh = rundir.check_launch(out, resuming)  # else a committed run: its files count
    prior = None if fresh or not resuming else checkpoint.read_run_config(out)
    if from_step is not None and not resuming:
        raise TrainError("--from-step continues a run: use it with --resume")
    saved = resume.check_config(run, out, resuming, allow_changes)
    distributed.barrier("config-read")  # every process has read config.yaml before it is written
    if resuming and (out / summary.SUMMARY_FILE).exists():  # finished already: nothing to redo
        return summary.read(out)
    # the micro-batch x accumulation and remat whose compiled step fits (cgpt.train.fit): that
    # compiled step is the one trained; stop here, before any file is written, if none fits
    res, strategy, optimizer, step_fn, fitted, _ = setup.start_up(saved)
    if not fitted.fits:
        mesh = ",".join(f"{k}={v}" for k, v in res.mesh.items())
        raise TrainError(fitted.error(f"{res.cfg.name} ({res.cfg.num_params():,} params), "
                                      f"{res.mode} on {res.num_devices} device(s)"
                                      + (f" ({mesh})" if mesh else "")))
    if writer:
        print(f"{res.cfg.name}: {fitted.line()}", file=sys.stderr, flush=True)
    data = setup.run_data(res, out, fresh)
    if writer:
        if fresh:
            launch.created.append(out / "tokenizer.json")
            data.save_tokenizer(out)
        atomic_write_text(out / checkpoint.CONFIG_FILE, saved.to_yaml())  # before the fit
    launch.commit()  # from here on the directory holds a resumable run

    _, params, opt_state = strategy.compile_step(
        make_step(res.cfg, optimizer, strategy.loss), optimizer, res.run.train.seed, res)
    ckpt = checkpoint.Checkpointer(out, keep=res.run.train.keep_checkpoints)
    start, params, opt_state = setup.start_state(
        res, strategy, ckpt, params, opt_state, out, resume=resuming, from_step=from_step,
        branch_from=branch_from)
    changes = []
    if writer:
        rundir.resume_log(out / rundir.METRICS_FILE, start, res.total_steps)
        changes = resume.record_changes(out, prior, saved, start)
    evaluate = _validation(res, strategy, data)

    # ---- the loop ----------------------------------------------------------------------------
    t, total = res.run.train, res.total_steps
    eval_every = t.eval_every or max(1, total // 10)
    ckpt_every = t.ckpt_every or max(1, total // 10)
    window = rundir.train_loss_window(total)  # the last steps, all logged: train_loss
    speed = Throughput.for_model(res.cfg, res.seq_len, res.num_devices)
    shape = (res.accum, res.micro_batch * res.replicas, res.seq_len + 1)  # a global batch
    rows = strategy.batch_rows(shape)  # the rows this process loads
    log = metrics.MetricsLog(out, start, write=writer)
    val_loss = math.nan
    bar = tqdm(total=total, initial=start, disable=not (progress and writer), unit="step",
               dynamic_ncols=True, desc=f"{res.cfg.name} {res.tokens / 1e6:.3g}M tok")
    triggers = preempt.CheckpointTriggers(t.checkpoint_minutes).install()
    reader = ahead.Reader(speed, res.tokens_per_step, start)

    def logged(done: int) -> bool:  # every log_every steps, evaluations, the last steps
        return (done % t.log_every == 0 or done % eval_every == 0 or done == total
                or done > total - window)

    lrs = ahead.LearningRates(res.recipe, logged, total, eval_every, ckpt_every)

    def finish(step: int, m: dict, dispatched: float, state=None) -> None:
        """Read `step`'s scalars (a step late unless `state`, its updated params, is passed for
        an evaluation), stop on a non-finite one before any write, log it."""
        nonlocal val_loss
        loss, grad_norm = reader.read(step, m, dispatched)
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):  # before any write
            what, note = ((f"loss is {loss}", "") if not math.isfinite(loss) else
                          (f"grad_norm is {grad_norm}", f" (loss {loss:.4g})"))
            raise resume.nonfinite_stop(what, step + 1, ckpt.steps(), out, note)
        done = step + 1
        if logged(done):
            rec = {"step": done, "loss": loss, "grad_norm": grad_norm, "lr": lrs.pop(step),
                   "tokens": done * res.tokens_per_step,
                   "epoch": data.epoch_at(done, res.batch_size),
                   "tokens_per_s": speed.tokens_per_s, "mfu": speed.mfu()}
            if state is not None and (done % eval_every == 0 or done == total):
                val_loss = rec["val_loss"] = evaluate(state)
            log.write(rec)
        bar.set_postfix(loss=f"{loss:.3f}", val=f"{val_loss:.3f}",
                        tok_s=f"{speed.tokens_per_s:,.0f}", mfu=f"{speed.mfu():.1%}",
                        refresh=False)
        bar.update(1)

    queued = None  # (step, metrics, dispatch time) of the step to read after the next dispatch
    try:
        for step in range(start, total):
            batch = data.train_batch(step, res.batch_size, rows=rows).reshape(
                res.accum, -1, res.seq_len + 1)
            if queued is None:  # the device is idle: the rates until the next read-at-once
                lrs.fill(step)
            t0 = time.perf_counter()
            params, opt_state, m = step_fn(params, opt_state, strategy.shard_batch(batch, shape))
            if queued is not None:  # the previous step, read now that this one is queued
                finish(*queued)
            done = step + 1
            save_now, stop_signal = triggers.poll(step)  # scheduler signal or wall-clock interval
            queued = (step, m, t0)
            if not (ahead.needs_state(done, total, eval_every, ckpt_every, save_now, stop_signal)
                    or done == lrs.filled):  # (or the rates must be refilled while idle)
                continue  # nothing uses this step's state now: read it a step late
            queued = None
            finish(step, m, t0, params)
            if done % ckpt_every == 0 or done == total or save_now:
                if not state_finite((params, opt_state)):  # the last guard before disk
                    raise resume.nonfinite_stop("non-finite parameters or optimizer state",
                                                done, ckpt.steps(), out)
                ckpt.save(done, params, opt_state)
                triggers.saved()
            if stop_signal and done < total:
                raise preempt.Preempted(stop_signal, done, out)
    finally:  # every closer runs even when a full disk fails several; the first error wins
        rundir.close_all(triggers.uninstall, bar.close, log.close, ckpt.close)

    # ---- the summary -------------------------------------------------------------------------
    if math.isnan(val_loss):  # resumed at (or one step before) its end: no fresh evaluation
        val_loss = evaluate(params)
    result = summary.build(
        res, out, val_loss, speed,
        wall_time_s=time.perf_counter() - wall0, start=start, data=data,
        placement={**strategy.describe(), **fitted.describe(), **distributed.job_layout()},
        changes=changes)
    if writer:
        summary.write(out, result)
    return result


def _validation(res: Resolved, strategy, data):
    """evaluate(params) -> the mean loss over the validation split (or its first
    train.eval_batches batches), in batches of a micro-batch per replica."""
    eval_fn = strategy.compile_eval(res.cfg)
    eval_bs = setup.eval_batch_size(res, data.num_val_sequences)
    if eval_bs < 1:
        raise TrainError(f"data.val_sequences={data.num_val_sequences} is smaller than the "
                         f"{res.replicas} data replicas; raise data.val_sequences")
    shape = (eval_bs, res.seq_len + 1)
    rows = strategy.batch_rows(shape)  # this process's rows of each eval batch
    limit = res.run.train.eval_batches

    def evaluate(params) -> float:
        losses = []
        for batch in data.val_batches(eval_bs, drop_last=True, rows=rows):
            losses.append(float(eval_fn(params, strategy.shard_eval_batch(batch, shape))))
            if limit and len(losses) >= limit:
                break
        return sum(x * eval_bs for x in losses) / (len(losses) * eval_bs)

    return evaluate
