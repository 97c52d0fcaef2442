"""Compiling a run's programs ahead of its start, on abstract values (`Ahead`).

A sweep's worker trains its jobs one after another (`cgpt.sweep.worker`), and each new model
shape costs XLA compiles before its first step (measured on the 2-core CPU: ~22 s per demo
shape: the train step, `init_params`, the evaluation and `all_finite`). `compile_run` runs the
start-up of `cgpt.train.loop` up to those compiles, on `jax.ShapeDtypeStruct`s (nothing is
allocated, no file is written), so a background thread can compile the next job's programs
while the current job trains. The executables land in JAX's persistent compilation cache
(the sweep always sets one); the job itself then traces and lowers as before and loads them
from the cache: the same programs, so the same results, bit for bit. A failed ahead-compile is
dropped: the job compiles for itself and fails, if it must, with its own one-line error.
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Callable

import jax
import jax.numpy as jnp

from cgpt.config import backend
from cgpt.config.run import RunConfig, parse_bytes


def cache_enabled() -> bool:
    """Whether compiles persist across `jax.jit` objects: without a persistent cache an
    ahead-compile would be thrown away, so it is not done."""
    return bool(jax.config.jax_compilation_cache_dir)


def compile_run(run: RunConfig) -> list[str]:
    """Compile the programs `cgpt.train.loop.train(run, ...)` starts with, on abstract values;
    returns their names in the order compiled. One process only (a multi-process job agrees
    on its memory with a collective, which must not run off the main thread)."""
    from cgpt.model import gpt as model
    from cgpt.sharding.mesh import device_memory_bytes, job_nodes
    from cgpt.train import fit, optim, setup
    from cgpt.train.resolve import resolve
    from cgpt.train.step import all_finite

    if jax.process_count() != 1:
        return []
    run = replace(run, model=backend.resolve(run.model))  # as resume.check_config, fresh
    t = run.train
    memory = (parse_bytes(t.device_memory, "train.device_memory") if t.device_memory
              else device_memory_bytes())
    devices = jax.devices()
    res = resolve(run, devices, device_memory=memory, num_processes=1, nodes=job_nodes(devices))
    strategy = setup.place(res, devices)
    optimizer = optim.make_optimizer(res.recipe, res.cfg)
    res, _, fitted = fit.fit_step(res, strategy, optimizer, memory)
    done = ["step"]
    if not fitted.fits or res.mode != "single":  # the sharded modes' init/eval: by the run
        return done
    abstract_p = jax.eval_shape(lambda: model.init_params(res.cfg))
    abstract_o = jax.eval_shape(optimizer.init, abstract_p)
    # as SingleDevice.compile_step and loop._validation call them (same HLO: a cache hit)
    jax.jit(model.init_params, static_argnums=0).lower(res.cfg, t.seed).compile()
    jax.jit(optimizer.init).lower(abstract_p).compile()
    placed = strategy.abstract_state(abstract_p, abstract_o)  # the live arrays' placement
    all_finite.lower(placed).compile()
    done += ["init", "optimizer init", "all_finite"]
    from cgpt.data.batches import load_data

    n_val = load_data(run.data).num_val_sequences  # the eval batch is capped by the split
    eval_bs = min(res.micro_batch * res.replicas, n_val)
    if eval_bs >= 1:
        batch = jax.ShapeDtypeStruct((eval_bs, res.seq_len + 1), jnp.int32)  # uncommitted
        strategy.compile_eval(res.cfg).lower(placed[0], batch).compile()
        done.append("eval")
    return done


class Ahead:
    """One background compile at a time: `start(name, fn)` runs `fn` in a daemon thread,
    `wait()` joins it and returns (name, compiled names or None, error or None). An error is
    kept, never raised: the job it was for compiles (and fails) on its own."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._result: tuple = (None, None, None)
        self.seconds = 0.0  # how long the last successful compile-ahead took

    def start(self, name: str, fn: Callable[[], list[str]]) -> None:
        self.wait()

        def body() -> None:
            t0 = time.perf_counter()
            try:
                done = fn()
                self.seconds = time.perf_counter() - t0
                self._result = (name, done, None)
            except BaseException as e:  # noqa: BLE001 - dropped: the job compiles for itself
                first = (str(e).strip().splitlines() or [""])[0][:300]  # one log line
                self._result = (name, None, f"{type(e).__name__}: {first}")

        self._result = (name, None, None)
        self._thread = threading.Thread(target=body, name=f"cgpt-ahead-{name}", daemon=True)
        self._thread.start()

    def wait(self) -> tuple:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self._result
