"""Meshes that know the node boundary, as arithmetic (JAX-free, like `axes` and `auto`).

A job of `nodes` nodes with G devices each has two networks: the fast one inside a node
(NVLink; MaxText's and `mesh_utils.create_hybrid_device_mesh`'s "ici") and the slow one
between nodes (InfiniBand/Ethernet: "dcn"). Each mesh axis of size n is split into an
across-nodes factor and a within-node factor (n = dcn x ici), the across factor the outer
one: an axis *crosses nodes* when its dcn factor is > 1. The node factor is handed out in
`CROSS_ORDER`: `data` first (one gradient reduction per step crosses the slow network), then
`stage` (activations between pipeline stages), and `fsdp` only when nothing else can take it
(every layer's gather would then cross nodes: `split_axes` says so and `plan` prints it).

The bytes a step moves over each axis are the cost model's (`cgpt.sharding.cost.axis_bytes`,
from the collectives it checks against the compiled HLO), laid over this split.
"""
from __future__ import annotations

import math
from typing import Sequence


CROSS_ORDER = ("data", "stage", "fsdp")  # which axes take the node count, first first


def host_groups(hosts: Sequence[str]) -> list[list[int]]:
    """Process indices grouped by the host each runs on (`hosts[i]`: process i's, as
    `cgpt.sharding.distributed` gathers them at start-up), hosts in the order of their first
    process. A node is a host, whatever the numbering: a scheduler that hands out tasks
    cyclically (node 0 gets processes 0, 2, ...) gives the same groups as a block one.
    ValueError naming every host's processes when the hosts hold different numbers of them
    (a node-aware mesh needs the same on each)."""
    groups: dict[str, list[int]] = {}
    for i, h in enumerate(hosts):
        groups.setdefault(h, []).append(i)
    if len({len(g) for g in groups.values()}) > 1:
        where = "; ".join(f"{h}: process{'es' if len(g) > 1 else ''} {', '.join(map(str, g))}"
                          for h, g in groups.items())
        raise ValueError(f"the job's {len(hosts)} processes run on {len(groups)} hosts with "
                         f"different numbers of processes ({where}); a node-aware mesh needs "
                         "the same number on every host: start as many tasks on each node "
                         "(srun --ntasks-per-node)")
    return list(groups.values())


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
