"""cuDNN flash attention's rules, checked before a GPU job starts (`cgpt plan --platform gpu`).

`plan` compiles the step on emulated CPU devices, where cuDNN attention cannot lower: JAX
refuses it without a cuDNN ("cuDNN is not detected", also for `.lower(lowering_platforms=
("cuda",))` on a CPU-only jaxlib), and its partitioning rule runs only inside XLA's GPU SPMD
partitioner. So the rules are reproduced here from JAX's own checks
(`jax/_src/cudnn/fused_attention_stablehlo.py`, jax 0.10.2: `check_layout`,
`check_is_flash_attention`, `_check_qkv_bias_mask_spec`), for cgpt's call
(`jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")`, q/k/v
[batch, seq, heads, head_dim], no bias, no mask tensor, no dropout):

- dtype: q, k, v in float16 or bfloat16 (fp8 is another entry point);
- head_dim: a multiple of 8 and at most 256 on Hopper and later (H100/H200/B200), at most
  128 before (A100); with a bias, even sequence lengths (cgpt passes none, so any T);
- partitioning: q, k and v sharded alike, the batch and heads dims may be split over mesh
  axes, the sequence and head_dim dims may not ("Sharding on sequence dim is not allowed").

A violation is one `ValueError` naming the setting and the fix; JAX-free.
"""
from __future__ import annotations

from typing import Mapping, Sequence

DTYPES = ("bfloat16", "float16")
HEAD_DIM_MULTIPLE = 8
HEAD_DIM_MAX = 256  # Hopper and later (compute capability >= 9.0)
HEAD_DIM_MAX_PRE_HOPPER = 128  # A100
DIMS = ("batch", "seq", "heads", "head_dim")
SPLITTABLE = ("batch", "heads")  # the dims cuDNN's custom partitioning may split


def check_shapes(dtype: str, n_head: int, d_head: int,
                 max_head_dim: int = HEAD_DIM_MAX) -> None:
    """cuDNN's dtype and head-dim limits for q/k/v of `n_head` heads of `d_head`."""
    if dtype not in DTYPES:
        raise ValueError(f"cuDNN flash attention needs model.compute_dtype bfloat16 or float16, "
                         f"got {dtype}; set model.compute_dtype=bfloat16 or model.attention=xla")
    if d_head % HEAD_DIM_MULTIPLE or d_head > max_head_dim:
        raise ValueError(
            f"cuDNN flash attention needs a head dim that is a multiple of {HEAD_DIM_MULTIPLE} "
            f"and at most {max_head_dim} (at most {HEAD_DIM_MAX_PRE_HOPPER} before Hopper, "
            f"e.g. A100), got d_head={d_head} ({n_head} heads); change model.n_head "
            "or set model.attention=xla")


def check_partitioning(spec: Sequence[Sequence[str]], mesh: Mapping[str, int]) -> str:
    """`spec`: per dim of q/k/v [batch, seq, heads, head_dim], the mesh axes splitting it;
    axes of size 1 split nothing. Raises if cuDNN's partitioner would refuse the layout;
    returns a one-line description of it otherwise."""
    if len(spec) != len(DIMS):
        raise ValueError(f"q/k/v spec {tuple(spec)!r}: one entry per dim of {DIMS}")
    split = {d: tuple(a for a in axes if mesh.get(a, 1) > 1) for d, axes in zip(DIMS, spec)}
    bad = {d: axes for d, axes in split.items() if axes and d not in SPLITTABLE}
    if bad:
        what = "; ".join(f"{d} over {'x'.join(axes)} "
                         f"({'x'.join(str(mesh[a]) for a in axes)} devices)"
                         for d, axes in bad.items())
        raise ValueError(
            f"cuDNN flash attention cannot run this placement: q/k/v would be split on {what}, "
            "and cuDNN's partitioner splits only the batch and heads dims; use a mesh/mode "
            "that keeps the sequence whole (data, fsdp or stage axes) or set "
            "model.attention=xla")
    return ", ".join(f"{d} over {'x'.join(a) or '-'}" for d, a in split.items())
