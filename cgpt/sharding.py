"""Execution strategies: how the train step is placed on devices.

`make_strategy(mode, mesh_spec, cfg, train_cfg)` returns an object the training loop uses
without knowing the mode:
  - `compile_step(step, optimizer, seed, plan)` -> (jitted step, params, opt_state)
  - `compile_eval(cfg)`, `shard_batch(batch[, shape])`, `shard_eval_batch(batch[, shape])`,
    `batch_rows(shape)`: the rows of a global batch this process loads
  - `abstract_state(params, opt_state)` -> ShapeDtypeStructs (with shardings) for restore
  - `loss` (params, tokens, cfg) -> scalar; `data_replicas`, `num_devices`, `mesh`

Modes (Cerebras' two execution modes, plus plain data parallelism and a chooser):
  single            everything on one device: the reference the others must match.
  data_parallel     weights replicated, batch sharded over `data`; XLA all-reduces gradients.
  weight_streaming  activations stationary (batch over every device); weights and optimizer
                    state sharded on their embed/mlp dims, the stand-in for MemoryX. Inside
                    the layer scan XLA all-gathers one layer's weights just before use and
                    reduces its gradients back (GSPMD FSDP; the gather sits in the while
                    loop, see tests/test_sharding.py::test_weight_streaming_gathers_per_layer).
  layer_pipelined   contiguous groups of layers pinned to the stages of a `stage` axis,
                    weights stationary, micro-batches flow through a GPipe schedule
                    (`cgpt.pipeline`); combinable with `data`.
  auto              layer_pipelined when the weights, optimizer state and an activation
                    estimate fit the devices' memory, weight_streaming otherwise.

Sharding is written as one MaxText-style rules table per mode: logical axis name -> the mesh
axes it may use. Weights (`vocab, embed, heads, mlp, layers, pos`, from `model.param_axes`)
and activations (`act_batch, act_seq, act_embed, act_mlp`, the names `model` constrains)
are kept apart, so FSDP can shard a weight's embed dim while activations shard on batch.
A dimension is split over the listed mesh axes that exist with size > 1, are not already
used by another dimension of the same array, and divide it; otherwise it is replicated.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import warnings
from typing import Callable, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from cgpt import distributed, model
from cgpt.config import ModelConfig
from cgpt.pipeline import bubble_fraction, pipelined_loss

log = logging.getLogger(__name__)

Rules = list[tuple[str, tuple[str, ...]]]

# ---- the rules tables: logical name -> mesh axes (first that fits wins) -------------------
DATA_PARALLEL: Rules = [
    # activations
    ("act_batch", ("data",)),
    ("act_seq", ()), ("act_embed", ()), ("act_mlp", ()),
    # weights: replicated on every device
    ("vocab", ()), ("pos", ()), ("embed", ()), ("heads", ()), ("mlp", ()), ("layers", ()),
]

WEIGHT_STREAMING: Rules = [
    # activations: stationary, the batch spread over every device
    ("act_batch", ("data",)),
    ("act_seq", ()), ("act_embed", ()), ("act_mlp", ()),
    # weights (and optimizer state): the "external store", sharded on weight dims ...
    ("embed", ("data",)), ("heads", ("data",)), ("mlp", ("data",)),
    ("vocab", ()), ("pos", ()),
    # ... and never on `layers`: without a pipeline XLA would gather every layer up front
    ("layers", ()),
]

LAYER_PIPELINED: Rules = [
    # activations: batch over `data`; inside the pipeline activations move along `stage`,
    # outside it (embedding, head, loss) the batch is split over the stages too
    ("act_batch", ("data", "stage")),
    ("act_seq", ()), ("act_embed", ()), ("act_mlp", ()),
    # weights: contiguous layer groups pinned to stages, the rest replicated
    ("layers", ("stage",)),
    ("vocab", ()), ("pos", ()), ("embed", ()), ("heads", ()), ("mlp", ()),
]

RULES: dict[str, Rules] = {"data_parallel": DATA_PARALLEL, "weight_streaming": WEIGHT_STREAMING,
                           "layer_pipelined": LAYER_PIPELINED}
# mesh axes each mode accepts; the first is where an empty --mesh puts every device
MESH_AXES: dict[str, tuple[str, ...]] = {"data_parallel": ("data",),
                                         "weight_streaming": ("data",),
                                         "layer_pipelined": ("stage", "data")}
SHARDED_MODES = ("data_parallel", "weight_streaming", "layer_pipelined", "auto")


# ---- mesh ----------------------------------------------------------------------------------
def maybe_initialize_distributed() -> bool:
    """Join a multi-host job when its environment says there is one (`cgpt.distributed`)."""
    return distributed.initialize()


def mesh_size(spec: str) -> int:
    """Devices a `--mesh` spec asks for (the product of its sizes), checking only its syntax."""
    n = 1
    for item in spec.split(","):
        _, eq, size = item.partition("=")
        if not eq or not size.strip().isdigit() or int(size) < 1:
            raise ValueError(f"--mesh {spec!r}: expected axis=size pairs separated by commas, "
                             "e.g. --mesh data=16 or --mesh stage=4,data=2")
        n *= int(size)
    return n


def emulate_cpu_devices(n: int) -> None:
    """Ask JAX's CPU backend for n (emulated) devices. Only possible before any JAX
    computation starts; accelerator backends ignore it."""
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_num_cpu_devices", max(n, 1))


def parse_mesh(spec: str, mode: str, num_devices: int) -> dict[str, int]:
    """`"data=2,stage=4"` -> {"data": 2, "stage": 4}; empty -> every device on the main axis."""
    allowed = MESH_AXES[mode]
    spec = (spec or "").strip()
    if not spec:
        return {allowed[0]: num_devices}
    axes: dict[str, int] = {}
    for item in spec.split(","):
        name, eq, size = item.strip().partition("=")
        name = name.strip()
        if not eq or not size.strip().isdigit():
            raise ValueError(f"--mesh {spec!r}: expected axis=size pairs separated by commas, "
                             f"e.g. --mesh {','.join(f'{a}=2' for a in allowed)}")
        if name not in allowed:
            raise ValueError(f"--mesh {spec!r}: axis {name!r} is not used by --mode {mode}; "
                             f"its axes are {', '.join(allowed)}")
        if name in axes:
            raise ValueError(f"--mesh {spec!r}: axis {name!r} is given twice")
        if int(size) < 1:
            raise ValueError(f"--mesh {spec!r}: axis {name} must have size >= 1")
        axes[name] = int(size)
    n = math.prod(axes.values())
    if n > num_devices:
        raise ValueError(f"--mesh {spec!r} needs {n} devices but only {num_devices} are "
                         f"available; shrink the mesh so the sizes multiply to <= {num_devices}")
    if n < num_devices and jax.process_count() > 1:
        raise ValueError(f"--mesh {spec!r} uses {n} of {num_devices} devices; on several hosts "
                         "the sizes must multiply to the global device count")
    return axes


def build_mesh(axes: dict[str, int], devices: Sequence | None = None) -> Mesh:
    """A mesh over the first prod(sizes) devices, with Auto axes (GSPMD + sharding rules)."""
    devices = list(jax.devices() if devices is None else devices)
    n = math.prod(axes.values())
    names = tuple(axes)
    auto = (AxisType.Auto,) * len(names)
    if n == len(devices):
        return jax.make_mesh(tuple(axes.values()), names, axis_types=auto, devices=devices)
    return Mesh(np.array(devices[:n]).reshape(tuple(axes.values())), names, axis_types=auto)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], rules: Rules,
                    mesh: Mesh) -> P:
    """PartitionSpec for an array with these logical axes under `rules` (trailing Nones cut).

    A dimension is split over every listed mesh axis (in order) that exists with size > 1,
    is not already used by another dimension of the array, and still divides it.
    """
    table = dict(rules)
    used: set[str] = set()
    out: list = []
    for name, dim in zip(axes, shape):
        picks: list[str] = []
        for ax in table.get(name, ()) if name else ():
            size = mesh.shape.get(ax, 1)
            if size > 1 and ax not in used and dim % (size * math.prod(
                    mesh.shape[a] for a in picks)) == 0:
                picks.append(ax)
                used.add(ax)
        out.append(None if not picks else picks[0] if len(picks) == 1 else tuple(picks))
    while out and out[-1] is None:
        out.pop()
    return P(*out)


def _is_axes(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(a, str) or a is None for a in x)


def _like(tree, params_struct) -> bool:
    try:
        return jax.tree.structure(tree) == params_struct
    except Exception:
        return False


# ---- the single-device reference -----------------------------------------------------------
class SingleDevice:
    """Everything on one device: the reference every other mode must match."""

    mode = "single"
    mesh = None
    data_replicas = 1
    num_devices = 1
    bubble_fraction = None
    loss: Callable = staticmethod(model.loss_fn)

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.device = jax.devices()[0]

    def compile_step(self, step, optimizer, seed: int, plan):
        params = jax.jit(model.init_params, static_argnums=0)(self.cfg, seed)
        opt_state = jax.jit(optimizer.init)(params)
        return jax.jit(step, donate_argnums=(0, 1)), params, opt_state

    def compile_eval(self, cfg: ModelConfig):
        return jax.jit(lambda params, tokens: self.loss(params, tokens, cfg))

    def abstract_state(self, params, opt_state):
        sh = jax.sharding.SingleDeviceSharding(self.device)
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                            (params, opt_state))

    def batch_rows(self, shape: tuple[int, ...]) -> slice:
        return slice(None)  # one process holds every row

    def shard_batch(self, batch: np.ndarray, shape: tuple[int, ...] | None = None) -> jax.Array:
        return jax.numpy.asarray(batch)

    shard_eval_batch = shard_batch

    def describe(self) -> dict:
        return {"mode": self.mode, "devices": 1, "data_replicas": 1}


# ---- sharded strategies --------------------------------------------------------------------
class Sharded:
    """Shared machinery: a mesh, a rules table, and jit with explicit in/out shardings."""

    mode = ""
    rules: Rules = []
    bubble_fraction: float | None = None
    auto_reason: str | None = None  # why `--mode auto` chose this mode

    def __init__(self, cfg: ModelConfig, mesh: Mesh, host_offload: bool = False):
        self.cfg = cfg
        self.mesh = mesh
        self.num_devices = mesh.size
        self.data_replicas = mesh.shape.get("data", 1)
        self.host_offload = host_offload and self._has_host_memory()
        if host_offload and not self.host_offload:
            warnings.warn("host_offload: this backend has no pinned_host memory; weights and "
                          "optimizer state stay in device memory", stacklevel=2)
        self.loss: Callable = functools.partial(model.loss_fn, constrain=self.constrain)

    # -- layouts
    def _has_host_memory(self) -> bool:
        dev = self.mesh.devices.flat[0]
        try:
            return "pinned_host" in {m.kind for m in dev.addressable_memories()}
        except Exception:
            return False

    def spec(self, axes: Sequence[str | None], shape: Sequence[int]) -> P:
        return logical_to_spec(axes, shape, self.rules, self.mesh)

    def constrain(self, x: jax.Array, axes: tuple) -> jax.Array:
        """The `constrain` hook of `cgpt.model`: pin an activation to the rules' layout."""
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, self.spec(axes, x.shape)))

    def param_specs(self, params=None) -> dict:
        """PartitionSpec of every parameter (same tree as `model.init_params`)."""
        shapes = params if params is not None else jax.eval_shape(lambda: model.init_params(self.cfg))
        return jax.tree.map(lambda a, p: self.spec(a, p.shape), model.param_axes(self.cfg),
                            shapes, is_leaf=_is_axes)

    def param_shardings(self, params=None, memory_kind: str | None = None) -> dict:
        return jax.tree.map(lambda s: NamedSharding(self.mesh, s, memory_kind=memory_kind),
                            self.param_specs(params), is_leaf=lambda x: isinstance(x, P))

    def opt_shardings(self, opt_state, params=None, memory_kind: str | None = None):
        """Optimizer state laid out like the parameters (Adam moments); scalars replicated."""
        psh = self.param_shardings(params, memory_kind)
        struct = jax.tree.structure(psh)
        rep = NamedSharding(self.mesh, P(), memory_kind=memory_kind)

        def place(sub):
            if _like(sub, struct):
                return psh
            return jax.tree.map(lambda _: rep, sub)

        return jax.tree.map(place, opt_state, is_leaf=lambda t: _like(t, struct))

    def _store_kind(self) -> str | None:
        return "pinned_host" if self.host_offload else None

    def batch_sharding(self, ndim: int = 3) -> NamedSharding:
        """Token batches [accum, rows, T+1] (ndim 3) or [rows, T+1] (ndim 2): rows over `data`."""
        data = "data" if self.data_replicas > 1 else None
        return NamedSharding(self.mesh, P(None, data) if ndim == 3 else P(data))

    # -- the training-loop interface
    def jit_step(self, step: Callable, abstract_params, abstract_opt_state) -> Callable:
        """The step jitted with this mode's in/out shardings (donating params and state)."""
        kind = self._store_kind()
        psh = self.param_shardings(abstract_params, kind)
        osh = self.opt_shardings(abstract_opt_state, abstract_params, kind)
        rep = NamedSharding(self.mesh, P())
        if kind is not None:  # stream weights/state host -> device at the top of the step
            dev_p = self.param_shardings(abstract_params, "device")
            dev_o = self.opt_shardings(abstract_opt_state, abstract_params, "device")
            inner = step

            def step(params, opt_state, batch):  # noqa: F811 - the offloaded wrapper
                return inner(jax.device_put(params, dev_p), jax.device_put(opt_state, dev_o),
                             batch)
        return jax.jit(step, in_shardings=(psh, osh, self.batch_sharding(3)),
                       out_shardings=(psh, osh, rep), donate_argnums=(0, 1))

    def prepare(self, plan) -> None:
        """Check the run's batch split against the mesh (overridden by layer_pipelined)."""

    def compile_step(self, step, optimizer, seed: int, plan):
        """(jitted step, params, opt_state), the state initialized directly in its layout."""
        self.prepare(plan)
        abstract_p = jax.eval_shape(lambda: model.init_params(self.cfg))
        abstract_o = jax.eval_shape(optimizer.init, abstract_p)
        kind = self._store_kind()
        psh = self.param_shardings(abstract_p, kind)
        params = jax.jit(model.init_params, static_argnums=0, out_shardings=psh)(self.cfg, seed)
        opt_state = jax.jit(optimizer.init, out_shardings=self.opt_shardings(
            abstract_o, abstract_p, kind))(params)
        return self.jit_step(step, abstract_p, abstract_o), params, opt_state

    def compile_eval(self, cfg: ModelConfig):
        psh = self.param_shardings(None, self._store_kind())
        loss = self.loss
        return jax.jit(lambda params, tokens: loss(params, tokens, cfg),
                       in_shardings=(psh, self.batch_sharding(2)),
                       out_shardings=NamedSharding(self.mesh, P()))

    def abstract_state(self, params, opt_state):
        """Shapes with this mode's shardings: orbax restores any mode's checkpoint into them."""
        kind = self._store_kind()
        psh = self.param_shardings(params, kind)
        osh = self.opt_shardings(opt_state, params, kind)
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
                             f"{self.data_replicas} data replicas of --mesh; make the batch a "
                             "multiple of the data axis")
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
        return {"mode": self.mode, "mesh": dict(self.mesh.shape), "devices": self.num_devices,
                "data_replicas": self.data_replicas, "bubble_fraction": self.bubble_fraction,
                "host_offload": self.host_offload}


