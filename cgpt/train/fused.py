"""Fused training: runs of one model shape trained as one vmapped program (issue #21).

Scaling-law sweeps are mostly small runs, and a small run leaves most of a machine idle (on
CPU the tiny presets reach 16-30% of the matmul peak; each run also pays its own compile and
process start). Runs that share a model shape and a step count but differ in seed, data
order, peak LR, warmup, schedule, weight decay or clipping are one program with a leading
member axis: `jax.vmap` over the members' params, optimizer states, batches and
hyperparameters (HFTA, Wang et al., MLSys 2021). On a CPU with the members on one device the
step loops over them instead (`members_per_pass`: the vmap made each member's step 1.2-3x
dearer than the solo step there; the loop runs the solo step's program, bit-identical).

Each member's optimizer is `cgpt.train.optim.make_optimizer`'s chain with the same state
(so its checkpoints restore into a run trained alone), but the learning rate is read from a
per-member table: `optim.schedule(recipe)` evaluated at every step, so every schedule
(published linear/cosine, WSD) is exactly the one a solo run uses. Weight decay and the
clipping norm are per-member arrays too; Adam's b1, b2 and eps must agree (they are the
preset's, and constant folding of a static b1 could differ from a traced one by an ulp).

A member whose loss or gradient norm is not finite keeps its last good params and optimizer
state (the update is masked inside the step), so the others go on unchanged.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cgpt.config import backend
from cgpt.config.model import ModelConfig
from cgpt.config.run import TrainConfig, config_diff, keys, without
from cgpt.errors import TrainError
from cgpt.model import gpt as model
from cgpt.sharding.members import FUSABLE_MODES
from cgpt.train import optim
from cgpt.train.memo import Memo
from cgpt.train.step import make_step

# what one program fixes of the resolved recipe (the config's keys are checked by their role)
SHARED_RECIPE_KEYS = ("total_steps", "batch_size", "adam_eps", "b1", "b2")


def check_group(resolved: Sequence, names: Sequence[str]) -> None:
    """Raise a TrainError naming the first key on which a member differs from member 0 in a
    way one program cannot train (`resolved`: each member's `Resolved`, `names`: its --out)."""
    if not resolved:
        raise TrainError("fused training needs at least one run")
    first = resolved[0]
    for i, r in enumerate(resolved):
        if r.mode not in FUSABLE_MODES:
            raise TrainError(f"fused run {names[i]}: train.mode={r.run.train.mode} resolved to "
                             f"{r.mode}; fused training supports {', '.join(FUSABLE_MODES)}: "
                             "set train.mode, or train the run alone (cgpt sweep --no-fuse)")
        for key, a, b in (("train.mode", first.mode, r.mode), ("train.mesh", first.mesh, r.mesh)):
            if a != b:  # one program has one mesh
                raise TrainError(f"fused runs must share {key}: {names[0]} resolved to {a!r} "
                                 f"but {names[i]} to {b!r}; train the others in another group")
    a = first.run.to_dict()
    ra = dataclasses.asdict(first.recipe)
    for i, r in enumerate(resolved[1:], 1):
        b = r.run.to_dict()
        diff = [d for d in config_diff(without(a, "member"), without(b, "member"))
                if d != "preset"]
        if diff:
            s, k = diff[0].split(".")
            member = ["data.seed"] + [f"train.{x}" for x in keys(TrainConfig, "member")]
            raise TrainError(
                f"fused runs must share {diff[0]}: {names[0]} has {a[s][k]!r} but {names[i]} "
                f"has {b[s][k]!r}; members may differ only in {', '.join(member)} and the "
                "init scales; train the others in another group")
        rb = dataclasses.asdict(r.recipe)
        for k in SHARED_RECIPE_KEYS:
            if ra[k] != rb[k]:
                raise TrainError(f"fused runs must share the recipe's {k}: {names[0]} has "
                                 f"{ra[k]!r} but {names[i]} has {rb[k]!r}; train the others in "
                                 "another group")


@dataclasses.dataclass(frozen=True)
class Hyper:
    """Per-member optimizer hyperparameters as arrays with a leading member axis."""

    lr: jax.Array  # [M, total_steps + 1]: the schedule at every update count
    weight_decay: jax.Array  # [M]
    clip_norm: jax.Array  # [M]


jax.tree_util.register_dataclass(Hyper, data_fields=["lr", "weight_decay", "clip_norm"],
                                 meta_fields=[])


def lr_table(recipe) -> np.ndarray:
    """`optim.schedule(recipe)` at counts 0..total_steps (float32): the solo run's LRs."""
    counts = jnp.arange(recipe.total_steps + 1, dtype=jnp.int32)
    return np.asarray(jax.jit(jax.vmap(optim.schedule(recipe)))(counts), np.float32)


def stack_hyper(recipes: Sequence) -> Hyper:
    return Hyper(lr=jnp.asarray(np.stack([lr_table(r) for r in recipes])),
                 weight_decay=jnp.asarray([r.weight_decay for r in recipes], jnp.float32),
                 clip_norm=jnp.asarray([r.clip_norm for r in recipes], jnp.float32))


def member_optimizer(h: Hyper, recipe, cfg: ModelConfig) -> optax.GradientTransformation:
    """One member's optimizer (`h`: its slice of the arrays, inside the vmap): the run's chain
    (`optim.make_optimizer`) with the per-member values traced."""
    return optim.make_optimizer(recipe, cfg, lr=lambda count: h.lr[count],
                                weight_decay=h.weight_decay, clip_norm=h.clip_norm)


def make_fused_step(cfg: ModelConfig, recipe, loss: Callable = model.loss_fn,
                    spmd_axis_name: str | None = None, shardings=None,
                    per_pass: int = 0, gns: bool = False) -> Callable:
    """step(params, opt_state, batch [M, accum, micro, T+1], hyper, active [M]) ->
    (params, opt_state, {loss, grad_norm, ok} each [M]), jitted with params and state donated;
    `gns`: each member's noise scale estimates too (`make_step`'s).

    A member that is not `active`, or whose loss or gradient norm is not finite, keeps its
    params and optimizer state (`ok` is False for it). On a mesh (`cgpt.sharding.members`):
    `loss` is the run's (its activation constraints), `spmd_axis_name` the mesh axis of the
    members, `shardings` the (in, out) shardings that pin every layout. `per_pass`: members
    vmapped per pass of a loop over them (0: all in one pass; `members_per_pass`)."""

    def member(params, opt_state, batch, h, active):
        new_p, new_o, m = make_step(cfg, member_optimizer(h, recipe, cfg), loss, gns)(
            params, opt_state, batch)
        ok = active & jnp.isfinite(m["loss"]) & jnp.isfinite(m["grad_norm"])
        keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
        return (jax.tree.map(keep, new_p, params), jax.tree.map(keep, new_o, opt_state),
                {**m, "ok": ok})

    vmapped = _over_members(member, spmd_axis_name, per_pass)
    if shardings is None:
        return jax.jit(vmapped, donate_argnums=(0, 1))
    return jax.jit(vmapped, in_shardings=shardings[0], out_shardings=shardings[1],
                   donate_argnums=(0, 1))


def members_per_pass(member_sharding=None, loop: bool = False) -> int:
    """How many members one pass of the fused step vmaps (0: all of them).

    On a CPU with the members on one device (`member_sharding` None), 1: a loop over the
    members, each step with the solo step's shapes. vmapping k members multiplies every
    activation by k (the [k, B, T, V] logits leave the L2 cache, and XLA:CPU's YNNPACK
    kernels run the batched dots and a leading member axis's reductions slower than k solo
    ones), which made the step 1.2-3x dearer per member than the solo step
    (bench/fused_step.py). Elsewhere (accelerators, members spread over devices) all members
    in one vmapped program. `loop`: a layer_pipelined group held on a CPU mesh
    (`cgpt.sharding.members.Members.loop`), 1."""
    return 1 if loop or member_sharding is None and backend.current_platform() == "cpu" else 0


def _over_members(fn: Callable, spmd_axis_name: str | None, per_pass: int,
                  in_axes=0) -> Callable:
    """`fn` over the leading member axis: vmapped over all members (per_pass 0, or on a
    member mesh axis), or `per_pass` members at a time in a loop over them (`jax.lax.map`;
    one member a pass is not vmapped at all: the solo step's program, member after member)."""
    if per_pass == 0 or spmd_axis_name is not None:
        return jax.vmap(fn, in_axes=in_axes, spmd_axis_name=spmd_axis_name)
    shared = [i for i, a in enumerate(in_axes if isinstance(in_axes, tuple) else ()) if a is None]

    def looped(*args):
        xs = tuple(a for i, a in enumerate(args) if i not in shared)

        def one(x):
            it = iter(x)
            return fn(*(args[i] if i in shared else next(it) for i in range(len(args))))

        return jax.lax.map(one, xs, batch_size=None if per_pass == 1 else per_pass)

    return looped


def make_fused_eval(cfg: ModelConfig, loss: Callable = model.loss_fn,
                    spmd_axis_name: str | None = None, tokens_sharding=None,
                    per_pass: int = 0) -> Callable:
    """eval(params [M, ...], tokens [B, T+1]) -> [M] losses on one shared batch (on a mesh:
    the tokens laid out as the run lays out an eval batch, `tokens_sharding`; `per_pass` as
    in `make_fused_step`)."""
    fn = jax.jit(_over_members(lambda p, tokens: loss(p, tokens, cfg), spmd_axis_name,
                               per_pass, in_axes=(0, None)))
    if tokens_sharding is None:
        return fn
    return lambda params, tokens: fn(params, jax.device_put(tokens, tokens_sharding))


@jax.jit
def members_finite(tree) -> jax.Array:
    """[M] booleans: every float leaf of member m is finite."""
    leaves = [jnp.isfinite(x).reshape(x.shape[0], -1).all(axis=1) for x in jax.tree.leaves(tree)
              if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.stack(leaves).all(axis=0)


def stack(trees: Sequence):
    """Member trees -> one tree with a leading member axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def member(tree, i: int):
    """Member `i`'s slice of a stacked tree."""
    return jax.tree.map(lambda x: x[i], tree)


_init_params = jax.jit(model.init_params, static_argnums=0)  # one compile per shape


@functools.partial(jax.jit, static_argnums=(0, 1))
def _init_opt(recipe, cfg: ModelConfig, params):
    return optim.make_optimizer(recipe, cfg).init(params)


def init_member(cfg: ModelConfig, recipe, seed: int, shardings=None):
    """(params, opt_state) exactly as a solo run initializes them: on one device
    (`SingleDevice`), or with `shardings` (params', opt_state's) directly in a sharded run's
    layout (`Sharded.compile_step`). The optimizer's initial state (zero moments, zero counts)
    does not depend on the hyperparameters, so a group may pass one member's recipe for all:
    one compile."""
    if shardings is None:
        params = _init_params(cfg, seed)
        return params, _init_opt(recipe, cfg, params)
    init_p, init_o = _init_on(shardings)
    params = init_p(cfg, seed)
    return params, init_o(recipe, cfg, params)


_INIT_ON = Memo("_init_on", 8)


def _init_on(shardings):
    """The jitted inits with `shardings` as outputs, one per layout (compiled once a shape)."""
    key = tuple((jax.tree.structure(t), tuple(jax.tree.leaves(t))) for t in shardings)
    return _INIT_ON.get(key, lambda: (
        jax.jit(model.init_params, static_argnums=0, out_shardings=shardings[0]),
        jax.jit(lambda recipe, cfg, p: optim.make_optimizer(recipe, cfg).init(p),
                static_argnums=(0, 1), out_shardings=shardings[1])))
