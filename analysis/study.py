"""A published study brought in once: its table in its own units, converted to the columns every
estimator of this package reads, with the conventions it was converted from kept beside it.

Papers report N with or without embeddings, data in tokens or in sequences of a length, compute
as 6ND or counted, a training or a validation loss, batches in sequences or tokens.
`bring_in()` takes the table and says which of each it holds; it returns one row per run with

    N          parameters, as `params` says ("total" or "nonembed"; with `embed`, the
               embedding parameters, both: N_total and N_nonembed)
    D          tokens (sequences x seq_len where `data="sequences"`)
    C          FLOPs: the table's counted FLOPs (`flops="counted"`, column `C`) or 6 N D
    loss       the loss column (`metric` names which record it is: "loss" or "val_loss")
    batch_size sequences (tokens / seq_len where `batch="tokens"`), steps, target: where given

and `attrs["units"]` holding the conventions. Those columns are the estimators' arguments:
fit_chinchilla(t.N, t.D, t.loss), fit_power_law(t.C, t.loss), fit_isoflop on (C, N, loss),
measure_critical_batch(t) and fit_bcrit_scaling(t) on (N, target, batch_size, steps),
fit_downstream(_two_step) on (flops = C, loss). A loss curve logged every k steps goes to
fit_schedule_law with `schedules=`; `lr_every_step` rebuilds a schedule released as (step, lr)
points. docs/published_studies.md shows it on published tables.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .checks import check_count, numeric_column

PARAMS = ("total", "nonembed")
DATA = ("tokens", "sequences")
FLOPS = ("6nd", "counted")
METRICS = ("loss", "val_loss")
BATCH = ("sequences", "tokens")
COUNTED = 10.0  # counted FLOPs / 6 N D: attention and embeddings add, never 10x


# a header that states a unit the column's numbers are in: "params (M)", "tokens_B",
# "N (millions)", "C (1e18)", "FLOPs (PF-days)"
_WORD = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12}
_LETTER = {"K": "thousand", "M": "million", "B": "billion", "G": "billion", "T": "trillion"}


def _header_unit(col) -> tuple[str, float] | None:
    """(the unit, its size) that column name `col` says its numbers are in, else None."""
    name = str(col)
    if m := re.search(r"[\s_(\[]([KMBGT])[)\]]?\s*$", name):
        return f"{_LETTER[m[1]]}s ({m[1]})", _WORD[_LETTER[m[1]]]
    if m := re.search(r"(thousand|million|billion|trillion)s?", name, re.I):
        return f"{m[1].lower()}s", _WORD[m[1].lower()]
    if m := re.search(r"(?<![\d.])1e\+?(\d+)", name, re.I):
        return f"units of 1e{m[1]}", 10.0 ** int(m[1])
    if re.search(r"pf[-_ ]?days?|petaflop", name, re.I):
        return "PF-days", 8.64e19
    return None


def _column(table: pd.DataFrame, col: str, what: str, fix: str,
            count: bool = True) -> np.ndarray:
    """Column `col` as positive numbers; a count's header may not state a unit (`count`:
    not for a loss, whose `loss_B` names a recipe, not billions)."""
    if col not in table.columns:
        raise ValueError(f"table: no column {col!r} ({what}); {fix}")
    unit = _header_unit(col) if count else None
    if unit:
        raise ValueError(f"table: column {col!r} ({what}) is in {unit[0]}, its header says; "
                         "bring_in reads plain counts: convert it, e.g. table['x'] = "
                         f"table[{col!r}] * {unit[1]:.3g}, and pass that column")
    v = numeric_column(table, col, what=what)
    bad = ~(np.isfinite(v) & (v > 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"table: column {col!r} ({what}) has {table[col].iloc[i]!r} at row "
                         f"{table.index[i]!r}, not a positive number; fix or drop that row")
    return v


def bring_in(table: pd.DataFrame, *, N: str = "N", D: str | None = "D",
             loss: str | None = "loss", params: str = "total", embed=None,
             data: str = "tokens", seq_len: int | None = None,
             flops: str = "6nd", C: str = "C", metric: str = "loss",
             batch: str = "sequences", batch_size: str = "batch_size", steps: str = "steps",
             target: str = "target") -> pd.DataFrame:
    """`table` (one row per run, the paper's columns and units) as the canonical columns (module
    docstring). N, D, loss, C, batch_size, steps, target: the table's column names for each
    (D=None or loss=None where the study has none, e.g. a steps-to-target table). params: what
    the N column counts; embed: the embedding parameters (a number or a column name), to give
    both N_total and N_nonembed. data: D in "tokens" or "sequences" (then seq_len, tokens per
    sequence). flops: "6nd" (C = 6 N D, N total) or "counted" (column C as published). metric:
    which record the loss column is. batch: batch_size in "sequences" or "tokens" (then
    seq_len)."""
    for name, v, allowed in (("params", params, PARAMS), ("data", data, DATA),
                             ("flops", flops, FLOPS), ("metric", metric, METRICS),
                             ("batch", batch, BATCH)):
        if v not in allowed:
            raise ValueError(f"{name}={v!r}: use one of {', '.join(map(repr, allowed))}")
    if seq_len is not None:
        seq_len = check_count(seq_len, "seq_len", 1)
    out = pd.DataFrame(index=table.index)
    n = _column(table, N, f"parameters, {params}", "name the column with N=")
    out["N"] = n
    if embed is not None:
        e = _column(table, embed, "embedding parameters", "pass embed= a number or a column") \
            if isinstance(embed, str) else np.full(n.size, float(embed))
        total = n + e if params == "nonembed" else n
        if (total - e <= 0).any():
            raise ValueError(f"embed: the embedding parameters exceed column {N!r}'s total "
                             "N in some row; is N non-embedding already? pass params='nonembed'")
        out["N_total"], out["N_nonembed"] = total, total - e
    _check_kind(D, data, "data")
    _check_kind(batch_size if batch_size in table.columns else None, batch, "batch")
    if D is not None:
        d = _column(table, D, f"data, {data}", "name the column with D=, or D=None")
        if data == "sequences":
            if seq_len is None:
                raise ValueError(f"data='sequences': column {D!r} counts sequences; pass "
                                 "seq_len=, the tokens in each, to convert to tokens")
            d = d * seq_len
        out["D"] = d
        if (d < n).all():
            raise ValueError(f"table: column {D!r} is below column {N!r} in every row (fewer "
                             "tokens than parameters): is it in sequences, or in billions? pass "
                             "data='sequences' with seq_len=, or convert the column to tokens")
    if flops == "counted":
        out["C"] = _column(table, C, "FLOPs as counted", "name the column with C=, or "
                           "flops='6nd' to compute 6 N D")
        if D is not None:
            _check_counted(table, C, out["C"].to_numpy() / (6.0 * out.get(
                "N_total", out["N"]).to_numpy() * out["D"].to_numpy()))
    elif D is not None:
        if params == "nonembed" and embed is None:
            raise ValueError("flops='6nd' with params='nonembed': 6 N D takes total N; pass "
                             "embed= (the embedding parameters) or flops='counted' with C=")
        out["C"] = 6.0 * out.get("N_total", out["N"]) * out["D"]
    if loss is not None:
        out["loss"] = _column(table, loss, metric, "name the column with loss=, or loss=None",
                              count=False)
    if batch_size in table.columns:
        b = _column(table, batch_size, f"batch, {batch}", "name it with batch_size=")
        if batch == "tokens":
            if seq_len is None:
                raise ValueError(f"batch='tokens': column {batch_size!r} counts tokens; pass "
                                 "seq_len= to convert it to sequences")
            b = b / seq_len
        out["batch_size"] = b
        out["seq_len"] = np.nan if seq_len is None else seq_len
    for src, dst in ((steps, "steps"), (target, "target")):
        if src in table.columns:   # empty where not reached; other text is named
            out[dst] = numeric_column(table, src).to_numpy()
    out.attrs["units"] = {"params": params, "data": "tokens", "flops": flops, "metric": metric,
                          "batch": "sequences", "from": {"data": data, "batch": batch,
                                                         "seq_len": seq_len}}
    return out.reset_index(drop=True)


def _check_kind(col, given: str, arg: str) -> None:
    """A header that says sequences where `arg` says tokens, or the reverse, is refused:
    `batch (tokens)` read as sequences makes every batch seq_len times too large."""
    if col is None:
        return
    name = str(col).lower()
    said = "tokens" if "token" in name else "sequences" if re.search(
        r"seq(?!_?len)|sample|example", name) else None
    if said and said != given:
        raise ValueError(f"table: column {col!r} counts {said}, its header says, but "
                         f"{arg}={given!r}; pass {arg}={said!r}"
                         f"{' with seq_len=' if said == 'sequences' or arg == 'batch' else ''}")


def _check_counted(table: pd.DataFrame, col: str, ratio: np.ndarray) -> None:
    """Counted FLOPs are 6 N D plus attention and the like: within COUNTED of 6 N D. Far
    outside it, a row is in other units (PF-days, 1e18 FLOPs) than FLOPs."""
    bad = (ratio < 1 / COUNTED) | (ratio > COUNTED)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"table: column {col!r} (FLOPs as counted) is {ratio[i]:.3g} x 6 N D "
                         f"at row {table.index[i]}, not within {COUNTED:g}x of it: another "
                         "unit (PF-days are 8.64e19 FLOPs)? convert the column to FLOPs, or "
                         "pass flops='6nd'")


def lr_every_step(steps, lrs, total: int | None = None) -> np.ndarray:
    """The LR of every step 1..total from a schedule released as (step, lr) points, linear
    between them and held before the first and after the last: what fit_schedule_law's
    `schedules=` takes. Exact for schedules linear between the points (a linear warmup
    and decay); a cosine between points 128 steps apart is off by < 1e-4 of the peak, a step
    drop between two points is smeared over the gap (give its points)."""
    s = np.asarray(steps, float).ravel()
    v = np.asarray(lrs, float).ravel()
    if s.shape != v.shape or s.size < 2:
        raise ValueError("steps and lrs: two arrays of equal length >= 2, the schedule's "
                         "(step, lr) points")
    if (np.diff(s) <= 0).any() or s[0] < 1:
        raise ValueError("steps: strictly increasing whole numbers >= 1 (step 1 is the first "
                         "update)")
    if not (np.isfinite(v) & (v >= 0)).all():
        raise ValueError("lrs: finite learning rates >= 0")
    total = int(s[-1]) if total is None else check_count(total, "total", 1)
    if total < s[-1]:
        raise ValueError(f"total={total}: shorter than the last (step, lr) point ({int(s[-1])})"
                         "; pass the schedule's length")
    return np.interp(np.arange(1, total + 1), s, v)
