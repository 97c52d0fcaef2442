"""Model configurations: the seven published Cerebras-GPT shapes and a CPU-scale family.

This is the ground floor of cgpt: it imports nothing else from the package. Shapes and
initialization scales are the published ones (Cerebras modelzoo yaml, HF model cards); see
the README for sources. Parameter counts are computed from the shapes, never stored.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import NamedTuple

COMPUTE_DTYPES = ("auto", "float32", "bfloat16")
ATTENTIONS = ("auto", "chunked", "xla", "cudnn")
EMBEDDINGS = (("wte",), ("wpe",))  # the token and position tables (the LM head is tied to wte)
# The remat ladder, most memory first (policies in `cgpt.model.remat.remat_policy`); the old
# booleans keep their meaning: false was "save_dots", true "full".
REMATS = ("none", "save_attn", "save_dots", "full")
TOKENS_PER_PARAM = 20  # Chinchilla-optimal (Hoffmann et al. 2022), as for every Cerebras-GPT model


class ParamSpec(NamedTuple):
    """One parameter: shape, logical axis names (the sharding rules' input) and published
    init: truncated normal of σ `std` cut at ±2σ, or the constant `fill` where std is None."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    std: float | None = None
    fill: float = 0.0


MAX_DIM = 2**31 - 1  # the largest size of one dimension of a model array

@dataclass(frozen=True)
class ModelConfig:
    """A GPT-3-style pre-LN decoder (Cerebras-GPT).

    `d_head` defaults to d_model / n_head; the published 2.7B model has 32 heads of 80.
    `out_init_std` is the σ of the two residual output projections (attention and MLP
    `c_proj`), which the published yaml sets per preset (0.0025 for 1.3B and 13B, not the
    0.02/sqrt(2L) formula). `None` means that formula.
    """

    name: str = field(default="custom", metadata={"roles": ("execution", "member")})
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 2
    d_head: int | None = None
    d_ffn: int | None = None
    vocab_size: int = 50257
    n_ctx: int = 2048
    ln_eps: float = 1e-5
    init_std: float = field(default=0.02, metadata={"roles": ("member",)})
    out_init_std: float | None = field(default=None, metadata={"roles": ("member",)})
    # μP (Cerebras-GPT μP recipe): width multiplier m_w = d_model / mup_base_width.
    mup: bool = False
    mup_base_width: int = 256
    mup_embed_mult: float = 10.0
    mup_init_std: float = field(default=0.08, metadata={"roles": ("member",)})
    # Execution: f32 parameters always; matmuls in `compute_dtype`. "auto" (and a None
    # vocab_multiple) means the platform's choice, made in `cgpt.config.backend`; a run records the
    # concrete dtype it trained with in its config.yaml.
    compute_dtype: str = field(default="auto", metadata={"roles": ("execution",)})
    # "chunked" | "xla" | "cudnn" (jax.nn.dot_product_attention)
    attention: str = field(default="auto", metadata={"roles": ("execution",)})
    # pad the LM head's vocabulary to a multiple of this
    vocab_multiple: int | None = field(default=None, metadata={"roles": ("execution",)})
    # Backward pass, a rung of the remat ladder `REMATS` (see `cgpt.model.remat.remat_policy`):
    # "none" keeps everything, "save_attn" the matmul and attention outputs, "save_dots" the
    # weight matmuls' outputs (the old false), "full" only each layer's input (the old true).
    # None: `train` and `plan` climb the platform's ladder and take the first rung whose step
    # fits (`cgpt.train.fit`); elsewhere "save_dots".
    remat: str | bool | None = field(default=None, metadata={"roles": ("execution", "placement")})
    # The loss's head and cross-entropy in chunks of this many sequence positions, so the
    # f32 logits are never all held (`cgpt.model.gpt.chunked_cross_entropy`); 0: unchunked.
    # None: the platform's (`cgpt.config.backend`).
    loss_chunk: int | None = field(default=None, metadata={"roles": ("execution", "placement")})

    def __post_init__(self) -> None:
        # Errors name the config key the user sets (model.d_model), and a derived size by
        # what it derives from: d_ffn = 4 x d_model unless model.d_ffn was given.
        for f in ("n_layer", "d_model", "n_head", "vocab_size", "n_ctx"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"model.{f} must be a positive int, got {v!r}")
            if v > MAX_DIM:  # JAX and XLA index arrays with int64 (shapes) and int32 (ids)
                raise ValueError(f"model.{f}={v} is beyond any array dimension (at most "
                                 f"{MAX_DIM:,}); did you mean a smaller value?")
        if self.d_head is None:
            if self.d_model % self.n_head:
                raise ValueError(
                    f"model.n_head={self.n_head} does not divide model.d_model={self.d_model}; "
                    "set model.d_head explicitly or pick a divisor")
            object.__setattr__(self, "d_head", self.d_model // self.n_head)
        for f in ("d_head", "d_ffn"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                                  or not 0 < v <= MAX_DIM):
                raise ValueError(f"model.{f} must be an int in [1, {MAX_DIM:,}], got {v!r}")
        if self.d_head * self.n_head != self.d_model:
            raise ValueError(
                f"model.d_head: n_head*d_head = {self.n_head}*{self.d_head} must equal "
                f"model.d_model={self.d_model}")
        if self.d_ffn is None:
            if 4 * self.d_model > MAX_DIM:
                raise ValueError(f"model.d_model={self.d_model} makes the MLP width 4 x d_model "
                                 f"= {4 * self.d_model:,}, beyond any array dimension (at most "
                                 f"{MAX_DIM:,}); use a smaller d_model or set model.d_ffn")
            object.__setattr__(self, "d_ffn", 4 * self.d_model)
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"model.compute_dtype={self.compute_dtype!r}; use one of {COMPUTE_DTYPES}")
        if self.attention not in ATTENTIONS:
            raise ValueError(
                f"model.attention={self.attention!r}; use one of {ATTENTIONS}")
        if self.vocab_multiple is not None and (isinstance(self.vocab_multiple, bool) or
                                                not isinstance(self.vocab_multiple, int)
                                                or self.vocab_multiple < 1):
            raise ValueError(f"model.vocab_multiple must be a positive int or null (the "
                             f"platform's choice), got {self.vocab_multiple!r}")
        object.__setattr__(self, "remat", None if self.remat is None else remat_value(self.remat))
        if self.loss_chunk is not None and (isinstance(self.loss_chunk, bool) or not isinstance(
                self.loss_chunk, int) or self.loss_chunk < 0):
            raise ValueError(f"model.loss_chunk must be a non-negative int (0: unchunked) "
                             f"or null (the platform's choice), got {self.loss_chunk!r}")
        v = self.ln_eps
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            raise ValueError(f"model.ln_eps must be a finite number > 0, got {v!r}")

    # ---- derived quantities -------------------------------------------------------------
    @property
    def width_mult(self) -> float:
        """μP width multiplier m_w = d_model / d_base (1 for standard parametrization)."""
        return self.d_model / self.mup_base_width if self.mup else 1.0

    @property
    def embed_std(self) -> float:
        return self.mup_init_std if self.mup else self.init_std

    @property
    def hidden_std(self) -> float:
        return self.mup_init_std / math.sqrt(self.width_mult) if self.mup else self.init_std

    @property
    def resid_out_std(self) -> float:
        if self.mup:
            return self.mup_init_std / math.sqrt(2 * self.width_mult * self.n_layer)
        if self.out_init_std is not None:
            return self.out_init_std
        return self.init_std / math.sqrt(2 * self.n_layer)

    @property
    def embed_mult(self) -> float:
        return self.mup_embed_mult if self.mup else 1.0

    @property
    def logits_mult(self) -> float:
        return 1.0 / self.width_mult

    @property
    def attn_scale(self) -> float:
        """SP: 1/sqrt(d_head). μP: 1/d_head."""
        return 1.0 / self.d_head if self.mup else 1.0 / math.sqrt(self.d_head)

    def param_tree(self) -> dict[tuple[str, ...], ParamSpec]:
        """The parameter tree, written once: {path: ParamSpec} in HF GPT-2's order (wte, wpe,
        h.*, ln_f; kernel before bias). Kernels are [in, out] and every block parameter is
        stacked on a leading `layers` axis. `cgpt.model.gpt` builds the parameters from it;
        `num_params` and the FLOPs accounting (`cgpt.config.flops`) sum it."""
        L, d, f, inner = self.n_layer, self.d_model, self.d_ffn, self.n_head * self.d_head

        def norm(*path: str, stacked: bool = True) -> dict:
            lead, names = ((L,), ("layers",)) if stacked else ((), ())
            return {(*path, "scale"): ParamSpec((*lead, d), (*names, "embed"), fill=1.0),
                    (*path, "bias"): ParamSpec((*lead, d), (*names, "embed"))}

        def linear(*path: str, d_in: int, d_out: int, axes: tuple[str, str], std: float) -> dict:
            return {(*path, "kernel"): ParamSpec((L, d_in, d_out), ("layers", *axes), std),
                    (*path, "bias"): ParamSpec((L, d_out), ("layers", axes[1]))}

        return {
            ("wte",): ParamSpec((self.vocab_size, d), ("vocab", "embed"), self.embed_std),
            ("wpe",): ParamSpec((self.n_ctx, d), ("pos", "embed"), self.embed_std),
            **norm("h", "ln_1"),
            **linear("h", "attn", "c_attn", d_in=d, d_out=3 * inner, axes=("embed", "heads"),
                     std=self.hidden_std),
            **linear("h", "attn", "c_proj", d_in=inner, d_out=d, axes=("heads", "embed"),
                     std=self.resid_out_std),
            **norm("h", "ln_2"),
            **linear("h", "mlp", "c_fc", d_in=d, d_out=f, axes=("embed", "mlp"),
                     std=self.hidden_std),
            **linear("h", "mlp", "c_proj", d_in=f, d_out=d, axes=("mlp", "embed"),
                     std=self.resid_out_std),
            **norm("ln_f", stacked=False),
        }

    def num_params(self, embedding: bool = True) -> int:
        """Exact parameter count: the sizes in `param_tree` (tied LM head counted once).

        `embedding=False` drops the token and position embeddings (Kaplan's convention).
        """
        return sum(math.prod(s.shape) for path, s in self.param_tree().items()
                   if embedding or path not in EMBEDDINGS)

    def chinchilla_tokens(self, tokens_per_param: float = TOKENS_PER_PARAM) -> int:
        """Compute-optimal token budget: 20 tokens per (total) parameter by default."""
        return int(round(tokens_per_param * self.num_params()))

    def replace(self, **changes) -> "ModelConfig":
        """A copy with fields changed; unknown field names are an error, not ignored."""
        names = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(changes) - names)
        if bad:
            raise ValueError(f"unknown ModelConfig field(s) {bad}; valid: {sorted(names)}")
        if "d_model" in changes or "n_head" in changes:
            changes.setdefault("d_head", None)
        if "d_model" in changes:
            changes.setdefault("d_ffn", None)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(d) - names)
        if bad:
            raise ValueError(f"unknown ModelConfig key(s) {bad}; valid: {sorted(names)}")
        return cls(**d)


