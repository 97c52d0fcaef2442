"""`--mode auto` and the memory model it (and `cgpt plan`'s callers) use.

Per-device footprints, in bytes, of the three placements for `rows` sequences of `seq_len`
tokens in flight per batch shard (one accumulation step):
  state        16 bytes per parameter held (f32 weight, gradient, Adam's mu and nu)
  activations  what the backward keeps, per token: `KEPT[rung]` bytes per d_model for each
               layer a device runs plus a per-token rest, at bf16 (x2 for f32 activations,
               `activation_itemsize`)
  logits       chunked loss (GPU/TPU, `model.loss_chunk` positions at a time): one f32
               [rows, chunk, V] buffer; unchunked (CPU): B x T x V f32 logits and their
               gradient (8 bytes each)
  gathered     weight streaming: the layer weights XLA keeps gathered (prefetch, the layer's
               f32 gradient before its reduce-scatter) and the bf16 token embedding
The constants are fitted to XLA's H100 compile of the real step (`bench/gpu_compile_table.py`,
docs/gpu_compile.md: 111M-6.7B, seq 2048, every GPU rung; one linear fit per rung, so
within ~15% of the compile, not exact). `cgpt plan` compiles the real step for the exact
figure, and the fit's ranked search replaces this estimate with each compile's.
"""
from __future__ import annotations

import logging
import math

from cgpt.config.backend import padded_vocab
from cgpt.config.model import ModelConfig, remat_value
from cgpt.config.units import fmt_bytes
from cgpt.sharding import cost
from cgpt.sharding.axes import SHARDED_MODES, parse_mesh, weight_streaming_axes
from cgpt.sharding.nodes import split_axes, weight_shards

log = logging.getLogger(__name__)

BYTES_PER_PARAM_STATE = 16  # f32 weight + gradient + Adam mu + nu
ACCUMULATOR_BYTES = 4  # per parameter held, when the step accumulates: the f32 gradient sum
# Bytes per token, in units of d_model at bf16, that the backward keeps: (for each layer a
# device runs, once per token). "none" keeps every residual of autodiff (the f32 LayerNorm and
# GELU intermediates among them: ~4x the bf16 matmul outputs); "save_attn" and "save_dots" the
# matmul and attention outputs; "full" each layer's input, one layer rebuilt at a time. Fitted
# to the H100 compile of one pass (docs/gpu_compile.md). A step that accumulates needs no more:
# XLA overlaps two micro-batches' passes (up to ~2x these bytes) only where memory is left
# over, and runs them one after the other where it is not (1.3B at 22 x 3, 2.7B at 11 x 6,
# 6.7B at 5 x 26 compile to this model's one pass within 3%).
KEPT = {"none": (58, 131), "save_attn": (24, 20), "save_dots": (24, 20), "full": (4, 0)}
PIPELINE_PASS = 1.2  # a pipeline stage's ticks keep a little more (111M, stage=2: 1.1-1.3)
LOGITS_CHUNK_BYTES = 4  # per chunk position and vocabulary entry: one f32 chunk of logits
GATHERED_LAYERS = 5  # f32-sized layer weights a weight-streaming device keeps gathered


def _block_params(cfg: ModelConfig) -> int:
    return cfg.num_params(embedding=False) - 2 * cfg.d_model  # the stacked layers only


def logits_bytes(cfg: ModelConfig, rows: int, seq_len: int) -> int:
    """The loss's logits: one f32 chunk [rows, chunk, V] when the loss is chunked
    (`cgpt.model.gpt.chunked_cross_entropy`), else the whole f32 [rows, T, V] and its
    gradient."""
    chunk = cfg.loss_chunk or 0  # the config's own, as `backend.for_platform` resolved it;
    if chunk:                    # its padded vocabulary likewise ("cpu": no padding if unset)
        return LOGITS_CHUNK_BYTES * rows * min(chunk, seq_len) * padded_vocab(cfg, "cpu")
    return 2 * 4 * rows * seq_len * cfg.vocab_size


def activation_itemsize(cfg: ModelConfig) -> int:
    """Bytes per activation value: the compute dtype's, as the step holds them (bf16 on a
    GPU: `cgpt.model.gpt.embed` casts the residual stream to it and every matmul returns it;
    only attention's scores, which cuDNN's flash attention never stores, and the logits are
    f32). One fact for auto's fit check, its cost ranking's fit replay and the analytic plan,
    so the mode auto picks is the fastest by the step the plan prints."""
    return 2 if cfg.compute_dtype == "bfloat16" else 4


