"""A step that fits: micro-batch x accumulation and remat, chosen from the compiled step's memory.

The train step is lowered and compiled on abstract arrays (`jax.ShapeDtypeStruct`s carrying
the mode's shardings: nothing is allocated) and XLA's `memory_analysis()` gives its footprint
per device: arguments + outputs + temp - aliased (donated) buffers, the estimate `cgpt plan`
reports (on CPU XLA's own `peak_memory_in_bytes` leaves temp out).

`search` walks the candidates in order of preference and takes the first that fits the
usable memory (the device's memory less HEADROOM, outside the allocator's pool, and less
POOL_MARGIN of the pool: `cgpt.sharding.fitrule`):

  micro-batch   the divisors of the per-replica batch, largest first: fewer accumulation
                steps, and under weight streaming fewer re-gathers of every layer's weights;
  remat         the platform's ladder (`backend.Kernels.remat_ladder`), most memory first:
                on GPU/TPU none -> save_attn -> full, on CPU save_dots -> full (see
                `cgpt.model.remat.remat_policy`); a higher rung recomputes more of each layer
                in the backward pass and keeps less of it.

Among the accumulating candidates memory falls with the micro-batch (accumulating adds one
gradient buffer, so the first of them can need more than the full batch), so after the
full-batch candidates (one per rung) the search bisects those on the top rung, then retries
the lower rungs at the micro-batch it found: a handful of compiles, not one per divisor (the
rule, with the GPU's cost-weighed step 3, is `cgpt.sharding.fitrule.choose_step`). On
CPU the first candidate is what `train` ran before this search existed (no accumulation,
save_dots, the old "remat off"); where it fits, as for every CPU preset, the search costs
that one compile and the compiled step is the one trained. A micro-batch or remat the user
set is kept and only checked.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

from cgpt.config import backend
from cgpt.config.model import recomputes_forward, remat_value
from cgpt.config.units import fmt_bytes
from cgpt.sharding import auto, cost
from cgpt.sharding.fitrule import (HEADROOM, POOL_MARGIN, choose_step,  # noqa: F401 (re-exported)
                                   divisors_desc, memory_for, pool_memory, usable_memory)
from cgpt.sharding.nodes import weight_shards

_LESS = (f"less {HEADROOM:.0%} outside the allocator's pool and {POOL_MARGIN:.0%} of the pool "
         "kept free")


def step_bytes(compiled) -> dict[str, int]:
    """Per-device bytes of a compiled step: total = argument + output + temp - alias."""
    mem = compiled.memory_analysis()
    b = {k: int(getattr(mem, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp",
                                                              "alias")}
    b["total"] = b["argument"] + b["output"] + b["temp"] - b["alias"]
    return b


@dataclass(frozen=True)
class Candidate:
    micro_batch: int
    remat: str  # a rung of the ladder (`cgpt.config.model.REMATS`)
    bytes: dict


@dataclass(frozen=True)
class Choice:
    """The step chosen (or, when `fits` is False, the smallest one tried)."""

    micro_batch: int
    accum: int
    remat: str
    bytes: dict  # step_bytes of the chosen step
    device_memory: int
    tried: tuple[Candidate, ...] = field(default=())
    micro_given: bool = False  # the user set the micro-batch: checked, not searched
    remat_given: bool = False

    @property
    def usable(self) -> int:
        return usable_memory(self.device_memory)

    @property
    def fits(self) -> bool:
        return self.bytes["total"] <= self.usable

    def describe(self) -> dict:
        """What a run records in its summary's `placement`."""
        return {"micro_batch": self.micro_batch, "accum": self.accum, "remat": self.remat,
                "bytes_per_device": self.bytes["total"], "device_memory": self.device_memory,
                "usable_memory": self.usable, "fits": self.fits, "fit_compiles": len(self.tried)}

    def line(self) -> str:
        how = ("as set" if self.micro_given and self.remat_given else
               f"chosen from {len(self.tried)} compiled candidate(s)")
        return (f"micro-batch {self.micro_batch} x {self.accum} accumulation step(s), remat "
                f"{self.remat} ({how}): {fmt_bytes(self.bytes['total'])} per "
                f"device of {fmt_bytes(self.usable)} usable ({fmt_bytes(self.device_memory)} "
                f"{_LESS})")

    def error(self, what: str) -> str:
        """Why nothing fits, with the numbers and what to change (`what`: model and mesh)."""
        b = self.bytes
        step = ("the step as set" if self.micro_given and self.remat_given else
                f"the smallest of {len(self.tried)} steps tried")
        fixes = []
        if self.micro_given and self.micro_batch > 1:
            fixes.append("a smaller train.micro_batch (or leave it unset: train then picks "
                         "the largest that fits)")
        if self.remat_given and self.remat != "full":
            fixes.append("model.remat=full (or leave it unset)")
        if b["argument"] - b["alias"] > self.usable or not fixes:
            fixes.append("more devices (more GPUs, or slurm.nodes), a mode that shards the "
                         "weights and optimizer state (train.mode=weight_streaming or "
                         "layer_pipelined), bf16 compute (model.compute_dtype=bfloat16), or a "
                         "shorter data.seq_len")
        return (f"{what}: {step} (micro-batch {self.micro_batch}, remat "
                f"{self.remat}) needs {fmt_bytes(b['total'])} per device "
                f"(arguments: parameters, optimizer state and batch "
                f"{fmt_bytes(b['argument'])}; temp {fmt_bytes(b['temp'])}) but "
                f"{fmt_bytes(self.usable)} are usable ({fmt_bytes(self.device_memory)} per "
                f"device {_LESS}); use " + "; or ".join(fixes))


