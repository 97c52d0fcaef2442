"""What the benchmark scripts share (run as `python bench/X.py`, so this directory is on the path)."""
from __future__ import annotations


def resolved(cfg, batch: int, seq_len: int, peak_lr: float):
    """The run a benchmark times, resolved as `train` resolves it (one device): its recipe and
    compute dtype come from `cgpt.train.resolve`, 1000 steps of `batch` x `seq_len` tokens."""
    import jax

    from cgpt.config.data import DataConfig
    from cgpt.config.run import RunConfig, TrainConfig
    from cgpt.train.resolve import resolve

    run = RunConfig(preset=cfg.name, model=cfg,
                    data=DataConfig(seq_len=seq_len, vocab_size=max(257, cfg.vocab_size)),
                    train=TrainConfig(tokens=1000 * batch * seq_len, batch_size=batch,
                                      peak_lr=peak_lr, warmup_steps=10))
    return resolve(run, jax.devices()[:1])