def activation_bytes(cfg: ModelConfig, layers: int, rows: int, seq_len: int) -> int:
    """What `layers` layers keep for the backward pass (`KEPT` at the config's rung)."""
    per_layer, rest = KEPT[remat_value(cfg.remat)]
    per_token = cfg.d_model * (layers * per_layer + rest) * activation_itemsize(cfg) // 2
    return rows * seq_len * per_token


def _state(params_held: int, accum: int) -> int:
    """Optimizer state of the parameters a device holds, and their f32 gradient sum when
    the step accumulates."""
    return (BYTES_PER_PARAM_STATE + (ACCUMULATOR_BYTES if accum > 1 else 0)) * params_held


def pipeline_bytes_per_device(cfg: ModelConfig, stages: int, rows: int, seq_len: int,
                              accum: int = 2) -> int:
    """layer_pipelined (stages = 1: data_parallel): state of one stage's layers and the
    replicated embeddings, activations of the `rows` sequences a data replica has in flight
    through its stage's layers, and the logits of the rows/stages the head runs per device."""
    blocks = _block_params(cfg)
    held = blocks // stages + cfg.num_params() - blocks
    acts = activation_bytes(cfg, cfg.n_layer // stages, rows, seq_len)
    return (_state(held, accum) + logits_bytes(cfg, math.ceil(rows / stages), seq_len)
            + (int(acts * PIPELINE_PASS) if stages > 1 else acts))


def data_parallel_bytes_per_device(cfg: ModelConfig, rows: int, seq_len: int,
                                   accum: int = 2) -> int:
    """data_parallel: every parameter's state, all layers' activations for `rows`."""
    return pipeline_bytes_per_device(cfg, 1, rows, seq_len, accum)


def weight_streaming_bytes_per_device(cfg: ModelConfig, num_devices: int, rows: int,
                                      seq_len: int, accum: int = 2) -> int:
    """weight_streaming: 1/N of the state, all layers' activations for the `rows` of this
    device's batch shard, the logits, and the weights kept gathered (`GATHERED_LAYERS`, and
    the bf16 token embedding for the head)."""
    layer = _block_params(cfg) // cfg.n_layer
    gathered = 4 * GATHERED_LAYERS * layer + 2 * padded_vocab(cfg, "cpu") * cfg.d_model
    return (_state(cfg.num_params() // num_devices, accum) + gathered
            + activation_bytes(cfg, cfg.n_layer, rows, seq_len)
            + logits_bytes(cfg, rows, seq_len))


def footprint(cfg: ModelConfig, num_devices: int, seq_len: int, mode: str, axes: dict[str, int],
              rows: int, remat: bool | str | None = None, accum: int = 2) -> int:
    """auto's estimate for `mode` on `axes` with `rows` in flight per batch shard, `accum`
    accumulation steps (remat: the config's unless given): the memory model the cost model
    replays the fit on."""
    cfg = cfg if remat is None else cfg.replace(remat=remat)
    if mode == "layer_pipelined":
        return pipeline_bytes_per_device(cfg, axes.get("stage", 1), rows, seq_len, accum)
    if mode == "data_parallel":
        return data_parallel_bytes_per_device(cfg, rows, seq_len, accum)
    return weight_streaming_bytes_per_device(cfg, num_devices, rows, seq_len, accum)


def choose_auto(cfg: ModelConfig, num_devices: int, memory: int, batch: int, seq_len: int,
                micro_batch: int | None = None, mesh: dict[str, int] | None = None,
                nodes: int = 1, hardware: cost.Hardware | None = None,
                ranking: list | None = None) -> tuple[str, dict[str, int], str]:
    """(mode, mesh axes, reason) for `--mode auto`.

    Candidates in order, the first whose footprint fits `memory` wins:
      --mesh with stage   layer_pipelined on it (the axes are honoured)
      --mesh with fsdp    weight_streaming on it
      --mesh data=N       data_parallel, then weight_streaming, on it
      empty --mesh        layer_pipelined on the most stages dividing both n_layer and the
                          device count with the rest (`data`) dividing the batch, when that
                          is > 1 stage, else data_parallel when the batch splits over every
                          device; then weight_streaming factored by `weight_streaming_axes`
    A 1-stage mesh is never called layer-pipelined. In flight per batch shard:
    `micro_batch` sequences, or one when it is unset (the least a step holds; train's
    accumulation fills the rest). ValueError, with the numbers and the fix, when none fits.
    On `nodes` > 1 weight streaming keeps `data` across nodes and shards the weights over
    the axes inside a node only (`cgpt.sharding.nodes.weight_shards`).

    With `hardware` (a GPU: `cost.hardware_for`) the fastest that fits wins instead
    (`cgpt.sharding.cost`), and an empty --mesh also offers every smaller stage count and
    data_parallel; equal times keep the order above. Without (CPU, TPU): first fit, as above.
    `ranking`, a list, receives every candidate's `cost.StepCost`, fastest first (`cgpt plan`).
    """
    rows = micro_batch or 1
    cands: list[tuple[str, dict[str, int], int]] = []
    if mesh and mesh.get("stage", 1) > 1:
        cands.append(("layer_pipelined", mesh, pipeline_bytes_per_device(
            cfg, mesh["stage"], rows, seq_len)))
    elif mesh and mesh.get("fsdp", 1) > 1:
        cands.append(("weight_streaming", mesh, weight_streaming_bytes_per_device(
            cfg, weight_shards("weight_streaming", mesh, nodes), rows, seq_len)))
    elif mesh:
        cands += [("data_parallel", mesh, data_parallel_bytes_per_device(cfg, rows, seq_len)),
                  ("weight_streaming", mesh, weight_streaming_bytes_per_device(
                      cfg, weight_shards("weight_streaming", mesh, nodes), rows, seq_len))]
    else:
        # the rest of the devices become `data`, which the batch must split over
        step = batch // micro_batch if micro_batch and batch % micro_batch == 0 else batch
        # a stage count divides both the devices and the layers: the divisors of their gcd
        # (a scan up to --devices 10**6 took seconds per call)
        options = [s for s in range(1, math.gcd(num_devices, cfg.n_layer) + 1)
                   if num_devices % s == 0 and cfg.n_layer % s == 0
                   and step % (num_devices // s) == 0 or s == 1]
        stages = max(options)
        if hardware:  # every stage count, the cost model ranks them
            pipelines = sorted(options, reverse=True)
        else:
            pipelines = [stages]
        if nodes > 1:  # stages inside a node first, across nodes only if those do not fit
            inside = [s for s in options if (num_devices // nodes) % s == 0]
            pipelines = [max(inside), *pipelines] if inside else pipelines
            pipelines = [s for s in pipelines if _tiles(s, num_devices, nodes)]
            pipelines = sorted(set(pipelines), key=pipelines.index)
        for s in pipelines:
            if s > 1:
                data = num_devices // s
                axes = {"stage": s, "data": data} if data > 1 else {"stage": s}
                cands.append(("layer_pipelined", axes,
                              pipeline_bytes_per_device(cfg, s, rows, seq_len)))
        if (stages == 1 or hardware) and step % num_devices == 0:
            cands.append(("data_parallel", {"data": num_devices},
                          data_parallel_bytes_per_device(cfg, rows, seq_len)))
        ws = weight_streaming_axes(num_devices, batch, micro_batch, nodes)[0]
        cands.append(("weight_streaming", ws, weight_streaming_bytes_per_device(
            cfg, weight_shards("weight_streaming", ws, nodes), rows, seq_len)))
    tried = "; ".join(f"{m} on {','.join(f'{k}={v}' for k, v in a.items())} needs ~{fmt_bytes(b)}"
                      for m, a, b in cands)
    ranked = cost.rank(cfg, cands, batch, seq_len, memory, hardware, lambda m, a, *rest: footprint(
        cfg, weight_shards(m, a, nodes) if m == "weight_streaming" else num_devices, seq_len,
        m, a, *rest), micro_batch) if hardware else []  # as the candidates' own footprints
    if ranking is not None:
        ranking.extend(ranked)
    # the reasons name no memory figure: the plan prints one per device, its step's (#29)
    if ranked and ranked[0].fits:
        best, others = ranked[0], [c for c in ranked[1:] if c.fits]
        return best.mode, best.axes, (
            f"{best.mode} fits and is the fastest by the cost model on {best.hardware}: "
            f"{best.line()}" + "".join(f"; {c.line()}" for c in others)
            + "".join(f"; {c.label()} does not fit" for c in ranked if not c.fits))
    for i, (mode, axes, need) in enumerate(cands):
        if need <= memory:
            skipped = "".join(f"; {m} on {','.join(f'{k}={v}' for k, v in a.items())} does not"
                              for m, a, _ in cands[:i])
            return mode, axes, (f"{mode} is the first that fits with {rows} sequence(s) in "
                                f"flight per batch shard{skipped}")
    raise ValueError(
        f"--mode auto: nothing fits {fmt_bytes(memory)} per device with {rows} sequence(s) of "
        f"{seq_len} tokens in flight per batch shard: {tried}. Use more devices"
        + (", a smaller train.micro_batch" if rows > 1 else "")
        + (", or leave --mesh empty so auto may stream weights" if mesh and "fsdp" not in mesh
           else "") + (" (or a shorter data.seq_len)" if rows == 1 else ""))


def within_limit(cfg: ModelConfig, batch: int, seq_len: int, *, num_devices: int, nodes: int,
                 device_memory: int, hardware: cost.Hardware,
                 limit: float = cost.COMM_LIMIT) -> cost.StepCost | None:
    """The fastest placement `--mode auto` weighs for a global batch of `batch` that fits and
    whose modelled communication is at most `limit` of its step; None when there is none
    (or nothing fits)."""
    ranking: list = []
    try:
        placement("auto", "", cfg, batch, num_devices=num_devices, device_memory=device_memory,
                  seq_len=seq_len, nodes=nodes, hardware=hardware, ranking=ranking)
    except ValueError:  # nothing fits this batch
        return None
    return next((c for c in ranking if c.fits and c.comm_fraction <= limit), None)


def nearest_batches(cfg: ModelConfig, batch: int, seq_len: int, *, num_devices: int, nodes: int,
                    device_memory: int, hardware: cost.Hardware,
                    limit: float = cost.COMM_LIMIT) -> list[tuple[int, cost.StepCost]]:
    """The global batches nearest `batch` (itself first) at which `--mode auto` weighs a
    placement within `limit` (`within_limit`): (batch, that step), both sides on a tie; []
    when none in (0, 2 x batch] has one. Besides `batch` only multiples of the node count
    are tried, the batches that split over the nodes (on N nodes a batch that does not leaves
    `fsdp` crossing them: `weight_streaming_axes`). What `cgpt plan` names when its step
    spends more than `limit` communicating."""
    found: list[tuple[int, cost.StepCost]] = []
    tries = sorted({batch, *range(nodes, 2 * batch + 1, nodes)},
                   key=lambda b: (abs(b - batch), b))
    for b in tries:
        if found and abs(b - batch) > abs(found[0][0] - batch):
            break
        step = within_limit(cfg, b, seq_len, num_devices=num_devices, nodes=nodes,
                            device_memory=device_memory, hardware=hardware, limit=limit)
        if step is not None:
            found.append((b, step))
    return found


def _tiles(stages: int, num_devices: int, nodes: int) -> bool:
    """Whether a stage x data mesh can be laid over `nodes` nodes (`split_axes`)."""
    try:
        split_axes({"stage": stages, "data": num_devices // stages}, nodes)
        return True
    except ValueError:
        return False


def placement(mode: str, mesh_spec: str, cfg: ModelConfig, batch: int, micro: int | None = None,
              *, num_devices: int, device_memory: int | None = None, seq_len: int | None = None,
              num_processes: int = 1, nodes: int = 1,
              hardware: cost.Hardware | None = None, ranking: list | None = None
              ) -> tuple[str, dict[str, int], str, str | None]:
    """(mode, mesh axes, why the mesh has that shape, why auto chose the mode) for a sharded
    `--mode`/`--mesh` on `num_devices` devices of `nodes` nodes: no devices needed, so a
    256-device placement can be checked anywhere. Which axes cross nodes: `cgpt.sharding.nodes`
    (a mesh that cannot be laid over the nodes is a ValueError). `ranking`: as `choose_auto`'s."""
    if mode not in SHARDED_MODES:
        raise ValueError(f"--mode {mode!r}; use one of single, {', '.join(SHARDED_MODES)}")
    given = bool((mesh_spec or "").strip())
    axes = parse_mesh(mesh_spec, mode, num_devices, num_processes)
    mesh_reason = ("given by --mesh" if given
                   else f"--mesh empty: every device on {next(iter(axes))}")
    auto_reason = None
    if mode == "auto":
        honoured = ({k: v for k, v in axes.items() if v > 1} or {"data": 1}) if given else None
        mode, axes, auto_reason = choose_auto(
            cfg, math.prod(axes.values()) if given else num_devices,
            device_memory, batch, seq_len or cfg.n_ctx, micro,
            honoured, nodes=nodes, hardware=hardware, ranking=ranking)
        log.info("--mode auto: %s", auto_reason)
    if mode == "weight_streaming" and not given:
        axes, mesh_reason = weight_streaming_axes(num_devices, batch, micro, nodes)
    elif auto_reason and not given:
        mesh_reason = "chosen by --mode auto"
    if nodes > 1:
        split_axes(axes, nodes)  # the mesh must tile the nodes
        n = math.prod(axes.values())
        if mode == "weight_streaming" and n > nodes and weight_shards(mode, axes, nodes) == 1:
            raise ValueError(
                f"--mesh {mesh_spec!r} on {nodes} nodes: weight_streaming shards the weights "
                "over fsdp inside a node (data crosses nodes), and this mesh has none, so every "
                f"device would hold all of them; use --mesh data={nodes},fsdp={n // nodes} "
                "(HSDP), or --mode data_parallel for replicated weights")
    return mode, axes, mesh_reason, auto_reason
