"""One transformer block's forward + backward with each attention kernel, on this machine.

    python bench/attention.py                      # cpu-19m block (B=16, T=256) and a 111M block (B=1, T=1024)
    python bench/attention.py --preset 111M --batch 2 --seq 2048 --kernels xla,cudnn --dtype bfloat16

Prints ms per block step and each kernel's time relative to the first: the measurement behind
`cgpt.config.backend`'s choice of attention per platform.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np


def time_block(cfg, batch: int, seq: int, repeats: int) -> float:
    from cgpt.model import gpt as model

    params = jax.tree.map(lambda a: a[0], model.init_params(cfg, seed=0)["h"])
    x = jnp.asarray(np.random.default_rng(0).standard_normal((batch, seq, cfg.d_model)),
                    model.compute_dtype(cfg))
    step = jax.jit(jax.grad(lambda p, x: model.block(p, x, cfg).astype(jnp.float32).sum(),
                            argnums=(0, 1)))
    jax.block_until_ready(step(params, x))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(step(params, x))
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    from cgpt.config.model import get_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", help="model shape (repeatable); default "
                    "cpu-19m and 111M")
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("--seq", type=int, action="append")
    ap.add_argument("--kernels", default="chunked,xla", help="comma list of chunked, xla, cudnn")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    presets = a.preset or ["cpu-19m", "111M"]
    batches = a.batch or ([16, 1] if not a.preset else [1] * len(presets))
    seqs = a.seq or ([256, 1024] if not a.preset else [2048] * len(presets))
    kernels = a.kernels.split(",")
    print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), dtype {a.dtype}")
    for name, B, T in zip(presets, batches, seqs):
        base = get_config(name).replace(n_layer=1, compute_dtype=a.dtype, n_ctx=max(T, 1))
        times = {k: time_block(base.replace(attention=k), B, T, a.repeats) for k in kernels}
        first = times[kernels[0]]
        print(f"{name} block, B={B} T={T}: " + ", ".join(
            f"{k} {t * 1e3:.1f} ms ({t / first:.2f}x)" for k, t in times.items()))


if __name__ == "__main__":
    main()
