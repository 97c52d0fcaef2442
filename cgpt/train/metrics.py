"""The run's log as it is written: `metrics.jsonl` (strict JSON, one object per logged
step) and its scalars as TensorBoard events. Process 0 writes both; the others get a log
that writes nothing. A W&B run (`cgpt.train.wandb_log`), when given, gets the same records.
Which field goes where is the step record's (`cgpt.record`).

A stop (Ctrl-C, a scheduler's signal) is never raised inside these writers, and closing them
never waits without bound: tensorboardX interrupted inside `add_scalar` keeps its queue's lock,
and its close then waits forever for a thread that never ends."""
from __future__ import annotations

import sys
import threading
from pathlib import Path

from cgpt import record
from cgpt.fileio import storage_oserror
from cgpt.rundir import EVENTS_DIR, METRICS_FILE, json_line
from cgpt.stop import GUARD

CLOSE_S = 10.0  # the TensorBoard writer's close (its thread joined) waits at most this long


class MetricsLog:
    """Appends records to `metrics.jsonl` and TensorBoard; `write=False` (not process 0) drops
    them. TensorBoard purges events past `start` on a resume, as the JSON log is cut back
    (`cgpt.train.launch.resume_log`, which also reads the log strictly)."""

    def __init__(self, out: Path, start: int, write: bool = True, wandb=None):
        self.file = self.tb = None
        self.wandb = wandb if write else None  # a `WandbRun`: its records are these
        if write:
            try:  # optional: a GPU image may lack it (metrics.jsonl has every logged step)
                from tensorboardX import SummaryWriter
            except ImportError:
                SummaryWriter = None
                print("cgpt train: tensorboardX is not installed: no TensorBoard events "
                      "(metrics.jsonl has every logged step); pip install tensorboardX for them",
                      file=sys.stderr)
            self.file = open(out / METRICS_FILE, "a")
            if SummaryWriter is not None:
                self.tb = SummaryWriter(str(out / EVENTS_DIR),
                                        purge_step=start + 1 if start else None)
                _quiet_tb_thread()

    def write(self, rec: dict) -> None:
        if self.file is None:
            return
        with GUARD.shielded():  # a stop that arrives meanwhile is raised after the record
            self.file.write(json_line(rec) + "\n")
            self.file.flush()
            for k in record.names(tensorboard=True) if self.tb is not None else ():
                if k in rec:
                    self.tb.add_scalar(f"train/{k}", rec[k], rec["step"])
            if self.wandb is not None:
                self.wandb.log(rec)

    def close(self) -> None:
        if self.file is not None:
            with GUARD.shielded():
                try:
                    self.file.close()
                finally:
                    if self.tb is not None:
                        _close_tb(self.tb)


def _close_tb(tb) -> None:
    """Close a SummaryWriter, waiting at most `CLOSE_S` for its writer thread (then the
    events may lack the last steps; metrics.jsonl has them all); if the close fails (disk
    full), stop its writer threads anyway, since tensorboardX would retry at exit and print
    a traceback per retry."""
    failed: list[BaseException] = []

    def close() -> None:
        try:
            tb.close()
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
            failed.append(e)

    closer = threading.Thread(target=close, name="cgpt-tensorboard-close", daemon=True)
    closer.start()
    closer.join(CLOSE_S)
    if closer.is_alive():
        if not GUARD.stopping:  # a stop says its one line; else the events' loss is said
            print(f"cgpt train: warning: the TensorBoard writer did not close within "
                  f"{CLOSE_S:g} s: its events may lack the last steps (metrics.jsonl has "
                  "every logged step)", file=sys.stderr, flush=True)
        return
    try:
        if failed:
            raise failed[0]
    except OSError:
        for w in (tb.all_writers or {}).values():
            ew = w.event_writer
            try:
                ew._worker.stop()
            except Exception:  # noqa: BLE001 - the worker may have died on the same error
                pass
            ew._closed = True
        raise


def _quiet_tb_thread() -> None:
    """tensorboardX writes events from its own thread: a full disk there would print a thread
    traceback beside the run's one error line (the checkpoint or metrics.jsonl write on the
    same storage reports it), so storage errors of that thread are dropped."""
    prev = threading.excepthook
    if getattr(prev, "_cgpt_tb", False):
        return

    def hook(args):
        tb = args.exc_traceback
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        in_tb = tb is not None and "tensorboardX" in tb.tb_frame.f_code.co_filename
        if not (in_tb and storage_oserror(args.exc_value) is not None):
            prev(args)

    hook._cgpt_tb = True
    threading.excepthook = hook
