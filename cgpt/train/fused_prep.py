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
from cgpt.train import evaluation, fused, setup
from cgpt.train.memo import Memo

_ABSTRACT = Memo("abstract_member", 16)


def abstract_member(cfg, recipe):
    """One member's (params, opt_state) shapes (`jax.eval_shape` of its init), traced once a
    shape: the layout and the step's compile both need them."""
    return _ABSTRACT.get((cfg, recipe),
                         lambda: jax.eval_shape(lambda: fused.init_member(cfg, recipe, 0)))


_COPY = Memo("member_copy", 8)


def member_copy(tree, k: int, shardings=None):
    """Member `k`'s slice of a stacked tree, as new arrays (`shardings`: the member's own
    layout, `Members.member_state`; None: where XLA puts it). The index is traced, so one
    program serves every member: a save of M members compiles once, not M slices of every
    leaf (a 7-member group's all-members slice took 5.6 s to compile under load)."""
    key = None if shardings is None else (jax.tree.structure(shardings),
                                          tuple(jax.tree.leaves(shardings)))
    take = lambda t, i: jax.tree.map(  # noqa: E731
        lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), t)
    copy = _COPY.get(key, lambda: jax.jit(take) if shardings is None else
                     jax.jit(take, out_shardings=shardings))
    return copy(tree, np.int32(k))


def init_states(res: list, lay) -> list:
    """Each member's fresh (params, opt_state) (`res`: their `Resolved`s) in its own layout on
    `lay`, as a solo run initializes it; one optimizer init for all (its state holds no
    hyperparameter)."""
    return [fused.init_member(r.cfg, res[0].recipe, r.run.train.seed, lay.member_state)
            for r in res]


class Prepare:
    """The group's initial states, stacked state and hyperparameters, computed in a background
    thread (started here); `get()` joins it and returns them, raising its error if it failed.

    `lay`: the layout the states are made for (`fused_loop.layout`), `evaluate`: the group's
    evaluation (`validation`), called on one batch to compile it. Resuming, the
    members' inits serve as restore templates only: nothing is stacked (one stacked state in
    memory at a time)."""

    def __init__(self, res: list, lay, evaluate, resuming: bool):
        self.lay = lay
        self._bg = Background("cgpt-fused-prepare")
        self._bg.start(lambda: self._run(res, evaluate, resuming))

    def _run(self, res, evaluate, resuming: bool):
        try:  # `metrics.MetricsLog` imports it (seconds): here it overlaps the compile
            import tensorboardX  # noqa: F401
        except ImportError:
            pass
        states = init_states(res, self.lay)
        hyper = fused.stack_hyper([r.recipe for r in res])
        stacked = None
        if not resuming:
            stacked = self.lay.stack([p for p, _ in states], [o for _, o in states])
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


def start(res: list, ckpts: list, outs: list, resuming: bool, lay, prepared=None):
    """(start step, stacked params, stacked optimizer state) of the members `res` (with their
    checkpointers and run directories). Resuming, every member restarts from the newest step
    all of them kept; later checkpoints are deleted (retrained exactly, so a killed group
    leaves no `discarded_checkpoints/`). `prepared`:
    `Prepare.get()`'s states for these members on `lay`, or None (made here)."""
    if prepared is None:
        states, stacked = init_states(res, lay), None
    else:
        states, stacked = list(prepared[0]), prepared[1]
    start_step = 0
    if resuming:
        common = set.intersection(*(set(c.steps()) for c in ckpts))
        start_step = max(common, default=0)
        for c in ckpts:  # retrained bit-exactly (batches are a pure function of the step)
            c.discard_after(start_step, remove=True)
        strategy = lay.strategy or SingleDevice(res[0].cfg)  # restored in its layout
        got = []
        for k, (r, c, out) in enumerate(zip(res, ckpts, outs)):
            step, p, o = setup.start_state(r, strategy, c, states[k], out, resume=True,
                                           from_step=None, branch_from=None)
            got.append(step)
            states[k] = (p, o)
        if len(set(got)) > 1:  # a checkpoint was unreadable and fell back further
            raise TrainError("the fused runs restored different steps ("
                             + ", ".join(f"{out}: {s}" for out, s in zip(outs, got))
                             + "); resume them with --from-step at a step all of them keep")
        start_step, stacked = got[0], None
    if stacked is None:
        stacked = lay.stack([p for p, _ in states], [o for _, o in states])
    return start_step, stacked[0], stacked[1]


def validation(r0, data, lay):
    """evaluate(params [M, ...], batches=None) -> [M] validation losses, as a solo run's
    (`cgpt.train.evaluation`; `batches`: at most this many, the start's compile uses 1)."""
    eval_fn = fused.make_fused_eval(r0.cfg, lay.loss, lay.spmd_axis_name, lay.eval_sharding(),
                                    fused.members_per_pass(lay.member_sharding(), lay.loop))
    return evaluation.validation(r0, data, lambda p, batch, _: eval_fn(p, jnp.asarray(batch)))
