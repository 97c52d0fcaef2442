"""Load a sweep's results.csv and pick the parameter / FLOPs convention.

Conventions (stated once, used everywhere in this package):
  params="total"    counts every parameter, embeddings included (Cerebras-GPT, Chinchilla).
  params="nonembed" drops token/position embeddings (Kaplan et al. 2020).
  flops="counted"   algorithmic FLOPs including the attention matmuls (Cerebras-GPT).
  flops="6nd"       6 * n_params * tokens (Kaplan/Chinchilla approximation).
Defaults are total params and counted FLOPs, the convention behind the Cerebras-GPT law.
"""
from __future__ import annotations

import csv as _csv
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from cgpt import rundir  # the run and sweep directories' contract (JAX-free)
# the results.csv columns, which cgpt writes and this reads (re-exported)
from cgpt.results_schema import (COLUMNS, NUMERIC, REQUIRED, STATUSES, TEXT,  # noqa: F401
                                 restore)

PARAMS = {"total": "n_params", "nonembed": "n_params_nonembed"}
FLOPS = {"counted": "flops", "6nd": "flops_6nd"}


def load_results(path: str | Path, finished_only: bool = False) -> pd.DataFrame:
    """Read a sweep's results (a sweep directory holding results.csv, or the CSV itself).

    Validates the column contract so a malformed file fails here, not inside a fit.
    finished_only=True keeps runs with status "done" and a finite val_loss (see `finished`).
    """
    path = Path(path)
    csv = path / rundir.RESULTS_FILE if path.is_dir() else path
    if not csv.is_file():
        raise FileNotFoundError(f"no results file at {csv}: pass a sweep directory containing "
                                "results.csv, or the path of the CSV itself")
    try:
        df = pd.read_csv(csv)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{csv}: the file is empty; a sweep writes results.csv with a header "
                         "row once it starts (rerun `cgpt sweep SPEC` to rebuild it)") from None
    except (UnicodeDecodeError, pd.errors.ParserError) as e:
        raise ValueError(f"{csv}: not a CSV table ({type(e).__name__}: {str(e)[:80]}); pass a "
                         "sweep's results.csv (rerun `cgpt sweep SPEC` to rebuild it)") from None
    with open(csv, newline="", errors="replace") as f:  # pandas renames a repeat to 'x.1'
        header = next(_csv.reader(f), [])
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:
        raise ValueError(f"{csv}: column(s) {twice} appear more than once in the header; "
                         "keep one of each (which one is meant cannot be guessed)")
    for col in (c for c in TEXT if c in df.columns):  # a quote the writer put before "=..."
        df[col] = df[col].map(restore)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"{csv}: missing required column(s) {missing}; "
                         f"results.csv must have columns {list(REQUIRED)}")
    bad = sorted(set(df["status"].dropna().astype(str)) - set(STATUSES))
    if bad or df["status"].isna().any():
        raise ValueError(f"{csv}: column 'status' has values {bad or ['<empty>']}; "
                         f"allowed are {list(STATUSES)}")
    for col in (c for c in NUMERIC if c in df.columns):
        try:
            df[col] = pd.to_numeric(df[col])
        except (ValueError, TypeError) as e:
            raise ValueError(f"{csv}: column '{col}' must be numeric ({e})") from None
    _check_rows(df, csv)
    try:
        df["mup"] = df["mup"].map(_as_bool)
    except ValueError as e:
        raise ValueError(f"{csv}: {e}") from None
    df.attrs["source"] = str(csv)
    return finished(df) if finished_only else df


# A finished run's counts: finite and > 0 (a fit takes their logs).
COUNTS = ("n_params", "tokens", "flops", "flops_6nd")
# flops / (6 * n_params * tokens) of a GPT: attention and the head move it by a few x at most,
# a unit (PFLOPs, GFLOPs) by 1e3 or more. A row outside FLOPS_RATIO, or SPREAD x from the
# column's median, is in another unit than the runs' sizes and tokens imply.
FLOPS_RATIO, SPREAD = (1e-2, 1e2), 30.0

def _runs(df: pd.DataFrame, bad) -> str:
    ids = (df.loc[bad, "run_id"] if "run_id" in df else df.index[bad]).astype(str).tolist()
    lines = (np.flatnonzero(np.asarray(bad)) + 2).tolist()  # the header is line 1
    more = f" and {len(ids) - 5} more" if len(ids) > 5 else ""
    return f"run(s) {ids[:5]}{more} (line(s) {lines[:5]})"


