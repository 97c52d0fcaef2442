"""`summary.json`: what a finished run reports, computed from its resolved config, final
parameters and log alone, so a resumed run's summary equals the uninterrupted one's (except
the wall-clock fields, which time only the last launch). The step record's fields are reduced
as `cgpt.record` declares."""
from __future__ import annotations

import json
import math
from pathlib import Path

from cgpt import record, rundir
from cgpt.config import flops
from cgpt.fileio import atomic_write_text
from cgpt.train.mfu import Throughput


def write(out: Path, summary: dict) -> None:
    atomic_write_text(Path(out) / rundir.SUMMARY_FILE, json.dumps(summary, indent=2))


def build(life, val_loss: float, speed: Throughput, wall_time_s: float,
          placement: dict) -> dict:
    """The summary of a run at the end of its launch (`life`, a `cgpt.train.lifecycle.
    Lifecycle`: its fitted `Resolved`, directory, data, first step and recorded changes),
    from its log: the step record's "mean" fields (train_loss: the mean logged loss of the
    last `train_loss_window` steps) and "last" ones (the gradient noise scale, train.gns:
    the smoothed one of the last logged step); its "final" ones are this launch's."""
    res, out, data, start, changes = life.res, life.out, life.data, life.start, life.changes
    cfg, total = res.cfg, res.total_steps
    path = out / rundir.METRICS_FILE
    log = rundir.read_metrics(path)
    means = {f.key: rundir.window_mean(path, total, f.name, f.key)
             for f in record.summarized("mean")}
    last = {f.key: log[-1].get(f.name, math.nan) for f in record.summarized("last")
            if any(f.name in r for r in log)}
    # a launch that trained no timed step (resumed at its end) reports the log's last speed
    tps = speed.tokens_per_s if speed.seconds else log[-1].get("tokens_per_s", math.nan)
    tokens = res.tokens_trained
    summary = {
        "model": cfg.name, "n_params": cfg.num_params(),
        "n_params_nonembed": cfg.num_params(embedding=False), "tokens": tokens,
        "tokens_budget": res.tokens, "flops": flops.train_flops(cfg, tokens, res.seq_len),
        "flops_6nd": flops.flops_6nd(cfg, tokens), **means, "val_loss": val_loss,
        "steps": total, "batch_size": res.batch_size, "seq_len": res.seq_len,
        "wall_time_s": wall_time_s, "train_time_s": speed.seconds, "resumed_from_step": start,
        "tokens_per_s": tps, "mfu": speed.mfu(tps),
        # MFU above counts causal attention once (MaxText/PaLM); this one the full T x T
        "mfu_full_attention": speed.mfu_full_attention(tps), "peak_flops_source": speed.peak_source,
        "epochs": data.epochs_for_tokens(tokens), "mup": cfg.mup, "mode": res.run.train.mode,
        "devices": res.num_devices, "placement": placement,
        "peak_lr": res.recipe.peak_lr, "warmup_steps": res.recipe.warmup_steps,
        "decay": res.recipe.decay, "config_changes": changes,
        # the run's own copy (relative to the run directory), the same after a resume
        "data": {**data.describe(), "tokenizer": rundir.TOKENIZER_FILE},
    }
    summary.update(last)
    return json.loads(rundir.json_line(summary, default=str))
