"""The strategies: a mesh, a rules table, and jit with explicit in/out shardings.

Every strategy offers the training loop the same interface: `compile_step`, `jit_step`,
`compile_eval`, `abstract_state`, `batch_sharding`, `batch_rows`, `shard_batch`,
`shard_eval_batch`, `prepare`, `describe`, `loss`, `data_replicas` (the number of distinct
batch shards: the global batch is micro_batch x accumulation x data_replicas sequences),
`num_devices`, `mesh`, `bubble_fraction`.
"""
from __future__ import annotations

import functools
import logging
import math
from typing import Callable, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from cgpt.sharding import distributed
from cgpt.model import gpt as model
from cgpt.config import backend
from cgpt.config.model import ModelConfig
from cgpt.config.recipe import published_defaults
from cgpt.sharding.auto import placement
from cgpt.sharding.mesh import build_mesh, device_memory_bytes, maybe_initialize_distributed
from cgpt.sharding.pipeline import bubble_fraction, pipelined_loss
from cgpt.sharding.fitrule import divisors_desc
from cgpt.sharding.axes import (HOST_OFFLOAD_REMOVED, SHARDED_MODES, batch_axes as ws_batch_axes,
                                check_stages)
from cgpt.sharding.nodes import node_axes, weight_axes
from cgpt.sharding.rules import (DATA_PARALLEL, LAYER_PIPELINED, WEIGHT_STREAMING, Rules,
                                 Unsharded, logical_to_spec, with_rule)

log = logging.getLogger(__name__)


def _is_axes(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(a, str) or a is None for a in x)


def _like(tree, params_struct) -> bool:
    try:
        return jax.tree.structure(tree) == params_struct
    except Exception:
        return False


def _paths(tree) -> list[str]:
    return ["/".join(str(getattr(k, "key", k)) for k in path)
            for path, _ in jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_axes)[0]]


# ---- the single-device reference -----------------------------------------------------------
class SingleDevice:
    """Everything on one device: the reference every other mode must match."""

    mode = "single"
    mesh = None
    data_replicas = 1
    num_devices = 1
    bubble_fraction = None
    loss: Callable = staticmethod(model.loss_fn)

    def __init__(self, cfg: ModelConfig, device=None):
        self.cfg = cfg
        self.device = jax.devices()[0] if device is None else device  # or a compile-only GPU

    def compile_step(self, step, optimizer, seed: int, plan):
        params, opt_state = self.init_state(optimizer)(seed)
        return jax.jit(step, donate_argnums=(0, 1)), params, opt_state

    def init_state(self, optimizer) -> Callable:
        """The jitted init(seed) -> (params, opt_state) `compile_step` runs (`fresh_state`)."""
        return fresh_state(self.cfg, optimizer, self.device)

    def compile_eval(self, cfg: ModelConfig):
        return jax.jit(lambda params, tokens: self.loss(params, tokens, cfg))

    def abstract_state(self, params, opt_state):
        sh = jax.sharding.SingleDeviceSharding(self.device)
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                            (params, opt_state))

    def prepare(self, plan) -> None:
        pass

    def batch_rows(self, shape: tuple[int, ...]) -> slice:
        return slice(None)  # one process holds every row

    def shard_batch(self, batch: np.ndarray, shape: tuple[int, ...] | None = None) -> jax.Array:
        return jax.numpy.asarray(batch)

    shard_eval_batch = shard_batch

    def describe(self) -> dict:
        return {"mode": self.mode, "devices": 1, "data_replicas": 1, "unsharded": []}


def fresh_state(cfg: ModelConfig, optimizer, device, **jit_kw) -> Callable:
    """jitted init(seed) -> (params, opt_state): the parameters and the optimizer's state as
    one program (one compile per shape, not two; the same values as initializing them one
    after the other), compiled with `device`'s platform's init options
    (`cgpt.config.backend.init_compile_options`). `jit_kw`: e.g. out_shardings."""

    def init_state(seed):
        params = model.init_params(cfg, seed)
        return params, optimizer.init(params)

    return jax.jit(init_state, compiler_options=backend.init_compile_options(
        backend.platform_of(device)), **jit_kw)


