"""`--mode auto`'s cost model: the time of one training step under each placement that fits.

auto's memory model (`cgpt.sharding.auto`) says which placements fit; this says which is
fastest, from four terms, each in seconds per step on the device (`Hardware`):

  compute   the step's counted FLOPs (`cgpt.config.flops`: 6 x matmul params + full T x T
            attention, what XLA's attention computes) / (devices x peak FLOP/s)
  remat     one more forward pass of the layers when the step recomputes them: 1/3 of the
            layers' FLOPs (the head is not recomputed)
  bubble    layer_pipelined: every stage runs M + S - 1 ticks for M micro-batches, so the
            layers' time grows by (S-1)/M, i.e. the idle fraction (S-1)/(M+S-1) of the schedule
  comm      the collectives a step issues that do NOT overlap compute (`traffic`): bytes per
            device per step x the ring factor (2(n-1)/n all-reduce, (n-1)/n gather/scatter)
            / the link: NVLink inside a node, the network between nodes

The step is the one `train` would run: the micro-batch and remat are predicted by replaying
`cgpt.train.fit.search` on the analytic memory model (`predict_fit`), and a pipeline's
micro-batch count by `LayerPipelined.micro_batches_for`'s rule (`pipeline_micro_batches`;
auto does not see a `train.micro_batches` that is set, `plan` costs the compiled step's M).

Assumptions (named, unmeasured here: no GPU was available when this was written):
  - peaks are the spec sheets' dense bf16 figures; the model runs at peak, so only the
    ratios between placements mean anything, not the absolute seconds
  - link bandwidths are the nominal per-GPU, one-direction rates: NVLink 4 450 GB/s (900 GB/s
    bidirectional, H100/H200 SXM), NVLink 3 300 GB/s (A100 SXM), PCIe Gen5 x16 64 GB/s
    (H100 PCIe), one 400 Gb/s NIC = 50 GB/s per GPU between nodes (DGX H100/H200), 25 GB/s
    for A100 (200 Gb/s HDR)
  - weight streaming's per-layer gathers and gradient reductions overlap the layer compute
    (the latency-hiding scheduler and pipelined collectives, #24 item 1); only what exceeds
    the compute, plus each scan's first layer, is exposed
  - data parallel's layer-gradient all-reduces are issued inside the backward layer scan,
    async, as each layer's gradient is ready (the H100 compile), so they overlap the backward
    like weight streaming's; its embeddings' follow the scan, exposed. A pipeline's gradient
    all-reduces follow its ticks and its stage-to-stage transfers are serialized with them:
    neither overlaps
  - a collective leaves a node when its group spans an axis the node-aware mesh splits over
    nodes (`cgpt.sharding.nodes`: data, then stage, then fsdp)
  - weight streaming on several nodes gathers and reduces over its within-node weight axes
    only and all-reduces each layer's gradient shard over the node-crossing `data`, hidden
    like the reduce-scatter (not separable in a CPU-compiled step: XLA's CPU all-reduces the
    whole gradient over every device)
JAX-free, like `auto`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from cgpt.config import flops
from cgpt.config.backend import defaults as platform_defaults
from cgpt.config.hardware import spec_peak
from cgpt.config.model import ModelConfig, recomputes_forward, remat_value
from cgpt.sharding.axes import replica_axes
from cgpt.sharding.fitrule import HEADROOM, choose_step, divisors_desc, usable_memory
from cgpt.sharding.nodes import crossing_axes, weight_axes

GPU_LADDER = platform_defaults("gpu").remat_ladder  # the rungs the fit climbs on a GPU

FIT_HEADROOM = HEADROOM  # the fit's (`cgpt.sharding.fitrule`)
GRAD_BYTES = 4  # gradients are reduced in f32


def gather_bytes(cfg: ModelConfig) -> int:
    """Bytes per parameter of weight streaming's gathers: the compute dtype's, since the
    weights are cast before they are gathered (the H100 compile gathers bf16:
    tests/plan/test_gpu_compile.py; XLA's CPU compiler widens part of them back to f32)."""
    return 2 if cfg.compute_dtype in ("bfloat16", "float16") else 4


PREFERENCE = ("layer_pipelined", "data_parallel", "weight_streaming")  # today's order (ties)
COMM_LIMIT = 0.25  # the most of a step a layout may spend in exposed communication before
# `plan` looks for a batch that does better (`auto.nearest_batches`): a quarter is what full
# remat costs (a recomputed forward, 1/4 of such a step), which the fit already avoids where it
# can; and beyond it the step is bound by the link rates the model assumes least surely


@dataclass(frozen=True)
class Hardware:
    """One accelerator and its links, per device, one direction (bytes/s)."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s (spec sheet)
    nvlink: float  # inside a node
    network: float  # between nodes
    gpus_per_node: int = 8


# device-kind substring -> (NVLink, network) bytes/s per GPU, one direction, first match wins
# (so "H100 PCIe" before "H100"): assumed nominal rates (see the module docstring). The peaks
# are the spec sheets' (`cgpt.config.hardware`, the MFU table).
LINKS: tuple[tuple[str, float, float], ...] = (
    ("H100 PCIe", 64e9, 50e9),
    ("H100", 450e9, 50e9),
    ("H200", 450e9, 50e9),
    ("A100", 300e9, 25e9),
    ("B200", 900e9, 50e9),  # NVLink 5: 1.8 TB/s both directions
)
DEFAULT_GPU = "NVIDIA H100 80GB HBM3"  # `plan --platform gpu` on emulated devices


def hardware_for(platform: str | None, device_kind: str | None = None,
                 gpus_per_node: int | None = None) -> Hardware | None:
    """The cost model's device for a platform, or None where there is none (CPU, TPU,
    ROCm): auto then keeps its memory-only first-fit rule. An unknown or absent GPU kind
    (emulated devices in `plan`) is costed as an H100 SXM, and says so in its name."""
    if platform != "gpu":
        return None
    kind = device_kind or ""
    peak = spec_peak(kind, "bfloat16")
    link = next((x for x in LINKS if x[0].lower() in kind.lower()), None)
    assumed = peak is None or link is None
    if assumed:
        peak = spec_peak(DEFAULT_GPU, "bfloat16")
        link = next(x for x in LINKS if x[0].lower() in DEFAULT_GPU.lower())
    name = peak[1] + (
        f" (assumed: {f'device kind {device_kind!r}' if device_kind else 'no device kind'})"
        if assumed else "")
    return Hardware(name, peak[0], link[1], link[2], gpus_per_node or 8)


@dataclass(frozen=True)
class Traffic:
    """One kind of collective of a step: bytes per device per step, counted as `cgpt plan`
    counts the HLO (the full buffer one device holds, times the loops around it)."""

    what: str
    kind: str  # all-reduce | all-gather | reduce-scatter | permute
    axes: tuple[str, ...]  # the mesh axes its group spans
    bytes: float
    overlapped: bool  # hidden behind compute up to the compute's length


def _ring(kind: str, n: int) -> float:
    """Bytes over each device's link per byte of buffer (ring algorithms)."""
    if kind == "permute":
        return 1.0
    return (2.0 if kind == "all-reduce" else 1.0) * (n - 1) / n


