"""The remat ladder (`ModelConfig.remat`): which of a layer's values the backward pass keeps.

`cgpt.model.gpt` names the values a policy may keep with `jax.ad_checkpoint.checkpoint_name`:
every weight matmul's output (`MATMUL`) and the attention output (`ATTENTION`). The rungs,
most memory first, are `cgpt.config.model.REMATS`; `cgpt.train.fit` climbs the platform's
ladder (`cgpt.config.backend.Kernels.remat_ladder`) until the compiled step fits.
"""
from __future__ import annotations

import jax

from cgpt.config.model import remat_value

# Names of the values a policy may keep for the backward pass (`checkpoint_name` in gpt.py).
MATMUL, ATTENTION = "matmul", "attention"
NO_REMAT = object()  # "none": no jax.checkpoint at all, autodiff keeps every residual
# cuDNN's fused attention keeps its softmax statistics (the row log-sum-exp) as a residual of
# its custom VJP, the output of this primitive; `jax.nn.dot_product_attention` gives them no
# name, so the "save_attn" policy saves that primitive's outputs (output and statistics) too,
# and the backward never runs the attention forward again.
_CUDNN_FWD = ("dot_product_attention_fwd", "dot_product_attention_fwd_wrapper")


def _save_attention_and_matmuls(prim, *_, **params) -> bool:
    if prim.name in _CUDNN_FWD:
        return True
    return _SAVE_NAMES(prim, **params)


_SAVE_NAMES = jax.checkpoint_policies.save_only_these_names(MATMUL, ATTENTION)


def remat_policy(remat: str | bool | None):
    """The `jax.checkpoint` policy of a ladder value (`cgpt.config.model.REMATS`):

    none       no checkpoint: the backward reads every residual autodiff keeps (most memory);
    save_attn  keeps the named matmul outputs and the attention output (and cuDNN's softmax
               statistics), recomputes LayerNorm, GELU and the other elementwise ops;
    save_dots  keeps XLA's weight-matmul outputs and recomputes the rest, attention included
               (the old `remat: false`; measured fastest on XLA's CPU backend, where writing
               and re-reading the stacked residuals costs more than recomputing them:
               cpu-19m step 2.02 -> 1.73 s);
    full       keeps only each layer's input and recomputes the whole layer (the old
               `remat: true`; least memory).
    """
    r = remat_value(remat)
    return {"none": NO_REMAT, "save_attn": _save_attention_and_matmuls,
            "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
            "full": None}[r]
