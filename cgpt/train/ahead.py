"""Reading a training step's scalars one step late, so the host never waits on the step it
has just queued.

The loop dispatches step k+1 before it reads step k's loss and gradient norm (one transfer
for both): while the device runs k+1 the host logs k, loads the next batch and polls the
checkpoint triggers. Only a step whose updated state is needed at once (an evaluation, a
checkpoint, a stop, the last step) is read before the next dispatch: `needs_state` says
which. A non-finite step k is noticed after k+1 was queued; k+1's result is then dropped
unread, nothing was written for either, and no checkpoint can have been taken in between
(checkpoint steps are read at once), so the run stops at the same step with the same kept
checkpoints as a loop that waits on every step. The logged learning rates come from
`LearningRates`, filled while the device is idle, since evaluating the schedule between two
queued steps would wait for the second.
"""
from __future__ import annotations

import time

import jax

from cgpt.config.recipe import Recipe
from cgpt.train import optim
from cgpt.train.mfu import Throughput


def needs_state(done: int, total: int, eval_every: int, ckpt_every: int, save_now: bool,
                stop_signal: int) -> bool:
    """Whether the state after `done` steps is used before the next step runs (evaluated,
    checkpointed, or the run stops there): then the step is read at once, not a step late."""
    return bool(save_now or stop_signal or done == total or done % eval_every == 0
                or done % ckpt_every == 0)


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
    such step, and only for the steps that will be logged."""

    def __init__(self, recipe: Recipe, logged, total: int, eval_every: int, ckpt_every: int):
        self.recipe, self.logged, self.total = recipe, logged, total
        self.every = (eval_every, ckpt_every)
        self.filled, self.lr = 0, {}

    CHUNK = 16  # logged steps per fill: a long stretch costs no pause before its first step

    def fill(self, step: int) -> None:
        """Compute the logged steps' rates from `step` to the next scheduled read-at-once, at
        most CHUNK of them; the step before `filled` is then read at once to refill."""
        end, n = next_read(step, self.total, *self.every), 0
        for s in range(max(step, self.filled), end + 1):
            if self.logged(s + 1):
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

    def read(self, step: int, metrics: dict, dispatched: float) -> tuple[float, float]:
        """(loss, grad_norm) of `step`, dispatched at perf_counter() time `dispatched`;
        the one host sync of a step."""
        loss, grad_norm = jax.device_get((metrics["loss"], metrics["grad_norm"]))
        now = time.perf_counter()
        began = dispatched if self.ready is None else max(dispatched, self.ready)
        self.ready = now
        if step > self.first:  # the first step includes compilation
            self.speed.add(now - began, self.tokens)
        return float(loss), float(grad_norm)
