"""What a fused group needs before its first step, prepared while its step compiles.

A fused job's fixed cost is mostly compiling: the step (the longest), the members' init, the
evaluation, the save's member copy, plus importing TensorBoard's writer. One XLA compile
keeps one core busy, so `Prepare` does everything but the step in a background thread while
the loop's thread compiles the step (`fused_loop.members_that_fit`): the members' initial
states (each exactly as a solo run initializes it) stacked, their learning-rate tables, and
one call of each other program on that state. The programs are the ones the loop would
compile anyway, so the results do not change; nothing is written to disk here.

`validation` is the group's evaluation; `start` its first step and state (fresh, or every
member restored from the newest checkpoint step all of them kept); `member_copy` one member's
slice of the stacked state for its checkpoint, one compiled program for any number of members.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np

from cgpt.errors import TrainError
from cgpt.sharding.strategies import SingleDevice
from cgpt.train.background import Background
from cgpt.train import fused, setup

_ABSTRACT: dict = {}


def abstract_member(cfg, recipe):
    """One member's (params, opt_state) shapes (`jax.eval_shape` of its init), traced once a
    shape: the layout and the step's compile both need them."""
    key = (cfg, recipe)
    if key not in _ABSTRACT:
        _ABSTRACT[key] = jax.eval_shape(lambda: fused.init_member(cfg, recipe, 0))
    return _ABSTRACT[key]


_COPY: dict = {}


def member_copy(tree, k: int, shardings=None):
    """Member `k`'s slice of a stacked tree, as new arrays (`shardings`: the member's own
    layout, `Members.member_state`; None: where XLA puts it). The index is traced, so one
    program serves every member: a save of M members compiles once, not M slices of every
    leaf (a 7-member group's all-members slice took 5.6 s to compile under load)."""
    key = None if shardings is None else (jax.tree.structure(shardings),
                                          tuple(jax.tree.leaves(shardings)))
    if key not in _COPY:
        take = lambda t, i: jax.tree.map(  # noqa: E731
            lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), t)
        _COPY[key] = jax.jit(take) if shardings is None else jax.jit(take,
                                                                      out_shardings=shardings)
    return _COPY[key](tree, np.int32(k))


def init_states(res, live, lay) -> dict:
    """{member: its fresh (params, opt_state)} in its own layout on `lay`, each as a solo run
    initializes it; one optimizer init for all (its state holds no hyperparameter)."""
    return {i: fused.init_member(res[i].cfg, res[live[0]].recipe, res[i].run.train.seed,
                                 lay.member_state) for i in live}


class Prepare:
    """The group's initial states, stacked state and hyperparameters, computed in a background
    thread (started here); `get()` joins it and returns them, raising its error if it failed.

    `lay`: the layout the states are made for (`fused_loop.layout`), `evaluate`: the group's
    evaluation (`validation`), called on one batch to compile it. Resuming, the
    members' inits serve as restore templates only: nothing is stacked (one stacked state in
    memory at a time)."""

    def __init__(self, res, live: list, lay, evaluate, resuming: bool):
        self.live, self.lay = list(live), lay
        self._bg = Background("cgpt-fused-prepare")
        self._bg.start(lambda: self._run(res, evaluate, resuming))

    def _run(self, res, evaluate, resuming: bool):
        try:  # `metrics.MetricsLog` imports it (seconds): here it overlaps the compile
            import tensorboardX  # noqa: F401
        except ImportError:
            pass
        states = init_states(res, self.live, self.lay)
        hyper = fused.stack_hyper([res[i].recipe for i in self.live])
        stacked = None
        if not resuming:
            stacked = self.lay.stack([states[i][0] for i in self.live],
                                     [states[i][1] for i in self.live])
            fused.members_finite(stacked)  # the save's programs and the evaluation,
            member_copy(stacked, 0, self.lay.member_state)  # compiled off the loop
            evaluate(stacked[0], batches=1)
            jax.block_until_ready(stacked)
        return states, stacked, hyper

    def get(self):
        """(each member's (params, opt_state), the stacked state or None, the stacked Hyper)."""
        return self._bg.wait()

    def drop(self) -> None:
        """Wait for the thread and let go of what it made or raised (the group trains in
        chunks, or the launch failed)."""
        self._bg.outcome()

    join = drop  # the launch failed, or it is over


def start(res, ckpts, outs, live, resuming: bool, lay, prepared=None):
    """(start step, stacked params, stacked optimizer state). Resuming, every member restarts
    from the newest step all of them kept; later checkpoints are set aside (a rewind).
    `prepared`: `Prepare.get()`'s states for these members on `lay`, or None (made here)."""
    if prepared is None:
        states = init_states(res, live, lay)
        stacked = None
    else:
        states, stacked = dict(prepared[0]), prepared[1]
    start_step = 0
    if resuming:
        common = set.intersection(*(set(ckpts[i].steps()) for i in live))
        start_step = max(common, default=0)
        for i in live:
            ckpts[i].discard_after(start_step)
        strategy = lay.strategy or SingleDevice(res[live[0]].cfg)  # restored in its layout
        got = {}
        for i in live:
            got[i], p, o = setup.start_state(res[i], strategy, ckpts[i], *states[i], outs[i],
                                             resume=True, from_step=None, branch_from=None)
            states[i] = (p, o)
        if len(set(got.values())) > 1:  # a checkpoint was unreadable and fell back further
            raise TrainError("the fused runs restored different steps ("
                             + ", ".join(f"{outs[i]}: {got[i]}" for i in live)
                             + "); resume them with --from-step at a step all of them keep")
        start_step, stacked = got[live[0]], None
    if stacked is None:
        stacked = lay.stack([states[i][0] for i in live], [states[i][1] for i in live])
    return start_step, stacked[0], stacked[1]


def validation(r0, data, lay):
    """evaluate(params [M, ...]) -> [M] mean losses over the validation split, batched as a
    solo run batches it (`cgpt.train.loop._validation`); the split is the same for every seed."""
    eval_fn = fused.make_fused_eval(r0.cfg, lay.loss, lay.spmd_axis_name, lay.eval_sharding(),
                                    fused.members_per_pass(lay.member_sharding(), lay.loop))
    eval_bs = min(r0.micro_batch * r0.replicas, data.num_val_sequences)
    eval_bs -= eval_bs % r0.replicas
    limit = r0.run.train.eval_batches

    def evaluate(params, batches: int | None = None) -> np.ndarray:
        """`batches`: at most this many (the start's compile uses 1)."""
        stop = min(limit or batches or 0, batches or limit or 0)
        queued = []  # every batch dispatched before any is read: one wait, not one a batch
        for batch in data.val_batches(eval_bs, drop_last=True):
            queued.append(eval_fn(params, jnp.asarray(batch)))
            if stop and len(queued) >= stop:
                break
        losses = [np.asarray(x, np.float64) for x in queued]
        return sum(x * eval_bs for x in losses) / (len(losses) * eval_bs)

    return evaluate
