"""MFU: the peak FLOP/s of a device (measured on CPUs, from spec sheets on accelerators) and a
launch's throughput against it."""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from cgpt.config import flops

# Dense (no 2:4 sparsity) tensor-core peaks per device, FLOP/s: (bf16, f32 matmuls = TF32),
# matched in order against the device_kind JAX reports (CUDA's device name, e.g. "NVIDIA H100
# 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"), so the
# specific names come before the families that contain them. NVIDIA's spec sheets print the
# sparse figure ("with sparsity"); the dense peak is half of it:
# - H100 datasheet (H100 SXM / H100 NVL / H100 PCIe): BF16 1,979 / 1,671 / 1,513 TFLOPS and
#   TF32 989 / 835 / 756 with sparsity.
# - H200 datasheet (H200 SXM / H200 NVL): BF16 1,979 / 1,671, TF32 989 / 835 with sparsity.
#   GH200 (Grace Hopper datasheet): the H100/H200 SXM tensor cores, BF16 1,979 with sparsity.
# - A100 datasheet (40GB and 80GB, PCIe and SXM alike): BF16 312 and TF32 156 dense.
# - HGX B200 datasheet, per GPU: FP16/BF16 4.5 PFLOPS and TF32 2.2 PFLOPS with sparsity.
# - TPU v5p / v4 system-architecture pages: bf16 459 / 275 TFLOP/s (no TF32: f32 as bf16).
PEAKS: tuple[tuple[str, str, float, float], ...] = (
    ("H100 PCIE", "H100 PCIe", 756.5e12, 378e12),
    ("H100 NVL", "H100 NVL", 835.5e12, 417.5e12),
    ("H200 NVL", "H200 NVL", 835.5e12, 417.5e12),
    ("GH200", "GH200", 989.5e12, 494.5e12),
    ("H200", "H200 SXM", 989.5e12, 494.5e12),
    ("H100", "H100 SXM", 989.5e12, 494.5e12),  # "H100 80GB HBM3", "H100 SXM5 ..."
    ("A100", "A100", 312e12, 156e12),  # SXM4/PCIe, 40GB/80GB: the same tensor cores
    ("B200", "B200", 2250e12, 1100e12),
    ("TPU V5P", "TPU v5p", 459e12, 459e12),
    ("TPU V4", "TPU v4", 275e12, 275e12),
)


def spec_peak(device_kind: str, dtype: str = "bfloat16") -> tuple[float, str] | None:
    """(dense peak FLOP/s, the spec-sheet name) for a device_kind string, or None if the
    table does not know it. bf16 peaks for "bfloat16" (and "float16"), TF32 for "float32"."""
    kind = device_kind.upper()
    for key, name, bf16, f32 in PEAKS:
        if key in kind:
            return (f32 if dtype == "float32" else bf16), name
    return None


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
