"""What the sweep tests share (tests/sweep/test_sweep.py, tests/sweep/test_sweep_fuse.py): a
tiny corpus, a spec over it, results.csv's rows, and SIGKILL-ing a sweep once a run has
checkpointed."""
from __future__ import annotations

import csv
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

TOKENS = 20_000  # tiny-17k, batch 8 x seq 32 -> 78 steps


def write_corpus(folder: Path) -> Path:
    """~60 KB of seeded pseudo-text in 24 .txt files: enough for 78 steps + 4 val sequences."""
    rng = random.Random(0)
    words = ["the", "model", "loss", "token", "scaling", "law", "compute", "data", "train",
             "jax", "layer", "width", "depth", "optimal", "budget", "param", "step", "batch"]
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(24):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + "."
                 for _ in range(30)]
        (folder / f"doc{i:02d}.txt").write_text("\n".join(lines) + "\n")
    return folder


def make_spec(tmp: Path, name: str, grid: dict, base: dict | None = None, **extra) -> Path:
    """A sweep spec `tmp/name.yaml` over `grid` on the tiny corpus (vocabulary 300, 32-token
    sequences, batch 8, TOKENS); `base` updates the base's sections, `extra` the spec's keys."""
    corpus = write_corpus(tmp / "corpus")
    b = {"model": {"vocab_size": 300},  # the small corpus's tokenizer: model and data agree
         "data": {"source": str(corpus), "vocab_size": 300, "seq_len": 32, "val_sequences": 4,
                  "cache_dir": str(tmp / "cache")},
         "train": {"batch_size": 8, "tokens": TOKENS}}
    for k, v in (base or {}).items():
        b.setdefault(k, {}).update(v)
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "base": b, "grid": grid, **extra}, sort_keys=False))
    return p


def result_rows(out: Path) -> dict[str, dict]:
    """results.csv of the sweep in `out`, by run id."""
    with open(out / "results.csv", newline="") as f:
        return {r["run_id"]: r for r in csv.DictReader(f)}


def sigkill_once_checkpointed(spec: Path, out: Path, run_id: str, timeout_s: float) -> list[str]:
    """Launch `python -m cgpt.sweep spec --out out`, SIGKILL it once `run_id` has written a
    checkpoint (or after `timeout_s`), and give PR_SET_PDEATHSIG's SIGTERM to its orphaned
    children 2 s to land; returns the command, for the relaunch."""
    cmd = [sys.executable, "-m", "cgpt.sweep", str(spec), "--out", str(out)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ck = out / run_id / "checkpoints"
    deadline = time.time() + timeout_s
    while time.time() < deadline and not any(x.name.isdigit() for x in ck.glob("*")):
        time.sleep(0.5)
    p.send_signal(signal.SIGKILL)
    p.wait()
    time.sleep(2)
    return cmd