# ---- sharded strategies --------------------------------------------------------------------
class Sharded:
    """Shared machinery: a mesh, a rules table, and jit with explicit in/out shardings.

    `batch_axes` are the mesh axes the rows of every batch are split over; their sizes
    multiply to `data_replicas`. `mesh_reason` says why the mesh has its shape.
    """

    mode = ""
    rules: Rules = []
    bubble_fraction: float | None = None
    auto_reason: str | None = None  # why `--mode auto` chose this mode
    nodes: int = 1  # the nodes the mesh is laid over (`cgpt.sharding.nodes`)

    def __init__(self, cfg: ModelConfig, mesh, batch_axes: Sequence[str] = ("data",),
                 mesh_reason: str = "given by --mesh"):
        self.cfg = cfg
        self.mesh = mesh
        self.num_devices = mesh.size
        self.batch_axes = tuple(a for a in batch_axes if mesh.shape.get(a, 1) > 1)
        self.data_replicas = math.prod(mesh.shape[a] for a in self.batch_axes)
        self.mesh_reason = mesh_reason
        self.loss: Callable = functools.partial(model.loss_fn, constrain=self.constrain)
        self.unsharded: set[Unsharded] = set()  # filled below and while tracing activations
        self.param_specs(report=self.unsharded)
        self._check_unsharded()

    # -- layouts
    def spec(self, axes: Sequence[str | None], shape: Sequence[int]) -> P:
        return logical_to_spec(axes, shape, self.rules, self.mesh)

    def constrain(self, x: jax.Array, axes: tuple) -> jax.Array:
        """The `constrain` hook of `cgpt.model.gpt`: pin an activation to the rules' layout."""
        spec = logical_to_spec(axes, x.shape, self.rules, self.mesh, self.unsharded,
                               f"activation {x.shape} ({', '.join(axes)})")
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    def param_specs(self, params=None, report: set | None = None) -> dict:
        """PartitionSpec of every parameter (same tree as `model.init_params`)."""
        shapes = params if params is not None else jax.eval_shape(
            lambda: model.init_params(self.cfg))
        axes = model.param_axes(self.cfg)
        names = iter(_paths(axes))
        return jax.tree.map(lambda a, p: logical_to_spec(a, p.shape, self.rules, self.mesh,
                                                         report, next(names)),
                            axes, shapes, is_leaf=_is_axes)

    def _check_unsharded(self) -> None:
        """Warn about every parameter dim the rules could not split; stop when none was."""
        params = [u for u in self.unsharded if not u.array.startswith("activation")]
        if not params:
            return
        wanted = {a for u in params for a in u.wanted}
        specs = jax.tree.leaves(self.param_specs(), is_leaf=lambda x: isinstance(x, P))
        got = {a for s in specs for d in s if d for a in ((d,) if isinstance(d, str) else d)}
        if wanted and not got & wanted:
            raise ValueError(
                f"{self.mode} on {self._mesh_str()}: no parameter of {self.cfg.name} can be "
                f"sharded as the rules ask ({len(params)} dims, e.g. {params[0].array} "
                f"{params[0].logical}: {params[0].why}); choose a mesh whose sizes divide "
                f"d_model={self.cfg.d_model} and d_ffn={self.cfg.d_ffn}")
        log.warning("%s on %s: %d parameter dims cannot be split as the rules ask and stay "
                    "replicated over those axes (see placement['unsharded']), e.g. %s", self.mode,
                    self._mesh_str(), len(params),
                    "; ".join(f"{u.array} {u.logical}={u.dim}: {u.why}"
                              for u in sorted(params, key=lambda u: u.array)[:3]))

    def _mesh_str(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.mesh.shape.items())

    def param_shardings(self, params=None) -> dict:
        return jax.tree.map(lambda s: NamedSharding(self.mesh, s), self.param_specs(params),
                            is_leaf=lambda x: isinstance(x, P))

    def opt_shardings(self, opt_state, params=None):
        """Optimizer state laid out like the parameters (Adam moments); scalars replicated."""
        psh = self.param_shardings(params)
        struct = jax.tree.structure(psh)
        rep = NamedSharding(self.mesh, P())

        def place(sub):
            if _like(sub, struct):
                return psh
            return jax.tree.map(lambda _: rep, sub)

        return jax.tree.map(place, opt_state, is_leaf=lambda t: _like(t, struct))

    def batch_sharding(self, ndim: int = 3) -> NamedSharding:
        """Token batches [accum, rows, T+1] (ndim 3) or [rows, T+1] (ndim 2): rows over the
        batch axes."""
        ax = self.batch_axes
        rows = None if not ax else ax[0] if len(ax) == 1 else ax
        return NamedSharding(self.mesh, P(None, rows) if ndim == 3 else P(rows))

    # -- the training-loop interface
    def jit_step(self, step: Callable, abstract_params, abstract_opt_state) -> Callable:
        """The step jitted with this mode's in/out shardings (donating params and state)."""
        psh = self.param_shardings(abstract_params)
        osh = self.opt_shardings(abstract_opt_state, abstract_params)
        return jax.jit(step, in_shardings=(psh, osh, self.batch_sharding(3)),
                       out_shardings=(psh, osh, NamedSharding(self.mesh, P())),
                       donate_argnums=(0, 1))

    def prepare(self, plan) -> None:
        """Check the run's batch split against the mesh (overridden by layer_pipelined)."""

    def compile_step(self, step, optimizer, seed: int, plan):
        """(jitted step, params, opt_state), the state initialized directly in its layout."""
        self.prepare(plan)
        abstract = self._abstract_state(optimizer)
        params, opt_state = self.init_state(optimizer, abstract)(seed)
        return self.jit_step(step, *abstract), params, opt_state

    def _abstract_state(self, optimizer) -> tuple:
        """(params, opt_state) as shapes and dtypes, nothing allocated."""
        abstract_p = jax.eval_shape(lambda: model.init_params(self.cfg))
        return abstract_p, jax.eval_shape(optimizer.init, abstract_p)

    def init_state(self, optimizer, abstract: tuple | None = None) -> Callable:
        """The jitted init(seed) -> (params, opt_state) `compile_step` runs: the state made
        directly in this mode's layout (the compile-ahead lowers this same program)."""
        abstract_p, abstract_o = abstract or self._abstract_state(optimizer)
        psh = self.param_shardings(abstract_p)
        return fresh_state(self.cfg, optimizer, self.mesh.devices.flat[0],
                           out_shardings=(psh, self.opt_shardings(abstract_o, abstract_p)))

    def compile_eval(self, cfg: ModelConfig):
        loss = self.loss
        return jax.jit(lambda params, tokens: loss(params, tokens, cfg),
                       in_shardings=(self.param_shardings(), self.batch_sharding(2)),
                       out_shardings=NamedSharding(self.mesh, P()))

    def abstract_state(self, params, opt_state):
        """Shapes with this mode's shardings: orbax restores any mode's checkpoint into them."""
        psh = self.param_shardings(params)
        osh = self.opt_shardings(opt_state, params)
        sds = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)  # noqa: E731
        return jax.tree.map(sds, params, psh), jax.tree.map(sds, opt_state, osh)

    def batch_rows(self, shape: tuple[int, ...]) -> np.ndarray:
        """Rows of a global batch laid out as `shape` ([accum, rows, T+1] or [rows, T+1])
        that this process loads: those its devices hold (`distributed.process_rows`)."""
        return distributed.process_rows(self.batch_sharding(len(shape)), shape)

    def _put(self, batch: np.ndarray, sharding: NamedSharding,
             shape: tuple[int, ...] | None) -> jax.Array:
        batch = np.asarray(batch)
        shape = tuple(shape or batch.shape)
        if shape[-2] % self.data_replicas:
            raise ValueError(f"a batch of {shape} rows cannot be split over the "
                             f"{self.data_replicas} batch shards of --mesh "
                             f"({'x'.join(self.batch_axes)}); make the batch a multiple of it")
        if shape == batch.shape:  # the global batch (e.g. one process)
            return jax.make_array_from_callback(shape, sharding, lambda idx: batch[idx])
        # this process's rows only (`batch_rows`); the other processes hold the rest
        return jax.make_array_from_process_local_data(sharding, batch, shape)

    def shard_batch(self, batch: np.ndarray, shape: tuple[int, ...] | None = None) -> jax.Array:
        """[accum, rows, T+1]: the global batch, or with `shape` (the global one) only the
        rows `batch_rows(shape)` of this process."""
        return self._put(batch, self.batch_sharding(3), shape)

    def shard_eval_batch(self, batch: np.ndarray,
                         shape: tuple[int, ...] | None = None) -> jax.Array:
        return self._put(batch, self.batch_sharding(2), shape)

    def describe(self) -> dict:
        """The placement (the run's summary.json `placement`, `cgpt plan`'s `unsharded`)."""
        weights = sorted({a for s in jax.tree.leaves(self.param_specs(), is_leaf=lambda x:
                                                     isinstance(x, P))
                          for d in s if d for a in ((d,) if isinstance(d, str) else d)})
        return {"mode": self.mode, "mesh": dict(self.mesh.shape), "devices": self.num_devices,
                "data_replicas": self.data_replicas, "batch_axes": list(self.batch_axes),
                "weight_axes": weights, "mesh_reason": self.mesh_reason,
                "auto_reason": self.auto_reason, "bubble_fraction": self.bubble_fraction,
                "axes": node_axes(dict(self.mesh.shape), self.nodes, self.mode),
                "unsharded": [u.as_dict() for u in sorted(
                    self.unsharded, key=lambda u: (u.array, u.logical))]}


