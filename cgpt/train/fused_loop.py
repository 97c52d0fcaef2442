"""Training a fused group: one vmapped program, one run directory per member.

Each member's run directory ends up as `train` would leave it (config.yaml, tokenizer.json,
metrics.jsonl, checkpoints, summary.json), so `cgpt.load(member_dir)` and `cgpt train
--resume` of one member alone work, and its logged losses equal the run trained alone (within
1e-6 in f32, `tests/fused/test_fused.py`). What is shared: one compile, one process, one loop.

Faults stay per member. A member whose loss or gradient norm is not finite at step k keeps its
last good state (the step masks its update), fails at step k with the advice a solo run prints
(`failed.json`, `cgpt.train.resume.nonfinite_stop`), writes nothing more, and is masked from
the step after next on (its scalars are read a step late, `cgpt.train.loop`); the others go
on. Nothing non-finite reaches the disk: every save is behind `fused.members_finite`.
Relaunching a killed group with `resume=True` restarts every member from the newest checkpoint
step they all kept (later ones are deleted, not kept in `discarded_checkpoints/` as
`--from-step` does): batches are a pure function of the step, so the rewound members retrain
exactly what they had.
"""
from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from cgpt.config import backend
from cgpt.config.units import fmt_bytes
from cgpt.config.model import remat_value
from cgpt.config.run import RunConfig
from cgpt.errors import TrainError
from cgpt.sharding.members import Members
from cgpt.sharding import distributed
from cgpt.train import fit, fused, fused_prep, loop, preempt, setup
from cgpt.train.launch import close_all
from cgpt.train.lifecycle import Lifecycle
from cgpt.train.memo import Memo
from cgpt.train.mfu import Throughput
from cgpt.train.resolve import resolve


def train_fused(runs: Sequence[RunConfig], outs: Sequence[str | Path], resume: bool = False,
                progress: bool = True, spread: bool | None = None) -> list[dict | TrainError]:
    """Train `runs` (one shape, see `cgpt.train.fused.check_group`) as one program into the
    run directories `outs`; returns each member's summary, or the TrainError that stopped it.

    Every directory is locked while this runs; a launch that fails before the configs are
    written leaves nothing behind. Single process (a TrainError in a multi-process job); each
    member on its run's devices (one for train.mode=single, its mesh for
    data_parallel/weight_streaming), the members split over the devices left when `spread`
    (default: on accelerators, not on CPU, whose devices share the same cores and where one
    device keeps the solo runs' exact numerics); see `cgpt.sharding.members`."""
    procs = distributed.job_processes()  # the environment's, read before JAX starts a backend
    if procs > 1 or jax.process_count() > 1:
        raise TrainError(f"fused training runs in one process, but this job has "
                         f"{max(procs, jax.process_count())} (SLURM_NTASKS or "
                         "JAX_NUM_PROCESSES); launch it as one task, or train the runs alone "
                         "(cgpt sweep --no-fuse)")
    outs = [Path(o) for o in outs]
    if len(runs) != len(outs):
        raise TrainError(f"fused training got {len(runs)} configs but {len(outs)} --out "
                         "directories; give one --out per config")
    dup = sorted({str(o) for o in outs if [p.resolve() for p in outs].count(o.resolve()) > 1})
    if dup:
        raise TrainError(f"fused runs need one directory each; {', '.join(dup)} is given twice")
    lives = [Lifecycle(run, out, resuming=resume) for run, out in zip(runs, outs)]
    with contextlib.ExitStack() as stack:
        for life in lives:
            life.open(stack)
        _train_fused(lives, progress, default_spread() if spread is None else spread)
    return [life.result for life in lives]


def default_spread() -> bool:
    """Members split over the devices: on accelerators; on a CPU one device keeps the solo
    runs' numerics (its devices share the same cores)."""
    return jax.default_backend() != "cpu"


