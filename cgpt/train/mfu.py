"""Peak FLOP/s of the device, for MFU: measured on CPUs, from spec sheets on accelerators."""
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
