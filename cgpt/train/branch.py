"""Cooldown branches: one WSD run, several budgets (`cgpt train --branch-from RUN@STEP`).

A warmup-stable-decay run holds the peak LR until its final `decay_fraction` of steps, and the
stable phase is the same for every budget with the same warmup. So a checkpoint at step S of
the stable phase can start the decay of any budget whose own decay starts at or after S: the
branch reloads params and optimizer state at S, continues with the same batches (they are a
pure function of the step) and its own schedule. The branch directory is a normal run
directory; its `metrics.jsonl` starts with the parent's lines up to S, so its training curve is
complete, and `branch.json` records where it came from.
"""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from cgpt.config import backend
from cgpt.errors import BranchError
from cgpt import rundir
from cgpt.model import orbax_format, orbax_quiet
from cgpt.fileio import atomic_write_text
from cgpt.config.run import RunConfig, cadence, from_dict
from cgpt.train.resolve import resolve

def parse_spec(spec: str) -> tuple[Path, int]:
    """'runs/x@1200' -> (Path('runs/x'), 1200)."""
    m = re.fullmatch(r"(.+)@(\d+)", spec.strip())
    if not m:
        raise BranchError(f"--branch-from {spec!r}: expected RUN@STEP, e.g. runs/wsd@1200")
    return Path(m.group(1)), int(m.group(2))


def parent_config(parent: Path) -> RunConfig:
    """The parent run's config (its config.yaml), with errors naming the file."""
    if not (parent / rundir.CONFIG_FILE).is_file():
        raise BranchError(f"--branch-from: {parent} is not a run directory (no "
                          f"{rundir.CONFIG_FILE})")
    return from_dict(rundir.read_config(parent), str(parent / rundir.CONFIG_FILE))


def check_branch(parent_run: RunConfig, parent_recipe, run: RunConfig, recipe, step: int,
                 parent: Path) -> None:
    """Refuse a branch whose first `step` steps would not equal the parent's."""
    if parent_recipe.schedule != "wsd":
        raise BranchError(f"--branch-from: {parent} uses train.schedule={parent_recipe.schedule}; "
                          "cooldown branches need a wsd run (train.schedule=wsd)")
    same = {k: (getattr(parent_recipe, k), getattr(recipe, k))
            for k in ("peak_lr", "warmup_steps", "batch_size", "schedule", "adam_eps",
                      "weight_decay", "clip_norm", "b1", "b2")}
    diff = [f"{k} ({a} vs {b})" for k, (a, b) in same.items() if a != b]
    # remat is how a step runs (the fit may choose it), not what is trained
    same_model = parent_run.model.replace(remat=run.model.remat) == run.model
    if not same_model or parent_run.data != run.data:
        diff.append("the model or data section")
    if diff:
        raise BranchError(f"--branch-from: the branch differs from {parent} in {', '.join(diff)}; "
                          "a branch may change only the budget (--tokens) and the decay")
    if step > parent_recipe.decay_start:
        raise BranchError(f"--branch-from {parent}@{step}: step {step} is past the parent's "
                          f"stable phase (its decay starts at step {parent_recipe.decay_start})")
    if step > recipe.decay_start:
        raise BranchError(f"--branch-from {parent}@{step}: a budget of {recipe.total_steps} steps "
                          f"starts its decay at step {recipe.decay_start}, before {step}; branch "
                          "from an earlier checkpoint or raise --tokens")


def branch_run(parent: Path, run: RunConfig) -> RunConfig:
    """The branch's config: the asked one, with the parent's resolved warmup made explicit
    (the CPU warmup rule scales with the run's length, which would change the stable phase)."""
    warmup = resolve(parent_config(parent)).recipe.warmup_steps
    if run.train.warmup_steps is None:
        run = replace(run, train=replace(run.train, warmup_steps=warmup))
    return run


def precheck(branch_from: tuple[Path, int], run: RunConfig) -> None:
    """Everything `begin` checks that needs no JAX, before the launch writes a file: a branch
    that cannot be made leaves nothing in its --out that blocks the next launch."""

    parent, step = branch_from
    parent_run = parent_config(parent)
    # an "auto" compute dtype is the parent's, as `train` resolves it (cgpt.train.resume)
    run = replace(run, model=backend.resolve(run.model, saved=parent_run.model))
    check_branch(parent_run, resolve(parent_run).recipe, run, resolve(run).recipe, step,
                 parent)
    ckpts = parent / rundir.CKPT_DIR
    steps = sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) \
        if ckpts.is_dir() else []
    if step not in steps:
        raise BranchError(f"--branch-from {parent}@{step}: no checkpoint at step {step} in "
                          f"{ckpts} (have {steps}); the parent must keep it (train.ckpt_every, "
                          "train.keep_checkpoints)")
    log = parent / rundir.METRICS_FILE
    if not log.exists():  # read as no records, the branch's log would lack the parent's steps
        raise BranchError(f"--branch-from {parent}@{step}: {log} is missing; a branch's log "
                          f"begins with its parent's up to step {step}: restore it, then rerun")
    rundir.read_metrics(log, step)  # a damaged log fails here, not later