def crosses_nodes(axes: dict[str, int], group: tuple[str, ...], gpus_per_node: int) -> bool:
    """Does a collective over `group` leave a node? The node-aware layout's answer
    (`cgpt.sharding.nodes.split_axes`: the node count goes to data, then stage, then fsdp);
    a mesh that cannot be laid over whole nodes counts a group wider than a node as leaving."""
    nodes = max(1, math.prod(axes.values()) // gpus_per_node)
    try:
        return any(a in crossing_axes(axes, nodes) for a in group)
    except ValueError:
        return math.prod(axes[a] for a in group) > gpus_per_node


def micro_and_replicas(mode: str, axes: dict[str, int], batch: int,
                       micro_batch: int | None) -> tuple[int, int]:
    """(per-replica batch, replicas) as `cgpt.train.resolve` splits the global batch."""
    reps = math.prod(axes[a] for a in replica_axes(mode, axes, batch, micro_batch))
    return batch // reps, reps


def pipeline_micro_batches(per_replica_rows: int, stages: int,
                           configured: int | None = None) -> int:
    """`LayerPipelined.micro_batches_for` as arithmetic (tests compare the two): the fewest
    divisors of the rows reaching 4 x stages, else one sequence each; a configured M is
    lowered to the largest divisor below it."""
    divisors = divisors_desc(per_replica_rows)
    if configured:
        return max(m for m in divisors if m <= configured)
    return min([m for m in divisors if m >= 4 * stages] or [per_replica_rows])


def _node_axes(axes: dict[str, int], nodes: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(weight streaming's weight axes, the node-crossing axes) on `nodes` nodes
    (`cgpt.sharding.nodes`); a mesh that cannot be laid over them: as on one node."""
    try:
        return weight_axes("weight_streaming", axes, nodes), crossing_axes(axes, nodes)
    except ValueError:
        return weight_axes("weight_streaming", axes, 1), ()


def traffic(cfg: ModelConfig, mode: str, axes: dict[str, int], batch: int, seq_len: int,
            micro_batch: int, remat: bool, micro_batches: int | None = None,
            nodes: int = 1) -> list[Traffic]:
    """The collectives of one step, bytes per device (this module's own estimate; `cgpt plan`
    reads the compiled HLO's, and `plan --json` shows both). On `nodes` > 1 weight streaming
    shards the weights inside a node only (`cgpt.sharding.nodes.weight_axes`) and all-reduces
    the gradient shards over the node-crossing `data`."""
    per, _ = micro_and_replicas(mode, axes, batch, micro_batch)
    accum = per // micro_batch
    P = cfg.num_params()
    blocks = cfg.num_params(embedding=False) - 2 * cfg.d_model  # the stacked layers
    out: list[Traffic] = []
    if mode == "data_parallel" and axes.get("data", 1) > 1:
        # the layers' gradients are all-reduced inside the backward layer scan, async, as
        # each layer's is ready (the H100 compile, docs/gpu_compile.md): overlapped; the
        # embeddings' after the scan, the tied one twice, its lookup's and the head's (as the
        # compiled step does: tests/plan/test_plan.py)
        out.append(Traffic("each layer's gradients, in the backward, per accumulation step",
                           "all-reduce", ("data",), accum * GRAD_BYTES * blocks, True))
        out.append(Traffic("embedding (the tied one twice) and final-norm gradients, per "
                           "accumulation step", "all-reduce", ("data",),
                           accum * GRAD_BYTES * (P - blocks + cfg.vocab_size * cfg.d_model),
                           False))
    elif mode == "weight_streaming":
        group = _node_axes(axes, nodes)[0]
        if group:
            passes = 3 if remat else 2  # forward, backward (and the recomputed forward)
            out.append(Traffic(f"each layer's weights gathered {passes}x per accumulation step",
                               "all-gather", group, accum * passes * gather_bytes(cfg) * P,
                               True))
            out.append(Traffic("each layer's gradients reduced per accumulation step",
                               "reduce-scatter", group, accum * GRAD_BYTES * P, True))
        if axes.get("data", 1) > 1 and "data" not in group:  # HSDP: replicated over data
            out.append(Traffic("each layer's gradient shard over the nodes per accumulation "
                               "step", "all-reduce", ("data",), accum * GRAD_BYTES * P
                               / math.prod(axes[a] for a in group), True))
    elif mode == "layer_pipelined":
        S, D = axes.get("stage", 1), axes.get("data", 1)
        M = micro_batches or pipeline_micro_batches(micro_batch, S)
        act = 4 * seq_len * cfg.d_model  # bytes per row: the residual stream is f32
        rows = micro_batch // M
        out.append(Traffic("activations to the next stage and gradients back, each tick",
                           "permute", ("stage",), 2 * accum * (M + S - 1) * rows * act, False))
        out.append(Traffic("the pipeline's output and input gradient, summed over stages",
                           "all-reduce", ("stage",), 2 * accum * micro_batch * act, False))
        out.append(Traffic("the head's rows, split over stages and gathered back",
                           "all-gather", ("stage",), 2 * accum * micro_batch * act, False))
        if D > 1:
            out.append(Traffic("a stage's layer gradients over data", "all-reduce", ("data",),
                               accum * GRAD_BYTES * blocks // S, False))
        out.append(Traffic("embedding (the tied one twice) and final-norm gradients",
                           "all-reduce", tuple(a for a in ("stage", "data") if a in axes),
                           accum * GRAD_BYTES * (P - blocks + cfg.vocab_size * cfg.d_model),
                           False))
    return out


def axis_bytes(cfg: ModelConfig, mode: str, axes: dict[str, int], nodes: int, batch: int,
               seq_len: int, micro_batch: int, remat: bool,
               micro_batches: int | None = None) -> dict[str, int]:
    """Bytes one device sends over each mesh axis in one step, what `plan` reports per axis:
    `traffic`'s collectives (the estimate checked against the compiled HLO) x their ring
    factor, one over several axes split as a hierarchical ring (node-crossing axes first,
    while the pieces are smallest: axis i carries (n_i - 1) x the product of those before it
    of the (K - 1) parts a device sends)."""
    cross = _node_axes(axes, nodes)[1] if nodes > 1 else ()
    out = {a: 0.0 for a in axes}
    for t in traffic(cfg, mode, axes, batch, seq_len, micro_batch, remat, micro_batches, nodes):
        group = sorted(((a, axes[a]) for a in t.axes), key=lambda x: x[0] not in cross)
        k = math.prod(n for _, n in group)
        sent, before = t.bytes * _ring(t.kind, k), 1
        for a, n in group if k > 1 else ():
            out[a] += sent * (n - 1) * before / (k - 1)
            before *= n
    return {a: int(round(b)) for a, b in out.items()}


@dataclass(frozen=True)
class StepCost:
    """One placement's predicted step and its time, in seconds per step."""

    mode: str
    axes: dict[str, int]
    need: int  # auto's memory estimate (bytes per device) that decided it fits
    fits: bool
    micro_batch: int
    accum: int
    remat: bool
    micro_batches: int | None
    compute_s: float
    remat_s: float
    bubble_s: float
    comm_s: float  # exposed (not overlapped) communication
    hardware: str
    traffic: tuple[Traffic, ...] = field(default=())

    @property
    def total_s(self) -> float:
        return self.compute_s + self.remat_s + self.bubble_s + self.comm_s

    @property
    def comm_fraction(self) -> float:
        """The share of the step spent in exposed communication (`COMM_LIMIT`)."""
        return self.comm_s / self.total_s if self.total_s else 0.0

    @property
    def bubble_fraction(self) -> float | None:
        if self.micro_batches is None:
            return None
        S = self.axes.get("stage", 1)
        return (S - 1) / (self.micro_batches + S - 1)

    def label(self) -> str:
        return f"{self.mode} on {','.join(f'{k}={v}' for k, v in self.axes.items())}"

    def line(self) -> str:
        bub = self.bubble_fraction
        return (f"{self.label()}: ~{self.total_s:.3g} s/step = compute {self.compute_s:.3g}"
                f" + remat {self.remat_s:.3g} + bubble {self.bubble_s:.3g}"
                + (f" ({bub:.1%})" if bub is not None else "")
                + f" + exposed comm {self.comm_s:.3g}"
                f" (micro-batch {self.micro_batch} x {self.accum}, "
                f"{'forward recomputed' if self.remat else 'no forward recomputed'})")

    def to_dict(self) -> dict:
        """The breakdown as `plan --json` prints it."""
        return {"mode": self.mode, "mesh": dict(self.axes), "fits": self.fits,
                "micro_batch": self.micro_batch, "accum": self.accum,
                "remat": self.remat, "micro_batches": self.micro_batches,
                "bubble_fraction": self.bubble_fraction, "total_s": self.total_s,
                "compute_s": self.compute_s, "remat_s": self.remat_s,
                "bubble_s": self.bubble_s, "comm_s": self.comm_s,
                "comm_fraction": self.comm_fraction, "hardware": self.hardware,
                "traffic": [{"what": t.what, "kind": t.kind, "axes": list(t.axes),
                             "bytes": t.bytes, "overlapped": t.overlapped}
                            for t in self.traffic]}


def step_cost(cfg: ModelConfig, mode: str, axes: dict[str, int], batch: int, seq_len: int,
              micro_batch: int, remat: bool, hw: Hardware, micro_batches: int | None = None,
              need: int = 0, fits: bool = True) -> StepCost:
    """The four terms for one placement and step (see the module docstring)."""
    n = math.prod(axes.values())
    tokens = batch * seq_len
    per_token = flops.train_flops_per_token(cfg, seq_len)
    layers = per_token - 6 * cfg.vocab_size * cfg.d_model  # everything but the tied head
    rate = n * hw.peak_flops
    compute = per_token * tokens / rate
    remat_s = layers / 3 * tokens / rate if remat else 0.0
    bubble, M = 0.0, None
    if mode == "layer_pipelined":
        S = axes.get("stage", 1)
        M = micro_batches or pipeline_micro_batches(micro_batch, S)
        bubble = (layers * tokens / rate + remat_s) * (S - 1) / M
    flows = traffic(cfg, mode, axes, batch, seq_len, micro_batch, remat, M,
                    max(1, n // hw.gpus_per_node))
    exposed, hidden, gather = 0.0, 0.0, 0.0
    for t in flows:
        k = math.prod(axes[a] for a in t.axes)
        bw = hw.network if crosses_nodes(axes, t.axes, hw.gpus_per_node) else hw.nvlink
        s = t.bytes * _ring(t.kind, k) / bw
        if not t.overlapped:
            exposed += s
        else:
            hidden += s
            gather += s if t.kind == "all-gather" else 0.0
    if hidden:  # what compute cannot cover, plus each scan's first layer (nothing before it)
        exposed += max(0.0, hidden - compute - remat_s) + gather / cfg.n_layer
    per, _ = micro_and_replicas(mode, axes, batch, micro_batch)
    return StepCost(mode, dict(axes), int(need), fits, micro_batch, per // micro_batch,
                    bool(remat), M, compute, remat_s, bubble, exposed, hw.name, tuple(flows))


def predict_fit(mode: str, axes: dict[str, int], batch: int, memory: int,
                need: Callable[[str, dict, int, str, int], int], micro_batch: int | None = None,
                remat: str | bool | None = None,
                cost_of: Callable[[int, str], float] | None = None) -> tuple[int, str]:
    """(micro-batch, remat rung) `cgpt.train.fit.search` would pick on a GPU: the fit's rule
    (`cgpt.sharding.fitrule.choose_step`) on `need(mode, axes, rows, rung)` (auto's memory
    model) in place of the compiled step, up the GPU's remat ladder, `cost_of` (seconds)
    weighing a recomputed forward against a smaller micro-batch as the fit does. When nothing
    fits: the smallest, at the ladder's top."""
    per, _ = micro_and_replicas(mode, axes, batch, micro_batch)
    micros = [micro_batch] if micro_batch else divisors_desc(per)
    remats = list(GPU_LADDER) if remat is None else [remat_value(remat)]
    usable = usable_memory(memory)
    step = choose_step(micros, remats, lambda m, r: need(mode, axes, m, r, per // m) <= usable,
                       cost_of)
    return step or (micros[-1], remats[-1])


def rank(cfg: ModelConfig, cands: list[tuple[str, dict[str, int], int]], batch: int,
         seq_len: int, memory: int, hw: Hardware, need: Callable[[str, dict, int, str, int], int],
         micro_batch: int | None = None) -> list[StepCost]:
    """Every candidate (mode, axes, auto's footprint) costed, fastest first among those
    that fit auto's memory check, then those that do not; equal times keep the candidates'
    order (today's preference)."""
    costs = []
    for mode, axes, footprint in cands:
        m, r = predict_fit(mode, axes, batch, memory, need, micro_batch, cfg.remat,
                           lambda m, r, mode=mode, axes=axes: step_cost(
                               cfg, mode, axes, batch, seq_len, m, recomputes_forward(r),
                               hw).total_s)
        costs.append(step_cost(cfg, mode, axes, batch, seq_len, m, recomputes_forward(r), hw,
                               need=footprint, fits=footprint <= memory))
    order = sorted(range(len(costs)), key=lambda i: (not costs[i].fits, costs[i].total_s, i))
    return [costs[i] for i in order]


def cheapest(cfg: ModelConfig, mode: str, axes: dict[str, int], batch: int, seq_len: int,
             memory: int, hw: Hardware, need: Callable[[str, dict, int, str, int], int]
             ) -> StepCost | None:
    """The fastest (micro-batch, remat) on this placement that fits by the memory model,
    whatever the fit would pick: e.g. a smaller micro-batch without remat where the fit
    takes the larger one with it (`train.micro_batch` / `model.remat` then select it)."""
    per, _ = micro_and_replicas(mode, axes, batch, None)
    usable = usable_memory(memory)
    steps = [step_cost(cfg, mode, axes, batch, seq_len, m, recomputes_forward(r), hw)
             for m in reversed(divisors_desc(per)) for r in GPU_LADDER
             if need(mode, axes, m, r, per // m) <= usable]
    return min(steps, key=lambda c: c.total_s, default=None)
