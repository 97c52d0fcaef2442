"""Training FLOPs, in one place (token budgets: `ModelConfig.chinchilla_tokens`).

Two conventions coexist in the scaling-law literature and both are exposed:
- `6ND`: 6 x total parameters x tokens (Chinchilla's C = 6ND, what `analysis` calls `flops_6nd`).
- counted: matmul FLOPs of the actual network: 6 x (non-embedding weights + tied LM head)
  per token, plus attention's QK^T and softmax.V matmuls (Cerebras-GPT's "algorithmic
  FLOPs" include attention; embedding lookups are free).

Attention is counted over the **full** T x T score matrix by default (`attention="full"`):
the compute figures (`summary.json` "flops", `plan`'s analytic count) and Levanter's MFU.
`attention="causal"` halves it (only the unmasked half is useful work, and what cuDNN's flash
attention computes): MFU_ATTENTION, the convention of cgpt's MFU (MaxText since its PR #1988,
PaLM appendix B), so an MFU figure is comparable with theirs (`cgpt.train.mfu.Throughput`).
"""
from __future__ import annotations

import math

from cgpt.config.model import TOKENS_PER_PARAM, ModelConfig  # noqa: F401  (re-exported)

ATTENTION_MODES = ("full", "causal")
MFU_ATTENTION = "causal"  # MFU counts causal attention once (MaxText, PaLM)


def matmul_params(cfg: ModelConfig) -> int:
    """Weights that take part in a matmul per token: blocks' kernels plus the tied LM head."""
    tree = cfg.param_tree()
    kernels = sum(math.prod(s.shape) for path, s in tree.items() if path[-1] == "kernel")
    return kernels + math.prod(tree[("wte",)].shape)


def attention_flops_per_token(cfg: ModelConfig, seq_len: int, attention: str = "full") -> float:
    """Forward+backward FLOPs per token of QK^T and probs.V (3 x 2 x 2 x L x T x H x Dh)."""
    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention={attention!r}; use one of {ATTENTION_MODES}")
    full = 12 * cfg.n_layer * seq_len * cfg.n_head * cfg.d_head
    return full / 2 if attention == "causal" else full


def train_flops_per_token(cfg: ModelConfig, seq_len: int | None = None,
                          attention: str = "full") -> float:
    """Counted training FLOPs per token: 6 x matmul params + attention (default: full)."""
    T = cfg.n_ctx if seq_len is None else seq_len
    return 6 * matmul_params(cfg) + attention_flops_per_token(cfg, T, attention)


def train_flops(cfg: ModelConfig, tokens: int, seq_len: int | None = None,
                attention: str = "full") -> float:
    return tokens * train_flops_per_token(cfg, seq_len, attention)


def flops_6nd(cfg: ModelConfig, tokens: int) -> float:
    """Chinchilla's C = 6ND with N the total parameter count."""
    return 6.0 * cfg.num_params() * tokens

