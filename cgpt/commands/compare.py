"""`cgpt sweep compare DIR_A DIR_B --at C`: is recipe B better than recipe A, and by how much
compute? The effective-compute multiplier of two finished sweeps (analysis.compare), printed,
and a plot of both laws and the multiplier against compute."""
from __future__ import annotations

import argparse
import math
import warnings
from pathlib import Path

import analysis  # its names load on first use (PEP 562): pandas and scipy only when run
from cgpt import rundir, stop

PLOT = "compare_{a}.png"   # written in DIR_B, beside its own report's scaling.png


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cgpt sweep compare",
        description="Compare two finished sweeps (two recipes trained as ladders of sizes): fit "
        "L(C) = A C^-b + c to each and print the compute recipe A needs to reach recipe B's "
        "loss at compute C, over C (> 1: B is better), with a 95% bootstrap interval. "
        "See docs/analysis_compare.md.")
    p.add_argument("dir_a", metavar="DIR_A", help="recipe A's sweep directory (the baseline)")
    p.add_argument("dir_b", metavar="DIR_B", help="recipe B's sweep directory")
    p.add_argument("--at", type=float,
                   help="the compute to compare at, in FLOPs (default: the largest run's)")
    p.add_argument("--exponent", default="auto", choices=("auto", "separate", "shared"),
                   help="auto (default): one law for both where the runs show no difference "
                   "in exponent or asymptote, else separate laws (the summary says which and "
                   "why); or force each law its own exponent, or one for both")
    p.add_argument("--asymptote",
                   help="'shared' (one offset c for both; needs --exponent shared) or a number "
                   "(c held fixed in both laws); default: c fitted per law")
    p.add_argument("--flops", default="counted", choices=("counted", "6nd"),
                   help="compute convention of results.csv (default: counted, attention included)")
    p.add_argument("--plot", help=f"where to write the plot (default: DIR_B/{PLOT.format(a='A')},"
                   " A the name of DIR_A)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--partial", action="store_true",
                   help="compare the finished runs of a sweep whose other runs are still "
                   "running or pending (refused by default: half a ladder is another one)")
    return p


def _asymptote(v: str | None):
    if v is None or v == "shared":
        return v
    try:
        c = float(v)
    except ValueError:
        raise ValueError(f"--asymptote {v}: use 'shared' or a number (the irreducible loss, "
                         "e.g. 1.7)") from None
    if not (math.isfinite(c) and c >= 0):
        raise ValueError(f"--asymptote {v}: a fixed offset must be a finite number >= 0")
    return c


def _sweep_dir(path: str, flag: str) -> Path:
    d = Path(path)
    if not (d / rundir.RESULTS_FILE).is_file():
        raise ValueError(f"{flag} {path}: no {rundir.RESULTS_FILE} there; pass a sweep "
                         "directory (`cgpt sweep SPEC --out DIR` writes one)")
    return d


def run(args: argparse.Namespace) -> int:
    a, b = _sweep_dir(args.dir_a, "DIR_A"), _sweep_dir(args.dir_b, "DIR_B")
    if args.at is not None and not (math.isfinite(args.at) and args.at > 0):
        raise ValueError(f"--at {args.at}: the compute to compare at, in FLOPs (> 0), e.g. 1e12")
    if args.asymptote == "shared" and args.exponent != "shared":
        raise ValueError("--asymptote shared: needs --exponent shared (one law shape for both "
                         "recipes); with separate exponents give a number or leave it out")
    names = (_shown(a.resolve().name), _shown(b.resolve().name))
    if names[0] == names[1]:
        names = (f"A ({names[0]})", f"B ({names[1]})")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cmp = analysis.compare(a, b, at=args.at, exponent=args.exponent,
                               asymptote=_asymptote(args.asymptote), flops=args.flops,
                               seed=args.seed, names=names, partial=args.partial)
    for w in caught:
        print(f"warning: {w.message}")
    print(cmp.summary())
    path = _plot_path(args.plot, b / PLOT.format(a=a.resolve().name))
    try:
        analysis.plot_compare(cmp, path=path, title=f"{names[1]} against {names[0]}",
                              xlabel=f"training FLOPs ({args.flops})")
    except (OSError, ValueError) as e:  # a read-only sweep, an unknown format
        where = f"--plot {path}" if args.plot else f"the plot {path} (--plot's default)"
        raise ValueError(f"{where}: cannot be written ({getattr(e, 'strerror', None) or e}); "
                         "pass --plot PATH.png in a writable folder") from None
    print(f"  plot: {path}")
    return 0


def _shown(name: str) -> str:
    """A folder name as text: bytes that are not UTF-8 (kept by Python as surrogates, which
    no font draws and no strict stream prints) become U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _plot_path(given: str | None, default: Path) -> Path:
    """The file the plot is written to, as it will be named: a path without a suffix gets
    .png (matplotlib would add it behind the name printed)."""
    path = Path(given) if given else default
    return path if path.suffix else path.with_name(path.name + ".png")


def main(argv: list[str]) -> int:
    """`cgpt sweep compare ...` (argv: what follows `compare`), at its process's edge."""
    args = parser().parse_args(argv)
    return stop.edge("sweep compare", lambda: run(args))
