"""Issue 42, class 3: `analysis` refuses, or leaves out with a warning naming them, rows that
cannot be a loss or a count: a run listed twice, a negative loss, a finished run's count that
is not finite and > 0, FLOPs in mixed units, a diverged (NaN) point of an LR curve. Each error
names the column and the runs or rows, never a bare `x` / `N`."""
from __future__ import annotations

import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import analysis as A

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "analysis" / "sweep"


@pytest.fixture
def sweep(tmp_path):
    d = tmp_path / "sweep"
    shutil.copytree(FIXTURE, d)
    return d


def _edit(d: Path, fn) -> Path:
    df = pd.read_csv(d / "results.csv")
    df = fn(df)
    df.to_csv(d / "results.csv", index=False)
    return d


def _refused(d, *words):
    with pytest.raises(ValueError) as e:
        A.load_results(d)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


def test_a_run_listed_twice_is_refused_not_fitted_twice(sweep):
    first = pd.read_csv(sweep / "results.csv").iloc[[0]]
    _edit(sweep, lambda df: pd.concat([df] + [first] * 5, ignore_index=True))
    _refused(sweep, "'run_id'", "d64-l2-sp-s0", "more than once")
    with pytest.raises(ValueError, match="d64-l2-sp-s0"):
        A.sweep_report(sweep, n_boot=10)
    _edit(sweep, lambda df: pd.concat([df.drop_duplicates("run_id")] * 2, ignore_index=True))
    with pytest.raises(ValueError, match="more than once"):  # every row twice: no double count
        A.sweep_report(sweep, n_boot=10)


def test_a_negative_train_loss_is_refused(sweep):
    _edit(sweep, lambda df: df.assign(train_loss=np.where(df.index == 2, -0.5, df.train_loss)))
    _refused(sweep, "'train_loss'", pd.read_csv(sweep / "results.csv").run_id[2], "line(s) [4]")


@pytest.mark.parametrize("col", ["flops", "n_params", "tokens", "flops_6nd"])
@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_a_finished_runs_count_that_is_not_finite_and_positive_names_column_and_run(
        sweep, col, value):
    _edit(sweep, lambda df: df.assign(**{col: np.where(df.index == 1, value, df[col])}))
    msg = _refused(sweep, f"'{col}'", "d64-l2-sp-s1")
    assert "x must" not in msg and "N must" not in msg


def test_flops_in_mixed_units_are_refused(sweep):
    def to_pflops(df):
        df["flops"] = df["flops"].astype(float)
        df.loc[df.index >= 9, "flops"] /= 1e15  # half the rows in PFLOPs
        return df

    msg = _refused(_edit(sweep, to_pflops), "'flops'", "mixed units")
    assert pd.read_csv(sweep / "results.csv").run_id[9] in msg


def test_a_finished_run_with_a_nan_loss_is_left_out_with_a_warning(sweep):
    _edit(sweep, lambda df: df.assign(val_loss=np.where(df.index == 3, math.nan, df.val_loss)))
    df = A.load_results(sweep)
    rid = df.run_id[3]
    with pytest.warns(UserWarning, match=rid):
        kept = A.finished(df)
    assert rid not in set(kept.run_id)
    with pytest.warns(UserWarning, match=rid):
        A.load_results(sweep, finished_only=True)


def test_lr_optimum_names_the_points_it_leaves_out_and_refuses_bad_losses():
    lr = pd.Series([1e-3, 2e-3, 4e-3, 8e-3], index=["a", "b", "c", "d"])
    loss = pd.Series([3.0, 2.8, 2.9, math.nan], index=lr.index)
    with pytest.warns(UserWarning, match=r"row\(s\) \['d'\] at lr \[0.008\]"):
        A.lr_optimum(lr, loss)
    with pytest.raises(ValueError, match=r"loss must be > 0.*\['b'\]"):
        A.lr_optimum(lr, loss.fillna(3.1).mask(loss.index == "b", -2.8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: all finite
        A.lr_optimum(lr, loss.fillna(3.1))
    seeds = np.repeat([0, 1], 4)
    with pytest.raises(ValueError, match="lr must be finite and > 0"):
        A.seed_optimum(np.r_[lr, -lr], np.r_[loss.fillna(3), loss.fillna(3)], seeds)


def test_a_fit_of_columns_names_the_column_and_rows():
    x = pd.Series([1e17, 1e18, 0.0, 1e20], name="flops", index=[10, 11, 12, 13])
    y = pd.Series([3.0, 2.8, 2.6, 2.5], name="val_loss")
    with pytest.raises(ValueError, match=r"x \(column 'flops'\).*at row\(s\) \[12\]"):
        A.fit_power_law(x, y, n_boot=0)
    with pytest.raises(ValueError, match=r"N.*\[nan\] at row\(s\) \[1\]"):
        A.fit_chinchilla([1e6, math.nan, 1e8], [1e8, 1e9, 1e10], [3.0, 2.9, 2.8])
