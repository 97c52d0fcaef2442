"""Accelerators' spec-sheet peaks, one table for MFU (`cgpt.train.mfu`) and auto's cost model
(`cgpt.sharding.cost`). No JAX."""
from __future__ import annotations

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
