"""What `train.wandb` costs a training step: the same tiny run trained with and without W&B
(offline: nothing leaves the machine), interleaved in one process so load drifts hit both arms
alike, after one warm-up run each; plus the cost of one `WandbRun.log` call alone.

    WANDB_MODE=offline python bench/wandb_overhead.py [--pairs 3] [--steps 200]

steps/s is `steps / train_time_s` of each run's summary.json (the timed training loop, which
includes the logging: log_every=1, the worst case, a W&B record every step).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path


def _run(corpus: Path, cache: Path, steps: int, wandb: str | None):
    from cgpt.config.data import DataConfig
    from cgpt.config.model import get_config
    from cgpt.config.run import RunConfig, TrainConfig

    return RunConfig(
        preset="tiny-17k", model=get_config("tiny-17k"),
        data=DataConfig(source=str(corpus), vocab_size=512, seq_len=16, val_sequences=16,
                        cache_dir=str(cache)),
        train=TrainConfig(tokens=8 * 16 * steps, batch_size=8, log_every=1, eval_every=steps,
                          ckpt_every=steps, peak_lr=3e-3, wandb=wandb))


def log_call_us(tmp: Path, calls: int = 2000) -> dict:
    """Microseconds per `WandbRun.log` of a metrics.jsonl-sized record (offline): what the
    training loop pays (a queue put), and what the sending thread spends per record."""
    import wandb

    from cgpt.train.wandb_log import WandbRun

    w = WandbRun(tmp / "calls")
    w.attach(wandb.init(project="overhead", dir=tmp, reinit="create_new"))
    rec = {"loss": 3.1, "grad_norm": 0.5, "lr": 1e-3, "tokens": 128, "epoch": 0.1,
           "tokens_per_s": 9e3, "mfu": 0.05}
    t0 = time.perf_counter()
    for s in range(1, calls + 1):
        w.log({"step": s, **rec})
    queued = time.perf_counter() - t0
    w.end(None)  # joins the sender: every record reached W&B
    sent = time.perf_counter() - t0
    return {"caller_us": round(queued / calls * 1e6, 1),
            "sender_us": round(sent / calls * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    if os.environ.get("WANDB_MODE") != "offline":
        raise SystemExit("set WANDB_MODE=offline: this bench sends nothing anywhere")
    from cgpt.train.loop import train

    tmp = Path(tempfile.mkdtemp(prefix="wandb_overhead_"))
    os.environ.setdefault("WANDB_SILENT", "true")
    for k in ("CONFIG", "CACHE", "DATA", "ARTIFACT"):
        os.environ.setdefault(f"WANDB_{k}_DIR", str(tmp / "wandb_home" / k.lower()))
    corpus = tmp / "corpus"
    corpus.mkdir()
    lib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py"):
        shutil.copy(lib / name, corpus / name)
    rates: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for i in range(args.pairs + 1):  # pair 0 warms both arms up (data, compiles, W&B)
            for arm in (("off", "on") if i % 2 else ("on", "off")):
                run = _run(corpus, tmp / "cache", args.steps, "overhead" if arm == "on" else None)
                s = train(run, tmp / f"{arm}{i}", progress=False)
                if i:
                    rates[arm].append(s["steps"] / s["train_time_s"])
        us = log_call_us(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(json.dumps({"steps": args.steps, "pairs": args.pairs,
                      "steps_per_s_off": [round(x, 1) for x in rates["off"]],
                      "steps_per_s_on": [round(x, 1) for x in rates["on"]],
                      "median_off": round(off, 1), "median_on": round(on, 1),
                      "on_over_off": round(on / off, 3), "log_call": us,
                      "load": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
