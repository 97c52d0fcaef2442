"""Training: the jitted step (with gradient accumulation) and the crash-safe loop.

The loop is written so that a SIGKILL at any moment loses at most the steps since the last
checkpoint: batches are a pure function of the step (`cgpt.data`), checkpoints are atomic
(`cgpt.checkpoint`), and on `--resume` the metrics log is cut back to the restored step, so
the resumed run continues with exactly the losses an uninterrupted run would have logged.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cgpt import backend, checkpoint, distributed, flops, model, optim, preempt, rundir
from cgpt.config import ModelConfig
from cgpt.data import load_data
from cgpt.fileio import atomic_write_text, probe_writable
from cgpt.runconfig import RunConfig, from_dict


PLACEMENT_KEYS = ("mode", "mesh", "micro_batches", "host_offload", "micro_batch", "device_memory")
# with model.remat, these change how a step runs on the hardware at hand, not what is trained
# (`cgpt.fit` may choose another micro-batch or remat on other devices): on --resume the
# launch's values win
# train.* keys `--resume --allow-train-changes` may change: the optimizer's hyperparameters and
# the logging cadence. The others fix what the checkpoint means (budget, batch, data order).
CHANGEABLE_KEYS = ("peak_lr", "decay", "warmup_steps", "adam_eps", "weight_decay", "clip_norm",
                   "end_lr_fraction", "log_every", "eval_every", "eval_batches", "ckpt_every",
                   "keep_checkpoints")
CHANGES_FILE = "config_changes.json"


class TrainError(RuntimeError):
    """Training cannot start or continue; the message says why and what to do."""


# ---- the step ------------------------------------------------------------------------
def make_step(cfg: ModelConfig, optimizer: optax.GradientTransformation,
              loss: Callable = model.loss_fn) -> Callable:
    """step(params, opt_state, batch [accum, micro, T+1]) -> (params, opt_state, metrics).

    Gradients of the `accum` micro-batches are averaged before one optimizer update, so the
    update equals that of one big batch (tested: 4 x 2 == 8 within 1e-5).
    """

    def step(params, opt_state, batch):
        grad_fn = jax.value_and_grad(loss)

        def micro(acc, tokens):
            l, g = grad_fn(params, tokens, cfg)
            return jax.tree.map(jnp.add, acc, (l, g)), None

        zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
        (l, g), _ = jax.lax.scan(micro, zeros, batch)
        n = batch.shape[0]
        l, g = l / n, jax.tree.map(lambda x: x / n, g)
        updates, opt_state = optimizer.update(g, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": l, "grad_norm": optax.global_norm(g)}

    return step


def make_eval(cfg: ModelConfig, loss: Callable = model.loss_fn) -> Callable:
    return jax.jit(lambda params, tokens: loss(params, tokens, cfg))


# ---- the plan of a run -----------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """Everything derived from the config before step 0: budget, batch split, recipe."""

    tokens: int
    batch_size: int
    micro_batch: int
    accum: int
    replicas: int
    seq_len: int
    recipe: optim.Recipe

    @property
    def total_steps(self) -> int:
        return self.recipe.total_steps

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


def make_plan(run: RunConfig, replicas: int = 1) -> Plan:
    cfg, t, seq = run.model, run.train, run.data.seq_len
    d = optim.published_defaults(cfg)
    batch = t.batch_size or d["batch_size"]
    tokens = cfg.chinchilla_tokens() if t.tokens == "chinchilla" else int(t.tokens)
    if batch % replicas:
        raise TrainError(f"train.batch_size={batch} must be a multiple of the {replicas} data "
                         "replicas of the mesh")
    micro = t.micro_batch or batch // replicas
    if batch % (micro * replicas):
        raise TrainError(f"train.batch_size={batch} must be a multiple of train.micro_batch="
                         f"{micro} x {replicas} replicas")
    total = optim.steps_for_tokens(tokens, batch, seq)
    warmup = t.warmup_steps or optim.warmup_steps_for(total, batch * seq, d["published"])
    decay = t.decay or ("1-sqrt" if t.schedule == "wsd" else d["decay"])
    recipe = optim.Recipe(
        peak_lr=t.peak_lr or d["peak_lr"], decay=decay, schedule=t.schedule,
        decay_fraction=t.decay_fraction,
        adam_eps=t.adam_eps or d["adam_eps"], batch_size=batch, warmup_steps=min(warmup, total),
        total_steps=total, end_lr_fraction=t.end_lr_fraction, weight_decay=t.weight_decay,
        clip_norm=t.clip_norm)
    return Plan(tokens=tokens, batch_size=batch, micro_batch=micro,
                accum=batch // (micro * replicas), replicas=replicas, seq_len=seq, recipe=recipe)


def fit_step(run: RunConfig, strategy, optimizer: optax.GradientTransformation,
             device_memory: int):
    """(plan, model config, compiled step, `cgpt.fit.Choice`): the largest micro-batch, and
    remat off before on, whose compiled step fits `device_memory` per device; a
    train.micro_batch or model.remat that is set is kept and only checked. If nothing fits,
    the choice is the smallest step tried and its `fits` is False."""
    from cgpt import fit

    t, replicas = run.train, strategy.data_replicas
    per_replica = make_plan(run, replicas).batch_size // replicas
    micros = [t.micro_batch] if t.micro_batch else [
        m for m in fit.divisors_desc(per_replica) if not (
            strategy.mode == "layer_pipelined" and t.micro_batches and m % t.micro_batches)]

    def variant(m: int, remat: bool) -> RunConfig:
        return replace(run, model=run.model.replace(remat=remat),
                       train=replace(t, micro_batch=m))

    def compile_one(m: int, remat: bool):
        r = variant(m, remat)
        p = make_plan(r, replicas)
        strategy.prepare(p)
        return fit.compile_step(strategy, make_step(r.model, optimizer, strategy.loss), r.model,
                                optimizer, p)

    choice, compiled = fit.search(micros or [per_replica], per_replica, compile_one,
                                  device_memory, run.model.remat, bool(t.micro_batch))
    chosen = variant(choice.micro_batch, choice.remat)
    plan = make_plan(chosen, replicas)
    strategy.prepare(plan)
    return plan, chosen.model, compiled, choice


# ---- run directory helpers ---------------------------------------------------------------
def _check_writable(out: Path) -> None:
    try:
        probe_writable(out)
    except OSError as e:
        raise TrainError(f"output directory {out} is not writable ({e.strerror or e}); "
                         "choose another --out") from e


def _config_diff(a: dict, b: dict) -> list[str]:
    return [f"{s}.{k}" for s in ("model", "data", "train") for k in a[s]
            if a[s][k] != b[s].get(k)] + (["preset"] if a["preset"] != b["preset"] else [])


def resolve_run(run: RunConfig, out: Path, resume: bool, allow_changes: bool = False) -> RunConfig:
    """The config to train with; on resume, the saved one (and it must match what was asked).

    `allow_changes` accepts differences in CHANGEABLE_KEYS (e.g. a lower train.peak_lr after
    a NaN): the run continues with the new values. An "auto" compute dtype becomes the
    platform's (or, resuming, the saved run's) before anything is compared or written."""
    saved = out / checkpoint.CONFIG_FILE
    if not saved.exists():
        return replace(run, model=backend.resolve(run.model))
    if not resume:
        raise TrainError(f"{out} already holds a run ({saved.name}); pass --resume to continue "
                         "it, or choose a new --out")
    prior = from_dict(checkpoint.read_run_config(out), str(saved))
    run = replace(run, model=backend.resolve(run.model, saved=prior.model))
    # Placement may change between launches (checkpoints restore into any mode's layout).
    placement = {k: getattr(run.train, k) for k in PLACEMENT_KEYS}
    prior = replace(prior, train=replace(prior.train, **placement),
                    model=prior.model.replace(remat=run.model.remat))
    if prior != run:
        diff = _config_diff(prior.to_dict(), run.to_dict())
        changeable = all(d.startswith("train.") and d[6:] in CHANGEABLE_KEYS for d in diff)
        if changeable and allow_changes:
            return run
        hint = (" (to continue with the new values, add --allow-train-changes)" if changeable
                else "")
        raise TrainError(f"--resume: the config differs from the run's saved {saved} in "
                         f"{', '.join(diff)}{hint}; resume with the same flags or a new --out")
    return prior


def _record_changes(out: Path, prior: dict | None, run: RunConfig, start: int) -> list[dict]:
    """config_changes.json: the train.* values changed on a resume, with the step they took
    effect (a rewind moves later entries back to the step it resumed from)."""
    path = out / CHANGES_FILE
    log = rundir.read_changes(path)
    log = [{**c, "step": min(c["step"], start)} for c in log]
    new = run.to_dict()
    diff = [d for d in (_config_diff(prior, new) if prior is not None else [])
            if d.startswith("train.") and d[6:] in CHANGEABLE_KEYS]
    if diff:
        log.append({"step": start, **{d: [prior["train"][d[6:]], new["train"][d[6:]]]
                                      for d in diff}})
    if log or path.exists():
        atomic_write_text(path, json.dumps(log, indent=1))
    return log


def _nonfinite_stop(what: str, step: int, ckpt, out: Path, note: str = "") -> TrainError:
    """The message of a run stopped by a non-finite step, with advice that works."""
    steps = ckpt.steps()
    if not steps:
        return TrainError(
            f"{what} at step {step}{note}; training stopped. No checkpoint was written yet; lower "
            "train.peak_lr (or raise train.warmup_steps) and rerun the same command with "
            "--resume --allow-train-changes train.peak_lr=<lower>")
    earlier = (f"; if the loss was already diverging there (see metrics.jsonl), go back further "
               f"with --from-step {steps[-2]}" if len(steps) > 1 else "")
    return TrainError(
        f"{what} at step {step}{note}; training stopped before saving anything from it. The "
        f"last good checkpoint (step {steps[-1]}, verified finite) is kept in "
        f"{out / checkpoint.CKPT_DIR}"
        f" (kept steps: {', '.join(map(str, steps))}). To continue with a lower learning rate, "
        "rerun the same command with --resume --allow-train-changes train.peak_lr=<lower> "
        f"(or a larger train.warmup_steps){earlier}; or start over in a new --out")


@jax.jit
def _all_finite(tree) -> jax.Array:
    leaves = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree)
              if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def _close_all(*closers: Callable[[], None]) -> None:
    first = None
    for close in closers:
        try:
            close()
        except Exception as e:  # noqa: BLE001 - re-raised below
            first = first or e
    if first is not None:
        raise first


def _close_tb(tb) -> None:
    """Close a SummaryWriter; if that fails (disk full), stop its writer threads anyway, since
    tensorboardX would retry at exit and print a traceback per retry."""
    try:
        tb.close()
    except OSError:
        for w in (tb.all_writers or {}).values():
            ew = w.event_writer
            try:
                ew._worker.stop()
            except Exception:  # noqa: BLE001 - the worker may have died on the same error
                pass
            ew._closed = True
        raise


# ---- the loop ----------------------------------------------------------------------------
def train(run: RunConfig, out: str | Path, resume: bool = False, progress: bool = True,
          strategy=None, allow_changes: bool = False, from_step: int | None = None,
          branch_from: tuple[Path, int] | None = None) -> dict:
    """Train `run` into the run directory `out`; returns the summary (also `summary.json`).

    The directory is locked while this runs; a launch that fails before its config is written
    leaves nothing behind; storage errors end in one `RunDirError` saying what was kept.
    `allow_changes` and `from_step` (with `resume`) continue with changed train.* values
    (CHANGEABLE_KEYS) and from an earlier kept checkpoint. branch_from=(RUN, STEP): start from
    RUN's checkpoint at STEP, a cooldown branch of a WSD run (cgpt.branch).
    """
    out = Path(out)
    distributed.initialize()  # a multi-process job: join it (no-op otherwise)
    owner = distributed.is_writer()  # process 0 alone locks, writes and cleans the directory
    new_dirs = rundir.first_missing(out) if owner else None
    if owner:
        _check_writable(out)
    with rundir.Launch(out, new_dirs, lock=owner) as launch:
        return _train(run, out, resume, progress, strategy, launch, allow_changes, from_step,
                      branch_from)


def _train(run: RunConfig, out: Path, resume: bool, progress: bool, strategy,
           launch: rundir.Launch, allow_changes: bool, from_step: int | None,
           branch_from: tuple[Path, int] | None) -> dict:
    from tensorboardX import SummaryWriter
    from tqdm.auto import tqdm

    from cgpt.perf import peak_flops
    from cgpt.runconfig import parse_bytes
    from cgpt.sharding import device_memory_bytes, make_strategy

    wall0 = time.perf_counter()
    writer = distributed.is_writer()  # process 0 alone writes the run directory's files
    fresh = rundir.check_launch(out, resume)  # else a committed run: its files count
    prior = None if fresh or not resume else checkpoint.read_run_config(out)
    run = resolve_run(run, out, resume, allow_changes)
    if from_step is not None and not resume:
        raise TrainError("--from-step continues a run: use it with --resume")
    distributed.barrier("config-read")  # every process has read config.yaml before it is written
    if resume and (out / "summary.json").exists():  # finished already: nothing to redo
        return rundir.read_json(out / "summary.json", dict, "delete it and rerun with --resume "
                                "to write it again from the last checkpoint and the log")
    cfg = run.model
    memory = (parse_bytes(run.train.device_memory, "train.device_memory")
              if run.train.device_memory else None)
    if strategy is None:
        strategy = make_strategy(run.train.mode, run.train.mesh, cfg, run.train,
                                 seq_len=run.data.seq_len, device_memory=memory)
    optimizer = optim.make_optimizer(make_plan(run, strategy.data_replicas).recipe, cfg)
    # the micro-batch x accumulation and remat whose compiled step fits (cgpt.fit): that
    # compiled step is the one trained; stop here, before any file is written, if none fits
    memory = memory or device_memory_bytes()
    if jax.process_count() > 1:  # every process must compile the same step: the smallest memory
        from jax.experimental import multihost_utils
        # in MiB: without jax_enable_x64 the gather is int32, which bytes would overflow
        mib = multihost_utils.process_allgather(np.int32(min(memory >> 20, 2**31 - 1)))
        memory = int(np.min(mib)) << 20
    plan, cfg, step_fn, fitted = fit_step(run, strategy, optimizer, memory)
    if not fitted.fits:
        mesh = ",".join(f"{k}={v}" for k, v in (strategy.describe().get("mesh") or {}).items())
        raise TrainError(fitted.error(f"{cfg.name} ({cfg.num_params():,} params), "
                                      f"{strategy.mode} on {strategy.num_devices} device(s)"
                                      + (f" ({mesh})" if mesh else "")))
    if writer:
        print(f"{cfg.name}: {fitted.line()}", file=sys.stderr, flush=True)
    # never a failed launch's tokenizer; process 0 prepares the data once, the others then read it
    data = distributed.first("data preparation", lambda: load_data(run.data, None if fresh else out))
    if data.vocab_size != cfg.vocab_size:  # unused rows would inflate N, D and FLOPs
        raise TrainError(f"the tokenizer has {data.vocab_size} tokens but model.vocab_size is "
                         f"{cfg.vocab_size}; set model.vocab_size={data.vocab_size} (or a "
                         f"tokenizer of {cfg.vocab_size} tokens, e.g. data.vocab_size="
                         f"{cfg.vocab_size} with more text)")
    if writer:
        if fresh:
            launch.created.append(out / "tokenizer.json")
            data.save_tokenizer(out)
        atomic_write_text(out / checkpoint.CONFIG_FILE, run.to_yaml())
    launch.commit()  # from here on the directory holds a resumable run

    _, params, opt_state = strategy.compile_step(
        make_step(cfg, optimizer, strategy.loss), optimizer, run.train.seed, plan)
    eval_fn = strategy.compile_eval(cfg)
    ckpt = checkpoint.Checkpointer(out, keep=run.train.keep_checkpoints)
    start = 0
    if resume:
        if from_step is not None:
            if from_step not in ckpt.steps():
                raise TrainError(f"--from-step {from_step}: no kept checkpoint at step "
                                 f"{from_step}; kept: {ckpt.steps()}")
            ckpt.discard_after(from_step)
        got = ckpt.restore_latest(*strategy.abstract_state(params, opt_state))
        if got is not None:
            start, params, opt_state = got
            if not bool(_all_finite((params, opt_state))):
                raise TrainError(f"checkpoint {start} in {out / checkpoint.CKPT_DIR} holds "
                                 "non-finite values; resume from an earlier one with "
                                 f"--from-step (kept: {ckpt.steps()}), or start over")
    if branch_from is not None and start == 0:  # a cooldown branch of a WSD run
        from cgpt import branch
        params, opt_state = branch.begin(branch_from, run, plan.recipe, out,
                                         *strategy.abstract_state(params, opt_state))
        start = branch_from[1]
    changes = []
    if writer:
        rundir.resume_log(out / "metrics.jsonl", start, plan.total_steps)
        changes = _record_changes(out, prior, run, start)

    total = plan.total_steps
    eval_every = run.train.eval_every or max(1, total // 10)
    ckpt_every = run.train.ckpt_every or max(1, total // 10)
    flops_per_step = flops.train_flops_per_token(cfg, plan.seq_len) * plan.tokens_per_step
    peak, peak_src = peak_flops(cfg.compute_dtype)
    # Emulated CPU devices share the cores the measured peak already used.
    on_cpu = jax.devices()[0].platform == "cpu"
    peak_total = peak * (1 if on_cpu else strategy.num_devices)
    epochs = data.epochs_for_tokens(total * plan.tokens_per_step)

    def mfu_of(tokens_per_s: float) -> float:
        return tokens_per_s * flops_per_step / plan.tokens_per_step / peak_total

    eval_bs = min(plan.micro_batch * plan.replicas, data.num_val_sequences)
    eval_bs -= eval_bs % plan.replicas
    if eval_bs < 1:
        raise TrainError(f"data.val_sequences={data.num_val_sequences} is smaller than the "
                         f"{plan.replicas} data replicas; raise data.val_sequences")

    eval_shape = (eval_bs, plan.seq_len + 1)
    eval_rows = strategy.batch_rows(eval_shape)  # this process's rows of each eval batch

    def evaluate() -> float:
        losses, n = [], 0
        for batch in data.val_batches(eval_bs, drop_last=True, rows=eval_rows):
            losses.append(float(eval_fn(params, strategy.shard_eval_batch(batch, eval_shape)))
                          * eval_bs)
            n += eval_bs
            if run.train.eval_batches and len(losses) >= run.train.eval_batches:
                break
        return sum(losses) / n

    metrics_f = open(out / "metrics.jsonl", "a") if writer else distributed.NullWriter()
    tb = (SummaryWriter(str(out / "events"), purge_step=start + 1 if start else None) if writer
          else distributed.NullWriter())
    shape = (plan.accum, plan.micro_batch * plan.replicas, plan.seq_len + 1)  # a global batch
    rows = strategy.batch_rows(shape)  # the rows this process loads
    # train_loss averages the last `window` steps, each logged: a function of the log alone.
    window = rundir.train_loss_window(total)
    val_loss, t_run, tokens_seen = math.nan, 0.0, 0
    bar = tqdm(total=total, initial=start, disable=not (progress and writer), unit="step",
               dynamic_ncols=True, desc=f"{cfg.name} {plan.tokens / 1e6:.3g}M tok")
    triggers = preempt.CheckpointTriggers(run.train.checkpoint_minutes).install()
    try:
        for step in range(start, total):
            batch = data.train_batch(step, plan.batch_size, rows=rows).reshape(
                plan.accum, -1, plan.seq_len + 1)
            t0 = time.perf_counter()
            params, opt_state, m = step_fn(params, opt_state, strategy.shard_batch(batch, shape))
            loss = float(m["loss"])  # waits for the step: honest timing and a NaN check
            grad_norm = float(m["grad_norm"])
            dt = time.perf_counter() - t0
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):  # before any write
                if not math.isfinite(loss):
                    raise _nonfinite_stop(f"loss is {loss}", step + 1, ckpt, out)
                raise _nonfinite_stop(f"grad_norm is {grad_norm}", step + 1, ckpt, out,
                                      f" (loss {loss:.4g})")
            if step > start:  # the first step includes compilation
                t_run += dt
                tokens_seen += plan.tokens_per_step
            tps = tokens_seen / t_run if t_run else 0.0
            mfu = mfu_of(tps)
            done = step + 1
            rec = {"step": done, "loss": loss, "grad_norm": grad_norm,
                   "lr": optim.lr_at(plan.recipe, step), "tokens": done * plan.tokens_per_step,
                   "epoch": data.epoch_at(done, plan.batch_size), "tokens_per_s": tps, "mfu": mfu}
            if done % eval_every == 0 or done == total:
                val_loss = evaluate()
                rec["val_loss"] = val_loss
            if (done % run.train.log_every == 0 or "val_loss" in rec
                    or done > total - window):
                metrics_f.write(rundir.json_line(rec) + "\n")
                metrics_f.flush()
                for k in ("loss", "val_loss", "grad_norm", "lr", "tokens_per_s", "mfu"):
                    if k in rec:
                        tb.add_scalar(f"train/{k}", rec[k], done)
            save_now, stop_signal = triggers.poll()  # scheduler signal or wall-clock interval
            if done % ckpt_every == 0 or done == total or save_now:
                if not bool(_all_finite((params, opt_state))):  # the last guard before disk
                    raise _nonfinite_stop("non-finite parameters or optimizer state", done,
                                          ckpt, out)
                ckpt.save(done, params, opt_state)
                triggers.saved()
            bar.set_postfix(loss=f"{loss:.3f}", val=f"{val_loss:.3f}", tok_s=f"{tps:,.0f}",
                            mfu=f"{mfu:.1%}", refresh=False)
            bar.update(1)
            if stop_signal and done < total:
                raise preempt.Preempted(stop_signal, done, out)
    finally:  # every closer runs even when a full disk fails several; the first error wins
        _close_all(triggers.uninstall, bar.close, metrics_f.close, lambda: _close_tb(tb), ckpt.close)

    # A run resumed at (or one step before) its end has no fresh numbers: take them from the log.
    log = rundir.read_metrics(out / "metrics.jsonl")
    if math.isnan(val_loss):
        val_loss = evaluate()
    train_loss = rundir.train_loss(out / "metrics.jsonl", total)
    tps = tokens_seen / t_run if t_run else log[-1].get("tokens_per_s", math.nan)
    tokens = total * plan.tokens_per_step
    summary = {
        "model": cfg.name, "n_params": cfg.num_params(),
        "n_params_nonembed": cfg.num_params(embedding=False), "tokens": tokens,
        "tokens_budget": plan.tokens, "flops": flops.train_flops(cfg, tokens, plan.seq_len),
        "flops_6nd": flops.flops_6nd(cfg, tokens), "train_loss": train_loss, "val_loss": val_loss,
        "steps": total, "batch_size": plan.batch_size, "seq_len": plan.seq_len,
        "wall_time_s": time.perf_counter() - wall0, "train_time_s": t_run,
        "resumed_from_step": start, "tokens_per_s": tps, "mfu": mfu_of(tps),
        "peak_flops_source": peak_src, "epochs": epochs, "mup": cfg.mup,
        "mode": run.train.mode, "devices": strategy.num_devices,
        "placement": {**strategy.describe(), **fitted.describe()},
        "peak_lr": plan.recipe.peak_lr, "warmup_steps": plan.recipe.warmup_steps,
        "decay": plan.recipe.decay, "config_changes": changes,
        # the run's own copy (relative to the run directory), the same after a resume
        "data": {**data.describe(), "tokenizer": "tokenizer.json"},
    }
    summary = json.loads(rundir.json_line(json.loads(json.dumps(summary, default=str))))
    if writer:
        atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
    return summary
