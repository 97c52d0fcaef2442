"""Continuing a run: which config a launch trains with, what `--resume` may change, and the
advice a stopped run gives.

A run directory's `config.yaml` fixes what its checkpoints mean. `--resume` must ask for the
same run (`cgpt.config.run.identity`, the sweep's rule too): placement may always change,
since checkpoints restore into any layout, and so may data.cache_dir (where the same data is
cached); `--allow-train-changes` accepts new values of the keys with the "changeable" role
(the optimizer's, the cadences), recorded with the step they took effect in
`config_changes.json`.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from cgpt.config import backend
from cgpt.config.run import RunConfig, TrainConfig, config_diff, from_dict, identity, keys, \
    with_placement
from cgpt.errors import TrainError
from cgpt.fileio import atomic_write_text
from cgpt import rundir
from cgpt.train import checkpoint



def _changeable(diff: list[str]) -> list[str]:
    """The names in `diff` that `--allow-train-changes` may change."""
    ok = {f"train.{k}" for k in keys(TrainConfig, "changeable")}
    return [d for d in diff if d in ok]


def check_config(run: RunConfig, out: Path, resume: bool, allow_changes: bool = False,
                 platform: str | None = None) -> RunConfig:
    """The config to train with; on resume, the saved one (and it must match what was asked).

    `allow_changes` accepts differences in "changeable" keys (e.g. a lower train.peak_lr after
    a NaN): the run continues with the new values. An "auto" compute dtype becomes the
    platform's (or, resuming, the saved run's) before anything is compared or written."""
    saved = out / rundir.CONFIG_FILE
    if not saved.exists():
        return replace(run, model=backend.resolve(run.model, platform))
    if not resume:
        raise TrainError(f"{out} already holds a run ({saved.name}) and this launch does not "
                         "resume it (--no-resume); to continue it, pass --resume (`cgpt train`'s "
                         "default for a run directory), or choose a new --out")
    prior = from_dict(rundir.read_config(out), str(saved))
    run = replace(run, model=backend.resolve(run.model, platform, saved=prior.model))
    # Placement may change between launches (checkpoints restore into any mode's layout).
    prior = with_placement(prior, run)
    # where prepared data is cached may move (as $CGPT_CACHE may): the store is the same data
    prior = replace(prior, data=replace(prior.data, cache_dir=run.data.cache_dir))
    diff = config_diff(identity(prior.to_dict()), identity(run.to_dict()))
    if diff:
        changeable = _changeable(diff) == diff
        if changeable and allow_changes:
            return run
        hint = (" (to continue with the new values, add --allow-train-changes)" if changeable
                else "")
        named = [f"preset ({prior.preset} saved, {run.preset} asked)" if d == "preset" else d
                 for d in diff]
        raise TrainError(f"{out} holds a run whose config ({saved}) differs from the one asked "
                         f"for in {', '.join(named)}{hint}; resume with the same flags to "
                         "continue it, or choose a new --out to train the new config")
    return prior


def record_changes(out: Path, prior: dict | None, run: RunConfig, start: int) -> list[dict]:
    """config_changes.json: the train.* values changed on a resume, with the step they took
    effect (a rewind moves later entries back to the step it resumed from)."""
    path = out / rundir.CHANGES_FILE
    log = rundir.read_changes(path)
    log = [{**c, "step": min(c["step"], start)} for c in log]
    new = run.to_dict()
    diff = _changeable(config_diff(prior, new) if prior is not None else [])
    if diff:
        log.append({"step": start, **{d: [prior["train"][d[6:]], new["train"][d[6:]]]
                                      for d in diff}})
    if log or path.exists():
        atomic_write_text(path, json.dumps(log, indent=1))
    return log


def nonfinite_stop(what: str, step: int, kept: list[int], out: Path, note: str = "") -> TrainError:
    """The message of a run stopped by a non-finite step, with advice that works."""
    if not kept:
        return TrainError(
            f"{what} at step {step}{note}; training stopped. No checkpoint was written yet; lower "
            "train.peak_lr (or raise train.warmup_steps) and rerun the same command with "
            "--resume --allow-train-changes train.peak_lr=<lower>")
    earlier = (f"; if the loss was already diverging there (see metrics.jsonl), go back further "
               f"with --from-step {kept[-2]}" if len(kept) > 1 else "")
    return TrainError(
        f"{what} at step {step}{note}; training stopped before saving anything from it. The "
        f"last good checkpoint (step {kept[-1]}, verified finite) is kept in "
        f"{out / rundir.CKPT_DIR}"
        f" (kept steps: {', '.join(map(str, kept))}). To continue with a lower learning rate, "
        "rerun the same command with --resume --allow-train-changes train.peak_lr=<lower> "
        f"(or a larger train.warmup_steps){earlier}; or start over in a new --out")
