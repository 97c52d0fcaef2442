"""The published Cerebras-GPT recipe as numbers: per-preset peak LR, decay shape, eps and batch,
warmup, the step count of a token budget. JAX-free, so `resolve` (and through it `plan`, the
sweep and `branch`) can decide a run's recipe without importing JAX; `cgpt.train.optim` turns a
`Recipe` into the optax optimizer and its schedule.
"""
from __future__ import annotations

from dataclasses import dataclass

from cgpt.config.model import ModelConfig

WARMUP_TOKENS = 375_000_000  # ≈ every published run's warmup
CPU_WARMUP_FRACTION = 0.10
END_LR_FRACTION = 0.10

# Published per-preset recipe (peak LR, decay shape, Adam eps, global batch in sequences).
PUBLISHED_RECIPE = {
    "111M": (6.0e-4, "linear", 1e-8, 120),
    "256M": (6.0e-4, "linear", 1e-8, 264),
    "590M": (2.0e-4, "linear", 1e-8, 264),
    "1.3B": (2.0e-4, "cosine", 1e-8, 528),
    "2.7B": (2.0e-4, "cosine", 1e-8, 528),
    "6.7B": (1.2e-4, "linear", 1e-9, 1040),
    "13B": (1.2e-4, "cosine", 1e-9, 720),
}
MUP_PEAK_LR = 6e-3
CPU_PEAK_LR = 2e-3  # SP CPU family; chosen on cpu-1.7m, see docs/recipe.md
CPU_BATCH = 32
MAX_STEPS = 2**31 - 1  # an int32 step counter


SCHEDULES = ("published", "wsd")
WSD_DECAYS = ("linear", "1-sqrt")


@dataclass(frozen=True)
class Recipe:
    peak_lr: float
    decay: str  # published: "linear" | "cosine"; wsd: "linear" | "1-sqrt"
    adam_eps: float
    batch_size: int
    warmup_steps: int
    total_steps: int
    end_lr_fraction: float = END_LR_FRACTION
    b1: float = 0.9
    b2: float = 0.95
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    schedule: str = "published"  # "published" (decay over the whole run) | "wsd"
    decay_fraction: float = 0.2  # wsd: the final fraction of the steps that decays

    @property
    def decay_start(self) -> int:
        """The first step of the decay: the end of warmup, or of the WSD stable phase."""
        if self.schedule == "wsd":
            return max(self.warmup_steps, self.total_steps - wsd_decay_steps(self))
        return self.warmup_steps


def wsd_decay_steps(r: Recipe) -> int:
    return max(1, round(r.decay_fraction * r.total_steps))


def published_defaults(cfg: ModelConfig) -> dict:
    """Peak LR, decay shape, eps and batch of a preset (CPU family: the CPU rule)."""
    base = cfg.name.split("+")[0].removesuffix("-mup")  # a reshaped preset keeps its recipe
    if base in PUBLISHED_RECIPE:
        lr, decay, eps, batch = PUBLISHED_RECIPE[base]
        if cfg.mup:  # μP twins: proxy-tuned LR, eps 1e-8, same schedule shape and batch
            lr, eps = MUP_PEAK_LR, 1e-8
        return dict(peak_lr=lr, decay=decay, adam_eps=eps, batch_size=batch, published=True)
    return dict(peak_lr=MUP_PEAK_LR if cfg.mup else CPU_PEAK_LR, decay="linear", adam_eps=1e-8,
                batch_size=CPU_BATCH, published=False)


def warmup_steps_for(total_steps: int, tokens_per_step: int, published: bool) -> int:
    """375M tokens for published presets; 10% of the run for CPU-scale budgets."""
    if published:
        return max(1, min(total_steps, WARMUP_TOKENS // tokens_per_step))  # 111M: 1525
    return max(1, round(CPU_WARMUP_FRACTION * total_steps))


def steps_for_tokens(tokens: int, batch_size: int, seq_len: int) -> int:
    """Whole steps within the budget, rounded down as in the published runs (111M: 9,037);
    a budget below one step is refused rather than rounded up to a run it did not ask for.
    At most MAX_STEPS: the optimizer counts steps in int32 inside the jitted update."""
    steps = tokens // (batch_size * seq_len)
    if steps < 1:
        raise ValueError(f"train.tokens={tokens:,} is less than one step of train.batch_size="
                         f"{batch_size:,} x data.seq_len={seq_len:,} = "
                         f"{batch_size * seq_len:,} tokens: raise train.tokens or lower "
                         "train.batch_size")
    if steps > MAX_STEPS:
        raise ValueError(f"train.tokens={tokens:.3g} is {steps:.3g} steps of train.batch_size="
                         f"{batch_size} x data.seq_len={seq_len} tokens; a run takes at most "
                         f"{MAX_STEPS:,} steps (at most {MAX_STEPS * batch_size * seq_len:.3g} "
                         "tokens here): did you mean a smaller budget?")
    return steps