class DataParallel(Sharded):
    """Weights replicated, batch over `data`; gradients all-reduced by XLA."""

    mode = "data_parallel"
    rules = DATA_PARALLEL


class WeightStreaming(Sharded):
    """Activations stationary, each layer's weights gathered inside the layer scan.

    With `host_offload=True` (where the backend has `pinned_host` memory) the parameters and
    optimizer state live in host memory between steps, as in MemoryX; on CPU this changes
    nothing but the memory-kind labels.
    """

    mode = "weight_streaming"
    rules = WEIGHT_STREAMING


class LayerPipelined(Sharded):
    """Layers in contiguous groups on the `stage` axis; micro-batches in a GPipe schedule."""

    mode = "layer_pipelined"
    rules = LAYER_PIPELINED

    def __init__(self, cfg: ModelConfig, mesh: Mesh, micro_batches: int | None = None,
                 host_offload: bool = False):
        super().__init__(cfg, mesh, host_offload=False)
        if host_offload:
            warnings.warn("host_offload applies to weight_streaming only; layer_pipelined "
                          "keeps its weights stationary on the stages", stacklevel=2)
        self.stages = mesh.shape.get("stage", 1)
        if cfg.n_layer % self.stages:
            divisors = [s for s in range(1, cfg.n_layer + 1) if cfg.n_layer % s == 0]
            raise ValueError(f"--mesh stage={self.stages} does not divide n_layer="
                             f"{cfg.n_layer}; layer_pipelined needs equal stages, use a stage "
                             f"size in {divisors}")
        self.micro_batches = micro_batches
        self.loss = pipelined_loss(cfg, mesh, self._micro, self.constrain)

    def _micro(self, rows: int) -> int:
        """Micro-batches for a batch of `rows`. Configured M: used when it divides the
        per-replica rows (`prepare` insists for training), else the largest divisor below it
        (eval batches). Default: the fewest that reach 4 x stages (GPipe's rule of thumb
        for a small bubble), else one sequence per micro-batch."""
        per = max(1, rows // self.data_replicas)
        divisors = [m for m in range(1, per + 1) if per % m == 0]
        if self.micro_batches:
            return max(m for m in divisors if m <= self.micro_batches)
        return min([m for m in divisors if m >= 4 * self.stages] or [per])

    def prepare(self, plan) -> None:
        M = self.micro_batches
        if M is not None and plan.micro_batch % M:
            raise ValueError(f"train.micro_batches={M} must divide the per-replica micro-batch "
                             f"train.micro_batch={plan.micro_batch}; pick a divisor or set "
                             "train.micro_batch to a multiple of it")
        m = self._micro(plan.micro_batch * plan.replicas)
        self.bubble_fraction = bubble_fraction(self.stages, m)
        log.info("layer_pipelined: %d stages x %d micro-batches, bubble %.1f%%", self.stages,
                 m, 100 * self.bubble_fraction)


# ---- auto: pipeline when it fits, stream weights otherwise -------------------------------
BYTES_PER_PARAM_STATE = 16  # f32 weight + gradient + Adam mu + nu


def device_memory_bytes(device=None) -> int:
    """Memory of one device: the allocator's limit on GPU/TPU, RAM / device count on CPU."""
    device = device or jax.devices()[0]
    stats = None
    try:
        stats = device.memory_stats()
    except Exception:
        pass
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram // max(1, jax.local_device_count())


def pipeline_bytes_per_device(cfg: ModelConfig, stages: int, rows: int, seq_len: int) -> int:
    """Rough per-device footprint of layer_pipelined (what `auto` compares to memory).

    Weights, gradients and Adam state of one stage's layers plus the replicated embeddings,
    plus the activations GPipe keeps for the backward pass of the `rows` sequences a data
    replica holds per step: a layer's full set is ~16 d + 2 H T floats per token
    (Korthikanti et al.'s count, f32), rebuilt one layer at a time in the backward pass.
    Each layer keeps its input (d floats) with remat, and its input plus the weight matmuls'
    outputs (8 d: QKV, attention projection, MLP up-projection) without (`model.apply_layers`).
    """
    n_blocks = cfg.num_params(embedding=False) - 2 * cfg.d_model  # the stacked layers only
    n_rest = cfg.num_params() - n_blocks
    state = BYTES_PER_PARAM_STATE * (n_blocks // stages + n_rest)
    full = 16 * cfg.d_model + 2 * cfg.n_head * seq_len
    per_token = (cfg.n_layer // stages) * cfg.d_model * (1 if cfg.remat else 9) + full
    return state + 4 * rows * seq_len * per_token


def choose_auto(cfg: ModelConfig, num_devices: int, memory: int, batch: int, seq_len: int,
                micro_batch: int | None = None) -> tuple[str, dict[str, int], str]:
    """(mode, mesh axes, reason). Pipeline over as many stages as divide n_layer and the
    device count (the rest as `data`) when its footprint, with `micro_batch` sequences per
    data replica in flight (default: the replica's whole share of `batch`), fits `memory`;
    else stream weights over every device. Where the line falls for a 40 GB device (a
    WSE-2's SRAM) is tabulated in docs/plan.md; Cerebras drew it near 1B parameters."""
    stages = max(s for s in range(1, num_devices + 1)
                 if num_devices % s == 0 and cfg.n_layer % s == 0)
    data = num_devices // stages
    rows = micro_batch or max(1, batch // data)
    need = pipeline_bytes_per_device(cfg, stages, rows, seq_len)
    axes = {"stage": stages, "data": data} if data > 1 else {"stage": stages}
    if need <= memory:
        return "layer_pipelined", axes, (f"layer_pipelined fits: ~{need / 2**30:.2f} GiB per "
                                         f"device of {memory / 2**30:.2f} GiB")
    return "weight_streaming", {"data": num_devices}, (
        f"layer_pipelined would need ~{need / 2**30:.2f} GiB per device of "
        f"{memory / 2**30:.2f} GiB; streaming weights instead")


# ---- the factory -------------------------------------------------------------------------
def make_strategy(mode: str, mesh_spec: str, cfg: ModelConfig, train_cfg=None, *,
                  devices: Sequence | None = None, device_memory: int | None = None,
                  seq_len: int | None = None, host_offload: bool | None = None):
    """The strategy for `--mode`/`--mesh`. `devices` defaults to all of JAX's devices
    (joining a multi-host job first if the environment describes one)."""
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
    n = len(devices)
    micro_batches = getattr(train_cfg, "micro_batches", None)
    if host_offload is None:
        host_offload = bool(getattr(train_cfg, "host_offload", False))
    reason = None
    if mode == "auto":
        if mesh_spec:
            n = math.prod(parse_mesh(mesh_spec, "layer_pipelined" if "stage" in mesh_spec
                                     else "weight_streaming", n).values())
        from cgpt.optim import published_defaults

        batch = getattr(train_cfg, "batch_size", None) or published_defaults(cfg)["batch_size"]
        memory = device_memory or device_memory_bytes(devices[0])
        mode, axes, reason = choose_auto(cfg, n, memory, batch, seq_len or cfg.n_ctx,
                                         getattr(train_cfg, "micro_batch", None))
        log.info("--mode auto: %s", reason)
    else:
        axes = parse_mesh(mesh_spec, mode, n)
    mesh = build_mesh(axes, devices)
    if mode == "data_parallel":
        s: Sharded = DataParallel(cfg, mesh)
    elif mode == "weight_streaming":
        s = WeightStreaming(cfg, mesh, host_offload=host_offload)
    else:
        s = LayerPipelined(cfg, mesh, micro_batches=micro_batches)
    s.auto_reason = reason
    return s
