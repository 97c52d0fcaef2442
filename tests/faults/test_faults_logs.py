"""Loss curves logged by other tools (W&B exports, nanoGPT, Lightning, HF Trainer) into the
schedule law: each test reproduces a fault of the code before it (a refusal of a valid log, a
message that blamed the wrong thing, a traceback)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import fit_schedule_law

T = 200


def _lr(kind: str) -> np.ndarray:
    i = np.arange(1, T + 1)
    decay = np.ones(T) if kind == "const" else np.where(i < 150, 1.0, 1 - (i - 150) / 50 * 0.9)
    return 1e-3 * np.minimum(1, i / 10) * decay


def _curves() -> pd.DataFrame:
    out = []
    for k, kind in enumerate(("const", "wsd")):
        lr = _lr(kind)
        s1 = np.cumsum(np.r_[0, lr[:-1]]) / 1e-3
        d = np.maximum(0, -np.diff(lr, prepend=lr[0]))
        loss = 3 + 2 * (s1 + 1) ** -0.4 - 0.15 * np.cumsum(np.r_[0, d[:-1]]) / 1e-3
        loss += np.random.default_rng(k).normal(0, 0.002, T)
        out.append(pd.DataFrame({"run_id": kind, "step": np.arange(1, T + 1), "lr": lr,
                                 "loss": loss}))
    return pd.concat(out, ignore_index=True)


def _final(curves, **kw) -> float:
    return fit_schedule_law(curves, "tissue", n_boot=0, **kw).final_loss(_lr("wsd"))[0]


def test_rows_without_a_loss_are_steps_not_logged():
    """Lightning's LR monitor logs the LR every step and the loss every k: before, the NaN
    loss of the other rows refused the whole log ("drop that run")."""
    c = _curves()
    sparse = c.assign(loss=c["loss"].where(c["step"] % 10 == 0))
    assert _final(sparse) == pytest.approx(_final(c), abs=0.01)


def test_rows_of_another_metric_are_dropped_not_duplicates():
    """HF Trainer logs each evaluation in a row of its own at the same step (loss and LR NaN):
    before, the row's NaN LR refused the log."""
    c = _curves()
    evals = c[c["step"] % 50 == 0].assign(loss=np.nan, lr=np.nan, val_loss=3.0)
    assert _final(pd.concat([c, evals])) == pytest.approx(_final(c), abs=1e-9)


def test_a_loss_that_stops_is_a_diverged_run():
    """Every step logged, or every 10th with the LRs from `schedules` (nanoGPT's `loss nan`
    lines): NaN from some step to the end is named, not skipped as steps not logged."""
    c = _curves()
    c.loc[(c["run_id"] == "wsd") & (c["step"] > 180), "loss"] = np.nan
    with pytest.raises(ValueError, match=r"run 'wsd' has no loss from step 181 to its last "
                                         r"record \(step 200\).*diverged"):
        _final(c)
    sparse = c[c["step"] % 10 == 1].drop(columns="lr")
    with pytest.raises(ValueError, match=r"run 'wsd' has no loss from step 181 to its last "
                                         r"record \(step 191\).*diverged"):
        _final(sparse, schedules={k: _lr(k) for k in ("const", "wsd")})


def test_steps_counted_from_zero_are_named():
    """W&B's _step, nanoGPT's iter: before, "no record for step 1" (the user had steps 0..)."""
    c = _curves()
    with pytest.raises(ValueError, match=r"run 'const' has a record of step 0; .*needs 1 added"):
        _final(c.assign(step=c["step"] - 1))
    sparse = c[c["step"] % 10 == 0].drop(columns="lr").assign(step=lambda d: d["step"] - 10)
    with pytest.raises(ValueError, match="record of step 0"):
        _final(sparse, schedules={k: _lr(k) for k in ("const", "wsd")})


def test_steps_and_lrs_written_as_text_are_read_as_numbers():
    """Before: steps as text sorted "1", "10", "100" (a missing step 2 was named); an LR as
    text ended in pandas' "Invalid comparison between dtype=str and int"."""
    c = _curves()
    want = _final(c)
    assert _final(c.assign(step=c["step"].astype(str))) == pytest.approx(want, abs=1e-9)
    assert _final(c.assign(lr=c["lr"].map("{:.9e}".format))) == pytest.approx(want, abs=1e-6)
    summary = pd.DataFrame({"run_id": ["wsd"], "step": ["Summary"], "lr": [0.0], "loss": [3.0]})
    with pytest.raises(ValueError, match=r"curves: column 'step' has 'Summary' at row 400, not "
                                         "a number"):
        _final(pd.concat([c, summary], ignore_index=True))


def test_what_is_not_a_table_of_curves_is_named():
    """Before: TypeErrors from inside (`'NoneType' object is not iterable`, `'numpy.ndarray'
    object is not callable`), a CSV path read as a run directory, two columns renamed to
    `step` named by pandas."""
    c = _curves()
    with pytest.raises(TypeError, match="curves: None: pass one DataFrame"):
        fit_schedule_law(None)
    with pytest.raises(TypeError, match="curves: a list of DataFrame: .*pandas.concat"):
        fit_schedule_law([c])
    sched = {k: _lr(k) for k in ("const", "wsd")}
    with pytest.raises(TypeError, match="schedules: a dict .*not a DataFrame"):
        fit_schedule_law(c.drop(columns="lr"), schedules=pd.DataFrame(sched))
    with pytest.raises(ValueError, match="column 'step' appears 2 times"):
        fit_schedule_law(pd.concat([c, c[["step"]]], axis=1))
    with pytest.raises(ValueError, match=r"no column\(s\) \['lr'\].*schedules="):
        fit_schedule_law(c.drop(columns="lr"))
    with pytest.raises(ValueError, match=r"2 row\(s\) have no run_id"):
        fit_schedule_law(c.assign(run_id=c["run_id"].where(c["step"] != 3)))


def test_a_csv_file_given_as_curves_says_read_it(tmp_path):
    p = tmp_path / "export.csv"
    _curves().to_csv(p, index=False)
    with pytest.raises(ValueError, match="export.csv is a file, not a run directory; .*"
                                         "pandas.read_csv"):
        fit_schedule_law(str(p))