def restore(parent: Path, step: int, abstract_params, abstract_opt_state):
    """(params, opt_state) of the parent's checkpoint at `step`."""
    import orbax.checkpoint as ocp  # loads JAX: only when this runs

    mngr = orbax_format.manager(parent, create=False)
    try:
        steps = sorted(mngr.all_steps())
        if step not in steps:
            raise BranchError(f"--branch-from {parent}@{step}: no checkpoint at step {step} in "
                              f"{parent / rundir.CKPT_DIR} (have {steps}); the parent must "
                              "keep it (train.ckpt_every, train.keep_checkpoints)")
        try:
            out = orbax_quiet.quiet_restore(lambda: mngr.restore(step, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract_params),
                opt_state=ocp.args.StandardRestore(abstract_opt_state))))
        except Exception as e:  # orbax/tensorstore raise many types for bad files
            raise BranchError(
                f"--branch-from {parent}@{step}: checkpoint {parent / rundir.CKPT_DIR / str(step)}"
                f" is unreadable ({orbax_format.brief(e)}); branch from another kept checkpoint "
                f"(have {steps}); nothing was written") from None
    finally:
        mngr.close()
    return out["params"], out["opt_state"]


def start_log(parent: Path, out: Path, step: int) -> None:
    """The branch's metrics.jsonl begins with the parent's lines up to `step`; branch.json."""
    lines = [line for line, _ in rundir.read_metrics(parent / rundir.METRICS_FILE, step, raw=True)]
    atomic_write_text(out / rundir.METRICS_FILE, "".join(x + "\n" for x in lines))
    atomic_write_text(out / rundir.BRANCH_FILE, json.dumps({"parent": str(parent), "step": step}))


def begin(branch_from: tuple[Path, int], run: RunConfig, recipe, out: Path, abstract_params,
          abstract_opt_state):
    """Check the branch, load the parent's state at the step and start the branch's log."""
    parent, step = branch_from
    parent_run = parent_config(parent)
    check_branch(parent_run, resolve(parent_run).recipe, run, recipe, step, parent)
    params, opt_state = restore(parent, step, abstract_params, abstract_opt_state)
    start_log(parent, out, step)
    return params, opt_state


def plan_branches(parent: RunConfig, fractions: list[float],
                  where: str = "grid.branches") -> tuple[RunConfig, list[tuple[RunConfig, int]]]:
    """One run, several budgets (the sweep's `branches:` axis).

    Returns the parent's config (made WSD, keeping every checkpoint) and, per fraction f of its
    budget, the branch's config and the parent step to branch from: the last checkpoint at or
    before the branch's own decay start (the branch trains at the peak LR up to there, exactly
    as an independent run of its budget would with the same warmup). Every branch keeps the
    parent's warmup (10% of the parent's steps, so 40% of a branch at f = 0.25): that is what
    makes the stable phase shared, and it costs the short branches a little loss against a run
    warmed up for its own length (measured in docs/analysis.md).
    """
    bad = [f for f in fractions if not (isinstance(f, (int, float)) and 0 < f < 1)]
    if bad:
        raise ValueError(
            f"{where}: entries are fractions of each run's budget in (0, 1), got {bad}")
    t = parent.train
    plan = resolve(replace(parent, train=replace(t, schedule="wsd")))
    every = cadence(t.ckpt_every, plan.total_steps)  # the parent's checkpoint steps
    parent = replace(parent, train=replace(
        t, schedule="wsd", warmup_steps=plan.recipe.warmup_steps, ckpt_every=every,
        keep_checkpoints=max(t.keep_checkpoints, plan.total_steps // every + 1)))
    out = []
    for f in sorted(fractions):
        cfg = replace(parent, train=replace(parent.train, tokens=max(1, round(f * plan.tokens))))
        step = resolve(cfg).recipe.decay_start // every * every
        if step < 1:
            raise ValueError(f"{where}: the branch at {f:g} of the budget decays before the "
                             f"parent's first checkpoint (step {every}); set a smaller "
                             "train.ckpt_every or drop that fraction")
        out.append((cfg, step))
    return parent, out