def _check_rows(df: pd.DataFrame, csv: Path | str) -> None:
    """What cannot be a loss or a count, refused naming the column and the runs: a run listed
    twice (fitted twice), a negative loss, a finished run's count that is not finite and > 0,
    a FLOPs column in other units than the runs' sizes imply. A check whose columns a table
    lacks is skipped (a table built by hand)."""
    twice = (df["run_id"].astype(str).duplicated(keep=False) & df["run_id"].notna()
             if "run_id" in df else pd.Series(False, index=df.index))
    if twice.any():
        raise ValueError(f"{csv}: column 'run_id' lists {_runs(df, twice)} more than once; a "
                         "sweep lists each run once and a fit would count them twice: keep one "
                         "row per run (df.drop_duplicates('run_id', keep='last') for copies)")
    odd = sorted(set(df["status"].dropna().astype(str)) - set(STATUSES))
    if odd:   # a table from elsewhere (W&B's "finished", "crashed"): no run would count
        raise ValueError(f"{csv}: column 'status' has {odd}; allowed are {list(STATUSES)} "
                         "(a finished run is 'done': map the other tool's states onto these)")
    done = df["status"] == "done"
    for col in ("val_loss", "train_loss"):  # cross-entropies: never negative, > 0 when done
        if col not in df.columns:
            continue
        bad = (df[col] < 0) | (done & (df[col] == 0))
        if bad.any():
            raise ValueError(f"{csv}: column '{col}' is negative (or 0 for a finished run) for "
                             f"{_runs(df, bad)}; a cross-entropy is > 0: fix or remove those rows")
    for col in (c for c in COUNTS if c in df):
        v = df[col].astype(float)
        bad = done & ~(np.isfinite(v) & (v > 0))
        if bad.any():
            raise ValueError(f"{csv}: column '{col}' must be > 0 for a finished run, got "
                             f"{', '.join(f'{x:g}' for x in v[bad][:5])} for {_runs(df, bad)}; "
                             "fix those rows, or mark them failed")
    if "n_params" not in df or "tokens" not in df:
        return
    nd = 6 * df["n_params"].astype(float) * df["tokens"].astype(float)
    lo, hi = FLOPS_RATIO
    for col in (c for c in ("flops", "flops_6nd") if c in df):
        r = df[col].astype(float) / nd
        med = float(np.median(r[done])) if done.any() else 1.0
        bad = done & ((r < lo) | (r > hi) | (r > SPREAD * med) | (r < med / SPREAD))
        if bad.any():
            raise ValueError(
                f"{csv}: column '{col}' is {float(r[bad].iloc[0]):.3g} x 6·n_params·tokens for "
                f"{_runs(df, bad)}, {med:.3g} x for the median run (a GPT's FLOPs are a few x "
                "at most): mixed units (PFLOPs, GFLOPs?) or another column; write every row "
                "in FLOPs")


def locate_run(df: pd.DataFrame, row, need: str, why: str) -> Path:
    """The directory of `row` (a row of `df`, as `load_results` read it) that holds the file
    `need` (a `cgpt.rundir` name): first DIR/<run_id> beside the results.csv read, where the
    sweep keeps each run (so a sweep directory moved or copied elsewhere still finds its runs),
    then the run_dir the sweep recorded. Neither: FileNotFoundError naming both and `why` (what
    the caller reads from the file). Each of the two that exists must hold the row's run
    (`other_run`: a stale or edited run_dir fed another run's curve into a fit), else a
    ValueError naming the row and the column. Every reader of a run's files through
    results.csv comes here."""
    source = df.attrs.get("source")
    recorded = Path(str(row.run_dir))
    tried = ([Path(source).parent / str(row.run_id)] if source else []) + [recorded]
    found = [d for d in dict.fromkeys(tried) if (d / need).is_file()]
    for d in found:
        other = other_run(d, row)
        if other:
            where = ("column 'run_dir' names" if d == recorded else
                     "the sweep's directory of that run,")
            raise ValueError(f"{source or 'results'}: the row of run {row.run_id!r}: {where} "
                             f"{d}, which holds another run ({other}); set run_dir to the "
                             "run's own directory, or remove the row")
    if found:
        return found[0]
    raise FileNotFoundError(f"no {need} for run {row.run_id!r} (looked in "
                            f"{' and '.join(map(str, dict.fromkeys(tried)))}); {why}")