def _train_fused(lives: list[Lifecycle], progress: bool, spread: bool) -> None:
    # ---- set up: each member resolved, the group checked, one compiled step -----------------
    wall0 = time.perf_counter()
    group, memory = [], None
    for life in lives:
        life.check()
        if life.finished is not None:  # finished already
            life.result = life.finished
            continue
        mem = setup.device_memory(life.saved.train)
        memory = mem if memory is None else memory  # the group's: its first member's
        life.res = resolve_member(life.saved, mem)
        group.append(life)
    if not group:
        return
    fused.check_group([m.res for m in group], [str(m.out) for m in group])
    data = [setup.run_data(m.res, m.out, m.fresh) for m in group]
    # while the step compiles, the rest of the start is prepared in a background thread
    # (`fused_prep.Prepare`), used if all members fit one program
    r0 = group[0].res
    lay = layout(r0, len(group), spread)
    evaluate = fused_prep.validation(r0, data[0], lay)
    prep = fused_prep.Prepare([m.res for m in group], lay, evaluate, group[0].resuming)
    try:
        # as many members per program as fit the device (as micro-batches are chosen); the
        # rest train next, in this process, from the same compiled step
        per, _ = members_that_fit(r0, len(group), memory, spread)
        if per < len(group):
            prep.drop()  # made for all members: not held while the chunks train
        for c in range(0, len(group), per):
            chunk = group[c:c + per]
            for life, d in zip(chunk, data[c:c + per]):
                life.data = d
            _train_chunk(chunk, spread, progress, wall0 if c == 0 else time.perf_counter(),
                         (prep, evaluate) if per == len(group) else None)
    finally:
        prep.join()


def compile_group(runs: Sequence[RunConfig]) -> list[str]:
    """Compile a fresh group's step ahead, on abstract values (kept in this process, where
    `train_fused(runs, ...)` then finds it), and its members' init into the persistent cache
    when one is set: a sweep's worker calls this in a background thread for its next group
    while the current job trains (`cgpt.sweep.worker`). Returns the names compiled; nothing
    is written to a run directory."""
    memory, spread = setup.device_memory(runs[0].train), default_spread()
    res = [resolve_member(replace(r, model=backend.resolve(r.model)), memory)  # as
           for r in runs]  # resume.check_config resolves a fresh run's model
    fused.check_group(res, [f"member {k}" for k in range(len(res))])
    members_that_fit(res[0], len(res), memory, spread)
    done = ["fused step"]
    if jax.config.jax_compilation_cache_dir and res[0].mode == "single":
        for cfg in {r.cfg for r in res}:  # the init programs `fused.init_member` runs
            fused._init_params.lower(cfg, res[0].run.train.seed).compile()
        done.append("init")
    return done


def resolve_member(run: RunConfig, memory: int):
    """A member resolved as it trains: on one device (train.mode=single) or on this process's
    devices as `train` places it alone (its mesh), micro-batch and remat as configured (no
    search: one shape, the group's memory checked by `members_that_fit`)."""
    devices = jax.devices()[:1] if run.train.mode == "single" else jax.devices()
    r = resolve(run, devices, device_memory=memory)
    return r.fitted(r.micro_batch, remat_value(r.cfg.remat))


def _train_chunk(group: list[Lifecycle], spread: bool, progress: bool, wall0: float,
                 prepared) -> None:
    """Train `group` (members of one program, as many as fit: `members_that_fit`) from their
    start to the end, then summarize."""
    r0 = group[0].res
    cfg, M = r0.cfg, len(group)
    step_fn, bytes_ = _compiled(r0, M, spread)
    lay = layout(r0, M, spread)
    print(f"{cfg.name}: {M} runs fused into one program, micro-batch {r0.micro_batch} x "
          f"{r0.accum} accumulation step(s): {fmt_bytes(bytes_['total'])} per device, "
          f"{lay.line()}", file=sys.stderr, flush=True)
    for life in group:
        life.commit(life.res, life.data)  # each directory a resumable run once it begins
    try:
        prep, evaluate = prepared or (None, fused_prep.validation(r0, group[0].data, lay))
        ready = prep.get() if prep is not None else None
        hyper = ready[2] if ready else None
        start, params, opt_state = fused_prep.start(
            [m.res for m in group], [m.ckpt for m in group], [m.out for m in group],
            group[0].resuming, lay, ready)
        del ready  # the members' unstacked initial states are not kept while training
        for life in group:
            life.begin(start)
        speed, params = _loop(group, start, [params, opt_state], step_fn, (evaluate, hyper),
                              lay, progress)
    finally:
        close_all(*(life.close for life in group))

    # ---- the summaries ----------------------------------------------------------------------
    placement = {**lay.describe(), "micro_batch": r0.micro_batch, "accum": r0.accum,
                 "remat": remat_value(cfg.remat), "bytes_per_device": bytes_["total"], "fused": M}
    for k, life in enumerate(group):
        if life.result is not None:  # failed
            continue
        val_loss = life.val_loss
        if math.isnan(val_loss):  # resumed at its end: no fresh evaluation
            val_loss = float(evaluate(params)[k])
        life.finish(val_loss, speed, time.perf_counter() - wall0, placement)