MAX_RANKED_COMPILES = 3  # a GPU fit ranked by the memory model compiles at most this many


class Models(NamedTuple):
    """What the search may know of a candidate (micro-batch, rung) before compiling it: its
    seconds per step (`cgpt.sharding.cost`) and its bytes per device (a memory model)."""

    seconds: Callable[[int, str], float] | None = None
    bytes: Callable[[int, str], int] | None = None


def search(micros: Sequence[int], per_replica: int, compile_fn: Callable[[int, bool], Any],
           device_memory: int, remat: str | bool | None = None,
           micro_given: bool = False,
           ladder: Sequence[str] = ("save_dots", "full"),
           models: Models = Models()) -> tuple[Choice, Any]:
    """(choice, compiled step) for the preferred candidate that fits; if none does, the
    smallest one tried (its `fits` is False). `micros`: allowed micro-batches, largest first;
    `ladder`: the remat rungs to climb when `remat` is None, most memory first;
    `compile_fn(micro_batch, remat rung)` returns the compiled step. `models.seconds(micro_batch,
    rung)`, seconds per step (GPUs: `cgpt.sharding.cost`): full remat competes with a smaller
    micro-batch on the rung below, the faster wins. The rule is `fitrule.choose_step`'s, the
    one the analytic plan and the cost model's replay use, here on compiled steps (cached:
    each candidate is compiled once).

    `models.bytes(micro_batch, rung)`: a memory model's bytes (a GPU's fit): the rule is
    applied to its figures, scaled by the last compiled step's ratio to them, and only the
    candidate it picks is compiled, at most MAX_RANKED_COMPILES times."""
    remats = [remat_value(r) for r in ladder] if remat is None else [remat_value(remat)]
    usable = usable_memory(device_memory)
    tried: dict[tuple[int, str], Candidate] = {}  # in compile order
    compiled: dict[tuple[int, str], Any] = {}

    def compile_one(m: int, r: str) -> Candidate:
        if (m, r) not in compiled:
            compiled[(m, r)] = compile_fn(m, r)
            tried[(m, r)] = Candidate(m, r, step_bytes(compiled[(m, r)]))
        return tried[(m, r)]

    def fits(m: int, r: str) -> bool:
        if (m, r) not in compiled and any(c.bytes["argument"] > usable for c in tried.values()):
            return False  # every candidate takes the same state and batch: none can fit
        return compile_one(m, r).bytes["total"] <= usable

    if models.bytes is not None and (len(micros) > 1 or len(remats) > 1):
        step = _ranked(micros, remats, models, compile_one, usable)
    else:
        step = choose_step(micros, remats, fits, models.seconds)
    if step is None:  # nothing fits: report the smallest step tried (not always the last:
        # accumulating adds a gradient buffer that one step lacks)
        c = min(tried.values(), key=lambda c: c.bytes["total"])
        step = (c.micro_batch, c.remat)
    m, r = step
    return Choice(m, per_replica // m, r, tried[step].bytes, device_memory,
                  tuple(tried.values()), micro_given, remat is not None), compiled[step]


