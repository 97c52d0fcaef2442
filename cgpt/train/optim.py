"""The published Cerebras-GPT optimizer recipe: AdamW, warmup, decay towards 10%, clipping, μP LR.

Published values (modelzoo yaml, per preset): AdamW β = (0.9, 0.95), weight decay 0.1,
global-norm clipping 1.0, linear warmup from 0 over ≈375M tokens, then linear or cosine
decay over the remaining total − warmup steps to 10% of the peak; eps 1e-8 (1e-9 for 6.7B
and 13B).

Where the schedule ends, as ModelZoo runs it: its schedulers are torch LR schedulers stepped
after every optimizer step, so the update with 0-based index k runs at lr(k), and the 111M
yaml decays 6e-4 -> 6e-5 over 7512 = 9037 − 1525 steps. The last update (k = 9036) therefore
runs at 6e-5 + 5.4e-4/7512 (10.012% of the peak); 6e-5 itself is lr(9037), one step after
training ends. cgpt does the same (optax counts updates from 0): lr(total_steps) is exactly
10%, and the last trained step sits one decay step above it, which only shows on short runs:
10% + 90%/45 = 12% at 50 steps with warmup 5. Tested against torch's schedulers stepped
this way (tests/train/test_schedule.py).

Weight decay applies to the weight matrices (the blocks' kernels and the token/position
embeddings) and not to biases or LayerNorm parameters: the usual GPT-2/3 practice (the
exact Cerebras exclusion list lives in a closed package).

CPU-scale runs are too short for a 375M-token warmup, so warmup scales with the budget:
`warmup = 10%` of the total steps (at least 1), which sits between the published ratios
(17% of the 111M budget, 1.3% of the 1.3B budget).

WSD (`train.schedule: wsd`, not published for Cerebras-GPT): warmup, a constant stable
phase, then a decay over the final `decay_fraction` of the steps, linear or 1-sqrt (Hägele et
al. 2024). Its stable phase does not depend on the run's length, so a checkpoint taken there
can be cooled down to any longer budget (`cgpt train --branch-from`): one run, many budgets.

μP: every model uses the proxy's tuned peak LR (6e-3) and the decoder kernels (QKV, attention
output, both MLP matrices) get LR x 1/m_w; embeddings, biases and LN keep the base LR.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cgpt.config.model import ModelConfig
from cgpt.config.recipe import SCHEDULES, WSD_DECAYS, Recipe, wsd_decay_steps


def schedule(r: Recipe) -> optax.Schedule:
    """Linear warmup 0 -> peak, then linear or cosine decay that reaches
    `end_lr_fraction * peak` at step `total_steps` (one past the last update, as ModelZoo);
    or, for WSD, a stable phase at the peak and the decay over the final steps."""
    if r.schedule == "wsd":
        return _wsd(r)
    if r.schedule != "published":
        raise ValueError(f"schedule={r.schedule!r}; use one of {', '.join(SCHEDULES)}")
    end = r.peak_lr * r.end_lr_fraction
    decay_steps = max(1, r.total_steps - r.warmup_steps)
    if r.decay == "linear":
        decay = optax.linear_schedule(r.peak_lr, end, decay_steps)
    elif r.decay == "cosine":
        decay = optax.cosine_decay_schedule(r.peak_lr, decay_steps, alpha=r.end_lr_fraction)
    else:
        raise ValueError(f"decay={r.decay!r}; use 'linear' or 'cosine'")
    warm = optax.linear_schedule(0.0, r.peak_lr, r.warmup_steps)
    return optax.join_schedules([warm, decay], [r.warmup_steps])


def _wsd(r: Recipe) -> optax.Schedule:
    """Warmup 0 -> peak, constant peak, then linear or 1-sqrt decay reaching
    end_lr_fraction * peak at step total_steps (as the published schedule)."""
    if r.decay not in WSD_DECAYS:
        raise ValueError(
            f"decay={r.decay!r} with schedule='wsd'; use one of {', '.join(WSD_DECAYS)}")
    if not 0 < r.decay_fraction <= 1:
        raise ValueError(f"decay_fraction={r.decay_fraction} must be in (0, 1]")
    peak, end, start = r.peak_lr, r.peak_lr * r.end_lr_fraction, r.decay_start
    n = max(1, r.total_steps - start)

    def cooldown(step):
        p = jnp.clip(step / n, 0.0, 1.0)
        shape = p if r.decay == "linear" else jnp.sqrt(p)
        return peak - (peak - end) * shape

    warm = optax.linear_schedule(0.0, peak, r.warmup_steps)
    return optax.join_schedules([warm, optax.constant_schedule(peak), cooldown],
                                [r.warmup_steps, start])


def _path_names(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", k)) for k in path)


def decay_mask(params) -> dict:
    """True for weight matrices (kernels, embeddings); False for biases and LayerNorm."""
    return jax.tree_util.tree_map_with_path(
        lambda p, _: _path_names(p)[-1] in ("kernel", "wte", "wpe"), params)


def decoder_kernel_mask(params) -> dict:
    """True for the blocks' kernels: the μP group that gets LR x 1/m_w."""
    return jax.tree_util.tree_map_with_path(
        lambda p, _: _path_names(p)[0] == "h" and _path_names(p)[-1] == "kernel", params)