class DataParallel(Sharded):
    """Weights replicated, batch over `data`; gradients all-reduced by XLA."""

    mode = "data_parallel"
    rules = DATA_PARALLEL


class WeightStreaming(Sharded):
    """Activations stationary, each layer's weights gathered inside the layer scan.

    On one node the weights and optimizer state are sharded over every device: kernels
    `embed` over `data` and `heads`/`mlp` over `fsdp`, 1-D weights over both. On several
    nodes `data` crosses them and the weights are sharded over `fsdp` only, inside a node,
    and replicated over `data` (HSDP: `cgpt.sharding.nodes.weight_axes`). The batch goes over
    `data`, and over `fsdp` too when `batch_axes` says the batch divides it; when it does
    not, the MLP's hidden activations are split over `fsdp` instead, so each fsdp group
    shares a batch shard but splits its matmuls (GSPMD follows the kernels' `fsdp` dim)
    rather than repeating them: 13B on 64 devices (data=16 x fsdp=4, batch 720) compiles
    to 1.25x the analytic FLOPs, remat included, against 2.4x with the batch alone.
    """

    mode = "weight_streaming"

    def __init__(self, cfg: ModelConfig, mesh, batch_axes: Sequence[str] = ("data",),
                 mesh_reason: str = "given by --mesh", nodes: int = 1):
        self.rules = with_rule(WEIGHT_STREAMING, "act_batch", tuple(batch_axes))
        if "fsdp" not in batch_axes:  # split the group's matmuls instead of repeating them
            self.rules = with_rule(self.rules, "act_mlp", ("fsdp",))
        keep = weight_axes(self.mode, dict(mesh.shape), nodes)
        if nodes > 1:  # no kernel sharded over a node-crossing `data` (cgpt.sharding.nodes)
            for name in ("embed", "heads", "mlp"):
                self.rules = with_rule(self.rules, name, tuple(
                    a for a in dict(self.rules)[name] if a in keep))
        super().__init__(cfg, mesh, batch_axes, mesh_reason)


