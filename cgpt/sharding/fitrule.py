"""The fit's rule, written once: which (micro-batch, remat rung) a step takes, given only
whether a candidate fits and, on a GPU, what it costs (JAX-free, like `auto` and `cost`).

Three callers ask it with their own memory: `cgpt.train.fit.search` (the compiled step's
`memory_analysis`), `cgpt.sharding.cost.predict_fit` (auto's memory model, to cost each
placement as train would run it) and `cgpt.plan.analytic` (the analytic plan's footprints).

  1. the full per-replica batch (no accumulation) on each rung, lowest first;
  2. else the largest micro-batch that fits on the top rung (bisected: memory falls with
     the micro-batch, and on the compiled path each probe is a compile), then the lower
     rungs at that micro-batch, lowest first;
  3. where the step of 1 or 2 is on the top rung and a cost is given: the largest smaller
     micro-batch that fits on the rung below the top (found the same way; on the lowest
     rung that fits there) competes, and the faster wins - a smaller micro-batch without
     recomputing the forward often beats a larger one with it (256M and 590M under FSDP on
     8 x 80 GB, 1.3B).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence, TypeVar

R = TypeVar("R")  # a remat rung: the ladder's names, or remat off/on as bools

HEADROOM = 0.10  # of device memory outside the allocator's pool: a GPU run's pool is the
# other 90% (`cgpt.config.backend.GPU_MEM_FRACTION`); the 10% holds the CUDA context, the
# cuBLAS/cuDNN workspaces and NCCL's buffers, which XLA allocates outside the pool
POOL_MARGIN = 0.05  # of the pool a step never plans to fill. The fit counts the compiled
# step's arguments, outputs and temp (`memory_analysis`) as if packed; XLA's buffer assignment
# packs the temp into one block, but the pool's allocator must find that block free between
# the long-lived buffers (parameters, optimizer state, the donated outputs): fragmentation.
# The pool also holds what the count leaves out: the next batch copied in while a step runs,
# the evaluation program's temp, autotuning's scratch on the first steps. 5% is 3.6 GB of a
# 72 GB pool. A chosen margin, not a measured one: bench/gpu_check.py prints a GPU's peak
# in use beside the fit's figure, the measurement that confirms or resizes it.


def divisors_desc(n: int) -> list[int]:
    """Every divisor of n, largest first, in O(sqrt n): the micro-batches a per-replica batch
    splits into. A batch of 10**9 sequences is decided in milliseconds, not by a scan of every
    count up to it (`cgpt plan --batch 1000000000` ran for minutes)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)}, reverse=True)


def pool_memory(device_memory: int) -> int:
    """The allocator's pool on a device of `device_memory` bytes (less HEADROOM)."""
    return int(device_memory * (1 - HEADROOM))


def usable_memory(device_memory: int) -> int:
    """What a step may use of `device_memory` bytes: the pool less POOL_MARGIN of it."""
    pool = pool_memory(device_memory)
    return pool - int(pool * POOL_MARGIN)


def memory_for(usable: int) -> int:
    """The least device memory whose `usable_memory` is at least `usable` bytes."""
    m = int(usable / ((1 - HEADROOM) * (1 - POOL_MARGIN)))
    while usable_memory(m) < usable:
        m += 1
    while m > 0 and usable_memory(m - 1) >= usable:
        m -= 1
    return m


def _largest(micros: Sequence[int], ok: Callable[[int], bool]) -> int:
    """The largest of `micros` (largest first, `ok(micros[-1])` known true) with `ok`:
    bisected, so `ok` must hold for every micro-batch below one where it holds."""
    lo, hi = 0, len(micros) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(micros[mid]):
            hi = mid
        else:
            lo = mid + 1
    return micros[hi]


def choose_step(micros: Sequence[int], rungs: Sequence[R], fits: Callable[[int, R], bool],
                cost: Callable[[int, R], float] | None = None) -> tuple[int, R] | None:
    """(micro-batch, rung) by the rule above, or None when nothing fits (each caller then
    reports its own smallest step). `micros`: the allowed micro-batches, largest first (the
    first is the whole per-replica batch, or the one the user set); `rungs`: the remat rungs
    to climb, least recomputation first (one when the user set it); `fits(m, rung)`: whether
    that step fits the usable memory (callers cache it where a probe is dear); `cost(m,
    rung)`: seconds per step, or None (CPU, TPU: memory only)."""
    top, rest = rungs[-1], list(micros[1:])
    at = next((r for r in rungs if fits(micros[0], r)), None)
    if at is not None:
        m = micros[0]
    else:
        if not rest or not fits(rest[-1], top):
            return None
        m = _largest(rest, lambda x: fits(x, top))
        at = next((r for r in rungs[:-1] if fits(m, r)), top)
    smaller = [x for x in micros if x < m]
    if (at != top or cost is None or len(rungs) < 2 or not smaller
            or not fits(smaller[-1], rungs[-2])):
        return m, at
    low = _largest(smaller, lambda x: fits(x, rungs[-2]))
    low_rung = next(r for r in rungs[:-1] if fits(low, r))
    return (low, low_rung) if cost(low, low_rung) < cost(m, top) else (m, top)
