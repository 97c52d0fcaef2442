"""What opening a token store costs now that it is checked against itself (`TokenStore.check`:
every shard's path and size, the total, and tokenizer.json's hash, vocab_size and eot_id).

Builds a synthetic store of --shards shard files (The Pile at `data prepare`'s largest unit,
256 MB of text a shard, is ~3,300) and a byte-level BPE of --vocab entries (GPT-2's 50,257),
then times `TokenStore(path)` with and without the check, median of --repeat opens each:

    python bench/store_open.py [--shards 3300] [--vocab 50257] [--repeat 7]

The tokens are a few per shard: the check reads sizes, never tokens, so their number does not
matter. Prints the medians, and of the check the tokenizer's load (which a run paid before too:
the store's tokenizer is the one it trains with, now loaded once, at open) and its hash; no
target beyond "small beside a run's start-up" (importing JAX alone takes ~2 s).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def byte_level_bpe(vocab_size: int):
    """A GPT-2-shaped tokenizer: 256 byte symbols, filler merges up to vocab_size - 1, EOT."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    chars = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 byte symbols
    vocab = {c: i for i, c in enumerate(chars)}
    merges = []
    for a in chars:
        for b in chars:
            if len(vocab) >= vocab_size - 1:
                break
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def build(root: Path, shards: int, vocab_size: int) -> None:
    from cgpt.data.store import FORMAT, token_dtype, write_manifest
    from cgpt.data.tokenizer import sha256

    tok = byte_level_bpe(vocab_size)
    tok.save(str(root / "tokenizer.json"))
    dtype = np.dtype(token_dtype(vocab_size))
    (root / "shards").mkdir()
    records = []
    for i in range(shards):
        a = np.arange(i % 7 + 1, dtype=dtype)
        a.tofile(root / "shards" / f"{i:06d}.bin")
        records.append({"file": f"shards/{i:06d}.bin", "num_tokens": len(a), "sha256": ""})
    write_manifest(root, {
        "format": FORMAT, "dtype": dtype.name, "vocab_size": vocab_size,
        "eot_id": tok.token_to_id("<|endoftext|>"), "tokenizer_sha256": sha256(tok),
        "num_tokens": sum(r["num_tokens"] for r in records), "shards": records})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=3300)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    from cgpt.data.store import TokenStore

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        build(root, args.shards, args.vocab)
        check = TokenStore.check
        times = {}
        for name, fn in (("unchecked", lambda self: None), ("checked", check)):
            TokenStore.check = fn
            ts = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                TokenStore(root)
                ts.append(time.perf_counter() - t0)
            times[name] = statistics.median(ts)
        TokenStore.check = check
        from cgpt.data.tokenizer import load_tokenizer, sha256, with_eot

        ts, hs = [], []  # the part a run paid before too: loading the tokenizer it trains with
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            tok = with_eot(load_tokenizer(root / "tokenizer.json"), "")
            t1 = time.perf_counter()
            sha256(tok)
            ts.append(t1 - t0)
            hs.append(time.perf_counter() - t1)
        times["tokenizer_load"], times["tokenizer_hash"] = map(statistics.median, (ts, hs))
        manifest_kb = (root / "manifest.json").stat().st_size / 1024
        tok_kb = (root / "tokenizer.json").stat().st_size / 1024
    print(json.dumps({
        "shards": args.shards, "vocab_size": args.vocab, "manifest_kb": round(manifest_kb),
        "tokenizer_kb": round(tok_kb), "open_unchecked_ms": round(1e3 * times["unchecked"], 1),
        "open_checked_ms": round(1e3 * times["checked"], 1),
        "check_ms": round(1e3 * (times["checked"] - times["unchecked"]), 1),
        "of_which_tokenizer_load_ms": round(1e3 * times["tokenizer_load"], 1),
        "of_which_tokenizer_hash_ms": round(1e3 * times["tokenizer_hash"], 1),
        "load": os.getloadavg()[0]}, indent=1))


if __name__ == "__main__":
    main()
