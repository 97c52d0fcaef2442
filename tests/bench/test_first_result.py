"""bench/first_result.py's parts (README command 1 timed fresh and warm), and the demo it times
keeping its science: >= 4 Chinchilla-optimal sizes over >= 1.5 decades of compute."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import first_result  # noqa: E402


def test_demo_keeps_its_science():
    from cgpt.sweep import load_sweep

    demo = load_sweep(ROOT / "sweeps" / "demo.yaml")
    flops = [r.flops for r in demo.runs]
    assert len({r.n_params for r in demo.runs}) >= 4
    assert math.log10(max(flops) / min(flops)) >= 1.5
    assert all(r.tokens / r.n_params == pytest.approx(20, rel=0.02) for r in demo.runs)


def test_the_bench_times_the_readme_command(tmp_path):
    cmd = first_result.readme_sweep()
    assert cmd.startswith("python -m cgpt sweep sweeps/demo.yaml --out {out}")
    assert cmd.format(out="runs/demo") in (ROOT / "README.md").read_text()
    (tmp_path / "README.md").write_text("# no command here\n")
    with pytest.raises(SystemExit, match="no command 1"):
        first_result.readme_sweep(tmp_path / "README.md")


def test_parts_from_events_and_summaries(tmp_path):
    events = tmp_path / "events.jsonl"
    rows = [("data", 30.0), ("data", 25.0),  # the cold load, and one that waited on its lock
            ("compile.trace", 1.0), ("compile.lower", 2.0), ("compile.xla", 4.0),
            ("compile.xla", 5.0), ("compile.cache_read", 0.5), ("eval", 0.25), ("eval", 0.25),
            ("checkpoint", 0.5), ("fit", 3.0)]
    events.write_text("".join(json.dumps({"pid": 1, "what": w, "t": 0, "dt": dt}) + "\n"
                              for w, dt in rows))
    out = tmp_path / "out"
    for i, (s, pid) in enumerate(((10.0, 7), (20.0, 8), (5.0, 7))):  # two workers
        (out / f"r{i}").mkdir(parents=True)
        (out / f"r{i}" / "summary.json").write_text(json.dumps({"train_time_s": s}))
        (out / f"r{i}" / "train.log").write_text(
            f"==== cgpt sweep ...: python -m cgpt train ... [in the sweep's worker process, "
            f"pid {pid}] [cpus {pid - 7}]\n")
    p = first_result.parts(events, out)
    assert p == {"data": 30.0, "compiles": 12.0, "compile_xla": 9.0, "compile_cache_read": 0.5,
                 "programs": 2, "cache_hits": 1, "steps": 35.0, "runs": 3, "workers": 2,
                 "steps_busiest": 20.0, "evals": 0.5, "n_evals": 2,
                 "checkpoints": 0.5, "n_checkpoints": 1, "fit": 3.0}
    line = first_result.row("fresh", 100.0, {**p, "cpu": 90.0}, 60.0)
    assert "sweep  100.0 s (90 CPU s)" in line and "busiest worker's steps   80.0 s" in line
    assert "rest  34.0]" in line  # 80 - data 30 - compiles 12 - evals 0.5 - ckpts 0.5 - fit 3


def test_hook_times_a_process_without_changing_it(tmp_path):
    """The sitecustomize the bench puts on PYTHONPATH records JAX's compiles and the patched
    functions' calls, and the functions still return what they return."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(first_result.HOOK)
    events = tmp_path / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT)]),
           "CGPT_BENCH_EVENTS": str(events), "JAX_PLATFORMS": "cpu"}
    code = ("import jax, jax.numpy as jnp\n"
            "print(float(jax.jit(lambda x: (x * 2).sum())(jnp.ones(3))))\n"
            "import analysis\n"
            "print(analysis.sweep_report.__wrapped__.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["6.0", "sweep_report"]
    what = [json.loads(line)["what"] for line in events.read_text().splitlines()]
    assert {"compile.trace", "compile.lower", "compile.xla"} <= set(what)
