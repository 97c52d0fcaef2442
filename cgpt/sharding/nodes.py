"""Meshes that know the node boundary, as arithmetic (JAX-free, like `axes` and `auto`).

A job of `nodes` nodes with G devices each has two networks: the fast one inside a node
(NVLink; MaxText's and `mesh_utils.create_hybrid_device_mesh`'s "ici") and the slow one
between nodes (InfiniBand/Ethernet: "dcn"). Each mesh axis of size n is split into an
across-nodes factor and a within-node factor (n = dcn x ici), the across factor the outer
one: an axis *crosses nodes* when its dcn factor is > 1. The node factor is handed out in
`CROSS_ORDER`: `data` first (one gradient reduction per step crosses the slow network), then
`stage` (activations between pipeline stages), and `fsdp` only when nothing else can take it
(every layer's gather would then cross nodes: `split_axes` says so and `plan` prints it).

`axis_bytes` is the analytic traffic of one step per axis (ring collectives, bytes one device
sends over that axis), so `plan --no-compile` can report it for any size in seconds.
"""
from __future__ import annotations

import math

from cgpt.config.model import ModelConfig

CROSS_ORDER = ("data", "stage", "fsdp")  # which axes take the node count, first first


def split_axes(axes: dict[str, int], nodes: int) -> dict[str, tuple[int, int]]:
    """{axis: (across nodes, within a node)} for a mesh over `nodes` equal nodes: the node
    count is factored over `CROSS_ORDER` (each axis takes the gcd of its size and what is left);
    ValueError when the sizes cannot absorb it (the mesh does not tile the nodes)."""
    left = max(1, int(nodes))
    out = {a: (1, n) for a, n in axes.items()}
    for a in CROSS_ORDER:
        if a in axes and left > 1:
            g = math.gcd(axes[a], left)
            out[a] = (g, axes[a] // g)
            left //= g
    if left > 1:
        mesh = ",".join(f"{k}={v}" for k, v in axes.items())
        raise ValueError(f"mesh {mesh} cannot be laid over {nodes} nodes: its axes "
                         f"({', '.join(CROSS_ORDER)}) do not factor the node count; use a mesh "
                         f"whose data (or stage) size is a multiple of {nodes}")
    return out


def crossing_axes(axes: dict[str, int], nodes: int) -> tuple[str, ...]:
    """The axes whose devices sit on different nodes (`split_axes`' across factor > 1)."""
    return tuple(a for a, (dcn, _) in split_axes(axes, nodes).items() if dcn > 1)


def node_axes(axes: dict[str, int], nodes: int, mode: str) -> dict[str, dict]:
    """`plan --json`'s `axes`: {name: {size, across_nodes, within_node, crosses_nodes}}."""
    split = split_axes(axes, nodes)
    return {a: {"size": n, "across_nodes": split[a][0], "within_node": split[a][1],
                "crosses_nodes": split[a][0] > 1} for a, n in axes.items()}


def weight_axes(mode: str, axes: dict[str, int], nodes: int) -> tuple[str, ...]:
    """weight_streaming's weight (and optimizer state) axes: `fsdp`, and `data` unless it
    crosses nodes (a kernel sharded over a node-crossing axis is gathered over the slow
    network every layer; across nodes the weights are replicated, HSDP-style). `fsdp` is
    kept even where it crosses (only when the batch leaves no other layout: `split_axes`)."""
    if mode != "weight_streaming":
        return ()
    cross = crossing_axes(axes, nodes) if nodes > 1 else ()
    return tuple(a for a in ("data", "fsdp") if axes.get(a, 1) > 1
                 and not (a == "data" and a in cross))


def weight_shards(mode: str, axes: dict[str, int], nodes: int) -> int:
    """How many ways weight_streaming's weights are split (1 for the other modes' blocks:
    layer_pipelined splits them over `stage`, counted by its own footprint)."""
    return math.prod(axes[a] for a in weight_axes(mode, axes, nodes))


def _ring(n: int) -> float:
    """Share of a buffer one device sends in a ring all-gather or reduce-scatter of n."""
    return (n - 1) / n if n > 1 else 0.0


def _hierarchical(full: float, group: list[tuple[str, int]]) -> dict[str, float]:
    """Bytes one device sends per axis in an all-gather of a `full`-byte buffer sharded over
    `group` (axis, size), gathered axis by axis (node-crossing axes first, while the pieces are
    smallest); a reduce-scatter moves the same bytes in reverse."""
    out, shard = {}, full / math.prod(n for _, n in group)
    for a, n in group:
        out[a] = (n - 1) * shard
        shard *= n
    return out


def axis_bytes(cfg: ModelConfig, mode: str, axes: dict[str, int], nodes: int, batch: int,
               seq_len: int, micro_batch: int, remat: bool,
               weight_bytes: int = 4, act_bytes: int = 4) -> dict[str, int]:
    """Analytic bytes one device sends over each mesh axis in one training step (ring
    collectives; what `plan --no-compile` reports; the compiled plan reads the real ones from
    the HLO). `micro_batch`: sequences per batch shard per accumulation step.

      data_parallel    data: all-reduce of every gradient (2 (d-1)/d x 4 bytes x params)
      layer_pipelined  data: all-reduce of a stage's gradients; stage: each micro-batch's
                       activations forward and their gradients back over (S-1)/S boundaries
      weight_streaming weight axes (`weight_axes`): every layer all-gathered twice per
                       accumulation step (forward, backward; three times with remat) and its
                       gradient reduce-scattered once; `data`, when it crosses nodes: one
                       all-reduce of the fsdp-sharded gradients per step
    Not counted: the head's and embedding's activation resharding, fsdp's MLP split when the
    batch does not divide it (tensor-parallel style traffic inside a node).
    """
    P = cfg.num_params()
    d, s = axes.get("data", 1), axes.get("stage", 1)
    out = {a: 0.0 for a in axes}
    if mode in ("data_parallel", "layer_pipelined"):
        blocks = cfg.num_params(embedding=False) - 2 * cfg.d_model
        held = blocks // s + (P - blocks)
        if d > 1:
            out["data"] += 2 * _ring(d) * 4 * held
        if s > 1:
            rows = batch // max(1, d)  # sequences through one pipeline per step
            out["stage"] += 2 * rows * seq_len * cfg.d_model * act_bytes * (s - 1) / s
    elif mode == "weight_streaming":
        waxes = weight_axes(mode, axes, nodes)
        w = math.prod(axes[a] for a in waxes)
        accum = max(1, batch // (micro_batch * _batch_shards(axes, batch, micro_batch)))
        cross = crossing_axes(axes, nodes) if nodes > 1 else ()
        group = sorted(((a, axes[a]) for a in waxes), key=lambda x: x[0] not in cross)
        gathers = (3 if remat else 2) * accum
        for a, b in _hierarchical(weight_bytes * P, group).items():
            out[a] += gathers * b + accum * b * 4 / weight_bytes  # f32 gradients scattered
        if "data" not in waxes and d > 1:
            out["data"] += 2 * _ring(d) * 4 * P / w
    return {a: int(round(b)) for a, b in out.items()}


def _batch_shards(axes: dict[str, int], batch: int, micro_batch: int) -> int:
    from cgpt.sharding.axes import batch_axes

    return math.prod(axes.get(a, 1) for a in batch_axes(axes, batch, micro_batch))
