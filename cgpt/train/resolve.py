"""A run described once: what it will do, decided before anything compiles or loads.

`resolve(RunConfig, devices)` answers every "what will this run do" question in one place:
the token budget and step count, the batch split (micro-batch x accumulation x data
replicas), the recipe (published defaults, warmup, schedule), the compute dtype for the
platform, and the execution mode and mesh. It imports no JAX (devices are only counted), so
`train`, `plan`, the sweep's dry run, `branch` and the benchmarks all read the same frozen
`Resolved`, and none of them recomputes a budget or a batch. The fit (`cgpt.train.fit`) then
picks the micro-batch and remat whose compiled step fits memory: `Resolved.fitted`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from cgpt.config import backend
from cgpt.config.model import ModelConfig
from cgpt.config.recipe import Recipe, published_defaults, steps_for_tokens, warmup_steps_for
from cgpt.config.run import RunConfig
from cgpt.errors import TrainError
from cgpt.sharding.auto import placement
from cgpt.sharding.cost import hardware_for
from cgpt.sharding.axes import HOST_OFFLOAD_REMOVED, check_stages, replica_axes


@dataclass(frozen=True)
class Resolved:
    """Everything derived from a run's config before step 0. `run` is the config as trained:
    its compute dtype concrete (when the platform is known) and, once fitted, its
    micro-batch and remat the fit's choice."""

    run: RunConfig
    platform: str | None  # None: arithmetic only (budget, batch, recipe); dtype left as given
    num_devices: int  # the devices the run uses (one for single)
    mode: str  # single | data_parallel | weight_streaming | layer_pipelined
    mesh: dict[str, int]  # {} for single
    mesh_reason: str
    auto_reason: str | None
    replica_axes: tuple[str, ...]
    tokens: int  # the budget asked for (the run trains total_steps x tokens_per_step)
    recipe: Recipe
    micro_batch: int  # per data replica, per accumulation step
    nodes: int = 1  # the nodes the mesh is laid over (cgpt.sharding.nodes)
    # `--mode auto` on a GPU: every placement it weighed, costed, fastest first
    # (`cgpt.sharding.cost.StepCost`; `cgpt plan` reports them); () otherwise
    auto_ranking: tuple = ()

    @property
    def cfg(self) -> ModelConfig:
        return self.run.model

    @property
    def batch_size(self) -> int:
        return self.recipe.batch_size

    @property
    def seq_len(self) -> int:
        return self.run.data.seq_len

    @property
    def replicas(self) -> int:
        return math.prod(self.mesh[a] for a in self.replica_axes)

    @property
    def accum(self) -> int:
        return self.batch_size // (self.micro_batch * self.replicas)

    @property
    def total_steps(self) -> int:
        return self.recipe.total_steps

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def tokens_trained(self) -> int:
        return self.total_steps * self.tokens_per_step

    def fitted(self, micro_batch: int, remat: bool) -> "Resolved":
        """This run with the fit's micro-batch and remat (`cgpt.train.fit`)."""
        run = replace(self.run, model=self.run.model.replace(remat=remat),
                      train=replace(self.run.train, micro_batch=micro_batch))
        _check_split(self.batch_size, micro_batch, self.replicas)
        return replace(self, run=run, micro_batch=micro_batch)


def _check_split(batch: int, micro: int, replicas: int) -> None:
    if batch % replicas:
        raise TrainError(f"train.batch_size={batch} must be a multiple of the {replicas} data "
                         "replicas of the mesh")
    if batch % (micro * replicas):
        raise TrainError(f"train.batch_size={batch} must be a multiple of train.micro_batch="
                         f"{micro} x {replicas} replicas")


def _check_pipeline(mode: str, mesh: dict, model: ModelConfig, micro_batches: int | None) -> None:
    """Before anything is placed or planned: the stages of a pipeline divide the layers, and
    train.micro_batches (a pipeline's) is never ignored by another mode."""
    if mode == "layer_pipelined":
        try:
            check_stages(model.n_layer, mesh.get("stage", 1))
        except ValueError as e:
            raise TrainError(str(e)) from None
    elif micro_batches is not None:
        raise TrainError(f"train.micro_batches={micro_batches} (--micro-batches) sets a "
                         f"layer_pipelined run's micro-batches, but this run is {mode}; leave it "
                         "out, or use --mode layer_pipelined")


def batch_of(run: RunConfig) -> int:
    """The run's global batch in sequences: train.batch_size, else the published default."""
    return run.train.batch_size or published_defaults(run.model)["batch_size"]


