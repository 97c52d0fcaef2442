"""The validation loss of a run, or of every member of a fused group: one definition for both.

The split is read in batches of a micro-batch per replica (`eval_batch_size`), the same for
every seed; every batch is dispatched before any loss is read (one wait, not one a batch),
and the losses are averaged in float64, so a fused member's val_loss equals its solo run's.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from cgpt.errors import TrainError


def eval_batch_size(res, num_val_sequences: int) -> int:
    """Rows per evaluation batch: a micro-batch per replica, capped by the validation split,
    a multiple of the replicas (0: the split is smaller than the replicas)."""
    return eval_rows(res.micro_batch, res.replicas, num_val_sequences)


def eval_rows(micro_batch: int, replicas: int, num_val_sequences: int) -> int:
    """`eval_batch_size` from the numbers a run records (summary.json's placement), so that
    `cgpt eval` reads the sequences the run's val_loss was measured on."""
    bs = min(micro_batch * replicas, num_val_sequences)
    return bs - bs % replicas


def validation(res, data, loss_of: Callable, rows=slice(None)) -> Callable:
    """evaluate(params, batches=None) -> the mean loss over the validation split (or its first
    train.eval_batches batches, or `batches`): a float64 array, [] for a run, [M] for a fused
    group. `res`: the run's (or member 0's) `Resolved`; `loss_of(params, batch, shape)`: the
    compiled evaluation on one batch of `shape` (it places the batch); `rows`: the rows of each
    batch this process loads (a multi-process run)."""
    eval_bs = eval_batch_size(res, data.num_val_sequences)
    if eval_bs < 1:
        raise TrainError(f"data.val_sequences={data.num_val_sequences} is smaller than the "
                         f"{res.replicas} data replicas; raise data.val_sequences")
    shape = (eval_bs, res.seq_len + 1)
    limit = res.run.train.eval_batches

    def evaluate(params, batches: int | None = None) -> np.ndarray:
        stop = min(limit or batches or 0, batches or limit or 0)
        queued = []
        for batch in data.val_batches(eval_bs, drop_last=True, rows=rows):
            queued.append(loss_of(params, batch, shape))
            if stop and len(queued) >= stop:
                break
        losses = [np.asarray(x, np.float64) for x in queued]
        return sum(x * eval_bs for x in losses) / (len(losses) * eval_bs)

    return evaluate
