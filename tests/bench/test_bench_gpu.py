"""bench/train_gpu.py: refuses to report GPU figures without a GPU; runs end to end on a CPU."""
import os
import subprocess
import sys
from pathlib import Path

import pytest


SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "train_gpu.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_refuses_gpu_figures_without_a_gpu():
    r = _run("--models", "tiny-45k")
    assert r.returncode != 0
    assert "no GPU visible to JAX" in r.stderr and "--device cpu" in r.stderr
    assert "tokens/s" not in r.stdout  # nothing measured, nothing estimated


@pytest.mark.slow  # 25 s on a quiet 2-core machine, 76 s on a loaded one
def test_cpu_smoke_run_measures_both_sides():
    r = _run("--models", "tiny-45k", "--seq", "64", "--batch", "2", "--steps", "1",
             "--device", "cpu", "--no-compile")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "CPU smoke run: these are CPU numbers, not GPU figures" in r.stdout
    assert "cgpt (jax" in r.stdout and "pytorch" in r.stdout
    assert "speed ratio cgpt / pytorch" in r.stdout
