"""Weights & Biases, optional (`pip install 'cgpt[wandb]'`): with `train.wandb=PROJECT` a run's
log also goes to a W&B run, named after the run directory and, in a sweep, grouped by the
sweep's name (the sweep sets W&B's own `WANDB_RUN_GROUP`, unless the user exported one).

The W&B run gets the records `metrics.jsonl` gets (the step record's `wandb` fields,
`cgpt.record`: all of them but the step, W&B's own x axis), handed over by the log's writer
(`cgpt.train.metrics.MetricsLog`, process 0 only) as the Python numbers already read for the
file: no device sync and no per-device logging. A W&B `log` call costs 1-7 ms of the caller's
time (a hand-off to W&B's service process), so one thread per W&B run makes the calls and the
loop only queues the record. Its config is the run as trained
(`Resolved.run`) and a few derived values; its summary is `summary.json`. The W&B run's id is
kept in the run directory (`rundir.WANDB_FILE`), so a resumed launch continues the same W&B
run; W&B's files go under the run directory too unless `WANDB_DIR` says otherwise. With
`WANDB_MODE=offline` nothing leaves the machine; `wandb sync RUN_DIR/wandb/offline-run-*`
uploads later.
"""
from __future__ import annotations

import json
import os
import queue
import sys
import threading
from functools import partial
from pathlib import Path

from cgpt import record, rundir
from cgpt.errors import TrainError
from cgpt.fileio import atomic_write_text, probe_writable

EXTRA = "pip install 'cgpt[wandb]'"
GROUP_ENV = "WANDB_RUN_GROUP"  # W&B's variable for a run's group: the sweep sets it


def group_env(sweep_name: str) -> dict[str, str]:
    """The environment that groups a sweep's W&B runs by the sweep's name: empty when the user
    exported `WANDB_RUN_GROUP` (their group wins, as it does outside a sweep)."""
    return {} if os.environ.get(GROUP_ENV) else {GROUP_ENV: sweep_name}


def require(project: str | None):
    """The `wandb` module when `project` is set (None otherwise); not installed: one error
    naming the extra, raised before anything is trained."""
    if project is None:
        return None
    wandb_dir = os.environ.get("WANDB_DIR")
    if wandb_dir:  # unwritable, W&B falls back to the system temp folder without a word
        try:
            probe_writable(wandb_dir)
        except OSError as e:
            raise TrainError(f"WANDB_DIR={wandb_dir}: cannot be written ({e.strerror or e}); "
                             "W&B would put the run's files in the system temp folder "
                             "instead: point WANDB_DIR at a writable folder, or unset it") from None
    try:
        import wandb
    except ImportError as e:
        raise TrainError(f"train.wandb={project} needs the wandb package ({e}): {EXTRA}, "
                         "or drop train.wandb") from None
    return wandb


def run_config(res) -> dict:
    """The config a W&B run records: the run as trained and what was derived from it."""
    cfg = res.cfg
    return {**res.run.to_dict(), "derived": {
        "n_params": cfg.num_params(), "n_params_nonembed": cfg.num_params(embedding=False),
        "steps": res.total_steps, "batch_size": res.batch_size, "tokens": res.tokens_trained,
        "peak_lr": res.recipe.peak_lr, "warmup_steps": res.recipe.warmup_steps,
        "devices": res.num_devices, "mode": res.mode}}


def _read_id(path: Path) -> str:
    """The W&B run id a run directory keeps."""
    got = rundir.read_json(path, dict, "remove it to log to a new W&B run")
    if not (isinstance(got.get("id"), str) and got["id"]):
        raise TrainError(f"{path}: no W&B run id in it; remove it to log to a new W&B run")
    return got["id"]