def remat_value(remat: str | bool | None) -> str:
    """A `model.remat` setting as its ladder rung: the old booleans (config.yaml files and
    summaries written before the ladder) keep their meaning, None is "save_dots"."""
    if remat is None or remat is False:
        return "save_dots"
    if remat is True:
        return "full"
    if isinstance(remat, str) and remat.strip().lower() in REMATS:
        return remat.strip().lower()
    raise ValueError(f"model.remat={remat!r}; use one of {', '.join(REMATS)} (or the old "
                     "true = full, false = save_dots), or null to let train choose")


def recomputes_forward(remat: str | bool | None) -> bool:
    """Whether a remat setting recomputes the layers' whole forward pass in the backward
    (`full`; +1/3 of the layers' FLOPs, more gathers): what the cost model and the analytic
    bytes count. The other rungs recompute only elementwise work, counted as none."""
    return remat_value(remat) == "full"


# ---- the seven published models (modelzoo yaml; 2.7B is 32 heads x 80) -------------------
_PUBLISHED = {
    "111M": dict(n_layer=10, d_model=768, n_head=12, out_init_std=0.004472),
    "256M": dict(n_layer=14, d_model=1088, n_head=17, out_init_std=0.003780),
    "590M": dict(n_layer=18, d_model=1536, n_head=12, out_init_std=0.003333),
    "1.3B": dict(n_layer=24, d_model=2048, n_head=16, out_init_std=0.0025),
    "2.7B": dict(n_layer=32, d_model=2560, n_head=32, out_init_std=0.0025),
    "6.7B": dict(n_layer=32, d_model=4096, n_head=32, out_init_std=0.0025),
    "13B": dict(n_layer=40, d_model=5120, n_head=40, out_init_std=0.0025),
}
# μP twins exist for these five only.
MUP_PRESETS = ("111M", "256M", "590M", "1.3B", "2.7B")