def recipe_of(run: RunConfig) -> tuple[int, Recipe]:
    """(token budget, recipe): the published defaults under the run's train.* values."""
    cfg, t, seq = run.model, run.train, run.data.seq_len
    d = published_defaults(cfg)
    batch = batch_of(run)
    tokens = cfg.chinchilla_tokens() if t.tokens == "chinchilla" else int(t.tokens)
    total = steps_for_tokens(tokens, batch, seq)
    warmup = t.warmup_steps or warmup_steps_for(total, batch * seq, d["published"])
    return tokens, Recipe(
        peak_lr=t.peak_lr or d["peak_lr"],
        decay=t.decay or ("1-sqrt" if t.schedule == "wsd" else d["decay"]),
        schedule=t.schedule, decay_fraction=t.decay_fraction,
        adam_eps=t.adam_eps or d["adam_eps"], batch_size=batch, warmup_steps=min(warmup, total),
        total_steps=total, end_lr_fraction=t.end_lr_fraction, weight_decay=t.weight_decay,
        clip_norm=t.clip_norm)


def resolve(run: RunConfig, devices: int | Sequence | None = None, *, platform: str | None = None,
            device_memory: int | None = None, num_processes: int = 1,
            saved: ModelConfig | None = None, nodes: int = 1) -> Resolved:
    """The run on `devices` (a count, or JAX's device objects: only counted and asked their
    platform). `platform` (default: the devices') makes the compute dtype concrete: "auto"
    becomes the platform's, or, resuming, the `saved` run's. `device_memory` is what `--mode
    auto` places against (bytes per device). Without devices the run is not placed (mode as
    configured, no mesh, one replica): the budget, batch and recipe, for the sweep and
    `branch`, which only do arithmetic. `nodes`: the devices' nodes, for a mesh whose only
    node-crossing axes are `data`/`stage` (`cgpt.sharding.nodes`)."""
    kind = None  # the GPU the cost model times `--mode auto` on (cgpt.sharding.cost)
    if devices is not None and not isinstance(devices, int):
        platform = platform or backend.platform_of(devices[0])
        if getattr(devices[0], "platform", None) and backend.platform_of(devices[0]) == platform:
            kind = getattr(devices[0], "device_kind", None)  # (plan: CPUs stand in for GPUs)
        devices = len(devices)
    model = backend.resolve(run.model, platform, saved) if platform else run.model
    run = replace(run, model=model)
    tokens, recipe = recipe_of(run)
    t = run.train
    if t.host_offload:
        raise TrainError(HOST_OFFLOAD_REMOVED)
    ranking: list = []
    if devices is None:
        mode, mesh, mesh_reason, auto_reason = t.mode, {}, "not placed (no devices given)", None
    elif t.mode == "single":
        if num_processes > 1:
            raise TrainError(f"--mode single runs on one device, but this job has "
                             f"{num_processes} processes; use a sharded --mode (data_parallel, "
                             "weight_streaming, layer_pipelined or auto)")
        if t.mesh:
            raise TrainError(f"--mesh {t.mesh!r} needs a sharded --mode (data_parallel, "
                             "weight_streaming, layer_pipelined or auto)")
        mode, mesh, mesh_reason, auto_reason = "single", {}, "one device", None
    else:
        try:
            # sized with the platform's kernels (its chunked loss, padded vocabulary), as the
            # analytic plan and the fit size them
            sized = backend.for_platform(model, platform) if platform else model
            mode, mesh, mesh_reason, auto_reason = placement(
                t.mode, t.mesh, sized, recipe.batch_size, t.micro_batch, num_devices=devices,
                device_memory=device_memory, seq_len=run.data.seq_len,
                num_processes=num_processes, nodes=nodes,
                hardware=hardware_for(platform, kind, devices // max(1, nodes)), ranking=ranking)
        except ValueError as e:
            raise TrainError(str(e)) from None
    if devices is not None:
        _check_pipeline(mode, mesh, model, t.micro_batches)
    axes = replica_axes(mode, mesh, recipe.batch_size, t.micro_batch) if mesh else ()
    replicas = math.prod(mesh[a] for a in axes)
    _check_split(recipe.batch_size, 1, replicas)
    micro = t.micro_batch or recipe.batch_size // replicas
    _check_split(recipe.batch_size, micro, replicas)
    return Resolved(run=run, platform=platform, num_devices=math.prod(mesh.values()),
                    mode=mode, mesh=mesh,
                    mesh_reason=mesh_reason, auto_reason=auto_reason, replica_axes=axes,
                    tokens=tokens, recipe=recipe, micro_batch=micro, nodes=nodes,
                    auto_ranking=tuple(ranking))