# (shape key, members, spread) -> (compiled step, bytes): a process reuses them
# (members_that_fit compiles a few member counts of one shape, then the group trains with one)
_COMPILED = Memo("_compiled", 8)


def _compiled(r0, members: int, spread: bool):
    """The fused step for `members` stacked states, compiled once per process and shape."""
    key = (r0.cfg.replace(name="", init_std=0.0, out_init_std=None, mup_init_std=0.0),
           r0.recipe.b1, r0.recipe.b2, r0.recipe.adam_eps, r0.total_steps, r0.accum,
           r0.micro_batch, r0.seq_len, members, spread, r0.mode,
           tuple(r0.mesh.items()), r0.run.train.micro_batches)
    return _COMPILED.get(key, lambda: _compile_step(r0, members, spread))


def _compile_step(r0, members: int, spread: bool):
    """Lower and compile the fused step for `members` stacked states of `r0`'s shape."""
    cfg = r0.cfg
    a_p, a_o = fused_prep.abstract_member(cfg, r0.recipe)
    lay = layout(r0, members, spread)
    sh, bsh = lay.member_sharding(), lay.batch_sharding()
    grow = lambda x, s: jax.ShapeDtypeStruct((members, *x.shape), x.dtype,  # noqa: E731
                                             sharding=s)
    a_hyper = fused.Hyper(
        lr=jax.ShapeDtypeStruct((members, r0.total_steps + 1), jnp.float32, sharding=sh),
        weight_decay=jax.ShapeDtypeStruct((members,), jnp.float32, sharding=sh),
        clip_norm=jax.ShapeDtypeStruct((members,), jnp.float32, sharding=sh))
    a_batch = jax.ShapeDtypeStruct(
        (members, r0.accum, r0.micro_batch * r0.replicas, r0.seq_len + 1), jnp.int32,
        sharding=bsh)
    per_pass = fused.members_per_pass(lay.member_sharding(), lay.loop)
    compiled = fused.make_fused_step(cfg, r0.recipe, lay.loss, lay.spmd_axis_name,
                                     lay.step_shardings(), per_pass,
                                     r0.run.train.gns).lower(
        *(jax.tree.map(lambda x: grow(x, None), a) if s is None else jax.tree.map(grow, a, s)
          for a, s in ((a_p, lay.params), (a_o, lay.opt_state))),
        a_batch, a_hyper,
        jax.ShapeDtypeStruct((members,), jnp.bool_, sharding=sh)).compile()
    return compiled, fit.step_bytes(compiled)


_LAYOUTS = Memo("layout", 8)


def layout(r0, members: int, spread: bool) -> Members:
    """Where `members` stacked members of `r0`'s shape live (`cgpt.sharding.members`): one
    device, the member axis over the devices (`spread`), or beside the run's mesh."""
    key = (r0.cfg, r0.mode, tuple(r0.mesh.items()), r0.batch_size, r0.micro_batch, members,
           spread, r0.run.train.micro_batches)

    def make() -> Members:
        abstract = fused_prep.abstract_member(r0.cfg, r0.recipe)
        try:
            return Members(r0.mode, r0.mesh, r0.cfg, members, jax.local_devices(), abstract,
                           spread=spread, batch=r0.batch_size, micro=r0.micro_batch,
                           mesh_reason=r0.mesh_reason, auto_reason=r0.auto_reason,
                           micro_batches=r0.run.train.micro_batches)
        except ValueError as e:
            raise TrainError(str(e)) from None

    return _LAYOUTS.get(key, make)


