"""A sweep run's own files, read as `cgpt train` writes them: metrics.jsonl (one strict JSON
object per logged step, a non-finite value written as null) and summary.json.

Damaged or hand-edited files are one ValueError / FileNotFoundError naming the file, the line
or key and the fix, never a parser's message without the file or a KeyError. A torn last line
(the run was killed mid-write) is dropped with a warning, as `cgpt train --resume` drops it; any
other bad line is an error. A results.csv row's run directory is the folder of that run_id next
to results.csv (a sweep moved as a whole), else the row's `run_dir`; its summary.json must
describe the row's run (same n_params and tokens), so a stale path never lends another run's
curve to a fit.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pandas as pd

LOG, SUMMARY = "metrics.jsonl", "summary.json"


def read_log(log: str | Path, numeric: tuple[str, ...] = ()) -> pd.DataFrame:
    """The logged steps of `log` (a run directory or its metrics.jsonl), one row each; the
    columns in `numeric` must be present and hold numbers (or null)."""
    log = Path(log)
    log = log / LOG if log.is_dir() else log
    if not log.is_file():
        raise FileNotFoundError(f"{log}: no such file (a run writes its metrics.jsonl as it "
                                "trains); pass the run's directory")
    raw = log.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{log}: not UTF-8 text ({e.reason} at byte {e.start}); cgpt writes "
                         "one JSON object per line: restore the file from the run") from None
    lines = text.splitlines()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            if i == len(lines) and not text.endswith("\n"):  # a write cut short by a kill
                warnings.warn(f"{log}: line {i} is cut short (the run was stopped while "
                              "writing it); it is left out", stacklevel=2)
                continue
            raise ValueError(f"{log}: line {i} is not JSON ({e.msg}); cgpt writes one JSON "
                             "object per line: restore the file or delete that line") from None
        if not isinstance(row, dict):
            raise ValueError(f"{log}: line {i} is a JSON {type(row).__name__}, not an object "
                             "with a 'step'; restore the file or delete that line")
        rows.append(row)
    return as_numeric(pd.DataFrame(rows), numeric, log)


def as_numeric(df: pd.DataFrame, columns: tuple[str, ...], log: Path) -> pd.DataFrame:
    """`df` (read from `log`) with `columns` present and numeric (null allowed)."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{log}: no {missing} in any of its {len(df)} logged step(s); "
                         "is this a cgpt run's metrics.jsonl?")
    for c in columns:
        try:
            df[c] = pd.to_numeric(df[c])
        except (ValueError, TypeError) as e:
            raise ValueError(f"{log}: key {c!r} must be a number on every line ({e})") from None
    return df


def read_summary(run_dir: str | Path, ints: tuple[str, ...] = ()) -> dict:
    """A finished run's summary.json, a JSON object whose keys in `ints` are integers."""
    f = Path(run_dir) / SUMMARY
    if not f.is_file():
        raise FileNotFoundError(f"{f}: no such file; a run writes it when it finishes (rerun "
                                "the sweep to redo an unfinished run)")
    try:
        s = json.loads(f.read_bytes().decode("utf-8"))
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{f}: not JSON ({e}); rerun the sweep to rewrite it") from None
    if not isinstance(s, dict):
        raise ValueError(f"{f}: a JSON {type(s).__name__}, not the run's summary object; rerun "
                         "the sweep to rewrite it")
    for k in ints:
        v = s.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
            got = "missing" if k not in s else f"{v!r}, not an integer"
            raise ValueError(f"{f}: key {k!r} is {got}; rerun the sweep to rewrite it")
    return s


def run_dir(row, results_csv: Path) -> Path:
    """The directory of a results.csv row's run (see the module docstring)."""
    near = Path(results_csv).parent / str(row.run_id)
    d = near if near.is_dir() else Path(str(row.run_dir))
    if not d.is_dir():
        raise FileNotFoundError(f"no directory for run {row.run_id!r} of {results_csv} (looked "
                                f"in {near} and its run_dir {row.run_dir}); restore it, or mark "
                                "the run failed in results.csv")
    s = d / SUMMARY
    if s.is_file():
        summary = read_summary(d)
        for key in ("n_params", "tokens"):
            want, got = getattr(row, key, None), summary.get(key)
            if want is not None and got is not None and float(want) != float(got):
                raise ValueError(f"{d}: its summary.json has {key}={got}, but {results_csv} "
                                 f"says {want} for run {row.run_id!r}: the folder holds another "
                                 "run; fix that row's run_dir (or put the run's folder next to "
                                 "results.csv)")
    return d
