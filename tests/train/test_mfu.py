"""MFU's convention (causal attention counted once, the full-attention figure beside it) and the
spec-sheet peak table matched from JAX's device_kind strings."""
import pytest

import cgpt
from cgpt.config import flops
from cgpt.train import mfu


@pytest.mark.parametrize("kind,name,bf16,tf32", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.5e12, 494.5e12),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5e12, 378e12),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5e12, 417.5e12),
    ("NVIDIA H200", "H200 SXM", 989.5e12, 494.5e12),
    ("NVIDIA H200 NVL", "H200 NVL", 835.5e12, 417.5e12),
    ("NVIDIA GH200 480GB", "GH200", 989.5e12, 494.5e12),
    ("NVIDIA A100-SXM4-80GB", "A100", 312e12, 156e12),
    ("NVIDIA A100-SXM4-40GB", "A100", 312e12, 156e12),
    ("NVIDIA A100-PCIE-40GB", "A100", 312e12, 156e12),
    ("NVIDIA A100 80GB PCIe", "A100", 312e12, 156e12),
    ("NVIDIA B200", "B200", 2250e12, 1100e12),
    ("TPU v5p", "TPU v5p", 459e12, 459e12),
])
def test_spec_peaks_by_device_kind(kind, name, bf16, tf32):
    assert mfu.spec_peak(kind, "bfloat16") == (bf16, name)
    assert mfu.spec_peak(kind, "float32") == (tf32, name)


def test_unknown_device_kind_has_no_spec_peak():
    assert mfu.spec_peak("NVIDIA GeForce RTX 4090") is None
    assert mfu.spec_peak("cpu") is None


def test_mfu_counts_causal_attention_once_and_keeps_the_full_figure():
    cfg = cgpt.get_config("111M").replace(compute_dtype="float32")
    T = 2048
    speed = mfu.Throughput.for_model(cfg, T, num_devices=1)
    causal = flops.train_flops_per_token(cfg, T, "causal")
    full = flops.train_flops_per_token(cfg, T, "full")
    assert flops.MFU_ATTENTION == "causal"
    assert speed.flops_per_token == causal and speed.flops_per_token_full == full
    assert full - causal == 6 * cfg.n_layer * T * cfg.d_model  # half of 12 L T H Dh
    speed.add(2.0, 4096)
    assert speed.mfu() == pytest.approx(2048 * causal / speed.peak_total)
    assert speed.mfu_full_attention() / speed.mfu() == pytest.approx(full / causal)
    assert 0.11 < 1 - causal / full < 0.12  # the 11% at 111M (full is 12.6% higher)