def other_run(d: Path, row) -> str:
    """What in run directory `d` says it holds another run than `row` of results.csv, or "":
    its summary.json's model, n_params, tokens, peak_lr and val_loss (the sweep copies them
    into a finished run's row; val_loss tells apart runs that differ in any other setting)
    and its config.yaml's train.seed (the row's seed). A file that is missing or unreadable
    says nothing."""
    theirs = rundir.try_json(d / rundir.SUMMARY_FILE) or {}
    try:
        theirs = {**theirs, "seed": rundir.read_config(d).get("train", {}).get("seed")}
    except (OSError, ValueError, AttributeError, rundir.LoadError):  # none, or unreadable
        pass
    diff = []
    for key in ("model", "n_params", "tokens", "peak_lr", "val_loss", "seed"):
        ours, got = getattr(row, key, None), theirs.get(key)
        if got is None or ours is None or (not isinstance(ours, str) and pd.isna(ours)):
            continue
        same = str(ours) == str(got) if key == "model" else _same_number(ours, got)
        if not same:
            diff.append(f"{key} {_shown(got)}, the row {_shown(ours)}")
    return "; ".join(diff)


def _same_number(a, b) -> bool:
    """Equal as the CSV's text can carry them (a float read back may differ in its last bit)."""
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9) or float(a) == float(b)
    except (TypeError, ValueError):
        return False


def _shown(v) -> str:
    """A count as 176,128 (also when the CSV read it as 176128.0), a loss or LR to 4 digits,
    anything else as repr."""
    try:
        if not isinstance(v, (str, bool)):
            return f"{int(v):,}" if float(v).is_integer() else f"{float(v):.4g}"
    except (TypeError, ValueError, OverflowError):
        pass
    return repr(v)


def finished(df: pd.DataFrame) -> pd.DataFrame:
    """Runs that completed and have a validation loss: the only rows a fit should see. A done
    run whose val_loss is not finite (a diverged run) is left out with a warning naming it.
    The rows' checks (`_check_rows`) run here too: every fit passes here, also one of a table
    read by pandas itself rather than by `load_results`."""
    _check_rows(df, df.attrs.get("source", "results"))
    done = df["status"] == "done"
    finite = np.isfinite(df["val_loss"].astype(float))
    if (done & ~finite).any():
        bad = done & ~finite
        ids = df.loc[bad, "run_id"].astype(str).tolist()
        warnings.warn(f"{df.attrs.get('source', 'results')}: left out {len(ids)} finished "
                      f"run(s) whose val_loss is not finite (diverged?): {ids[:10]}"
                      f"{' ...' if len(ids) > 10 else ''}", stacklevel=2)
    return df.loc[done & finite].reset_index(drop=True)


def n_params(df: pd.DataFrame, params: str = "total") -> np.ndarray:
    """Parameter counts under the chosen convention ("total" default, or "nonembed")."""
    if params not in PARAMS:
        raise ValueError(f"params={params!r}: use one of {list(PARAMS)}")
    if PARAMS[params] not in df:
        raise ValueError(f"{df.attrs.get('source', 'results')}: no column "
                         f"{PARAMS[params]!r} (parameters, params={params!r}); name your "
                         f"parameter counts {PARAMS[params]!r}")
    return df[PARAMS[params]].to_numpy(float)


def compute(df: pd.DataFrame, flops: str = "counted") -> np.ndarray:
    """Training compute under the chosen convention ("counted" default, or "6nd")."""
    if flops not in FLOPS:
        raise ValueError(f"flops={flops!r}: use one of {list(FLOPS)}")
    if FLOPS[flops] not in df:
        other = [f"flops={k!r}" for k, c in FLOPS.items() if c in df and k != flops]
        raise ValueError(f"{df.attrs.get('source', 'results')}: no column {FLOPS[flops]!r} "
                         f"(FLOPs, flops={flops!r}); "
                         + (f"pass {other[0]}, or " if other else "")
                         + f"name your compute column {FLOPS[flops]!r} "
                         f"(df.rename(columns={{'compute': {FLOPS[flops]!r}}}))")
    return df[FLOPS[flops]].to_numpy(float)


def _as_bool(v) -> bool:
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("true", "1", "yes"):
            return True
        if s in ("false", "0", "no", ""):
            return False
        raise ValueError(f"column 'mup': cannot read {v!r} as a boolean (use true/false)")
    return bool(v) if not pd.isna(v) else False
