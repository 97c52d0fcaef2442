"""Argument checks shared by every fit: one ValueError naming the argument and the fix.

A fit that silently accepts level=95 (a percentage), n_boot=10.5 or losses read as strings
either crashes deep inside numpy or returns a number that means nothing; these turn each into
a sentence before any work starts.
"""
from __future__ import annotations

import numbers

import numpy as np
import pandas as pd


def check_level(level, name: str = "level") -> float:
    """A confidence level strictly between 0 and 1 (0.95, not 95)."""
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0 < level < 1:
        hint = f"; {level}% is level={level / 100:g}" if isinstance(level, numbers.Real) \
            and 1 < level < 100 else ""
        raise ValueError(f"{name}={level!r}: a confidence level is a fraction in (0, 1), "
                         f"e.g. {name}=0.95{hint}")
    return float(level)


def check_count(n, name: str = "n_boot", minimum: int = 0) -> int:
    """A whole number >= minimum (bootstrap resamples, runs)."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        if isinstance(n, numbers.Real) and float(n).is_integer():
            n = int(n)
        else:
            raise ValueError(f"{name}={n!r}: must be a whole number >= {minimum}, "
                             f"e.g. {name}={max(minimum, 200)}")
    if n < minimum:
        raise ValueError(f"{name}={n}: must be >= {minimum}")
    return int(n)


def as_numbers(v, name: str) -> np.ndarray:
    """A 1-d float array, or a ValueError naming `name` and the first value that is not a number."""
    arr = np.asarray(v, dtype=object).ravel() if not isinstance(v, np.ndarray) else v.ravel()
    try:
        return np.asarray(arr, float)
    except (TypeError, ValueError):
        out = np.empty(arr.size)
        for k, item in enumerate(arr):
            if item is None or item is pd.NA:  # pandas' missing value
                out[k] = np.nan
                continue
            try:
                out[k] = float(item)
            except (TypeError, ValueError):
                raise ValueError(f"{name} must be numbers, got {item!r}; convert the column "
                                 "first (pandas.to_numeric) or load it with "
                                 "analysis.load_results") from None
        return out


def check_xy(x, y, name_x: str = "x", name_y: str = "y") -> tuple[np.ndarray, np.ndarray]:
    """Finite, positive 1-d arrays of equal length, or a ValueError saying which one is wrong."""
    labels = [_labels(v) for v in (x, y)]
    x, y = as_numbers(x, name_x), as_numbers(y, name_y)
    if x.shape != y.shape:
        raise ValueError(f"{name_x} and {name_y} differ in length ({x.size} vs {y.size})")
    if x.size == 0:
        raise ValueError(f"{name_x} and {name_y} are empty: no finished runs to fit")
    for name, v, (col, rows) in ((name_x, x, labels[0]), (name_y, y, labels[1])):
        bad = ~(np.isfinite(v) & (v > 0))
        if bad.any():
            at = np.flatnonzero(bad)
            rows = rows if rows is not None else np.arange(v.size)
            raise ValueError(
                f"{name}{f' (column {col!r})' if col else ''} must be finite and > 0 for a "
                f"log-space fit: {v[at[:5]].tolist()} at row(s) {rows[at[:5]].tolist()}"
                f"{' ...' if at.size > 5 else ''}; drop unfinished runs first "
                "(analysis.finished) and fix or remove those rows")
    return x, y


def _labels(v) -> tuple[str | None, np.ndarray | None]:
    """A pandas Series' column name and index labels, to name the rows a check refuses."""
    name, index = getattr(v, "name", None), getattr(v, "index", None)
    if index is None or not hasattr(v, "to_numpy"):
        return None, None
    return (str(name) if name is not None else None), np.asarray(index).ravel()


def fmt_bound(v: float, ref: float) -> str:
    """A bound a reader can use: values below 1e-6 of the estimate's scale print as 0 (an
    optimiser driving log E to -700 leaves E = 4.79e-310, which means 'at the bound 0')."""
    if not np.isfinite(v):
        return str(v)
    if abs(v) < 1e-6 * max(abs(ref), 1e-300):
        return "0"
    return f"{v:.4g}"


# cells a table may leave without a value (read as NaN: not logged, not reached)
EMPTY_CELLS = ("", "nan", "none", "null", "n/a", "na", "-", "\u2014")


def numeric_column(table, col: str, where: str = "table", what: str = ""):
    """Column `col` of a DataFrame as floats: numbers and numbers written as text ("3.21",
    "1e-3") are read, cells left empty (EMPTY_CELLS: "", "NaN", "n/a", "-") are NaN, and any
    other text ("1,000", "125M", ">10000", "3.5 nats") is one ValueError naming the column, its
    row (and `what` it holds) and the value (pandas' to_numeric(errors="coerce") would make it
    NaN without a word)."""
    v = pd.to_numeric(table[col], errors="coerce")
    text = v.isna() & table[col].notna() & ~table[col].astype(str).str.strip().str.lower() \
        .isin(EMPTY_CELLS)
    if text.any():
        i = int(np.argmax(text.to_numpy()))
        raise ValueError(f"{where}: column {col!r}{f' ({what})' if what else ''} has "
                         f"{table[col].iloc[i]!r} at row "
                         f"{table.index[i]}, not a number (no thousands separators, units or "
                         "suffixes: write 1000, not 1,000 or 1k); fix that cell, or leave it "
                         "empty where there is no value")
    return v.astype(float)
