"""CPU execution choices that change speed, not results: glibc keeps the steps' memory, and
the shallow layer stacks run unrolled."""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cgpt.config import backend
from cgpt.config.model import ModelConfig
from cgpt.model import gpt

# What XLA's CPU runtime does every step, in a thread of its own: take a 64 MiB buffer, fill
# it, free it. Prints the page faults of the second round (glibc's default: a fresh mapping,
# every page faults again).
_FAULTS = """
import ctypes, json, resource, sys, threading
from cgpt.config import backend
kept = backend.keep_host_memory() if sys.argv[1] == "keep" else []
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
faults = []

def step():
    p = libc.malloc(64 << 20)
    libc.memset(p, 1, 64 << 20)
    libc.free(p)

def steps():
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

t = threading.Thread(target=steps)
t.start()
t.join()
print(json.dumps({"kept": kept, "faults": faults[0]}))
"""


def _faults(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "CGPT_CPU_MALLOC"}
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="glibc's malloc options")
def test_keep_host_memory_stops_the_per_step_page_faults():
    default, kept = _faults("default"), _faults("keep")
    assert default["kept"] == [] and default["faults"] > 8000  # 16k pages of 4 KiB, fresh
    assert kept["kept"] == [name for _, _, name, _ in backend.CPU_MALLOC_OPTIONS]
    assert kept["faults"] < 800


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="glibc's malloc options")
def test_host_memory_env_keeps_a_child_process_memory():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "CGPT_CPU_MALLOC"}
    child = subprocess.run([sys.executable, "-c", _FAULTS, "default"], capture_output=True,
                           env={**env, **backend.host_memory_env(env)}, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    assert json.loads(child.stdout.strip().splitlines()[-1])["faults"] < 800
    assert backend.host_memory_env({"CGPT_CPU_MALLOC": "off"}) == {}
    assert backend.host_memory_env({"MALLOC_ARENA_MAX": "4"}).keys() == {
        "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_"}


def test_keep_host_memory_leaves_the_user_settings():
    assert backend.keep_host_memory({"CGPT_CPU_MALLOC": "0"}) == []
    mine = {name: "1" for _, _, name, _ in backend.CPU_MALLOC_OPTIONS}
    assert backend.keep_host_memory(mine) == []  # each option the user set is theirs


@pytest.mark.parametrize("platform_, calls", [("cpu", 1), ("gpu", 0)])
def test_a_training_process_keeps_its_memory_on_cpu_only(monkeypatch, platform_, calls):
    import cgpt.cli as entry  # the process entry: `cgpt`, `python -m cgpt`

    seen = []
    monkeypatch.setattr(backend, "keep_host_memory", lambda *a: seen.append(a) or [])
    monkeypatch.setattr(backend, "launch_platform", lambda environ, gpus: platform_)
    entry._keep_host_memory()
    assert len(seen) == calls


# the demo's tiny-116k shape, small: 3 layers of d 48 in 3 heads, causal attention in 2 chunks
DEMO = ModelConfig(name="demo3", n_layer=3, d_model=48, n_head=3, vocab_size=97, n_ctx=80)


def _loss_grad(cfg, unroll_layers: int, monkeypatch):
    monkeypatch.setitem(backend._DEFAULTS, "cpu",
                        dataclasses.replace(backend.defaults("cpu"), unroll_layers=unroll_layers))
    params = gpt.init_params(cfg, seed=2)
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, cfg.vocab_size, (4, 81)))
    fn = jax.jit(jax.value_and_grad(gpt.loss_fn), static_argnums=2)
    hlo = fn.lower(params, tokens, cfg).as_text()
    return fn(params, tokens, cfg), "while" in hlo


@pytest.mark.parametrize("remat", ["save_dots", "none"])
def test_unrolled_layers_equal_the_scanned_ones(monkeypatch, remat):
    cfg = DEMO.replace(remat=remat)
    assert backend.kernels(cfg, "cpu").unroll_layers >= cfg.n_layer  # the CPU default
    (l_scan, g_scan), scanned = _loss_grad(cfg, 0, monkeypatch)
    (l_unroll, g_unroll), looped = _loss_grad(cfg, cfg.n_layer, monkeypatch)
    assert scanned and not looped  # the setting took: no while loop left in the step
    assert float(l_unroll) == pytest.approx(float(l_scan), abs=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 g_unroll, g_scan)


def test_deep_stacks_stay_scanned(monkeypatch):
    cfg = DEMO.replace(n_layer=backend.defaults("cpu").unroll_layers + 1)
    assert _loss_grad(cfg, backend.defaults("cpu").unroll_layers, monkeypatch)[1]