# ---- CPU-scale family: same shape rules (pre-LN, d_ffn = 4d, learned positions, tied head),
# a small trained BPE vocabulary and short context so that a laptop can train them
# Chinchilla-optimally. Names give the rounded total parameter count.
CPU_VOCAB = 4096
CPU_CTX = 256
_CPU = {
    "cpu-165k": dict(n_layer=2, d_model=32, n_head=2),
    "cpu-380k": dict(n_layer=2, d_model=64, n_head=2),
    "cpu-870k": dict(n_layer=4, d_model=96, n_head=3),
    "cpu-1.7m": dict(n_layer=6, d_model=128, n_head=4),
    "cpu-4.4m": dict(n_layer=8, d_model=192, n_head=6),
    "cpu-9.0m": dict(n_layer=10, d_model=256, n_head=8),
    "cpu-19m": dict(n_layer=10, d_model=384, n_head=6),
}

# ---- tiny family: the same shape rules again, with a 512-token BPE vocabulary and 128-token
# context, so that a whole Chinchilla-optimal sweep (>= 2 decades of compute) fits in minutes
# on a 2-core laptop. With a 4096 vocabulary the embeddings alone would outweigh these blocks.
# The demo sweep's six sizes (sweeps/demo.yaml) are presets too, so that `cgpt train --model
# tiny-9k` trains the model the demo names: its 300-entry vocabulary (DEMO_VOCAB; why 300:
# the spec's comment), hence not the 512 of the family's other names.
TINY_VOCAB = 512
TINY_CTX = 128
DEMO_VOCAB = 300
_TINY = {
    "tiny-9k": dict(n_layer=2, d_model=12, n_head=2, vocab_size=DEMO_VOCAB),
    "tiny-13k": dict(n_layer=2, d_model=16, n_head=2, vocab_size=DEMO_VOCAB),
    "tiny-17k": dict(n_layer=2, d_model=16, n_head=2),
    "tiny-25k": dict(n_layer=2, d_model=24, n_head=2, vocab_size=DEMO_VOCAB),
    "tiny-39k": dict(n_layer=2, d_model=32, n_head=2, vocab_size=DEMO_VOCAB),
    "tiny-45k": dict(n_layer=2, d_model=32, n_head=2),
    "tiny-57k": dict(n_layer=2, d_model=40, n_head=2, vocab_size=DEMO_VOCAB),
    "tiny-76k": dict(n_layer=3, d_model=40, n_head=2, vocab_size=DEMO_VOCAB),
    "tiny-116k": dict(n_layer=3, d_model=48, n_head=3),
    "tiny-240k": dict(n_layer=4, d_model=64, n_head=4),
    "tiny-518k": dict(n_layer=6, d_model=80, n_head=5),
    "tiny-956k": dict(n_layer=8, d_model=96, n_head=6),
}
_SMALL = {**_CPU, **_TINY}


