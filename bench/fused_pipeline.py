"""A fused layer_pipelined step per member against the solo pipelined step (issue #21 item 3),
on emulated CPU devices: why a CPU pipelined group loops over its members.

    python bench/fused_pipeline.py [--preset tiny-240k] [--members 4] [--stages 2]
                                   [--batch 16] [--seq 128] [--steps 8]

One fused group of k members on `member=1 x stage=S` (every device holding its stage of every
member, `cgpt.sharding.members.Members`), two ways: the loop over the members
(`Members.loop`, `lax.map` of the solo pipelined step: what a CPU runs) and all members in
one vmapped pass (spmd_axis_name='member', the pipeline traced with check_vma=False: what
accelerators and split member axes run); and the solo run's own step (`LayerPipelined`,
`compile_step`) k times. The three in turn after a warm-up, best of --steps: ms per
member-step and the ratio to the solo step.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np


def bench(preset: str, k: int, stages: int, batch: int, seq: int, steps: int) -> dict:
    import jax

    from cgpt.config.data import DataConfig
    from cgpt.config.model import get_config
    from cgpt.config.run import RunConfig, TrainConfig
    from cgpt.sharding.members import Members
    from cgpt.sharding.pipeline import pipelined_loss
    from cgpt.train import fused, optim, setup
    from cgpt.train.resolve import resolve
    from cgpt.train.step import make_step

    cfg = get_config(preset).replace(compute_dtype="float32", vocab_size=512)
    run = RunConfig(preset=preset, model=cfg, data=DataConfig(vocab_size=512, seq_len=seq),
                    train=TrainConfig(tokens=100 * batch * seq, batch_size=batch,
                                      mode="layer_pipelined", mesh=f"stage={stages}"))
    r = resolve(run, jax.devices()[:stages])
    abstract = jax.eval_shape(lambda: fused.init_member(r.cfg, r.recipe, 0))
    lay = Members(r.mode, r.mesh, r.cfg, k, jax.devices(), abstract, spread=False,
                  batch=batch, micro=r.micro_batch)
    assert lay.loop, "a CPU mesh holding every member loops"
    vmapped = Members(r.mode, r.mesh, r.cfg, k, jax.devices(), abstract, spread=False,
                      batch=batch, micro=r.micro_batch)
    vmapped.loop, vmapped.spmd_axis_name = False, "member"  # the accelerators' program
    st = vmapped.strategy
    vmapped.loss = pipelined_loss(r.cfg, vmapped.mesh, st.micro_batches_for, st.constrain,
                                  check_vma=False)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 512, (k, 1, batch, seq + 1)).astype(np.int32)
    hyper = jax.device_put(fused.stack_hyper([r.recipe] * k), lay.member_sharding())
    active = jax.device_put(np.ones(k, bool), lay.member_sharding())
    fb = jax.device_put(tokens, lay.batch_sharding())

    def fused_runner(layout, per_pass):
        step = fused.make_fused_step(r.cfg, r.recipe, layout.loss, layout.spmd_axis_name,
                                     layout.step_shardings(), per_pass)
        members = [fused.init_member(r.cfg, r.recipe, i, layout.member_state)
                   for i in range(k)]
        s = dict(zip("po", layout.stack([m[0] for m in members], [m[1] for m in members])))

        def go():
            s["p"], s["o"], m = step(s["p"], s["o"], fb, hyper, active)
            return m["loss"]
        return go

    alone = setup.place(r, jax.devices()[:stages])
    opt = optim.make_optimizer(r.recipe, r.cfg)
    solo, sp, so = alone.compile_step(make_step(r.cfg, opt, alone.loss), opt, 0, r)
    solo_batch = alone.shard_batch(tokens[0])
    s = {"p": sp, "o": so}

    def solo_k():
        for _ in range(k):
            s["p"], s["o"], m = solo(s["p"], s["o"], solo_batch)
        return m["loss"]

    fns = {"solo": solo_k, "loop": fused_runner(lay, 1), "vmap": fused_runner(vmapped, 0)}
    for fn in fns.values():  # warm-up: compile, allocator
        jax.block_until_ready(fn())
        jax.block_until_ready(fn())
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(steps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: 1e3 * b / k for name, b in best.items()} | {"line": lay.line()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny-240k")
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={a.stages}")
    print(f"load {os.getloadavg()[0]:.1f}; {a.preset}, {a.members} members, batch {a.batch} x "
          f"{a.seq}, vocab 512, stage={a.stages}")
    ms = bench(a.preset, a.members, a.stages, a.batch, a.seq, a.steps)
    print(ms.pop("line"))
    print("ms per member-step (best of %d): %s" % (a.steps, ", ".join(
        f"{n} {v:.1f} ({v / ms['solo']:.2f}x solo)" for n, v in ms.items())))
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
