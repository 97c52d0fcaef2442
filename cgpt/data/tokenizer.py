"""Tokenizers: train a byte-level BPE on a corpus, or load one (tokenizer.json, or GPT-2's
vocab.json + merges.txt as the published Cerebras-GPT models ship it: 50,257 tokens)."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from cgpt.errors import LoadError
from cgpt.data.sources import DataError
from cgpt.rundir import TOKENIZER_FILE  # one name: a run's, a store's, an HF directory's

if TYPE_CHECKING:
    import tokenizers

EOT = "<|endoftext|>"


def train_tokenizer(batches: Iterable[list[str]], vocab_size: int) -> "tokenizers.Tokenizer":
    """Byte-level BPE (GPT-2 style: any byte string encodes, no <unk>) with <|endoftext|>."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=sys.stderr.isatty())
    tok.train_from_iterator(batches, trainer)
    return tok


def load_tokenizer(path: str | os.PathLike) -> "tokenizers.Tokenizer":
    """A tokenizer.json file, or a directory with tokenizer.json or GPT-2 vocab.json and
    merges.txt."""
    path = Path(path).expanduser()
    try:
        if path.is_file():
            return Tokenizer.from_file(str(path))
        if (path / TOKENIZER_FILE).is_file():
            return Tokenizer.from_file(str(path / TOKENIZER_FILE))
        if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
            # GPT-2's own pre-tokenization: its regex split, bytes mapped to printable characters.
            tok = Tokenizer(models.BPE.from_file(str(path / "vocab.json"),
                                                 str(path / "merges.txt")))
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = decoders.ByteLevel()
            return tok
    except Exception as e:  # tokenizers raises plain Exceptions on malformed files
        raise DataError(
            f"tokenizer {str(path)!r} is unreadable ({e}); point DataConfig.tokenizer at a "
            "valid tokenizer.json or a vocab.json + merges.txt directory") from e
    raise DataError(
        f"tokenizer {str(path)!r} is not a tokenizer.json file nor a directory with tokenizer.json "
        "or vocab.json + merges.txt; set DataConfig.tokenizer to such a path or to 'train'")


def load_checkpoint_tokenizer(d: str | os.PathLike):
    """A checkpoint's tokenizer (tokenizer.json or GPT-2 vocab.json + merges.txt) with
    <|endoftext|> marked special, or None when the directory has none."""
    d = Path(d)
    if not ((d / TOKENIZER_FILE).exists() or (d / "vocab.json").exists()):
        return None
    try:
        tok = load_tokenizer(d)
    except Exception as e:  # tokenizers raises plain Exception subclasses on bad files
        raise LoadError(f"{d}: tokenizer files are unreadable ({e})") from e
    if tok.token_to_id(EOT) is not None:
        tok.add_special_tokens([EOT])
    return tok


def with_eot(tok, origin: str):
    """`tok` with <|endoftext|> marked special (its id kept); refuse a tokenizer without it."""
    if tok.token_to_id(EOT) is None:
        raise DataError(f"tokenizer {origin!r} has no {EOT!r} token, which separates documents; "
                        "use a tokenizer that has it, or DataConfig.tokenizer='train'")
    tok.add_special_tokens([EOT])
    return tok


def sha256(tok) -> str:
    """The tokenizer's identity: the hash of its serialized form."""
    return hashlib.sha256(tok.to_str().encode()).hexdigest()
