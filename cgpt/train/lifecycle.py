"""One run's life through one launch, the same for a run trained alone (`cgpt.train.loop`) and
for each member of a fused group (`cgpt.train.fused_loop`): the two loops differ only in how
they step (one program or M stacked members), never in what a run directory goes through.

    life = Lifecycle(run, out, resuming=...)
    life.open(stack)        # writable, locked (`cgpt.train.launch.Launch`)
    life.check()            # fresh or resumed: the config it trains with, or finished already
    life.commit(res, data)  # tokenizer, config.yaml, checkpoints opened
    life.begin(start)       # a resumable run from here; the log cut back to the restored step
    ... life.record(...) on logged steps, life.save(...) when `saves`, life.stop(...) ...
    life.finish(...)        # summary.json

Like torchtitan's components, the run owns its cadence (`logged`, `evaluates`, `saves`): a
loop asks it, and never computes eval_every or the train_loss window itself.
"""
from __future__ import annotations

import contextlib
import json
import math
import sys
from pathlib import Path

from cgpt import record, rundir
from cgpt.config.run import RunConfig, cadence
from cgpt.errors import TrainError
from cgpt.fileio import atomic_write_text, probe_writable
from cgpt.train import checkpoint, curve, metrics, noise, resume, summary, wandb_log
from cgpt.train.launch import Launch, check_launch, close_all, first_missing, resume_log


