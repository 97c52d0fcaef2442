"""MFU: the peak FLOP/s of a device (measured on CPUs, from spec sheets on accelerators) and a
launch's throughput against it."""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from cgpt.config import flops
from cgpt.config.hardware import PEAKS, spec_peak  # noqa: F401  (the table lives in config)

@functools.lru_cache(maxsize=None)
def measured_matmul_peak(dtype: str = "float32", n: int = 1024, repeats: int = 5) -> float:
    """Best observed FLOP/s of one jitted n x n matmul on the default device."""
    dt = jnp.dtype(dtype)
    # numpy's generator, not jax.random: its eager programs would compile in every fresh
    # process (seconds on a loaded 2-core CPU) for numbers whose values do not matter
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32), dt)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a, a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def peak_flops(dtype: str = "float32") -> tuple[float, str]:
    """(peak FLOP/s per device, where the number came from)."""
    dev = jax.devices()[0]
    spec = spec_peak(dev.device_kind, dtype) if dev.platform != "cpu" else None
    if spec is not None:
        return spec[0], f"spec sheet: {spec[1]} dense {dtype} ({dev.device_kind})"
    return measured_matmul_peak(dtype), f"measured {dtype} matmul on {dev.platform}"


class Throughput:
    """Tokens per second over a launch's timed steps (its first step compiles, so it is not
    timed) and the model FLOPs utilization they mean. Emulated CPU devices share the cores
    the measured peak already used, so on CPU the peak is one device's.

    `mfu()` counts `flops_per_token` (`for_model`: causal attention once, the MaxText/PaLM
    convention); `mfu_full_attention()` the full T x T attention (`flops_per_token_full`)."""

    def __init__(self, flops_per_token: float, dtype: str, num_devices: int,
                 flops_per_token_full: float | None = None):
        peak, self.peak_source = peak_flops(dtype)
        on_cpu = jax.devices()[0].platform == "cpu"
        self.peak_total = peak * (1 if on_cpu else num_devices)
        self.flops_per_token = flops_per_token
        self.flops_per_token_full = (flops_per_token if flops_per_token_full is None
                                     else flops_per_token_full)
        self.seconds, self.tokens = 0.0, 0

    @classmethod
    def for_model(cls, cfg, seq_len: int, num_devices: int) -> "Throughput":
        """A model's throughput at `seq_len`, MFU in cgpt's convention (`flops.MFU_ATTENTION`)."""
        return cls(flops.train_flops_per_token(cfg, seq_len, flops.MFU_ATTENTION),
                   cfg.compute_dtype, num_devices,
                   flops.train_flops_per_token(cfg, seq_len, "full"))

    def add(self, seconds: float, tokens: int) -> None:
        self.seconds += seconds
        self.tokens += tokens

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def mfu(self, tokens_per_s: float | None = None) -> float:
        tps = self.tokens_per_s if tokens_per_s is None else tokens_per_s
        return tps * self.flops_per_token / self.peak_total

    def mfu_full_attention(self, tokens_per_s: float | None = None) -> float:
        """MFU with 6N + the full T x T attention (the pre-#24 `mfu`, Levanter's count)."""
        tps = self.tokens_per_s if tokens_per_s is None else tokens_per_s
        return tps * self.flops_per_token_full / self.peak_total
