"""Compiling the next job's programs ahead (#21 item 5c): `cgpt.train.warm` and the sweep
worker's `_Ahead`. The ahead-compiled programs are the run's own (every compile of the run is
then a persistent-cache hit) and give the same results; a failed ahead-compile is a line in
the job's log, never an exception or a hang."""
import json
import os
import threading
import time

import pytest

from cgpt.sweep import worker
from cgpt.sweep.executors import Job
from cgpt.train import warm


def test_ahead_keeps_a_failure_and_runs_one_at_a_time():
    a = warm.Ahead()
    a.start("x", lambda: 1 / 0)
    name, done, err = a.wait()
    assert (name, done) == ("x", None) and err == "ZeroDivisionError: division by zero"
    a.start("y", lambda: (_ for _ in ()).throw(ValueError("bad key\n  at line 3")))
    assert a.wait() == ("y", None, "ValueError: bad key")  # one line for the job's log
    running, overlaps = [], []

    def slow(tag):
        running.append(tag)
        time.sleep(0.2)
        overlaps.append(list(running))  # the previous compile was joined before this one
        running.remove(tag)
        return [tag]

    a.start("p", lambda: slow("p"))
    a.start("q", lambda: slow("q"))  # waits for "p"
    assert a.wait() == ("q", ["q"], None) and overlaps == [["p"], ["q"]]
    assert not any(t.name.startswith("cgpt-ahead") for t in threading.enumerate())


def test_worker_compiles_the_next_job_ahead(tmp_path, monkeypatch):
    jobs = [Job(f"r{i}", str(tmp_path / f"r{i}"), False) for i in range(3)]
    jobs[2] = Job("g", str(tmp_path / "g"), False, members=(jobs[0],))  # fused
    monkeypatch.setattr(warm, "cache_enabled", lambda: True)
    seen = []
    from cgpt.train import fused_loop

    monkeypatch.setattr(fused_loop, "compile_group", lambda runs: seen.append(runs) or ["s"])

    def compile_run(run):
        seen.append(run)
        raise ValueError("model.d_model: bad")

    monkeypatch.setattr(warm, "compile_run", compile_run)
    monkeypatch.setattr(worker, "_config", lambda job: job.run_id)
    ahead = worker._Ahead(jobs)
    assert ahead.next(0) == ""  # nothing was compiled for the first job
    assert ahead.next(1) == ("compile-ahead failed (ValueError: model.d_model: bad); "
                             "compiling at start-up\n")
    assert ahead.next(2).startswith("compiled ahead while the previous job ran (")
    assert seen == ["r1", ["r0"]]  # the group's members, by `fused_loop.compile_group`
    monkeypatch.setattr(warm, "compile_run", lambda run: ["step", "eval"])
    ahead = worker._Ahead(jobs[:2])
    ahead.next(0)
    assert ahead.next(1).startswith("compiled ahead while the previous job ran (")
    monkeypatch.setattr(warm, "cache_enabled", lambda: False)  # no cache: nothing ahead
    assert worker._Ahead(jobs).runner is None


@pytest.mark.slow
@pytest.mark.parametrize("placement", [{}, {"mode": "data_parallel", "mesh": "data=2"}],
                         ids=["single", "data_parallel"])
def test_ahead_compiled_programs_are_the_runs_own(tmp_path, placement):
    """After compile_run(B), training B compiles nothing (every program a cache hit) and logs
    exactly the metrics of B compiled at its start-up, on one device and data parallel (its
    init and evaluation were compiled inside the run: the sweep's data-parallel demo lost)."""
    import jax
    from jax._src import compilation_cache

    from cgpt.config.run import from_dict
    from cgpt.train.loop import train
    from tests.sweep_helpers import write_corpus

    corpus = write_corpus(tmp_path / "corpus")

    def run(preset: str):
        return from_dict({"model": {"preset": preset, "vocab_size": 300},
                          "data": {"source": str(corpus), "vocab_size": 300, "seq_len": 32,
                                   "val_sequences": 4, "cache_dir": str(tmp_path / "data")},
                          "train": {"batch_size": 8, "tokens": 8 * 32 * 6, **placement}},
                         "test")

    saved = {k: getattr(jax.config, k) for k in (
        "jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes")}

    def use_cache(path):  # in-memory caches cleared: every program is looked up in `path`
        jax.clear_caches()
        compilation_cache.reset_cache()
        jax.config.update("jax_compilation_cache_dir", path and str(path))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    def programs(cache):  # Orbax saves a state replicated over devices in slices: one
        # small program per leaf shape, compiled by the checkpoint, not by the start-up
        return {f for f in os.listdir(cache) if not f.startswith("jit_slice-")}

    def metrics(d):
        return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]

    try:
        use_cache(tmp_path / "c1")
        train(run("tiny-45k"), tmp_path / "solo", progress=False)  # compiled at start-up
        use_cache(tmp_path / "c2")
        train(run("tiny-17k"), tmp_path / "a", progress=False)  # the shape-free eager ops
        assert warm.cache_enabled()
        assert warm.compile_run(run("tiny-45k")) == ["step", "init", "eval"]
        ahead = programs(tmp_path / "c2")
        assert len(ahead) >= 3
        train(run("tiny-45k"), tmp_path / "b", progress=False)
        assert programs(tmp_path / "c2") == ahead  # nothing compiled at start-up
    finally:
        jax.clear_caches()
        compilation_cache.reset_cache()
        for k, v in saved.items():
            jax.config.update(k, v)
    drop = ("tokens_per_s", "mfu")  # timings
    assert [{k: v for k, v in m.items() if k not in drop} for m in metrics(tmp_path / "b")] \
        == [{k: v for k, v in m.items() if k not in drop} for m in metrics(tmp_path / "solo")]


