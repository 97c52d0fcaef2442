"""The rules tables: logical axis name -> the mesh axes it may be split over, per mode.

One MaxText-style table per execution mode. Weights (`vocab, embed, heads, mlp, layers,
pos`, from `model.param_axes`) and activations (`act_batch, act_seq, act_embed, act_mlp`,
the names `model` constrains) are kept apart, so weight streaming can shard a weight's
embed dim while activations shard on batch. `heads` is the fused QKV/attention-output dim
(3 x n_head x d_head or n_head x d_head), so a head count such as 256M's 17 never has to
divide the mesh; d_model does.

`logical_to_spec` splits a dimension over the listed mesh axes that exist with size > 1,
are not already used by another dimension of the array, and divide it (first choices
first, see there). An axis that the
rules want for an array but that none of its dimensions could take leaves the array
replicated over it: that is recorded as an `Unsharded` entry (never silent), which the
strategy shows in `describe()` (the run's `placement`) and `cgpt plan` prints.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

from jax.sharding import PartitionSpec as P

Rules = list[tuple[str, tuple[str, ...]]]

DATA_PARALLEL: Rules = [
    # activations
    ("act_batch", ("data",)),
    ("act_seq", ()), ("act_embed", ()), ("act_mlp", ()),
    # weights: replicated on every device
    ("vocab", ()), ("pos", ()), ("embed", ()), ("heads", ()), ("mlp", ()), ("layers", ()),
]

WEIGHT_STREAMING: Rules = [
    # activations: stationary, the batch over `data` (and `fsdp` where the batch divides)
    ("act_batch", ("data", "fsdp")),
    ("act_seq", ()), ("act_embed", ()), ("act_mlp", ()),
    # weights (and optimizer state): the "external store", sharded on weight dims over
    # every device ...
    ("embed", ("data", "fsdp")), ("heads", ("fsdp", "data")), ("mlp", ("fsdp", "data")),
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


def with_rule(rules: Rules, name: str, axes: tuple[str, ...]) -> Rules:
    """`rules` with the entry for logical `name` replaced (e.g. the batch axes a run uses)."""
    return [(n, axes if n == name else a) for n, a in rules]


@dataclass(frozen=True)
class Unsharded:
    """A dimension the rules ask to split over mesh axes it could not take; the array is
    replicated over those axes."""

    array: str  # parameter path ("h/attn/c_attn/kernel"), or what the activation is
    logical: str  # the dimension's logical axis name
    dim: int  # its size
    wanted: tuple[str, ...]  # mesh axes (size > 1) the rules list for it
    got: tuple[str, ...]  # those it was split over
    why: str

    def as_dict(self) -> dict:
        return {**asdict(self), "wanted": list(self.wanted), "got": list(self.got)}


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], rules: Rules, mesh,
                    report: set | None = None, name: str = "array") -> P:
    """PartitionSpec for an array with these logical axes under `rules` (trailing Nones cut).

    Mesh axes (those that exist with size > 1) are handed out in two passes: first each
    dimension gets the first axis its rule lists, then, dimension by dimension, the rest
    of its list; an axis is taken if no other dimension of the array took it and the
    dimension still divides. So weight streaming's kernels get `embed` over `data` and
    `heads`/`mlp` over `fsdp` (a 2-D layout whose per-layer gather keeps the output dim
    split), while 1-D weights take both axes. With `report`, each dimension whose array
    ends up replicated over a mesh axis the rules wanted for it is added as an
    `Unsharded(name, ...)`.
    """
    table = dict(rules)
    sizes = dict(mesh.shape)
    wanted = [tuple(a for a in table.get(n, ()) if sizes.get(a, 1) > 1) if n else ()
              for n in axes]
    picks: list[list[str]] = [[] for _ in axes]
    skipped: list[dict[str, str]] = [{} for _ in axes]
    used: set[str] = set()

    def take(i: int, ax: str) -> None:
        n = sizes[ax] * math.prod(sizes[a] for a in picks[i])
        if ax in used:
            skipped[i][ax] = f"{ax} already splits another dim"
        elif shape[i] % n:
            skipped[i][ax] = (f"{shape[i]} is not a multiple of "
                              f"{' x '.join(f'{a}={sizes[a]}' for a in [*picks[i], ax])}")
        else:
            picks[i].append(ax)
            used.add(ax)
            skipped[i].pop(ax, None)

    for i, w in enumerate(wanted):  # pass 1: first choices
        if w:
            take(i, w[0])
    for i, w in enumerate(wanted):  # pass 2: the rest, in order
        for ax in w[1:]:
            if ax not in picks[i]:
                take(i, ax)
    if report is not None:
        for i, w in enumerate(wanted):
            lost = [a for a in skipped[i] if a not in used]  # axes the whole array misses
            if lost:
                report.add(Unsharded(name, str(axes[i]), int(shape[i]), w, tuple(picks[i]),
                                     "; ".join(skipped[i][a] for a in lost)))
    out = [None if not p else p[0] if len(p) == 1 else tuple(p) for p in picks]
    while out and out[-1] is None:
        out.pop()
    return P(*out)