class WandbRun:
    """One run directory's W&B run through one launch, a context manager held while the run
    directory is (`Lifecycle.open`): `start` when training begins, `log` each record,
    `summary` at the end; it finishes on exit with code 0, a stop's signal code (marked
    preempting, so W&B shows the run preempted, not crashed), or 1 on an error."""

    def __init__(self, out: str | Path):
        self.out, self.run = Path(out), None
        self._calls: queue.SimpleQueue = queue.SimpleQueue()  # W&B calls, made in order
        self._sender: threading.Thread | None = None
        self._error: tuple[str, Exception] | None = None  # the first call that failed

    def start(self, res) -> None:
        """Open (or, on resume, continue) the W&B run, if `train.wandb` asks for one."""
        project = res.run.train.wandb
        wandb = require(project)
        if wandb is None:
            return
        entity, _, project = project.rpartition("/")
        path = self.out / rundir.WANDB_FILE
        known = _read_id(path) if path.exists() else None
        try:
            self.run = wandb.init(
                entity=entity or None, project=project, id=known, resume="allow",
                name=self.out.absolute().name, group=os.environ.get(GROUP_ENV) or None,
                dir=os.environ.get("WANDB_DIR") or self.out, config=run_config(res),
                allow_val_change=True, reinit="create_new")  # members of a fused group
        except Exception as e:  # noqa: BLE001 - wandb's errors (login, network) vary
            raise TrainError(f"train.wandb={res.run.train.wandb}: W&B could not start the run "
                             f"({' '.join(str(e).split())}); `wandb login`, or set "
                             "WANDB_MODE=offline and `wandb sync` later") from None
        if known is None:  # the first launch: its id, for the next ones
            atomic_write_text(path, json.dumps({"id": self.run.id}) + "\n")
        self.attach(self.run)

    def attach(self, run) -> None:
        """Log to `run` (a started `wandb.Run`) from here on, through the sending thread."""
        self.run = run
        self._sender = threading.Thread(target=self._send, name=f"wandb {self.out.name}",
                                        daemon=True)
        self._sender.start()

    def _send(self) -> None:
        """The W&B calls, in the order queued, until None; after a failure, none more."""
        while (call := self._calls.get()) is not None:
            if self._error is None:
                try:
                    call()
                except Exception as e:  # noqa: BLE001 - reported when the run ends
                    self._error = (call.keywords.get("step", "the summary"), e)

    def log(self, rec: dict) -> None:
        """A metrics.jsonl record at its step: W&B's step is the training step (W&B ignores a
        step below its run's current one, so the steps a resume repeats keep their first
        values)."""
        if self.run is not None:
            fields = record.names(wandb=True)  # the step record's (`cgpt.record`)
            self._calls.put(partial(self.run.log, {k: v for k, v in rec.items() if k in fields},
                                    step=rec["step"]))

    def summary(self, result: dict) -> None:
        """summary.json's values as the W&B run's summary."""
        if self.run is not None:
            self._calls.put(partial(self.run.summary.update, result))

    def end(self, exc: BaseException | None) -> None:
        """Finish the W&B run: exit code 0, a stop's code (preempting), or 1."""
        run, self.run = self.run, None
        if run is None:
            return
        code = 0 if exc is None else getattr(exc, "exit_code", 1)
        self._calls.put(None)
        self._sender.join()  # every record queued reaches W&B before it finishes
        if self._error is not None:
            at, e = self._error
            print(f"cgpt train: W&B stopped taking {self.out}'s log at step {at} "
                  f"({' '.join(str(e).split())}); metrics.jsonl has every step",
                  file=sys.stderr, flush=True)
        try:
            if exc is not None and hasattr(exc, "exit_code"):
                run.mark_preempting()
            run.finish(exit_code=code)
        except Exception as e:  # noqa: BLE001 - the run's own outcome is the one reported
            print(f"cgpt train: the W&B run of {self.out} did not finish cleanly "
                  f"({' '.join(str(e).split())}); its files are in "
                  f"{os.environ.get('WANDB_DIR') or self.out / rundir.WANDB_DIR}",
                  file=sys.stderr, flush=True)

    def __enter__(self) -> "WandbRun":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        self.end(exc)
        return False
