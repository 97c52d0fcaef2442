"""The fused (vmapped) train step against the solo step, per member, at the tiny shapes of
sweeps/mup_transfer.yaml (issue #21 item 5 (a)): the step alone, no data, no sweep.

    python bench/fused_step.py [--widths 16 32 64] [--members 1 2 7] [--steps 30] [--mup]

Per width: the solo step (`make_step` with `optim.make_optimizer`, jitted, donated) and
`train.fused.make_fused_step` with k members (k LRs) two ways: all members in one vmapped
pass (`per_pass=0`, what every fused step was before) and a loop of `per_pass` members
(`fused.members_per_pass()`, 1 on a CPU), all on a batch of 16 x 64 tokens (vocab 512, 2
layers, 2 heads). Timed after a warm-up with `jax.block_until_ready`, the three in turn
(a shared machine's load drifts over all alike), best of --steps: ms per member-step and
the ratio to the solo step (<= 1: fusing costs nothing per member). --hlo DIR writes each
program's optimized HLO there (to compare what vmap changed).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np


def _interleaved_ms(fns, steps: int) -> list[float]:
    """Best-of-`steps` ms of each function, run in turn (solo, fused, solo, ...), so that a
    shared machine's load drifts over all of them alike."""
    import jax
    for fn in fns:  # warm-up: compile, allocator
        jax.block_until_ready(fn())
        jax.block_until_ready(fn())
    best = [float("inf")] * len(fns)
    for _ in range(steps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            best[i] = min(best[i], time.perf_counter() - t0)
    return [1e3 * b for b in best]


def _setup(width: int, mup: bool):
    import jax

    from cgpt.config.model import get_config
    from common import resolved

    cfg = get_config("tiny-45k-mup" if mup else "tiny-45k", d_model=width, vocab_size=512)
    res = resolved(cfg, 16, 64, 1e-3)
    return res.cfg, res.recipe, jax


def bench(width: int, ks, steps: int, mup: bool, hlo: str | None, per_pass: int) -> list[tuple]:
    import dataclasses

    import jax.numpy as jnp

    from cgpt.model import gpt as model
    from cgpt.train import fused, optim
    from cgpt.train.step import make_step

    cfg, recipe, jax = _setup(width, mup)
    rng = np.random.default_rng(0)
    batch = jnp.asarray(rng.integers(0, 512, (1, 16, 65)), jnp.int32)
    opt = optim.make_optimizer(recipe, cfg)
    solo = jax.jit(make_step(cfg, opt), donate_argnums=(0, 1))
    s = {"p": model.init_params(cfg, 0)}
    s["o"] = opt.init(s["p"])
    if hlo:
        os.makedirs(hlo, exist_ok=True)
        with open(f"{hlo}/solo_w{width}.txt", "w") as f:
            f.write(solo.lower(s["p"], s["o"], batch).compile().as_text())

    def run_solo():
        s["p"], s["o"], m = solo(s["p"], s["o"], batch)
        return m["loss"]

    rows = []
    for k in ks:
        recipes = [dataclasses.replace(recipe, peak_lr=1e-3 * 2 ** i) for i in range(k)]
        steps_ = {"vmap": fused.make_fused_step(cfg, recipe, per_pass=0),
                  "loop": fused.make_fused_step(cfg, recipe, per_pass=per_pass)}
        members = [fused.init_member(cfg, recipe, i) for i in range(k)]
        f = {"p": fused.stack([m[0] for m in members]), "o": fused.stack([m[1] for m in members])}
        g = {"p": jax.tree.map(jnp.copy, f["p"]), "o": jax.tree.map(jnp.copy, f["o"])}
        hyper = fused.stack_hyper(recipes)
        fb = jnp.broadcast_to(batch[None], (k,) + batch.shape)
        active = jnp.ones((k,), bool)
        for name, st in steps_.items() if hlo else ():
            with open(f"{hlo}/fused_{name}_w{width}_k{k}.txt", "w") as fh:
                fh.write(st.lower(f["p"], f["o"], fb, hyper, active).compile().as_text())

        def runner(st, state):
            def run():
                state["p"], state["o"], m = st(state["p"], state["o"], fb, hyper, active)
                return m["loss"]
            return run

        t_solo, t_v, t_l = _interleaved_ms(
            [run_solo, runner(steps_["vmap"], f), runner(steps_["loop"], g)], steps)
        rows.append((width, k, t_solo, t_v / k, t_v / k / t_solo, t_l / k, t_l / k / t_solo))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--members", type=int, nargs="+", default=[1, 2, 7])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--mup", action="store_true", help="the μP preset (tiny-45k-mup)")
    ap.add_argument("--per-pass", type=int, help="members per pass of the loop arm "
                    "(default: fused.members_per_pass(), 1 on a CPU)")
    ap.add_argument("--hlo", help="write the optimized HLO of every program into this folder")
    a = ap.parse_args()
    print(f"load {os.getloadavg()[0]:.1f}; batch 16 x 64, vocab 512, 2 layers, 2 heads, "
          f"{'μP' if a.mup else 'SP'}")
    from cgpt.train import fused
    per_pass = fused.members_per_pass() if a.per_pass is None else a.per_pass
    print(f"ms per member-step; vmap: all members in one vmapped pass (before), loop: "
          f"{per_pass or 'all'} per pass (make_fused_step's per_pass); ratio: / solo")
    print(f"{'width':>5} {'k':>3} {'solo':>7} {'vmap':>7} {'ratio':>6} {'loop':>7} {'ratio':>6}")
    for w in a.widths:
        for row in bench(w, a.members, a.steps, a.mup, a.hlo, per_pass):
            print("{:>5} {:>3} {:>7.2f} {:>7.2f} {:>6.2f} {:>7.2f} {:>6.2f}".format(*row),
                  flush=True)
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