def members_that_fit(r0, members: int, memory: int, spread: bool = False) -> tuple[int, int]:
    """(how many of `members` one fused program holds within `memory`, that program's bytes):
    all of them if their compiled step fits; else from the bytes of 1 and of all members
    (linear in the members: states, batches and activations are per member), checked by
    compiling. A TrainError if not even one fits. `spread`: as `layout`'s."""
    usable = fit.usable_memory(memory)
    b_all = _compiled(r0, members, spread)[1]["total"]
    if b_all <= usable:
        return members, b_all
    b_one = _compiled(r0, 1, spread)[1]["total"]
    if b_one > usable:
        raise TrainError(f"one run of {r0.cfg.name} needs {fmt_bytes(b_one)} per device but "
                         f"{fmt_bytes(usable)} are usable; train it alone (--no-fuse) so that "
                         "train can choose its micro-batch and remat, or on more devices")
    per = max(1.0, (b_all - b_one) / (members - 1))
    m = max(1, min(members - 1, int((usable - b_one) // per) + 1))
    while m > 1 and _compiled(r0, m, spread)[1]["total"] > usable:
        m -= 1
    return m, _compiled(r0, m, spread)[1]["total"]


def _loop(group: list[Lifecycle], start: int, state: list, step_fn, prepared, lay: Members,
          progress: bool):
    """The fused steps from `start`, in the loop of a run alone (`cgpt.train.loop.run`): each
    member's record, guard and saves are its own (`Lifecycle`); a member that fails stops
    alone. `prepared`: (the group's evaluation, its stacked Hyper or None).
    Returns (throughput, the final params)."""
    evaluate, hyper = prepared
    r0 = group[0].res
    program = Group(group, state, step_fn, evaluate, hyper, lay)
    speed = Throughput.for_model(r0.cfg, r0.seq_len, 1)
    bar = tqdm(total=r0.total_steps, initial=start, disable=not progress, unit="step",
               dynamic_ncols=True, desc=f"{r0.cfg.name} x{len(group)} fused")
    triggers = preempt.CheckpointTriggers(r0.run.train.checkpoint_minutes).install()
    try:
        loop.run(group, program, start, speed, triggers, bar)
    finally:
        close_all(triggers.uninstall, bar.close)
    return speed, program.state[0]


class Group:
    """A fused group's `cgpt.train.loop.Program`: the members' stacked states, the fused
    step, its per-member hyperparameters and the mask of the members training."""

    def __init__(self, lives: list[Lifecycle], state: list, step_fn, evaluate, hyper,
                 lay: Members):
        self.lives, self.state, self.step_fn, self._evaluate, self.lay = (
            lives, state, step_fn, evaluate, lay)
        self.sh = lay.member_sharding()
        self.hyper = lay.put(hyper or fused.stack_hyper([m.res.recipe for m in lives]),
                             self.sh)
        self.lrs = np.asarray(self.hyper.lr)  # the LR each member's update runs at
        self.active = self.mask = None  # the members training; `active` on the device

    def batch(self, step: int) -> np.ndarray:
        r0 = self.lives[0].res
        by_seed = {}  # members of one data seed share their batches
        for m in self.lives:
            if m.data.seed not in by_seed:
                by_seed[m.data.seed] = m.data.train_batch(step, r0.batch_size).reshape(
                    r0.accum, -1, r0.seq_len + 1)
        return np.stack([by_seed[m.data.seed] for m in self.lives])

    def step(self, batch: np.ndarray) -> dict:
        # the members training, a new array each step: a queued step's mask never changes
        active = np.array([m.result is None for m in self.lives])
        if self.mask is None or not np.array_equal(active, self.active):  # moved on a change
            self.active, self.mask = active, self.lay.put(active, self.sh)
        self.state[0], self.state[1], out = self.step_fn(
            *self.state, self.lay.put(batch, self.lay.batch_sharding()), self.hyper, self.mask)
        return out

    def lr(self, k: int, step: int) -> float:
        return float(self.lrs[k, step])

    def evaluate(self) -> np.ndarray:
        return self._evaluate(self.state[0])

    def finite(self) -> np.ndarray:
        return np.asarray(fused.members_finite(tuple(self.state)))

    def member_state(self, k: int):
        """Member `k`'s params and optimizer state, copied for Orbax's asynchronous save."""
        return fused_prep.member_copy(tuple(self.state), k, self.lay.member_state)

    def fail(self, k: int, err: TrainError) -> None:
        self.lives[k].fail(err)  # masked from the next step queued on
