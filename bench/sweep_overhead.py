"""Per-run overhead of a sweep with and without JAX's persistent compilation cache.

Runs the same sweep spec three times into fresh directories, in this one run:
  1. --no-compile-cache                     (every run compiles its programs)
  2. a fresh shared cache (cold)            (what a first launch pays)
  3. the cache filled by 2 (warm)           (a relaunch, or the same shapes again)
and prints, per run and on average, the overhead = the run's process seconds (from the
train.log header the sweep writes at its start, to summary.json; 1 s resolution) minus its
training-step time (`train_time_s`, the steps after the first): interpreter start, imports,
data, compilation, evaluation, checkpoints.

    python bench/sweep_overhead.py [--spec sweeps/demo.yaml] [--only PATTERN]
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

from cgpt.sweep import launch, load_sweep, select


def one(spec: str, only: str | None, out: Path, cache: Path | None) -> dict:
    """{run_id: (overhead s, process s)} of one launch into `out`, plus the sweep's wall."""
    sweep = load_sweep(spec)
    t0 = time.perf_counter()
    assert launch(sweep, out, only=only, compile_cache=cache) == 0
    res = {"_sweep_wall": (time.perf_counter() - t0,) * 2}
    for r in select(sweep.runs, only):
        d = out / r.run_id
        # process start: the train.log header the sweep writes just before starting it
        header = re.search(r"==== cgpt sweep (\S+ \S+):", (d / "train.log").read_text())
        start = time.mktime(time.strptime(header.group(1), "%Y-%m-%d %H:%M:%S"))
        seconds = (d / "summary.json").stat().st_mtime - start
        s = json.loads((d / "summary.json").read_text())
        res[r.run_id] = (seconds - s["train_time_s"], seconds)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="sweeps/demo.yaml")
    ap.add_argument("--only")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cgpt-bench-sweep-"))
    try:
        cache = tmp / "jax_cache"
        res = {"no cache": one(args.spec, args.only, tmp / "a", None),
               "cold cache": one(args.spec, args.only, tmp / "b", cache),
               "warm cache": one(args.spec, args.only, tmp / "c", cache)}
        runs = [k for k in res["no cache"] if not k.startswith("_")]
        print(f"{'run':28s} " + " ".join(f"{k:>22s}" for k in res))
        for rid in runs:
            print(f"{rid:28s} " + " ".join(
                f"{res[k][rid][0]:9.1f}s of {res[k][rid][1]:6.1f}s" for k in res))
        mean = {k: sum(v[r][0] for r in runs) / len(runs) for k, v in res.items()}
        print(f"{'mean overhead per run':28s} " + " ".join(f"{mean[k]:21.1f}s" for k in res))
        print(f"{'sweep wall':28s} " + " ".join(f"{res[k]['_sweep_wall'][0]:21.1f}s" for k in res))
        print(f"warm cache / no cache overhead: {mean['warm cache'] / mean['no cache']:.2f}x; "
              f"cold: {mean['cold cache'] / mean['no cache']:.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
