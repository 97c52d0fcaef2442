"""lm-eval `generate_until` on prompts of many distinct lengths: cgpt vs lm-eval's `hf` model.

A tiny random GPT-2 with its own byte-level BPE tokenizer (built here, no download), one
greedy generation task of N prompts with many distinct token lengths, the same batch size for
both models. Prints each model's wall time for the whole task (cgpt's includes compiling, as
a one-shot `lm_eval` run pays it), the ratio, whether the texts agree, and how many programs
cgpt compiled. Target: cgpt no slower than `hf` (ratio <= 1).

    python bench/generate.py [--prompts 60] [--batch 8] [--new 32] [--layers 2] [--width 64]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TEXT = ("The cat sat on the mat. A dog ran in the park. Birds sing in the morning. "
        "Rain falls on the hills and the rivers run to the sea. ") * 40


def make_checkpoint(d: str, layers: int, width: int, ctx: int) -> None:
    """A random GPT-2 (exact GELU, as Cerebras-GPT) and a 320-token BPE, saved by transformers."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                         bos_token="<|endoftext|>").save_pretrained(d)
    eot = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=4, n_positions=ctx,
                                  vocab_size=tok.get_vocab_size(), activation_function="gelu",
                                  resid_pdrop=0.0, attn_pdrop=0.0, embd_pdrop=0.0,
                                  initializer_range=0.3, bos_token_id=eot, eos_token_id=eot)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8, help="batch size of both models")
    ap.add_argument("--new", type=int, default=32, help="max_gen_toks")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=256)
    args = ap.parse_args()

    import numpy as np
    import transformers
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from cgpt.eval.harness import CgptLM
    from cgpt.eval.lm import _generate

    transformers.logging.set_verbosity_error()
    words = TEXT.split(" ")
    rng = np.random.default_rng(0)
    max_words = (args.ctx - args.new) // 2  # ~1.5 tokens per word here: no truncation
    counts = rng.integers(2, max_words, args.prompts)
    starts = rng.integers(0, len(words) - max_words, args.prompts)
    kw = {"until": ["\n\n"], "max_gen_toks": args.new, "do_sample": False}
    reqs = [Instance(request_type="generate_until", doc={}, idx=i,
                     arguments=(" ".join(words[s:s + c]), dict(kw)))
            for i, (s, c) in enumerate(zip(starts, counts))]
    with tempfile.TemporaryDirectory() as d:
        make_checkpoint(d, args.layers, args.width, args.ctx)
        ours = CgptLM(pretrained=d, batch_size=args.batch)
        hf = HFLM(pretrained=d, dtype="float32", batch_size=args.batch, device="cpu")
        lengths = [len(ours.tok_encode(r.args[0])) for r in reqs]
        times, outs = {}, {}
        for name, model in (("hf", hf), ("cgpt", ours)):
            t0 = time.perf_counter()
            outs[name] = model.generate_until(reqs, disable_tqdm=True)
            times[name] = time.perf_counter() - t0
        t0 = time.perf_counter()
        ours.generate_until(reqs, disable_tqdm=True)
        warm = time.perf_counter() - t0
    print(f"{args.prompts} prompts, {len(set(lengths))} distinct lengths ({min(lengths)}.."
          f"{max(lengths)} tokens), max_gen_toks {args.new}, batch {args.batch}; "
          f"GPT-2 {args.layers}x{args.width}, n_ctx {args.ctx}; {os.cpu_count()} CPUs")
    print(f"hf   {times['hf']:7.2f} s")
    print(f"cgpt {times['cgpt']:7.2f} s  ({_generate._cache_size()} compiled programs; "
          f"{warm:.2f} s once compiled)")
    print(f"cgpt / hf wall time: {times['cgpt'] / times['hf']:.2f}")
    same = sum(a == b for a, b in zip(outs["cgpt"], outs["hf"]))
    print(f"identical texts: {same}/{len(reqs)}")


if __name__ == "__main__":
    main()
