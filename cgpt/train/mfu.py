"""MFU: the peak FLOP/s of a device (measured on CPUs, from spec sheets on accelerators) and a
launch's throughput against it."""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

# Dense matmul peaks (FLOP/s) by device kind substring, bf16 and f32 (TF32 where it applies).
_SPEC = {
    "H200": (989e12, 494e12),
    "H100": (989e12, 494e12),
    "A100": (312e12, 156e12),
    "TPU v5p": (459e12, 459e12),
    "TPU v4": (275e12, 275e12),
}


@functools.lru_cache(maxsize=None)
def measured_matmul_peak(dtype: str = "float32", n: int = 1024, repeats: int = 5) -> float:
    """Best observed FLOP/s of one jitted n x n matmul on the default device."""
    dt = jnp.dtype(dtype)
    a = jnp.asarray(jax.random.normal(jax.random.key(0), (n, n)), dt)
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
    if dev.platform != "cpu":
        for key, (bf16, f32) in _SPEC.items():
            if key in dev.device_kind:
                return (bf16 if dtype == "bfloat16" else f32), f"spec sheet ({dev.device_kind})"
    return measured_matmul_peak(dtype), f"measured {dtype} matmul on {dev.platform}"


class Throughput:
    """Tokens per second over a launch's timed steps (its first step compiles, so it is not
    timed) and the model FLOPs utilization they mean. Emulated CPU devices share the cores
    the measured peak already used, so on CPU the peak is one device's."""

    def __init__(self, flops_per_token: float, dtype: str, num_devices: int):
        peak, self.peak_source = peak_flops(dtype)
        on_cpu = jax.devices()[0].platform == "cpu"
        self.peak_total = peak * (1 if on_cpu else num_devices)
        self.flops_per_token = flops_per_token
        self.seconds, self.tokens = 0.0, 0

    def add(self, seconds: float, tokens: int) -> None:
        self.seconds += seconds
        self.tokens += tokens

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def mfu(self, tokens_per_s: float | None = None) -> float:
        tps = self.tokens_per_s if tokens_per_s is None else tokens_per_s
        return tps * self.flops_per_token / self.peak_total
