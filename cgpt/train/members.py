"""What the members of a fused group may differ in (JAX-free: the sweep groups runs with it).

A fused group (`cgpt.train.fused`) is one program, so everything that shapes the program is
shared: the model's shape, the data's sequence length and source, the batch and the step
count. What is per member: the init (seed and init scales), the batch order (data.seed) and
the optimizer's hyperparameters (peak LR, warmup, schedule, weight decay, clipping), plus the
bookkeeping cadences (logging, evaluation, checkpoints).
"""
from __future__ import annotations

MEMBER_MODEL_KEYS = ("name", "init_std", "out_init_std", "mup_init_std")  # init only
MEMBER_DATA_KEYS = ("seed",)  # the batch order
MEMBER_TRAIN_KEYS = ("seed", "peak_lr", "warmup_steps", "weight_decay", "clip_norm", "decay",
                     "schedule", "decay_fraction", "end_lr_fraction", "log_every", "eval_every",
                     "ckpt_every", "keep_checkpoints")
SHARED_RECIPE_KEYS = ("total_steps", "batch_size", "adam_eps", "b1", "b2")
MEMBER_KEYS = ([f"model.{k}" for k in MEMBER_MODEL_KEYS] + [f"data.{k}" for k in MEMBER_DATA_KEYS]
               + [f"train.{k}" for k in MEMBER_TRAIN_KEYS])


def shared_part(cfg: dict) -> dict:
    """A run config's dict (`RunConfig.to_dict()`) less the keys members may differ in: runs
    with equal shared parts can train as one fused program."""
    drop = {"model": MEMBER_MODEL_KEYS, "data": MEMBER_DATA_KEYS, "train": MEMBER_TRAIN_KEYS}
    return {s: ({k: v for k, v in sec.items() if k not in drop.get(s, ())}
                if isinstance(sec, dict) else sec) for s, sec in cfg.items()}
