"""Reading a training step's scalars one step late, so the host never waits on the step it
has just queued; the one step schedule of both loops (`cgpt.train.loop`, a run alone, and
`cgpt.train.fused_loop`, a fused group).

`run` dispatches step k+1 before it reads step k's scalars (one transfer for all of the step
record's device fields, `cgpt.record`): while the device runs k+1 the host logs k, loads the
next batch and polls the checkpoint triggers. Only a step whose updated state is needed at
once (an evaluation, a checkpoint, a stop, the last step: `Lifecycle.needs_state`) is read
before the next dispatch.
A non-finite step k is noticed after k+1 was queued. A run alone then stops: k+1's result is
dropped unread, nothing was written for either, and no checkpoint can have been taken in
between (checkpoint steps are read at once), so it stops at the same step with the same kept
checkpoints as a loop that waits on every step. A fused member is failed at step k (its
`failed.json` names k) and masked from step k+2 on; its step k+1 is never read, logged or
saved, and the others never see it (each member's update is its own). The logged learning
rates come from `LearningRates`, filled while the device is idle, since evaluating the
schedule between two queued steps would wait for the second.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import jax

from cgpt import record
from cgpt.train import optim
from cgpt.train.mfu import Throughput


def run(start: int, total: int, triggers, dispatch: Callable[[int, bool], Any],
        finish: Callable[[int, Any, float, bool], bool], needs_state: Callable[..., bool],
        at_state: Callable[[int, bool, int], None]) -> None:
    """Steps `start`..`total`-1, each read a step late unless its state is needed at once.

    dispatch(step, idle) queues `step` and returns its metrics (`idle`: nothing else is
    queued); finish(step, metrics, dispatched, at_once) reads and logs them (`at_once`: the
    step's state is the current one, for an evaluation) and returns False when nothing is
    left to train; needs_state(done, save_now, stop_signal) says whether the state after
    `done` steps is used now; at_state(done, save_now, stop_signal) then saves or stops.
    `triggers.poll` runs once a step, in every process of a job (`cgpt.train.preempt`)."""
    queued = None  # (step, metrics, dispatch time) of the step to read after the next dispatch
    for step in range(start, total):
        idle = queued is None
        t0 = time.perf_counter()
        m = dispatch(step, idle)
        if queued is not None and not finish(*queued, False):
            return
        done = step + 1
        save_now, stop_signal = triggers.poll(step)  # scheduler signal or wall-clock interval
        queued = (step, m, t0)
        if not needs_state(done, save_now, stop_signal):
            continue  # nothing uses this step's state now: read it a step late
        queued = None
        if not finish(step, m, t0, True):
            return
        at_state(done, save_now, stop_signal)


def next_read(step: int, total: int, eval_every: int, ckpt_every: int) -> int:
    """The first step from `step` on that is read at once on schedule (evaluated,
    checkpointed or the last); a signal or a wall-clock checkpoint may add one earlier."""
    done = step + 1
    return min(-(-done // eval_every) * eval_every, -(-done // ckpt_every) * ckpt_every,
               total) - 1


class LearningRates:
    """The learning rates of the steps that will be logged, computed while the device is idle.

    `optim.lr_at` evaluates the schedule eagerly on the default device, whose queue runs in
    order: called between two queued steps it would wait for the step just queued (measured on
    CPU), a host sync per step. So the loop fills this table, with the same `lr_at` (the
    same values as before), before it queues a step after a read-at-once step: up to the next
    such step, and only for the steps that will be logged. `life`: the run's `Lifecycle`."""

    def __init__(self, recipe, life):
        self.recipe, self.life = recipe, life
        self.filled, self.lr = 0, {}

    CHUNK = 16  # logged steps per fill: a long stretch costs no pause before its first step

    def fill(self, step: int) -> None:
        """Compute the logged steps' rates from `step` to the next scheduled read-at-once, at
        most CHUNK of them; the step before `filled` is then read at once to refill."""
        life, n = self.life, 0
        end = next_read(step, life.res.total_steps, life.eval_every, life.ckpt_every)
        for s in range(max(step, self.filled), end + 1):
            if life.logged(s + 1):
                self.lr[s] = optim.lr_at(self.recipe, s)
                n += 1
                if n == self.CHUNK:
                    end = s
                    break
        self.filled = max(self.filled, end + 1)

    def pop(self, step: int) -> float:
        return self.lr.pop(step)


class Reader:
    """Reads queued steps' scalars and times the steps for `speed`.

    A step's time runs from when the device could start it (its dispatch, or the end of the
    step before it when that was still running) to when its scalars arrived: with a queue that
    is the device's step time, host work included only where the device waited on it."""

    def __init__(self, speed: Throughput, tokens_per_step: int, first_step: int):
        self.speed, self.tokens, self.first = speed, tokens_per_step, first_step
        self.ready = None  # when the last read step's scalars arrived

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
    """Member `k`'s values of a fused group's `Reader.read`."""
    return {name: v[k] for name, v in values.items()}
