"""Fused vs one-at-a-time training of same-shape runs (#21, item 5b): 8 seeds of tiny-45k.

    python bench/fuse.py                         # 8 seeds of tiny-45k, its Chinchilla budget
    python bench/fuse.py --runs 4 --tokens 2e5 --preset tiny-17k

Both arms run in this one process on the same data (prepared before either is timed): the
runs one after another with `cgpt.train.loop.train`, then the same runs as one fused group
with `cgpt.train.fused_loop.train_fused`. Each seed sets the init (train.seed) and the batch
order (data.seed). Prints wall-clock seconds, member-steps per second and the ratio, and the
largest difference between the two arms' final training losses (they train the same runs).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny-45k")
    ap.add_argument("--runs", type=int, default=8, help="seeds 0..runs-1")
    ap.add_argument("--tokens", default="chinchilla", help="token budget per run")
    ap.add_argument("--out", default=None, help="where the run directories go (default: a "
                    "temporary directory, removed afterwards)")
    a = ap.parse_args()

    import jax

    from cgpt.config.run import from_dict
    from cgpt.data.batches import load_data
    from cgpt.train.fused_loop import train_fused
    from cgpt.train.loop import train

    runs = [from_dict({"preset": a.preset, "model": {"compute_dtype": "float32"},
                       "data": {"seed": k}, "train": {"seed": k, "tokens": a.tokens}},
                      f"--preset {a.preset}") for k in range(a.runs)]
    load_data(runs[0].data)  # the tokenizer and token store, prepared before any timing
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.out or tmp)
        t0 = time.perf_counter()
        solo = [train(r, root / f"solo-{k}", progress=False) for k, r in enumerate(runs)]
        t_solo = time.perf_counter() - t0
        t0 = time.perf_counter()
        fused = train_fused(runs, [root / f"fused-{k}" for k in range(a.runs)], progress=False)
        t_fused = time.perf_counter() - t0
    steps = solo[0]["steps"]
    member_steps = steps * a.runs
    diff = max(abs(s["train_loss"] - f["train_loss"]) for s, f in zip(solo, fused))
    print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{a.runs} x {a.preset} ({solo[0]['n_params']:,} params), {steps} steps of "
          f"{solo[0]['batch_size']} x {solo[0]['seq_len']} tokens each, f32")
    print(f"one at a time: {t_solo:.1f} s wall ({member_steps / t_solo:.1f} member-steps/s; "
          f"training steps {sum(s['train_time_s'] for s in solo):.1f} s)")
    print(f"fused:         {t_fused:.1f} s wall ({member_steps / t_fused:.1f} member-steps/s; "
          f"training steps {fused[0]['train_time_s']:.1f} s)")
    print(f"fused is {t_solo / t_fused:.2f}x faster in wall-clock time "
          f"(largest train_loss difference {diff:.1e})")


if __name__ == "__main__":
    main()
