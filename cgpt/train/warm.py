"""Compiling a run's programs ahead of its start, on abstract values (`Ahead`).

A sweep's worker trains its jobs one after another (`cgpt.sweep.worker`), and each new model
shape costs XLA compiles before its first step (measured on the 2-core CPU: ~15 s per demo
shape: the train step, the fresh state's init and the evaluation). `compile_run` runs the
start-up of `cgpt.train.loop` (`cgpt.train.setup.start_up`) up to those compiles, on
`jax.ShapeDtypeStruct`s (nothing is allocated, no file is written), so a background thread can
compile the next job's programs while the current job trains. The executables land in JAX's
persistent compilation cache (the sweep always sets one); the job itself then traces and lowers as
before and loads them from the cache: the same programs, so the same results, bit for bit. A failed
ahead-compile is dropped: the job compiles for itself and fails, if it must, with its own one-line
error.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import jax
import jax.numpy as jnp

from cgpt.config import backend
from cgpt.config.run import RunConfig
from cgpt.data.batches import load_data
from cgpt.train.background import Background


def cache_enabled() -> bool:
    """Whether compiles persist across `jax.jit` objects: without a persistent cache an
    ahead-compile would be thrown away, so it is not done."""
    return bool(jax.config.jax_compilation_cache_dir)


def compile_run(run: RunConfig) -> list[str]:
    """Compile the programs `cgpt.train.loop.train(run, ...)` starts with, on abstract values;
    returns their names in the order compiled. The start-up is train's own
    (`cgpt.train.setup.start_up`). One process only (a multi-process job agrees on its memory
    with a collective, which must not run off the main thread)."""
    from cgpt.train import evaluation, setup  # loads JAX: only when this runs

    if jax.process_count() != 1:
        return []
    run = replace(run, model=backend.resolve(run.model))  # as resume.check_config, fresh
    res, strategy, optimizer, _, fitted, _ = setup.start_up(run)
    done = ["step"]
    if not fitted.fits:
        return done
    init = strategy.init_state(optimizer).lower(res.run.train.seed)  # as compile_step runs it
    init.compile()
    done.append("init")
    eval_bs = evaluation.eval_batch_size(res, load_data(run.data).num_val_sequences)
    if eval_bs >= 1:
        params = strategy.abstract_state(*init.out_info)[0]  # the live arrays' placement
        batch = jax.ShapeDtypeStruct((eval_bs, res.seq_len + 1), jnp.int32)  # uncommitted
        strategy.compile_eval(res.cfg).lower(params, batch).compile()
        done.append("eval")
    return done


class Ahead:
    """One background compile at a time: `start(name, fn)` runs `fn` in a daemon thread,
    `wait()` joins it and returns (name, compiled names or None, error or None). An error is
    kept, never raised: the job it was for compiles (and fails) on its own."""

    def __init__(self) -> None:
        self._bg = Background("cgpt-ahead")
        self._name: str | None = None  # the job whose compile runs, until joined
        self._result: tuple = (None, None, None)
        self.seconds = 0.0  # how long the last successful compile-ahead took

    def start(self, name: str, fn: Callable[[], list[str]]) -> None:
        self.wait()
        self._name, self._result = name, (name, None, None)
        self._bg.start(fn)

    def wait(self) -> tuple:
        if self._name is not None:
            name, self._name = self._name, None
            done, e = self._bg.outcome()
            if e is None:
                self.seconds, self._result = self._bg.seconds, (name, done, None)
            else:  # dropped: the job compiles for itself; one line for its log
                first = (str(e).strip().splitlines() or [""])[0][:300]
                self._result = (name, None, f"{type(e).__name__}: {first}")
        return self._result
