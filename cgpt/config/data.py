"""What to train on and how to cut it into sequences: the run config's `data` section (the
pipeline that reads it: `cgpt.data.batches`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class DataConfig:
    """What to train on and how to cut it into sequences.

    source: a token store directory (`python -m cgpt data prepare`), "default" (the embedded
        Python-stdlib corpus), a local file or folder (.txt/.md/.py = one document per file;
        .jsonl/.json/.jsonl.zst/.jsonl.gz/.parquet = one document per row, text in
        `text_column`), or "hf:<dataset>[:<config>]" (needs the network).
    split: the `datasets` split of an hf: source (slicing such as "train[:10%]" works too).
    tokenizer: "train" (byte-level BPE trained on the corpus at `vocab_size`) or a path to
        a tokenizer.json file or a directory with tokenizer.json or vocab.json+merges.txt.
        A store brings its own tokenizer.
    val_sequences: how many sequences, spread evenly over the token stream, are held out.
    cache_dir: where prepared data lives; None = $CGPT_CACHE or ~/.cache/cgpt.
    fraction: the share of the default corpus's documents used, spread evenly over it (every
        document whose index i has floor((i+1) f) > floor(i f)): a small sweep tokenizes only
        the text it trains on instead of the whole corpus (the demo: a quarter). The BPE is
        trained on the same documents; the sample is part of the cached store's key.
    """

    source: str = "default"
    split: str = "train"
    text_column: str = "text"
    tokenizer: str = "train"
    vocab_size: int = 4096
    seq_len: int = 256
    val_sequences: int = 128
    seed: int = field(default=0, metadata={"roles": ("member",)})  # the batch order
    cache_dir: str | None = None
    fraction: float = 1.0

    def __post_init__(self) -> None:
        for name in ("source", "split", "text_column", "tokenizer"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"DataConfig.{name} must be a non-empty string (got {value!r})")
        if self.source.startswith("hf:") and not self.source[3:].partition(":")[0]:
            raise ValueError(
                f"DataConfig.source {self.source!r} has no dataset name; use 'hf:<name>[:<config>]'"
            )
        _check_int("vocab_size", self.vocab_size, 257, "at least 256 byte tokens + <|endoftext|>")
        if self.vocab_size > 2**32:
            raise ValueError(f"DataConfig.vocab_size must be <= 2**32 (got {self.vocab_size})")
        _check_int("seq_len", self.seq_len, 1, "tokens per training sequence")
        _check_int("val_sequences", self.val_sequences, 1, "held-out sequences for validation")
        _check_int("seed", self.seed, 0, "it seeds numpy's default_rng")
        if (isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float))
                or not 0 < self.fraction <= 1):
            raise ValueError(f"DataConfig.fraction must be a number in (0, 1], the share of the "
                             f"corpus's documents used (got {self.fraction!r})")
        if self.fraction != 1 and self.source != "default":
            raise ValueError(f"DataConfig.fraction={self.fraction} samples the default corpus only "
                             f"(source {self.source!r}): select the files, or the split of an hf: "
                             "source, instead")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise ValueError(
                f"DataConfig.cache_dir must be a path or None (got {self.cache_dir!r})")


def _check_int(name: str, value: object, minimum: int, why: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"DataConfig.{name} must be an int >= {minimum} ({why}); got {value!r}")