def _ranked(micros, remats, models: Models, compile_one, usable: int) -> tuple | None:
    """The fit rule on the memory model's figures, each compile rescaling them to the
    compiler's (the ratio of the last compiled step), until the rule's pick is a compiled
    step or MAX_RANKED_COMPILES are spent; then the preferred compiled step that fits."""
    predict, cost_fn = models.bytes, models.seconds
    scale, seen = 1.0, []
    for _ in range(MAX_RANKED_COMPILES):
        pick = choose_step(micros, remats, lambda m, r: predict(m, r) * scale <= usable,
                           cost_fn)
        if pick is None:  # the model says nothing fits: try the smallest candidate
            pick = (micros[-1], remats[-1])
        if pick in seen:
            break
        seen.append(pick)
        c = compile_one(*pick)
        scale = c.bytes["total"] / max(1, predict(*pick))
    def order(p: tuple) -> tuple:  # the rule's preference: faster by the cost model where
        # there is one (its step 3), then the larger micro-batch, then the lower rung
        return (cost_fn(*p) if cost_fn else 0.0), -p[0], remats.index(p[1])

    fitting = [p for p in seen if compile_one(*p).bytes["total"] <= usable]
    while fitting and len(seen) < MAX_RANKED_COMPILES:
        # compiles left: the nearest step the rule prefers to the best that fits (the model
        # may not tell two rungs apart: none and save_attn, say)
        better = [(m, r) for m in micros for r in remats
                  if order((m, r)) < order(min(fitting, key=order)) and (m, r) not in seen]
        if not better:
            break
        nearest = max(better, key=order)
        seen.append(nearest)
        if compile_one(*nearest).bytes["total"] <= usable:
            fitting.append(nearest)
    return min(fitting, key=order) if fitting else None


def compile_step(strategy, step: Callable, cfg, optimizer, plan) -> Any:
    """`step` jitted with the strategy's shardings, lowered on abstract state and a batch
    [accum, micro_batch x replicas, T+1], compiled: the executable `train` runs."""
    import jax  # loads JAX: only when this runs
    import jax.numpy as jnp  # loads JAX: only when this runs

    from cgpt.model import gpt as model  # loads JAX: only when this runs

    abstract_p = jax.eval_shape(lambda: model.init_params(cfg))
    abstract_o = jax.eval_shape(optimizer.init, abstract_p)
    a_params, a_opt = strategy.abstract_state(abstract_p, abstract_o)
    shape = (plan.accum, plan.micro_batch * plan.replicas, plan.seq_len + 1)
    if hasattr(strategy, "jit_step"):
        jitted = strategy.jit_step(step, abstract_p, abstract_o)
        batch_sharding = strategy.batch_sharding(3)
    else:  # one device: the state's own placement
        jitted = jax.jit(step, donate_argnums=(0, 1))
        batch_sharding = jax.tree.leaves(a_params)[0].sharding
    a_batch = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch_sharding)
    device = next(iter(batch_sharding.device_set))
    options = {k: v for k, v in backend.compile_options(strategy.mode, device.platform).items()
               if _known_option(k, device)}
    return jitted.lower(a_params, a_opt, a_batch).compile(options or None)


@functools.lru_cache(maxsize=None)  # one probe per option and device kind, not per compile
def _known_option(name: str, device) -> bool:
    """Whether this XLA has compile option `name` (a tiny compile for `device`): a GPU flag
    that a later XLA renamed or dropped is left out, the step compiled with XLA's default
    (the GPU compile tests then show what that default does)."""
    import jax  # loads JAX: only when this runs
    import jax.numpy as jnp  # loads JAX: only when this runs

    x = jax.ShapeDtypeStruct((1,), jnp.float32,
                             sharding=jax.sharding.SingleDeviceSharding(device))
    try:
        jax.jit(lambda a: a + 1).lower(x).compile({name: False})
    except jax.errors.JaxRuntimeError as e:
        if "No such compile option" in str(e):
            return False
        raise
    return True