def test_fresh_state_is_init_then_optimizer_init():
    """The start's one init program gives, bit for bit, what the two programs gave (and what a
    fused group's members still use, `cgpt.train.fused.init_member`)."""
    import jax
    import numpy as np

    from cgpt.config.model import get_config
    from cgpt.config.recipe import Recipe
    from cgpt.model import gpt as model
    from cgpt.sharding.strategies import SingleDevice
    from cgpt.train import fused, optim

    from cgpt.config import backend

    assert backend.init_compile_options("cpu") == {"xla_backend_optimization_level": 1}
    assert backend.init_compile_options("gpu") is None
    cfg = get_config("tiny-17k")  # compiled with the CPU's init options, compared without
    opt = optim.make_optimizer(Recipe(peak_lr=1e-2, decay="linear", adam_eps=1e-8, batch_size=1,
                                      warmup_steps=1, total_steps=10), cfg)
    got = SingleDevice(cfg).init_state(opt)(3)
    params = jax.jit(model.init_params, static_argnums=0)(cfg, 3)
    want = (params, jax.jit(opt.init)(params))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    member = fused.init_member(cfg, Recipe(peak_lr=1e-3, decay="linear", adam_eps=1e-8,
                                           batch_size=1, warmup_steps=1, total_steps=10), 3)
    assert all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(member), jax.tree.leaves(got)))


def test_state_finite_reads_cpu_arrays_on_the_host(monkeypatch):
    """On a CPU the checkpoint guard reads the state with numpy (no `all_finite` compile per
    shape) and agrees with the jitted check; integer leaves (counts) are not checked."""
    import jax.numpy as jnp

    from cgpt.train import step

    calls = []
    jitted = step.all_finite
    monkeypatch.setattr(step, "all_finite", lambda t: calls.append(1) or jitted(t))
    ok = {"w": jnp.ones((3, 2)), "n": jnp.int32(7), "m": (jnp.zeros(4), jnp.float32(2.0))}
    assert step.state_finite(ok) and bool(jitted(ok))
    for bad in (jnp.nan, jnp.inf, -jnp.inf):
        tree = {**ok, "m": (jnp.zeros(4).at[2].set(bad), jnp.float32(2.0))}
        assert not step.state_finite(tree) and not bool(jitted(tree))
    assert calls == []  # never compiled here
    assert step.state_finite({"n": jnp.int32(1)}) and step.state_finite({})
    assert not step.state_finite([1.0, float("nan")]) and calls == [1]  # not jax arrays: jitted


def test_background_returns_or_reraises_in_the_callers_thread():
    """The helper of the compile-ahead and a fused job's saves: one call at a time; `wait()`
    gives its result or raises its error (once); `start` raises a pending error first."""
    from cgpt.train.background import Background

    bg = Background("cgpt-test-bg")
    assert bg.wait() is None  # nothing ran
    bg.start(lambda: 41 + 1)
    assert bg.wait() == 42 and bg.wait() is None
    bg.start(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        bg.wait()
    assert bg.wait() is None  # raised once
    bg.start(lambda: [][0])
    with pytest.raises(IndexError):  # the next start waits for it and raises it
        bg.start(lambda: 7)
    assert bg.outcome() == (None, None)
    bg.start(lambda: 7)
    assert bg.outcome() == (7, None) and bg.seconds >= 0
    assert not any(t.name == "cgpt-test-bg" for t in threading.enumerate())


def test_worker_exposes_the_cpu_devices_its_largest_mesh_asks(tmp_path, monkeypatch):
    # One worker process trains every job of a local sweep and JAX fixes its CPU devices when
    # it starts: a job's `train.mesh` data=2 must find 2 devices (it failed with "needs 2
    # devices but only 1 are available"). A config that does not read is left to its job.
    from cgpt import rundir
    import yaml

    seen = []
    monkeypatch.setattr("cgpt.sharding.emulate_cpu_devices", seen.append)
    raws = {"dp": {"preset": "tiny-17k", "train": {"mode": "data_parallel", "mesh": "data=2"}},
            "one": {"preset": "tiny-17k"}, "bad": {"preset": "tiny-17k", "train": {"nope": 1}}}
    jobs = []
    for name, raw in [*raws.items(), ("missing", None)]:
        d = tmp_path / name
        d.mkdir()
        if raw is not None:
            (d / rundir.RUN_FILE).write_text(yaml.safe_dump(raw))
        jobs.append(Job(name, str(d), False))
    worker._emulate_devices(jobs)
    assert seen == [2]
    worker._emulate_devices(jobs[1:])
    assert seen == [2, 1]
