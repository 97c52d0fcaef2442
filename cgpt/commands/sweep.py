"""`cgpt sweep SPEC`: the command line (registered into `cgpt`'s subcommands by
`cgpt.cli.commands`) over the sweep library (`cgpt.sweep`), with the report and --suggest
that read a sweep's results through `analysis`."""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from cgpt import rundir, stop
from cgpt.paths import check_destination
from cgpt.commands.report import report
from cgpt.commands.suggest import print_suggestions
from cgpt.sweep.fitcheck import fit_results, print_fit
from cgpt.sweep.groups import fit_groups, plan_groups, print_groups
from cgpt.sweep.launcher import EXECUTORS, ON_CHANGE, check_identity, launch, print_table
from cgpt.sweep.resources import print_resources
from cgpt.sweep.spec import load_sweep, select

# a `--set` item (or a bare override): section.key=value, e.g. train.peak_lr=1e-3, slurm.nodes=2
_OVERRIDE = re.compile(r"^[A-Za-z_]\w*\.[\w.]+=")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="?", help="sweep spec YAML (see sweeps/*.yaml and docs/sweeps.md)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value",
                   help="the same as --set: may stand anywhere on the line, as train's do")
    p.add_argument("--out", help="sweep directory (default: runs/sweeps/<spec name>)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the runs with N, D, FLOPs and estimated time, and for a spec "
                   "with GPUs and estimate.device_memory each run's compiled step: mesh, "
                   "micro-batch x accumulation, remat, memory per device, fits; then exit")
    p.add_argument("--no-fit", action="store_true",
                   help="--dry-run: skip compiling each run's step (the fit columns)")
    p.add_argument("--parallel", type=int,
                   help="runs at a time: local default 1 (each run pinned to its own GPUs, or "
                   "its share of the cores); slurm default slurm.array_parallelism or all")
    p.add_argument("--executor", default="local", choices=EXECUTORS,
                   help="local subprocesses, a SLURM job array via submitit, or submitit's "
                   "local executor (the SLURM code path on this machine)")
    p.add_argument("--only", metavar="PATTERN",
                   help="run only ids matching these comma-separated globs (or substrings)")
    p.add_argument("--set", dest="sets", nargs="+", action="extend", default=[],
                   metavar="section.key=value",
                   help="override every run (data.source=..., train.batch_size=16) or the "
                   "slurm:/estimate: sections (slurm.partition=gpu)")
    p.add_argument("--on-change", default="error", choices=ON_CHANGE,
                   help="a run directory trained with a different config: 'error' (default) "
                   "names the differing keys; 'rerun' moves it to DIR/.superseded/ and trains anew")
    p.add_argument("--suggest", type=int, metavar="K",
                   help="for a finished sweep: print the next K runs (analysis.suggest_runs: "
                   "most shrinkage of the forecast at --target-flops per FLOP), then exit")
    p.add_argument("--write", action="store_true",
                   help="--suggest: also write SPEC_next.yaml, the spec plus the runs (runs:)")
    p.add_argument("--target-flops", type=float,
                   help="--suggest: the compute to forecast (default 100x the largest run)")
    p.add_argument("--budget-flops", type=float,
                   help="--suggest: compute for the new runs, 6ND (default: the sweep's own)")
    p.add_argument("--fit-min-flops", type=float,
                   help="--suggest: leave runs below this compute (6ND) out of the fit, e.g. a "
                   "smallest budget of a few hundred steps that sits off the law (default: "
                   "fit every finished run)")
    p.add_argument("--no-fuse", action="store_true",
                   help="train every run as its own job; by default runs of one shape that "
                   "differ only in seed, data order or optimizer hyperparameters train as one "
                   "vmapped program per group (--dry-run lists the groups)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (the runs' own bars are never shown: their output goes "
                   "to each run's train.log)")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="do not use JAX's persistent compilation cache (~/.cache/cgpt/jax, "
                   "or $CGPT_CACHE/jax), which the runs of this and every later sweep share")


def register(subparsers) -> argparse.ArgumentParser:
    """Add `sweep` to cgpt's subcommands (`cgpt.cli.commands`: `sweep.register(sub)`)."""
    p = subparsers.add_parser(
        "sweep", help="launch a grid of training runs from a spec (resumable)",
        description="Expand a sweep spec into runs and train each as its own process. "
        "Relaunching the same command skips finished runs and resumes interrupted ones. "
        "`cgpt sweep compare DIR_A DIR_B [--at C]` compares two finished sweeps (the compute "
        "multiplier of recipe B over A; --help there).")
    add_arguments(p)
    p.set_defaults(func=cmd_sweep)
    return p


