"""A run's own validation split: the sequences its val_loss was measured on, read from its
directory, so that `cgpt eval RUN` reports the val_loss the run did (summary.json,
results.csv) rather than a loss on another corpus.

The run evaluated the fixed validation windows of its own data (its source, fraction, split,
seq_len and val_sequences, tokenized by its tokenizer.json) in batches of a micro-batch per
data replica, the last partial batch left out (`cgpt.train.evaluation`); the micro-batch is the
fit's choice, recorded in summary.json's placement. A run without a summary (still training,
or stopped) has no recorded batch: its whole split is evaluated, and the output says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cgpt import rundir
from cgpt.config.data import DataConfig
from cgpt.config.run import from_dict
from cgpt.data.batches import TokenData
from cgpt.train.evaluation import eval_rows

UNKNOWN_BATCH = 16  # rows per batch when the run recorded none (the whole split is read)


@dataclass(frozen=True)
class RunSplit:
    """How a run evaluated: its data, rows per batch, how many batches (None: every full one,
    or, with `exact` False, every sequence), and the val_loss it recorded (None: unfinished)."""

    data: DataConfig
    batch: int
    batches: int | None
    exact: bool  # the batch is the run's own: the same sequences as its val_loss
    recorded: float | None


def run_split(run_dir: str | Path) -> RunSplit:
    """The validation split `run_dir` was evaluated on (a LoadError or RunDirError naming the
    file when its config.yaml or summary.json cannot be read)."""
    run_dir = Path(run_dir)
    run = from_dict(rundir.read_config(run_dir), str(run_dir / rundir.CONFIG_FILE))
    summary = rundir.try_json(run_dir / rundir.SUMMARY_FILE) or {}
    placement = summary.get("placement") or {}
    micro, replicas = placement.get("micro_batch"), placement.get("data_replicas", 1)
    recorded = summary.get("val_loss")
    recorded = float(recorded) if isinstance(recorded, (int, float)) else None
    batch = eval_rows(micro, replicas, run.data.val_sequences) \
        if isinstance(micro, int) and isinstance(replicas, int) and micro > 0 < replicas else 0
    if batch < 1:
        return RunSplit(run.data, UNKNOWN_BATCH, None, False, recorded)
    return RunSplit(run.data, batch, run.train.eval_batches, True, recorded)


def split_loss(loss_of, data: TokenData, split: RunSplit,
               batch: int | None = None) -> tuple[float, int]:
    """(mean loss, sequences read) over `split` of `data`, averaged as the run averaged it:
    the mean of equal batches' mean losses, in float64. `loss_of(batch) -> float` is one
    batch's mean loss; `batch` (rows per call) changes only the float rounding."""
    if split.exact:
        rows = split.batch * (data.num_val_sequences // split.batch)
        if split.batches:
            rows = min(rows, split.batches * split.batch)
    else:
        rows = data.num_val_sequences
    total, n = 0.0, 0
    for window in data.val_batches(batch or split.batch):
        window = window[:rows - n]
        total += float(np.float64(loss_of(window))) * len(window)
        n += len(window)
        if n >= rows:
            break
    return (total / n if n else math.nan), n
