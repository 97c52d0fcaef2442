"""Fused against --no-fuse sweeps, and the demo's overhead (#21, item 5), in one run.

    python bench/fuse.py                       # (a), (b) and (c) at full size
    python bench/fuse.py --cases b --runs 4    # 4 seeds of tiny-45k only
    python bench/fuse.py --scale 0.25          # every token budget x 0.25 (a quick look)

(a) the learning-rate grid of sweeps/mup_transfer.yaml at its two smallest widths (w16, w32,
    μP and SP, 7 LRs: 28 runs in 4 groups of 7); (b) N seeds (init and batch order) of
    tiny-45k at its Chinchilla budget, f32; (c) sweeps/demo.yaml: its wall time against the
    sum of its training-step time (`train_time_s`, the steps after the first; the issue's
    target is at most 1.3x).

Each case is launched with `cgpt sweep` exactly as a user would (`cgpt.sweep.launch`: its
process start, imports, data, compiles, evaluation and checkpoints included), once fused and
once with --no-fuse, into fresh directories; each launch gets a fresh persistent
compilation cache, so neither arm reuses the other's compiles. The data are prepared before
anything is timed. Prints wall-clock seconds, the ratio, and the largest |val_loss|
difference between the arms (they train the same runs).
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rows(out: Path) -> dict[str, dict]:
    with open(out / "results.csv", newline="") as f:
        return {r["run_id"]: r for r in csv.DictReader(f)}


def _launch(sweep, out: Path, fuse: bool, only: str | None) -> tuple[float, dict]:
    from cgpt.sweep import launch

    t0 = time.perf_counter()
    with redirect_stdout(io.StringIO()):
        rc = launch(sweep, out, only=only, fuse=fuse, report=False)
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"bench/fuse.py: the sweep in {out} did not finish (rc {rc}); see its "
                         "results.csv and train.log files")
    return wall, _rows(out)


def _steps_s(out: Path, rows: dict) -> float:
    """Training-step seconds of a sweep: each program's once (a fused group's members share)."""
    import json

    seen = {}
    for rid in rows:
        s = json.loads((out / rid / "summary.json").read_text())
        key = (s["placement"].get("fused"), round(s["train_time_s"], 6))
        seen[key if s["placement"].get("fused") else rid] = s["train_time_s"]
    return sum(seen.values())


def compare(name: str, sweep, root: Path, only: str | None = None) -> None:
    """One spec fused and with --no-fuse; prints the wall-clock ratio."""
    walls, rows = {}, {}
    for fuse in (True, False):
        out = root / f"{name}-{'fused' if fuse else 'nofuse'}"
        walls[fuse], rows[fuse] = _launch(sweep, out, fuse, only)
        steps = _steps_s(out, rows[fuse])
        print(f"  {'fused   ' if fuse else '--no-fuse'}: {walls[fuse]:7.1f} s wall, "
              f"training steps {steps:7.1f} s ({len(rows[fuse])} runs)", flush=True)
    diff = max(abs(float(rows[True][k]["val_loss"]) - float(rows[False][k]["val_loss"]))
               for k in rows[True])
    print(f"  ({name}) fused is {walls[False] / walls[True]:.2f}x faster in wall-clock time; "
          f"largest |val_loss| difference {diff:.1e}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="abc", help="which of a, b, c to run (default: abc)")
    ap.add_argument("--runs", type=int, default=8, help="(b): seeds 0..runs-1")
    ap.add_argument("--preset", default="tiny-45k", help="(b): the model")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="token budgets x this (1: the specs' own; smaller: a quick look)")
    ap.add_argument("--out", help="where the sweeps go (default: a temporary directory)")
    a = ap.parse_args()

    import jax

    from cgpt.config.model import get_config
    from cgpt.data.batches import load_data
    from cgpt.sweep import load_sweep

    print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.out or tmp)
        root.mkdir(parents=True, exist_ok=True)
        if "a" in a.cases:
            sets = [f"train.tokens={int(160_000 * a.scale)}"] if a.scale != 1 else []
            s = load_sweep(REPO / "sweeps" / "mup_transfer.yaml", sets)
            load_data(s.runs[0].config.data)
            print(f"(a) mup_transfer.yaml, widths 16 and 32, 7 LRs, μP and SP "
                  f"({s.runs[0].steps} steps each):", flush=True)
            compare("a", s, root, only="w16-*,w32-*")
        if "b" in a.cases:
            tokens = get_config(a.preset).chinchilla_tokens() * a.scale
            spec = root / "b.yaml"
            spec.write_text(f"name: seeds\nbase:\n  model: {{compute_dtype: float32}}\n"
                            f"  train: {{tokens: {int(tokens)}}}\ngrid:\n  model: [{a.preset}]\n"
                            f"  seed: [{', '.join(map(str, range(a.runs)))}]\n")
            s = load_sweep(spec)
            load_data(s.runs[0].config.data)
            print(f"(b) {a.runs} seeds of {a.preset} ({s.runs[0].steps} steps of "
                  f"{s.runs[0].batch_size} x {s.runs[0].config.data.seq_len}, f32):", flush=True)
            compare("b", s, root)
        if "c" in a.cases:
            s = load_sweep(REPO / "sweeps" / "demo.yaml")
            load_data(s.runs[0].config.data)
            wall, rows = _launch(s, root / "demo", True, None)
            steps = _steps_s(root / "demo", rows)
            print(f"(c) demo.yaml, {len(rows)} runs: {wall:.1f} s wall, training steps "
                  f"{steps:.1f} s: wall = {wall / steps:.2f}x the training steps (target <= 1.3x)",
                  flush=True)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
