"""The scaling-law report a sweep prints when its runs end (`cgpt sweep SPEC`): the training
curves of its finished runs (`curves.png`) and the fit of `analysis.sweep_report`
(`scaling.png`). The launch (`cgpt.sweep.launcher`) is handed this function by the command line
and never imports `analysis` itself."""
from __future__ import annotations

from pathlib import Path

from cgpt import rundir


def report(out: Path, n_done: int) -> None:
    """Scaling-law report from the `analysis` package, when it is there and can fit: the
    finished runs' curves (with one run done) and the scaling law (with three)."""
    try:
        from analysis import plot_curves, read_curves, sweep_report  # optional package
    except ImportError as e:
        print(f"(no scaling-law report: the analysis package is not importable: {e})")
        return
    if n_done:  # every finished run's training curve on one figure
        try:
            plot_curves(read_curves(out), path=out / rundir.SWEEP_CURVES_FILE)
            print(f"training curves: {out / rundir.SWEEP_CURVES_FILE}")
        except (ValueError, OSError) as e:
            print(f"(no training-curve figure: {e})")
    if n_done < 3:
        print(f"(no scaling-law report: {n_done} finished run(s); a fit needs at least 3)")
        return
    try:
        print(sweep_report(out, out_png=out / "scaling.png"))
    except ValueError as e:
        print(f"(no scaling-law report: {e})")
    except Exception as e:  # a fit that fails must not hide that the runs are safe
        print(f"(scaling-law report failed: {type(e).__name__}: {e}; results are in "
              f"{out / rundir.RESULTS_FILE})")