def make_optimizer(r: Recipe, cfg: ModelConfig, lr: optax.Schedule | None = None,
                   weight_decay=None, clip_norm=None) -> optax.GradientTransformation:
    """The recipe's AdamW chain. A fused member (`cgpt.train.fused`) passes its `lr` schedule
    (a per-member table), `weight_decay` and `clip_norm` as traced values: the same chain,
    hence the same optimizer state, so its checkpoints restore into a run trained alone."""
    parts = [
        optax.clip_by_global_norm(r.clip_norm if clip_norm is None else clip_norm),
        optax.scale_by_adam(b1=r.b1, b2=r.b2, eps=r.adam_eps),
        optax.add_decayed_weights(r.weight_decay if weight_decay is None else weight_decay,
                                  mask=decay_mask),
        optax.scale_by_learning_rate(schedule(r) if lr is None else lr),
    ]
    if cfg.mup:
        parts.append(optax.masked(optax.scale(1.0 / cfg.width_mult), decoder_kernel_mask))
    return optax.chain(*parts)


def lr_at(r: Recipe, step: int) -> float:
    """The LR of the update with 0-based index `step` (the optimizer's own count), computed on
    the host (nanoGPT's get_lr): the loop logs it without a device call, which would wait for
    the step just queued. `schedule(r)` evaluated as JAX evaluates it outside jit, one float32
    operation at a time: the same value to the bit, but for the cosine decay's cos, which is
    the platform's (glibc's cosf on CPU, within an ulp of this; tests/train/test_schedule.py)."""
    f32 = np.float32
    peak, end = r.peak_lr, r.peak_lr * r.end_lr_fraction

    def linear(init: float, final: float, steps: int, count: int):  # optax.linear_schedule
        if steps <= 0:
            return init
        frac = f32(1) - f32(min(max(count, 0), steps)) / f32(steps)
        return f32(init - final) * frac + f32(final)

    if r.schedule == "wsd":
        n = max(1, r.total_steps - r.decay_start)

        def cooldown(count: int):
            p = f32(min(max(count / n, 0.0), 1.0))
            return f32(peak) - f32(peak - end) * (p if r.decay == "linear" else np.sqrt(p))

        pieces = [(r.warmup_steps, lambda c: peak), (r.decay_start, cooldown)]
    else:
        decay_steps = max(1, r.total_steps - r.warmup_steps)

        def decay(count: int):
            if r.decay == "linear":
                return linear(peak, end, decay_steps, count)
            c = f32(min(count, decay_steps))  # optax.cosine_decay_schedule
            cos = f32(np.cos(np.float64(f32(f32(np.pi) * c) / f32(decay_steps))))
            decayed = f32(1 - r.end_lr_fraction) * (f32(0.5) * (f32(1) + cos))
            return f32(peak) * (decayed + f32(r.end_lr_fraction))

        pieces = [(r.warmup_steps, decay)]
    lr = linear(0.0, peak, r.warmup_steps, step)
    for boundary, piece in pieces:  # optax.join_schedules
        if step >= boundary:
            lr = piece(step - boundary)
    return float(f32(lr))
