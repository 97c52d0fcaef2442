"""The member axis of a fused program beside a run's own mesh (issue #21 item 3).

A fused group (`cgpt.train.fused`) stacks its members' params, optimizer states, batches and
hyperparameters on a leading member axis and `jax.vmap`s one member's step over it. Where
that axis lives on the devices:

  single            each member's step on one device: all on the first device, or (`spread`)
                    the members split over a 1-D `member` mesh, no communication.
  data_parallel,    the mesh is `{member: k, **the run's axes}`: the run's own mesh (data=2,
  weight_streaming  data=2 x fsdp=2, ...) repeated for k groups of members, the member axis
                    outermost (as MaxText puts its independent `data`/`diloco` replicas
                    first). Every array is laid out as the run alone lays it out, with the
                    member axis in front: params and optimizer state P('member', *the run's
                    spec), batches P('member', None, rows), per-member values P('member').
                    `jax.vmap(..., spmd_axis_name='member')` adds `member` to every
                    activation constraint the model makes (`Sharded.constrain`), so each
                    group of devices runs the solo run's partitioned step on its members
                    (gradients reduced over its own `data` only). k = 1, every member held
                    on the run's devices (each device holds its shard of every member),
                    unless `spread` and devices are left over: then k is the largest divisor
                    of the members with k x (the run's devices) <= the devices.
  layer_pipelined   the same: `{member: k, stage: s, data: d}`, params P('member', 'stage',
                    ...) (each stage holds its layers of its members), batches P('member',
                    None, 'data'). The step: on a CPU with k = 1 (every device holding its
                    stage of every member) a loop over the members (`loop`: `lax.map` of the
                    solo pipelined step, its program and its `shard_map` unchanged, so
                    bit-identical to the run alone; per member the loop took 1.04x the solo
                    step and the vmap 2.16x on tiny-240k, 0.61x and 0.85x on tiny-45k,
                    bench/fused_pipeline.py: the vmapped single-device step's cost again,
                    `members_per_pass`).
                    Elsewhere vmapped with spmd_axis_name='member': jax's shard_map batching
                    rule adds `member` to the GPipe map's specs, so each member group runs its
                    own pipeline (ppermutes and psums stay inside the group); that map is
                    traced with check_vma=False (`cgpt.sharding.pipeline.gpipe` says why).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from cgpt.config.backend import platform_of
from cgpt.config.model import ModelConfig
from cgpt.model import gpt as model
from cgpt.sharding.axes import member_groups
from cgpt.sharding.mesh import build_mesh
from cgpt.sharding.pipeline import pipelined_loss
from cgpt.sharding.strategies import strategy_on

MEMBER = "member"
FUSABLE_MODES = ("single", "data_parallel", "weight_streaming", "layer_pipelined")


class _Split(NamedTuple):
    """The batch split `LayerPipelined.prepare` checks (a resolved run's fields)."""

    micro_batch: int
    replicas: int


class Members:
    """Where a fused program's stacked arrays live: the mesh, every sharding, the loss.

    `axes`: the run's own mesh ({} for single), `abstract_state`: one member's (params,
    optimizer state) shapes, `batch`/`micro`: the global batch and micro-batch (the run's
    batch axes follow from them, as for a solo run), `micro_batches`: a layer_pipelined run's
    train.micro_batches (checked against `micro` as a solo run's `prepare` does)."""

    def __init__(self, mode: str, axes: dict[str, int], cfg: ModelConfig, members: int,
                 devices: Sequence, abstract_state, *, spread: bool, batch: int,
                 micro: int | None = None, mesh_reason: str = "", auto_reason: str | None = None,
                 micro_batches: int | None = None):
        if mode not in FUSABLE_MODES:
            raise ValueError(f"train.mode resolved to {mode}: fused training supports "
                             f"{', '.join(FUSABLE_MODES)}; set train.mode to one of them, or "
                             "train these runs alone (cgpt sweep --no-fuse)")
        self.mode, self.members, self.axes = mode, members, dict(axes)
        self.run_devices = math.prod(self.axes.values()) if self.axes else 1
        self.groups = member_groups(members, self.run_devices, len(devices), spread)
        self.strategy = None
        self.loop = False  # members one after another in the step (`members_per_pass`)
        self.member_state = None  # one member's (params, opt_state) shardings, before stacking
        if mode == "single":
            self.mesh = (None if self.groups == 1 else
                         Mesh(np.array(list(devices)[:self.groups]), (MEMBER,)))
            self.spmd_axis_name = None
            self.loss = model.loss_fn
            sh = self.member_sharding()  # None on one device: the default device's
            self.params, self.opt_state = (None if sh is None else jax.tree.map(lambda _: sh, t)
                                           for t in abstract_state)
            return
        self.mesh = build_mesh({MEMBER: self.groups, **self.axes}, devices)
        self.strategy = strategy_on(self.mesh, mode, cfg, batch, micro, micro_batches,
                                    mesh_reason, auto_reason)
        if mode == "layer_pipelined" and micro is not None:  # M checked, the bubble recorded
            self.strategy.prepare(_Split(micro, self.strategy.data_replicas))
        self.spmd_axis_name = MEMBER
        self.loss = self.strategy.loss
        # layer_pipelined: a loop over the members on a CPU whose devices hold every member
        # (the solo step's program, member after member), else vmapped (`gpipe`'s check_vma)
        self.loop = (mode == "layer_pipelined" and self.groups == 1
                     and platform_of(list(devices)[0]) == "cpu")
        if self.loop:
            self.spmd_axis_name = None
        elif mode == "layer_pipelined":
            s = self.strategy
            self.loss = pipelined_loss(cfg, self.mesh, s.micro_batches_for, s.constrain,
                                       check_vma=False)
        a_p, a_o = abstract_state
        # a member's own layout (the run's specs, replicated over the member groups): its
        # init and checkpoint restore land there, sharded as the run alone would hold it
        self.member_state = (self.strategy.param_shardings(a_p),
                             self.strategy.opt_shardings(a_o, a_p))
        self.params = jax.tree.map(self._stacked, self.member_state[0])
        self.opt_state = jax.tree.map(self._stacked, self.member_state[1])

    def _stacked(self, sh: NamedSharding) -> NamedSharding:
        return NamedSharding(self.mesh, P(MEMBER, *sh.spec))

    @property
    def num_devices(self) -> int:
        return 1 if self.mesh is None else self.mesh.size

    def member_sharding(self) -> NamedSharding | None:
        """Arrays [M, ...] split on the member axis only (hyperparameters, masks, metrics);
        None on one device."""
        return None if self.mesh is None else NamedSharding(self.mesh, P(MEMBER))

    def batch_sharding(self) -> NamedSharding | None:
        """Stacked train batches [M, accum, rows, T+1]: rows as the run splits them."""
        if self.strategy is None:
            return self.member_sharding()
        return self._stacked(self.strategy.batch_sharding(3))

    def eval_sharding(self) -> NamedSharding | None:
        """An eval batch [rows, T+1] every member reads: the run's layout, on every group."""
        return None if self.strategy is None else self.strategy.batch_sharding(2)

    def step_shardings(self):
        """(in, out) shardings of the fused step (params, opt, batch, hyper, active), or
        None: on one device the inputs' placement decides."""
        if self.strategy is None:
            return None
        m = self.member_sharding()  # one sharding for every leaf of the hyperparameters
        return ((self.params, self.opt_state, self.batch_sharding(), m, m),
                (self.params, self.opt_state, m))

    def stack(self, params: Sequence, opt_states: Sequence):
        """Member states -> the stacked (params, opt_state) on this layout, by one jitted
        program; on a mesh the members (each in `member_state`) go straight into the stacked
        shardings: no member is ever gathered on one device."""
        join = lambda *xs: jnp.stack(xs)  # noqa: E731
        both = lambda p, o: (jax.tree.map(join, *p), jax.tree.map(join, *o))  # noqa: E731
        if self.strategy is None:  # one program, not one per leaf (51 for tiny-45k: 1.8 s)
            p, o = jax.jit(both)(list(params), list(opt_states))
            return self.put(p, self.params), self.put(o, self.opt_state)
        fn = jax.jit(both, out_shardings=(self.params, self.opt_state))
        return fn(list(params), list(opt_states))

    @staticmethod
    def put(tree, sharding):
        """A host (or stacked) tree on `sharding` (a tree of them, or one; None: the default
        device)."""
        if sharding is None:
            return jax.tree.map(jnp.asarray, tree)
        return jax.device_put(tree, sharding)

    def describe(self) -> dict:
        """The fused members' `placement` (summary.json): the run's own mesh as a solo run
        records it, and the member axis beside it."""
        if self.strategy is None:
            return {"mode": "single", "devices": 1, "data_replicas": 1, "unsharded": [],
                    "member_devices": self.num_devices, "member_groups": self.groups}
        d = self.strategy.describe()
        d["mesh"] = dict(self.axes)
        d["axes"] = {a: v for a, v in d["axes"].items() if a != MEMBER}
        d["devices"] = self.run_devices
        return {**d, "member_devices": self.num_devices, "member_groups": self.groups,
                "member_mesh": dict(self.mesh.shape)}

    def line(self) -> str:
        """What the launch and the dry run print."""
        if self.strategy is None:
            return f"members on {self.num_devices} device(s)"
        mesh = " x ".join(f"{a}={n}" for a, n in self.mesh.shape.items())
        how = ("split over the member axis" if self.groups > 1 else
               "each device holding its shard of every member")
        return (f"{self.mode} mesh {mesh} on {self.num_devices} device(s) ({self.groups} "
                f"group(s) of the run's {self.run_devices}, {how})")