def _canonical(name: str) -> str:
    key = name.strip().lower()
    key = re.sub(r"^(cerebras/)?cerebras-gpt-", "", key)
    mup = key.endswith("-mup")
    if mup:
        key = key[: -len("-mup")]
    for preset in list(_PUBLISHED) + list(_SMALL):
        if preset.lower() == key:
            return preset + ("-mup" if mup else "")
    return ""


def list_configs() -> list[str]:
    """Every preset name: the seven published, their μP twins, the CPU and tiny families (+μP)."""
    return (list(_PUBLISHED) + [f"{p}-mup" for p in MUP_PRESETS]
            + list(_CPU) + [f"{p}-mup" for p in _CPU] + list(_TINY) + [f"{p}-mup" for p in _TINY])


def get_config(name: str, **overrides) -> ModelConfig:
    """A preset by name, case-insensitive: "111M", "cerebras-gpt-111m", "1.3b-mup", "cpu-1.7m"."""
    canon = _canonical(name)
    if not canon or (canon.endswith("-mup") and canon[:-4] in _PUBLISHED
                     and canon[:-4] not in MUP_PRESETS):
        raise ValueError(
            f"unknown model preset {name!r}; valid names: {', '.join(list_configs())}")
    mup = canon.endswith("-mup")
    base = canon[:-4] if mup else canon
    if base in _PUBLISHED:
        fields = dict(_PUBLISHED[base])
    elif base in _CPU:
        # The CPU family's μP proxy is its 64-wide member (cpu-380k), as d=256 was for 111M+.
        fields = dict(_CPU[base], vocab_size=CPU_VOCAB, n_ctx=CPU_CTX, mup_base_width=64)
    else:  # tiny family: proxy tiny-45k (d=32)
        fields = {"vocab_size": TINY_VOCAB, "n_ctx": TINY_CTX, "mup_base_width": 32,
                  **_TINY[base]}
    cfg = ModelConfig(name=canon, mup=mup, **fields)
    return cfg.replace(**overrides) if overrides else cfg
