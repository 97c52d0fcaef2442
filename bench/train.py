"""Training throughput and MFU: cgpt (JAX) vs the same model in PyTorch, same machine, same run.

Model: the `cpu-19m` preset (~19.4M parameters, seq_len 256) unless --model says otherwise.
Both sides train the same architecture (PyTorch side: transformers' GPT2LMHeadModel with the
same config) with AdamW, global-norm clipping and the same batch and dtype (f32). MFU is
measured against this machine's f32 matmul peak, measured in the same run.

    python bench/train.py [--model cpu-19m] [--batch 8] [--seq-len 256] [--steps 5]
Targets: cgpt >= 1.5x the PyTorch step, and >= 40% of the measured matmul peak.

    python bench/train.py --model tiny-45k --d-model 40 --batch 32 --seq-len 128 --threads 1
The demo's tiny shapes (here its tiny-65k), both sides pinned to one core (--threads N: the
process's first N cores, and N torch threads), as the demo's pinned workers train. The cgpt
side runs with glibc keeping freed memory, as `cgpt train` does on a CPU
(`cgpt.config.backend.keep_host_memory`; in this one process PyTorch gets it too);
CGPT_CPU_MALLOC=0 times both with glibc's defaults.

    python bench/train.py --gns-overhead [--accum 1] [--steps 10]
The step with the gradient noise scale (train.gns, docs/gns.md) against the step without it,
interleaved (off, on, off, on, ...) so both see the same machine load. Target: <= 5%.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np


def _best(fn, steps: int) -> float:
    """Median wall seconds of `steps` calls of fn (after a warm-up call)."""
    return _timed(fn, steps)[0]


def _timed(fn, steps: int) -> tuple[float, float]:
    """Median wall and CPU seconds (all the process's threads) of `steps` calls of fn. On a
    shared machine the CPU time is the step's own cost; the wall time adds the waiting."""
    fn()  # warm-up: compilation / allocator
    wall, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return float(np.median(wall)), float(np.median(cpu))


def cgpt_step(cfg, tokens, gns: bool = False, accum: int = 1):
    """run() -> loss: one step of cgpt's jitted update (`make_step`, published AdamW) on
    `tokens` as `accum` micro-batches, its state kept between calls."""
    import jax

    from cgpt.model import gpt as model
    from cgpt.train import optim
    from cgpt.train.step import make_step
    from common import resolved

    res = resolved(cfg, tokens.shape[0], tokens.shape[1] - 1, 1e-3)
    cfg = res.cfg
    opt = optim.make_optimizer(res.recipe, cfg)
    state = {"p": model.init_params(cfg, 0)}
    state["o"] = opt.init(state["p"])
    step = jax.jit(make_step(cfg, opt, gns=gns), donate_argnums=(0, 1))
    batch = jax.numpy.asarray(tokens.reshape(accum, -1, tokens.shape[1]))

    def run():
        state["p"], state["o"], m = step(state["p"], state["o"], batch)
        return float(m["loss"])

    return run


def bench_cgpt(cfg, tokens, steps):
    run = cgpt_step(cfg, tokens)
    return _best(run, steps), run()


def bench_gns_overhead(cfg, tokens, steps: int, accum: int) -> tuple[float, float]:
    """Median seconds per step without and with train.gns, timed alternately (ABAB)."""
    runs = [cgpt_step(cfg, tokens, gns, accum) for gns in (False, True)]
    for run in runs:
        run()  # compile
    times = ([], [])
    for _ in range(steps):
        for run, t in zip(runs, times):
            t0 = time.perf_counter()
            run()
            t.append(time.perf_counter() - t0)
    return float(np.median(times[0])), float(np.median(times[1]))


def bench_torch(cfg, tokens, steps, threads):
    import torch
    import transformers

    from cgpt.model.hf import config_to_hf

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config_to_hf(cfg))).train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    x = torch.tensor(tokens)

    def run():
        out = m(x[:, :-1], labels=None)
        loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        return float(loss.detach())

    return _timed(run, steps), run(), torch.get_num_threads(), torch.__version__


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cpu-19m")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per side (median)")
    ap.add_argument("--threads", type=int, default=0,
                    help="pin the process to its first N cores and run N torch threads "
                         "(0: every core, torch's default threads)")
    for flag in ("--n-layer", "--d-model", "--n-head"):
        ap.add_argument(flag, type=int, default=None,
                        help=f"--model's preset with this {flag[2:]} (d_head, d_ffn derived)")
    ap.add_argument("--gns-overhead", action="store_true",
                    help="time cgpt's step with and without train.gns (interleaved), no torch")
    ap.add_argument("--accum", type=int, default=1,
                    help="--gns-overhead: micro-batches per step (the batch split in them)")
    args = ap.parse_args()
    if args.threads:  # before JAX sizes its thread pool to the cores it may use
        cores = sorted(os.sched_getaffinity(0))
        if not 1 <= args.threads <= len(cores):
            ap.error(f"--threads {args.threads}: this process may use {len(cores)} core(s)")
        os.sched_setaffinity(0, cores[:args.threads])

    import cgpt
    from cgpt.config import backend

    kept = backend.keep_host_memory()
    from cgpt.config import flops
    from cgpt.train.mfu import measured_matmul_peak

    cfg = cgpt.get_config(args.model)
    shape = {k: v for k, v in (("n_layer", args.n_layer), ("d_model", args.d_model),
                                ("n_head", args.n_head)) if v is not None}
    cfg = cfg.replace(**shape) if shape else cfg
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq_len + 1))
    if args.gns_overhead:
        if args.accum < 1 or args.batch % args.accum:
            ap.error(f"--accum {args.accum} must divide --batch {args.batch}")
        off, on = bench_gns_overhead(cfg, tokens, args.steps, args.accum)
        print(f"model {args.model}, batch {args.batch} x seq {args.seq_len} as {args.accum} "
              f"micro-batch(es), {args.steps} interleaved steps each (median)")
        print(f"train.gns off {off * 1e3:8.1f} ms/step   on {on * 1e3:8.1f} ms/step   "
              f"overhead {on / off - 1:+.1%}")
        return
    n_tok = args.batch * args.seq_len
    step_flops = flops.train_flops_per_token(cfg, args.seq_len) * n_tok
    peak = measured_matmul_peak("float32", n=2048)
    run = cgpt_step(cfg, tokens)
    c0 = time.process_time()
    run()  # the compile and one step
    first = time.process_time() - c0
    t_jax, l_jax = _timed(run, args.steps), run()
    t_pt, l_pt, threads, tv = bench_torch(cfg, tokens, args.steps, args.threads)
    peak = max(peak, measured_matmul_peak("float32", n=2048, repeats=6))  # re-measure, keep best
    shape = "".join(f" {k}={v}" for k, v in shape.items())
    print(f"model {args.model}{shape} ({cfg.num_params():,} params), batch {args.batch} x seq "
          f"{args.seq_len}, f32, {step_flops / 1e9:.1f} GFLOP/step (counted, full attention)")
    print(f"cores {len(os.sched_getaffinity(0))}, load {os.getloadavg()[0]:.1f}, glibc malloc "
          f"{'keeps freed memory (' + ', '.join(kept) + ')' if kept else 'defaults'}")
    print(f"measured f32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
    for name, (t, c) in (("cgpt (jax)", t_jax), (f"pytorch {tv} ({threads} thr)", t_pt)):
        print(f"{name:28s} {t * 1e3:8.1f} ms/step {n_tok / t:9,.0f} tokens/s "
              f"MFU {step_flops / t / peak:6.1%}   CPU {c * 1e3:8.1f} ms/step")
    print(f"cgpt's first step (compile + step): {first:.1f} s CPU")
    print(f"speed ratio cgpt / pytorch: {t_pt[0] / t_jax[0]:.2f}x wall, {t_pt[1] / t_jax[1]:.2f}x "
          f"CPU time   (loss after the timed steps {l_jax:.3f} / {l_pt:.3f})")


if __name__ == "__main__":
    main()