class LayerPipelined(Sharded):
    """Layers in contiguous groups on the `stage` axis; micro-batches in a GPipe schedule."""

    mode = "layer_pipelined"
    rules = LAYER_PIPELINED

    def __init__(self, cfg: ModelConfig, mesh, micro_batches: int | None = None,
                 mesh_reason: str = "given by --mesh"):
        self.stages = mesh.shape.get("stage", 1)
        check_stages(cfg.n_layer, self.stages)
        super().__init__(cfg, mesh, ("data",), mesh_reason)
        self.micro_batches = micro_batches
        self.loss = pipelined_loss(cfg, mesh, self.micro_batches_for, self.constrain)

    def micro_batches_for(self, rows: int) -> int:
        """Micro-batches for a batch of `rows`. Configured M: used when it divides the
        per-replica rows (`prepare` insists for training), else the largest divisor below it
        (eval batches). Default: the fewest that reach 4 x stages (GPipe's rule of thumb
        for a small bubble), else one sequence per micro-batch."""
        per = max(1, rows // self.data_replicas)
        divisors = divisors_desc(per)
        if self.micro_batches:
            return max(m for m in divisors if m <= self.micro_batches)
        return min([m for m in divisors if m >= 4 * self.stages] or [per])

    def prepare(self, plan) -> None:
        M = self.micro_batches
        if M is not None and plan.micro_batch % M:
            raise ValueError(f"train.micro_batches={M} must divide the per-replica micro-batch "
                             f"train.micro_batch={plan.micro_batch}; pick a divisor or set "
                             "train.micro_batch to a multiple of it")
        m = self.micro_batches_for(plan.micro_batch * plan.replicas)
        self.bubble_fraction = bubble_fraction(self.stages, m)
        log.info("layer_pipelined: %d stages x %d micro-batches, bubble %.1f%%", self.stages,
                 m, 100 * self.bubble_fraction)


def strategy_on(mesh, mode: str, cfg: ModelConfig, batch: int, micro: int | None = None,
                micro_batches: int | None = None, mesh_reason: str = "",
                auto_reason: str | None = None, nodes: int = 1) -> Sharded:
    """The strategy of a decided placement (`cgpt.sharding.auto.placement`, or a resolved run's
    mode and mesh) on `mesh` (a real Mesh, or an AbstractMesh to inspect shardings and the
    unsharded report without devices), for a global batch of `batch` sequences, on `nodes`
    nodes (the mesh built by `build_mesh(..., nodes=nodes)`)."""
    axes = dict(mesh.shape)
    if mode == "data_parallel":
        s: Sharded = DataParallel(cfg, mesh, ("data",), mesh_reason)
    elif mode == "weight_streaming":
        batch_axes = ws_batch_axes(axes, batch, micro)
        s = WeightStreaming(cfg, mesh, batch_axes, mesh_reason, nodes)
        if "fsdp" not in batch_axes and axes.get("fsdp", 1) > 1:
            s.unsharded.add(Unsharded(
                "batch (every activation)", "act_batch", batch, ("data", "fsdp"), ("data",),
                f"the global batch {batch} is not a multiple of data={axes.get('data', 1)} x "
                f"fsdp={axes['fsdp']}" + (f" x micro-batch {micro}" if micro else "")))
            over = weight_axes(mode, axes, nodes)
            log.warning("weight_streaming: the batch of %d splits over data=%d only; the "
                        "fsdp=%d devices of each group share its rows and split their MLP "
                        "instead (the weights are sharded over %s: %d of the %d devices%s)",
                        batch, axes.get("data", 1), axes["fsdp"],
                        " x ".join(f"{a}={axes[a]}" for a in over) or "none",
                        math.prod(axes[a] for a in over), mesh.size,
                        "" if "data" in over or axes.get("data", 1) == 1 else
                        f", replicated over data={axes['data']}, which crosses the {nodes} nodes")
    else:
        s = LayerPipelined(cfg, mesh, micro_batches, mesh_reason)
    s.auto_reason = auto_reason
    s.nodes = nodes
    return s


def make_strategy(mode: str, mesh_spec: str, cfg: ModelConfig, train_cfg=None, *,
                  devices: Sequence | None = None, device_memory: int | None = None,
                  seq_len: int | None = None, host_offload: bool | None = None):
    """The strategy for `--mode`/`--mesh` on `devices` (default: all of JAX's, joining a
    multi-host job first if the environment describes one): placement, then `strategy_on`.
    Training and `plan` place a resolved run instead (`cgpt.train.resolve`); this is the
    sharding layer's own entry point, for its tests and tools."""
    if host_offload or getattr(train_cfg, "host_offload", False):
        raise ValueError(HOST_OFFLOAD_REMOVED)
    if mode == "single":
        if jax.process_count() > 1:
            raise ValueError(f"--mode single runs on one device, but this job has "
                             f"{jax.process_count()} processes; use a sharded --mode "
                             "(data_parallel, weight_streaming, layer_pipelined or auto)")
        if mesh_spec:
            raise ValueError(f"--mesh {mesh_spec!r} needs a sharded --mode (data_parallel, "
                             "weight_streaming, layer_pipelined or auto)")
        return SingleDevice(cfg)
    if mode not in SHARDED_MODES:
        raise ValueError(f"--mode {mode!r}; use one of single, {', '.join(SHARDED_MODES)}")
    if devices is None:
        maybe_initialize_distributed()
        devices = jax.devices()
    if mode == "auto" and device_memory is None:
        device_memory = device_memory_bytes(devices[0])
    batch = getattr(train_cfg, "batch_size", None) or published_defaults(cfg)["batch_size"]
    micro = getattr(train_cfg, "micro_batch", None)
    mode, axes, mesh_reason, auto_reason = placement(
        mode, mesh_spec, cfg, batch, micro, num_devices=len(devices),
        device_memory=device_memory, seq_len=seq_len, num_processes=jax.process_count())
    return strategy_on(build_mesh(axes, devices), mode, cfg, batch, micro,
                       getattr(train_cfg, "micro_batches", None), mesh_reason, auto_reason)
