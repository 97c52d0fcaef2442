"""The rules tables: logical axis name -> the mesh axes it may be split over, per mode.

One MaxText-style table per execution mode. Weights (`vocab, embed, heads, mlp, layers,
pos`, from `model.param_axes`) and activations (`act_batch, act_seq, act_embed, act_mlp`,
the names `model` constrains) are kept apart, so weight streaming can shard a weight's
embed dim while activations shard on batch. `heads` is the fused QKV/attention-output dim
(3 x n_head x d_head or n_head x d_head), so a head count such as 256M's 17 never has to
divide the mesh; d_model does.

`logical_to_spec` splits a dimension over the listed mesh axes that exist with size > 1,
are not already used by another dimension of the array, and divide it. An axis that the
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
    ("embed", ("fsdp", "data")), ("heads", ("fsdp", "data")), ("mlp", ("fsdp", "data")),
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

    A dimension is split over every listed mesh axis (in order) that exists with size > 1,
    is not already used by another dimension of the array, and still divides it. With
    `report`, each dimension whose array ends up replicated over a mesh axis the rules
    wanted for it is added as an `Unsharded(name, ...)`.
    """
    table = dict(rules)
    sizes = dict(mesh.shape)
    used: set[str] = set()
    out: list = []
    misses: list[tuple[str, int, tuple[str, ...], list[str], dict[str, str]]] = []
    for logical, dim in zip(axes, shape):
        picks: list[str] = []
        skipped: dict[str, str] = {}
        wanted = tuple(a for a in (table.get(logical, ()) if logical else ())
                       if sizes.get(a, 1) > 1)
        for ax in wanted:
            n = sizes[ax] * math.prod(sizes[a] for a in picks)
            if ax in used:
                skipped[ax] = f"{ax} already splits another dim"
            elif dim % n:
                skipped[ax] = (f"{dim} is not a multiple of "
                               f"{' x '.join(f'{a}={sizes[a]}' for a in [*picks, ax])}")
            else:
                picks.append(ax)
                used.add(ax)
        if skipped:
            misses.append((logical, dim, wanted, picks, skipped))
        out.append(None if not picks else picks[0] if len(picks) == 1 else tuple(picks))
    if report is not None:
        for logical, dim, wanted, picks, skipped in misses:
            lost = [a for a in skipped if a not in used]  # axes the whole array misses
            if lost:
                report.add(Unsharded(name, logical, int(dim), wanted, tuple(picks),
                                     "; ".join(skipped[a] for a in lost)))
    while out and out[-1] is None:
        out.pop()
    return P(*out)
