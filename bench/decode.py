"""KV-cache greedy decoding throughput at batch 1, cgpt vs transformers, same machine, same run.

Random weights at the published 111M shape (no download). Prints tokens/s of both and the
ratio (target: cgpt >= 2x transformers `generate` on CPU).

    python bench/decode.py [--model 111M] [--prompt 32] [--new 128] [--repeats 3]
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="111M")
    ap.add_argument("--prompt", type=int, default=32, help="prompt length")
    ap.add_argument("--new", type=int, default=128, help="new tokens per generate call")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = ap.parse_args()

    import torch
    import transformers

    import cgpt
    from cgpt.model.hf import config_to_hf

    cfg = cgpt.get_config(args.model)
    transformers.logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config_to_hf(cfg))).eval()
    with tempfile.TemporaryDirectory() as d:
        ref.save_pretrained(d)
        lm = cgpt.load(d)  # the very same weights
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, args.prompt))
    tids = torch.tensor(ids)
    mask = torch.ones_like(tids)

    def run_ref():
        with torch.no_grad():
            return ref.generate(tids, attention_mask=mask, max_new_tokens=args.new,
                                min_new_tokens=args.new, do_sample=False, use_cache=True,
                                pad_token_id=0).numpy()

    def run_ours():
        return lm.generate(ids, max_new_tokens=args.new)

    def best_time(fn):
        fn()  # warm-up (and, for cgpt, compilation)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        return min(times), out

    t_ours, a = best_time(run_ours)
    t_ref, b = best_time(run_ref)
    same = np.array_equal(a, b)
    ours, theirs = args.new / t_ours, args.new / t_ref
    print(f"model {args.model} ({cfg.num_params():,} params), batch 1, prompt {args.prompt}, "
          f"{args.new} new tokens, best of {args.repeats}")
    print(f"cgpt         {ours:8.1f} tokens/s")
    print(f"transformers {theirs:8.1f} tokens/s (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads)")
    print(f"ratio        {ours / theirs:8.2f}x   (greedy outputs identical: {same})")


if __name__ == "__main__":
    main()