class Lifecycle:
    """One run directory through one launch. `writer`: this process writes the directory's
    files (process 0 of a multi-process run; the others keep the same cadence, write none)."""

    def __init__(self, run: RunConfig, out: str | Path, *, resuming: bool,
                 allow_changes: bool = False, writer: bool = True):
        self.run, self.out, self.resuming = run, Path(out), resuming
        self.allow_changes, self.writer = allow_changes, writer
        self.launch: Launch | None = None
        self.fresh, self.prior, self.saved, self.finished = True, None, None, None
        self.res = self.data = self.ckpt = self.log = None
        self.wandb = wandb_log.WandbRun(self.out)  # a W&B run, when train.wandb asks for one
        self.start, self.changes, self.val_loss = 0, [], math.nan
        self.noise = noise.Smoother()  # the gradient noise scale's smoothing (train.gns)
        self.result: dict | TrainError | None = None  # the summary, or what stopped the run

    # ---- launch ----------------------------------------------------------------------------
    def open(self, stack: contextlib.ExitStack) -> None:
        """Make the directory, check it is writable, and hold its lock until `stack` closes
        (a launch that fails before `commit` leaves nothing behind)."""
        new_dirs = first_missing(self.out) if self.writer else None
        if self.writer:
            try:
                probe_writable(self.out)
            except OSError as e:
                raise TrainError(f"output directory {self.out} is not writable "
                                 f"({e.strerror or e}); choose another --out") from e
        self.launch = stack.enter_context(Launch(self.out, new_dirs, lock=self.writer))
        stack.enter_context(self.wandb)  # finished (as the launch ended) before the unlock

    def check(self, platform: str | None = None) -> None:
        """Whether the launch starts fresh, the config it trains with (on resume the saved one,
        which must match), and the summary of a run finished already."""
        self.fresh = check_launch(self.out, self.resuming)  # else a committed run
        if not self.fresh and self.resuming:
            self.prior = rundir.read_config(self.out)
        self.saved = resume.check_config(self.run, self.out, self.resuming, self.allow_changes,
                                         platform)
        wandb_log.require(self.saved.train.wandb)  # a missing package: before any work
        if self.resuming and (self.out / rundir.SUMMARY_FILE).exists():
            self.finished = rundir.read_summary(self.out)

    def commit(self, res, data) -> None:
        """Write the tokenizer (fresh) and config.yaml and open the checkpoints; the run is
        resumable from `begin` on: a fresh launch that fails before (its state, or a branch's
        parent state, not restored) removes them again, leaving nothing that blocks the next."""
        self.res, self.data = res, data
        if self.writer:
            if self.fresh:
                self.launch.created += [self.out / f for f in (
                    rundir.TOKENIZER_FILE, rundir.CONFIG_FILE, rundir.CKPT_DIR)
                    if not (self.out / f).exists()]
                data.save_tokenizer(self.out)
            atomic_write_text(self.out / rundir.CONFIG_FILE, self.saved.to_yaml())
        self.ckpt = checkpoint.Checkpointer(self.out, keep=res.run.train.keep_checkpoints)

    def begin(self, start: int) -> None:
        """Training starts at `start`: the run is committed, the log cut back to `start`,
        resumed changes recorded."""
        self.launch.commit()
        self.start = start
        if self.writer:
            resume_log(self.out / rundir.METRICS_FILE, start, self.res.total_steps)
            self.changes = resume.record_changes(self.out, self.prior, self.saved, start)
            if start:  # the smoothed noise scale goes on from the kept log
                self.noise = noise.Smoother.replay(
                    rundir.read_metrics(self.out / rundir.METRICS_FILE))
            self.wandb.start(self.res)
        self.log = metrics.MetricsLog(self.out, start, write=self.writer, wandb=self.wandb)

    # ---- cadence -----------------------------------------------------------------------------
    @property
    def eval_every(self) -> int:
        return cadence(self.res.run.train.eval_every, self.res.total_steps)

    @property
    def ckpt_every(self) -> int:
        return cadence(self.res.run.train.ckpt_every, self.res.total_steps)

    def evaluates(self, done: int) -> bool:
        return done % self.eval_every == 0 or done == self.res.total_steps

    def saves(self, done: int, save_now: bool = False) -> bool:
        """A checkpoint after `done` steps: on schedule, at the end, or asked (`save_now`)."""
        return done % self.ckpt_every == 0 or done == self.res.total_steps or save_now

    def needs_state(self, done: int, save_now: bool = False, stop_signal: int = 0) -> bool:
        """Whether the state after `done` steps is used before the next step runs (evaluated,
        saved, or the run stops there): then the step is read at once (`cgpt.train.loop.run`)."""
        return self.evaluates(done) or self.saves(done, save_now) or bool(stop_signal)

    def logged(self, done: int) -> bool:
        """Every log_every steps, evaluations, and the last steps (the summary's train_loss)."""
        total = self.res.total_steps
        return (done % self.res.run.train.log_every == 0 or self.evaluates(done)
                or done > total - rundir.train_loss_window(total))

    # ---- the metrics record and the guard ----------------------------------------------------
    def record(self, done: int, device: dict, lr: float, speed,
               val_loss: float | None = None) -> None:
        """Log step `done` (a logged step): the step record (`cgpt.record`), its `device`
        fields as read from the step (`cgpt.train.loop.Reader`), the host's beside them: the
        evaluation, if one ran, and the noise scale's smoothing (train.gns)."""
        values = {k: float(v) for k, v in device.items()}
        values.update(step=done, lr=lr, tokens=done * self.res.tokens_per_step,
                      epoch=self.data.epoch_at(done, self.res.batch_size),
                      tokens_per_s=speed.tokens_per_s, mfu=speed.mfu())
        if val_loss is not None:
            self.val_loss = values["val_loss"] = val_loss
        values.update(self.noise.update(done, {k: values[k] for k in noise.STEP_KEYS
                                               if k in values}))
        self.log.write({k: values[k] for k in record.names() if k in values})

    def nonfinite(self, step: int, loss: float, grad_norm: float) -> TrainError:
        """The error of a step (0-based `step`) whose loss or gradient norm is not finite,
        raised (or, for a member, recorded) before anything of it is written."""
        what, note = ((f"loss is {loss}", "") if not math.isfinite(loss) else
                      (f"grad_norm is {grad_norm}", f" (loss {loss:.4g})"))
        return resume.nonfinite_stop(what, step + 1, self.ckpt.steps(), self.out, note)

    def unsafe_state(self, done: int) -> TrainError:
        """The error of a state found non-finite before its checkpoint: the last guard."""
        return resume.nonfinite_stop("non-finite parameters or optimizer state", done,
                                     self.ckpt.steps(), self.out)

    def save(self, done: int, params, opt_state) -> None:
        self.ckpt.save(done, params, opt_state)

    def fail(self, err: TrainError) -> None:
        """A member stopped while its group goes on: `failed.json`, as the sweep writes for a
        run trained alone; nothing more is logged."""
        self.result = err
        log, self.log = self.log, None
        log.close()
        self.wandb.end(err)
        atomic_write_text(self.out / rundir.FAILED_FILE,
                          json.dumps({"status": "failed", "error": str(err)}, indent=2))
        print(f"{self.out}: {err}", file=sys.stderr, flush=True)

    # ---- the end -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the log and finish the checkpoint in flight, even when a full disk fails one."""
        close_all(*(c for c in (self.log and self.log.close, self.ckpt and self.ckpt.close) if c))

    def finish(self, val_loss: float, speed, wall_time_s: float, placement: dict) -> dict:
        """The run's summary, written to summary.json (by the writer)."""
        self.result = summary.build(self, val_loss, speed, wall_time_s, placement)
        if self.writer:
            summary.write(self.out, self.result)
            self.wandb.summary(self.result)
            try:  # a picture of the run; the run is done whether or not it can be drawn
                curve.write(self.out, self.result)
            except OSError as e:
                print(f"note: {self.out / rundir.CURVE_FILE} not written ({e.strerror or e}); "
                      f"the curve is in {self.out / rundir.METRICS_FILE}", file=sys.stderr)
        return self.result