def split_spec_and_sets(args: argparse.Namespace) -> tuple[str, list[str]]:
    """argparse gives `--set a.b=1 spec.yaml` the spec as one more --set value: sort the
    tokens back into the one spec path and the section.key=value overrides."""
    tokens = ([args.spec] if args.spec else []) + list(args.overrides) + list(args.sets)
    sets = [t for t in tokens if _OVERRIDE.match(t)]
    paths = [t for t in tokens if not _OVERRIDE.match(t)]
    if len(paths) != 1:
        raise ValueError(f"expected one sweep spec and section.key=value overrides, got "
                         f"{paths or 'no spec'}; e.g. cgpt sweep sweeps/demo.yaml --set "
                         "train.batch_size=16")
    return paths[0], sets


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.parallel is not None and args.parallel < 1:  # 0 read as "the default" below
        raise ValueError(f"--parallel {args.parallel}: must be >= 1 (runs at a time)")
    given = [f for f, v in (("--write", args.write or None), ("--target-flops", args.target_flops),
                            ("--budget-flops", args.budget_flops),
                            ("--fit-min-flops", args.fit_min_flops)) if v is not None]
    if given and args.suggest is None:  # never silently ignored
        raise ValueError(f"{', '.join(given)}: only with --suggest K")
    spec, sets = split_spec_and_sets(args)
    sweep = load_sweep(spec, sets)
    if args.out is not None:
        check_destination(args.out, "--out")  # "" is refused, never read as the default
    out = Path(args.out or f"runs/sweeps/{sweep.name}")
    if args.suggest is not None:
        if args.suggest < 1:
            raise ValueError(f"--suggest {args.suggest}: the number of runs to suggest, >= 1")
        for flag, v in (("--target-flops", args.target_flops),
                        ("--budget-flops", args.budget_flops),
                        ("--fit-min-flops", args.fit_min_flops)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"{flag} {v}: must be a positive number of FLOPs, e.g. 1e20")
        return print_suggestions(sweep, out, args.suggest, args.target_flops,
                                 args.budget_flops, write=args.write,
                                 fit_min_flops=args.fit_min_flops)
    if args.dry_run:
        runs = select(sweep.runs, args.only)
        print_table(sweep, out if out.is_dir() else None, runs, args.parallel or 1)
        print_resources(sweep, runs)
        groups = plan_groups(runs, not args.no_fuse)
        # as the fit check: compiled for a spec with GPUs and estimate.device_memory; a local
        # CPU job chooses its members per program from its compiled step when it starts
        fits = (fit_groups(groups, sweep.estimate.device_memory)
                if not args.no_fit and sweep.estimate.device_memory
                and any(len(g) > 1 and "gpus_per_node" in g[0].slurm for g in groups) else None)
        print_groups(groups, not args.no_fuse, fits)
        if not args.no_fit:
            results, note = fit_results(sweep, runs)
            if results is not None:
                print_fit(runs, results)
            if note:
                print(note)
        if out.is_dir() and args.on_change == "error":  # what the launch would refuse
            check_identity(sweep, [r for r in runs if rundir.state(out / r.run_id) != "running"],
                           out, "error")
        return 0
    return launch(sweep, out, parallel=args.parallel, executor=args.executor, only=args.only,
                  on_change=args.on_change, fuse=not args.no_fuse,
                  compile_cache=None if args.no_compile_cache else "default",
                  progress=not args.no_progress, report=report)


def main(argv: list[str] | None = None) -> int:
    """`cgpt sweep SPEC ...` in process (a test, a library), at its edge (`cgpt.stop.edge`: a
    stop or an error is one line and an exit status); a process runs `cgpt.cli.entry`."""
    argv = sys.argv[1:] if argv is None else argv
    old = stop.GUARD.defer("sweep")  # SIGTERM, SIGUSR1/2 and Ctrl-C: one line, runs stopped
    try:
        ap = argparse.ArgumentParser(prog="cgpt sweep")
        add_arguments(ap)
        args = ap.parse_args(argv)
        return stop.edge("sweep", lambda: cmd_sweep(args))
    finally:
        stop.GUARD.restore(old)
