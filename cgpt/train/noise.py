"""The gradient noise scale of a run: McCandlish et al. 2018 ("An Empirical Model of Large-Batch
Training", appendix A.1), measured from gradients the step computes anyway.

The mean gradient of a batch of B examples, g_B, has E|g_B|^2 = |G|^2 + tr(S)/B (G the true
gradient, S the per-example covariance). Two batch sizes b < B give two unbiased estimates:

    |G|^2 ~ (B |g_B|^2 - b |g_b|^2) / (B - b)
    tr(S) ~ (|g_b|^2 - |g_B|^2) / (1/b - 1/B)

and the simple noise scale B_simple = tr(S) / |G|^2, the critical batch's first-order proxy.
In a step, b is one micro-batch (all data-parallel replicas' rows of it: the step's gradient
of a micro-batch is already reduced over them) and B the global batch; |g_b|^2 is the mean
over the micro-batches. A step with one micro-batch splits it in two halves inside the step
(b = B/2): the same rows and the same mean gradient, two half-size backward passes.

Each estimate is noisy (and may be negative), so the logged noise scale is the ratio of
exponentially smoothed numerator and denominator, as McCandlish et al. and Cerebras' gns tool
smooth them; the smoothing runs over the logged steps on the host and is rebuilt from
`metrics.jsonl` on resume, so a resumed run logs what an uninterrupted one would.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# the step's per-step estimates (its metrics keys) and the smoothed ones: step record fields
# (`cgpt.record`)
STEP_KEYS = ("gns_g2", "gns_trace")
EMA_KEYS = ("gns_g2_ema", "gns_trace_ema", "gns_b_simple")
# per-step decay of the smoothing: a ~100-step horizon (steps, not logged records, so the
# horizon does not depend on train.log_every)
EMA_BETA = 0.99


def two_batch(g2_small, g2_big, b_small, b_big):
    """(|G|^2, tr(S)) unbiased from the squared norms of mean gradients over b_small and
    b_big examples (b_small < b_big); arrays or floats."""
    g2 = (b_big * g2_big - b_small * g2_small) / (b_big - b_small)
    trace = (g2_small - g2_big) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


def sq_norm(tree) -> jax.Array:
    """|tree|^2 over all leaves, in float32."""
    return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree))


def halves(batch: jax.Array) -> jax.Array:
    """A step's one micro-batch [1, B, T+1] as two [2, B/2, T+1] of alternate rows: each
    replica's block of rows splits within itself, so a data-parallel layout needs no move."""
    _, rows, width = batch.shape
    return batch.reshape(rows // 2, 2, width).swapaxes(0, 1)


def step_metrics(g2_small_mean: jax.Array, g2_big: jax.Array, b_small: int,
                 b_big: int) -> dict:
    """The step's `gns_g2` and `gns_trace` estimates (micro-batches of `b_small` rows,
    `b_big` rows a step)."""
    g2, trace = two_batch(g2_small_mean, g2_big, b_small, b_big)
    return {"gns_g2": g2, "gns_trace": trace}


class Smoother:
    """Exponentially weighted means of |G|^2 and tr(S) over the logged steps (weights decay by
    EMA_BETA per training step, normalised so the first record is not biased to zero), and
    their ratio: the run's noise scale B_simple."""

    def __init__(self, beta: float = EMA_BETA):
        self.beta, self.last = beta, None
        self.g2 = self.trace = self.weight = 0.0

    def update(self, step: int, est: dict) -> dict:
        """Add step `step`'s estimates (its `STEP_KEYS`, as read from the step); the record
        keys to log ({} for {})."""
        est = {k: float(v) for k, v in est.items()}
        if not est or not all(math.isfinite(est[k]) for k in STEP_KEYS):
            return est  # a non-finite step stops the run before it is logged
        decay = 1.0 if self.last is None else self.beta ** (step - self.last)
        self.last = step
        self.g2 = decay * self.g2 + est["gns_g2"]
        self.trace = decay * self.trace + est["gns_trace"]
        self.weight = decay * self.weight + 1.0
        g2, trace = self.g2 / self.weight, self.trace / self.weight
        rec = {**est, "gns_g2_ema": g2, "gns_trace_ema": trace}
        if g2 > 0:  # else undefined (early, noisy |G|^2 estimates): left out of the record
            rec["gns_b_simple"] = trace / g2
        return rec

    @classmethod
    def replay(cls, records) -> "Smoother":
        """The smoother after the logged `records` (a resumed run's kept log)."""
        s = cls()
        for r in records:
            if all(isinstance(r.get(k), (int, float)) for k in STEP_KEYS):
                s.update(r["step"], {k: r[k] for k in STEP_KEYS})
        return s