def fit_step(res, strategy, optimizer, device_memory: int,
             log: Callable[[str], None] | None = None):
    """(the fitted `Resolved`, its compiled step, the `Choice`): the largest micro-batch, and
    the lowest rung of the platform's remat ladder, whose compiled step fits `device_memory`
    per device. A
    train.micro_batch or model.remat that is set is kept and only checked. If nothing fits,
    the choice is the smallest step tried and its `fits` is False."""
    from cgpt.train.step import make_step  # loads JAX: only when this runs

    t, per_replica = res.run.train, res.batch_size // res.replicas
    micros = [t.micro_batch] if t.micro_batch else [
        m for m in divisors_desc(per_replica) if not (
            res.mode == "layer_pipelined" and t.micro_batches and m % t.micro_batches)]

    def compile_one(m: int, remat: str):
        r = res.fitted(m, remat)
        strategy.prepare(r)
        if log:
            log(f"compiling the step at micro-batch {m}, remat {remat}...")
        step = compile_step(strategy, make_step(r.cfg, optimizer, strategy.loss, t.gns), r.cfg,
                            optimizer, r)
        if log:
            total, usable = step_bytes(step)["total"], usable_memory(device_memory)
            log(f"  {fmt_bytes(total)} per device: "
                f"{'fits' if total <= usable else 'does not fit'} in {fmt_bytes(usable)}")
        return step

    choice, compiled = search(micros or [per_replica], per_replica, compile_one, device_memory,
                              res.cfg.remat, bool(t.micro_batch),
                              backend.defaults(res.platform or "cpu").remat_ladder,
                              Models(_step_seconds(res),
                                     _predicted_bytes(res, strategy, per_replica)))
    fitted = res.fitted(choice.micro_batch, choice.remat)
    strategy.prepare(fitted)
    return fitted, compiled, choice


def _predicted_bytes(res, strategy, per_replica: int) -> Callable[[int, str], int] | None:
    """The memory model's bytes per device of (micro-batch, rung) for a step compiled by a
    GPU's compiler (a GPU, or a plan's compile-only GPUs: `cgpt.sharding.auto.footprint`),
    which ranks the candidates so that a few are compiled; None elsewhere (CPU devices, also
    emulating a GPU plan, and TPU), where the search compiles its way (one step on CPU
    presets) and agrees with the rule's other callers (tests/plan/test_fitrule.py)."""
    device = (strategy.mesh.devices.flat[0] if strategy.mesh is not None
              else getattr(strategy, "device", None))
    if res.platform != "gpu" or getattr(device, "platform", None) != "gpu":
        return None
    mesh = res.mesh or {}
    mode = "data_parallel" if res.mode == "single" else res.mode  # one device: all of it
    shards = max(1, weight_shards(mode, mesh, res.nodes)) if mesh else 1
    cfg = backend.for_platform(res.cfg, res.platform)  # its chunked loss, as compiled
    return lambda m, r: auto.footprint(cfg, shards, res.seq_len, mode, mesh, m, r,
                                       per_replica // m)


def _step_seconds(res) -> Callable[[int, str], float] | None:
    """The cost model's seconds per step of (micro-batch, rung) for a placed GPU run
    (`cgpt.sharding.cost`: only ratios matter, so the assumed H100 of a plan will do); None
    elsewhere (CPU, TPU, one device), where the search is memory-only."""
    hw = cost.hardware_for(res.platform)
    if hw is None or not res.mesh or res.mode not in ("data_parallel", "weight_streaming",
                                                       "layer_pipelined"):
        return None
    return lambda m, r: cost.step_cost(res.cfg, res.mode, res.mesh, res.batch_size,
                                       res.seq_len, m, recomputes_forward(r), hw).total_s
