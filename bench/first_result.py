"""Time README command 1 as a newcomer runs it, then again with warm caches, and print its parts.

    python bench/first_result.py [--ref HEAD] [--repo .] [--keep] [--install uv|pip]

Fresh: a clone of REF into a temporary directory, a new virtualenv, HOME an empty directory
(so uv's and pip's caches, ~/.cache/cgpt and any compiled-program cache are all cold), then
command 1 exactly as the README gives it:

    pip install uv && python -m uv pip install -r requirements.txt -e . && \\
        python -m cgpt sweep sweeps/demo.yaml --out runs/demo --parallel 2

(the sweep as the README of the commit timed gives it: `readme_sweep`). (`--install pip`: the install it replaced, `pip install -r requirements.txt && pip install
--no-deps -e .`, for a before/after in one sitting.)

Warm: the same sweep again into a new --out (runs/demo2), same clone, venv and HOME.

The parts come from the runs themselves: a `sitecustomize` put on PYTHONPATH (of the sweep and
of the worker processes it starts) times data loading (`cgpt.data.batches.load_data`: the
corpus, the BPE tokenizer and the token store on a cold cache), evaluations, checkpoint saves
and the end-of-sweep fit (`analysis.sweep_report`), and adds up JAX's compile events (trace,
lowering, XLA); the training steps are each run's `train_time_s` (summary.json). Compiles that
run beside the steps (the worker's compile-ahead thread, a parallel worker) overlap other
parts, so the parts need not add up to the wall clock; the table says what is beyond them.
Report the load (`uptime`, printed before and after) with any figure: the machine is shared.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# README command 1's install (uv: parallel downloads, no byte-compilation of the ~230 MB of
# wheels), and the pip install it replaced
INSTALLS = {"uv": ("pip install uv", "python -m uv pip install -r requirements.txt -e ."),
            "pip": ("pip install -r requirements.txt", "pip install --no-deps -e .")}


def readme_sweep(readme: Path = ROOT / "README.md") -> str:
    """Command 1's sweep as the README gives it, with `{out}` for its --out: what is timed is
    what a newcomer types."""
    for line in readme.read_text().splitlines():
        if line.startswith("pip install") and "cgpt sweep" in line:
            cmd = line.split("&&")[-1].strip()
            if "--out runs/demo" in cmd:
                return cmd.replace("--out runs/demo", "--out {out}")
    raise SystemExit(f"{readme}: no command 1 (`pip install ... && python -m cgpt sweep ... "
                     "--out runs/demo`) in it")


CPU: dict[str, float] = {}  # command -> CPU seconds of it and its children

# Loaded by every Python process of the sweep (PYTHONPATH); writes one JSON line per event to
# $CGPT_BENCH_EVENTS. Patching happens after a module's own code ran, so nothing else changes.
HOOK = r'''
import functools, importlib.abc, importlib.util, json, os, sys, time, threading
_PATH = os.environ.get("CGPT_BENCH_EVENTS")
_lock = threading.Lock()

def _emit(what, dt):
    with _lock, open(_PATH, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "what": what, "t": time.time(), "dt": dt}) + "\n")

def _timed(what, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            _emit(what, time.perf_counter() - t0)
    return wrapper

def _validation(fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        return _timed("eval", fn(*a, **k))
    return wrapper

COMPILE = {"/jax/core/compile/jaxpr_trace_duration": "compile.trace",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "compile.lower",
           "/jax/core/compile/backend_compile_duration": "compile.xla",
           "/jax/compilation_cache/cache_retrieval_time_sec": "compile.cache_read"}

def _jax(mod):
    import jax.monitoring
    def listener(event, secs, **kw):
        if event in COMPILE:
            _emit(COMPILE[event], secs)
    jax.monitoring.register_event_duration_secs_listener(listener)

def _patch(name, mod):
    if name == "jax":
        _jax(mod)
    elif name == "cgpt.data.batches" and hasattr(mod, "load_data"):
        mod.load_data = _timed("data", mod.load_data)
    elif name == "cgpt.train.loop" and hasattr(mod, "_validation"):
        mod._validation = _validation(mod._validation)
    elif name == "cgpt.train.checkpoint" and hasattr(mod, "Checkpointer"):
        mod.Checkpointer.save = _timed("checkpoint", mod.Checkpointer.save)
    elif name == "analysis" and hasattr(mod, "sweep_report"):
        mod.sweep_report = _timed("fit", mod.sweep_report)

class _Loader(importlib.abc.Loader):
    def __init__(self, inner, name):
        self.inner, self.name = inner, name
    def create_module(self, spec):
        return self.inner.create_module(spec)
    def exec_module(self, mod):
        self.inner.exec_module(mod)
        _patch(self.name, mod)

class _Finder(importlib.abc.MetaPathFinder):
    NAMES = {"jax", "cgpt.data.batches", "cgpt.train.loop",
             "cgpt.train.checkpoint", "analysis"}
    def find_spec(self, name, path, target=None):
        if name not in self.NAMES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, name)
        return spec

if _PATH:
    sys.meta_path.insert(0, _Finder())
'''


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def sh(cmd: str, cwd: Path, env: dict, log: Path) -> float:
    """Run `cmd` in a shell; its output goes to `log`; return its wall seconds (its CPU
    seconds, all its processes, go to CPU[cmd]: on a shared machine they move less)."""
    t0, c0 = time.perf_counter(), cpu_children()
    with open(log, "a") as f:
        f.write(f"$ {cmd}\n")
        f.flush()
        rc = subprocess.call(cmd, shell=True, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
    dt = time.perf_counter() - t0
    CPU[cmd] = cpu_children() - c0
    if rc != 0:
        sys.exit(f"`{cmd}` failed (exit {rc}) after {dt:.0f} s; its output: {log}")
    return dt


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                 if ln.startswith("Model name")), "?")


def parts(events: Path, out: Path) -> dict:
    """Seconds per part of one sweep, from the hook's events and the runs' summaries."""
    total = defaultdict(float)
    count = defaultdict(int)
    longest = defaultdict(float)
    if events.is_file():
        for line in events.read_text().splitlines():
            e = json.loads(line)
            total[e["what"]] += e["dt"]
            count[e["what"]] += 1
            longest[e["what"]] = max(longest[e["what"]], e["dt"])
    steps, runs, by_worker = 0.0, 0, defaultdict(float)
    for s in sorted(out.glob("*/summary.json")):
        secs = json.loads(s.read_text())["train_time_s"]
        steps += secs
        runs += 1
        log = s.parent / "train.log"  # its header names the worker process that trained it
        pid = re.search(r"worker process, pid (\d+)", log.read_text()) if log.is_file() else None
        by_worker[pid.group(1) if pid else s.parent.name] += secs
    # data: the longest load (the cold prepare); the compile-ahead's loads of the next runs
    # wait for that one on the cache's lock, so a sum would count the wait again
    compiles = sum(v for k, v in total.items()
                   if k.startswith("compile.") and k != "compile.cache_read")
    return {"data": longest["data"], "compiles": compiles,
            "compile_xla": total["compile.xla"], "compile_cache_read": total["compile.cache_read"],
            "programs": count["compile.xla"], "cache_hits": count["compile.cache_read"],
            "steps": steps, "runs": runs, "workers": len(by_worker),
            "steps_busiest": max(by_worker.values(), default=0.0), "evals": total["eval"], "n_evals": count["eval"],
            "checkpoints": total["checkpoint"], "n_checkpoints": count["checkpoint"],
            "fit": total["fit"]}


def sweep(clone: Path, env: dict, name: str, log: Path) -> tuple[float, dict]:
    events = clone / f"events-{name}.jsonl"
    env = {**env, "CGPT_BENCH_EVENTS": str(events)}
    cmd = readme_sweep(clone / "README.md").format(out=f"runs/{name}")
    wall = sh(cmd, clone, env, log)
    return wall, {**parts(events, clone / "runs" / name), "cpu": CPU[cmd]}


def row(label: str, wall: float, p: dict, install: float | None) -> str:
    """One line of parts. The steps are summed over the runs and, with several workers, given
    for the busiest one too (its runs' steps one after another); what is beyond that worker's
    steps is wall time the steps do not explain. `rest` is what no part covers: interpreter
    start-up and imports, run set-up, the sweep's own work (negative when parts overlap:
    compiles beside the steps, the other worker's parts)."""
    beyond = wall - p["steps_busiest"]
    rest = beyond - p["data"] - p["compiles"] - p["evals"] - p["checkpoints"] - p["fit"]
    return (f"{label:6s} install {install if install is not None else 0:6.1f} s | sweep {wall:6.1f} s "
            f"({p['cpu']:.0f} CPU s): "
            f"steps {p['steps']:6.1f} s ({p['runs']} runs in {p['workers']} worker(s), the "
            f"busiest {p['steps_busiest']:.1f}), beyond the busiest worker's steps {beyond:6.1f} s "
            f"[data {p['data']:5.1f} (first load), compiles {p['compiles']:5.1f} ({p['programs']} programs, "
            f"{p['cache_hits']} from the persistent cache; XLA {p['compile_xla']:.1f}, cache reads "
            f"{p['compile_cache_read']:.1f}), "
            f"evals {p['evals']:4.1f} ({p['n_evals']}), checkpoints {p['checkpoints']:4.1f} "
            f"({p['n_checkpoints']}), fit {p['fit']:4.1f}, rest {rest:5.1f}]")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default=str(ROOT), help="git repository to clone (default: this one)")
    ap.add_argument("--ref", default="HEAD", help="commit to time (default: HEAD; commit first)")
    ap.add_argument("--python", default=sys.executable, help="interpreter that makes the venv")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    ap.add_argument("--install", choices=sorted(INSTALLS), default="uv",
                    help="uv: README command 1's install (default); pip: the one it replaced")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="cgpt-first-"))
    clone, home, hook = tmp / "cgpt", tmp / "home", tmp / "hook"
    home.mkdir()
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    log = tmp / "log.txt"
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "PIP_", "UV_", "XDG_", "CGPT", "JAX_", "XLA_", "HF_",
                                 "VIRTUAL_ENV"))}
    env = {**base, "HOME": str(home), "PATH": f"{clone / '.venv' / 'bin'}:{base['PATH']}",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores; load before: {uptime()}", flush=True)
    print(f"work directory: {tmp} (log: {log})", flush=True)
    commit = subprocess.run(["git", "-C", args.repo, "rev-parse", "--short", args.ref],
                            capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", args.repo, str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    venv = sh(f"{args.python} -m venv .venv", clone, env, log)
    steps = INSTALLS[args.install]
    install = sum(sh(c, clone, env, log) for c in steps)
    install_cpu = sum(CPU[c] for c in steps)
    print(f"commit {commit}: venv {venv:.1f} s, install {install:.1f} s ({install_cpu:.0f} CPU s: "
          f"{' && '.join(steps)})", flush=True)
    env["PYTHONPATH"] = str(hook)
    fresh_wall, fresh = sweep(clone, env, "demo", log)
    print(row("fresh", fresh_wall, fresh, install), flush=True)
    science = [ln for ln in log.read_text().splitlines()[-60:]
               if re.search(r"\bb\s+= |extrapolat|runs, ", ln)]
    print("\n".join(f"        | {ln}" for ln in science), flush=True)
    total = install + fresh_wall
    print(f"        command 1 fresh: {total:.1f} s ({int(total // 60)} min {total % 60:.0f} s)",
          flush=True)
    warm_wall, warm = sweep(clone, env, "demo2", log)
    print(row("warm", warm_wall, warm, None), flush=True)
    print(f"        command 1 warm (rerun into a new --out): {warm_wall:.1f} s "
          f"({warm_wall / (install + fresh_wall):.0%} of fresh)", flush=True)
    print(f"load after: {uptime()}", flush=True)
    report = (clone / "runs" / "demo" / "results.csv")
    print(f"results: {report} ({sum(1 for _ in open(report)) - 1} runs)" if report.is_file()
          else "no results.csv", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "commit": commit, "install_s": install, "install_cpu_s": install_cpu,
            "fresh_sweep_s": fresh_wall, "fresh": fresh,
            "warm_sweep_s": warm_wall, "warm": warm}, indent=1) + "\n")
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
