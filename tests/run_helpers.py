"""The one-run configuration the train and fault tests vary: tiny-17k on a small corpus,
batch 8 x 16 tokens, a 512-token vocabulary, 16 validation sequences."""
from __future__ import annotations

from pathlib import Path

from cgpt.config.data import DataConfig
from cgpt.config.model import get_config
from cgpt.config.run import RunConfig, TrainConfig

BATCH, SEQ = 8, 16


def tiny_run(corpus: Path, cache_dir: Path, steps: int, **train_kw) -> RunConfig:
    """`steps` steps of tiny-17k on `corpus`; `train_kw` sets or overrides TrainConfig's
    fields (log_every 1 and peak_lr 3e-3 unless given)."""
    train = {"tokens": BATCH * SEQ * steps, "batch_size": BATCH, "log_every": 1,
             "peak_lr": 3e-3, **train_kw}
    return RunConfig(
        preset="tiny-17k", model=get_config("tiny-17k"),
        data=DataConfig(source=str(corpus), vocab_size=512, seq_len=SEQ, val_sequences=16,
                        cache_dir=str(cache_dir)),
        train=TrainConfig(**train))
