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

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "analysis" / "sweep"


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


# ---- a run directory that holds another run ------------------------------------------------
DEMO = Path(__file__).resolve().parents[2] / "notebooks" / "data" / "demo"
SMALL, OTHER = "tiny-9k_d179k_s0", "tiny-13k_d269k_s0"


def _demo(tmp_path, beside: bool = True) -> tuple[Path, Path]:
    """A copy of the demo sweep; beside=False: results.csv alone in a folder of its own, its
    run_dir cells naming the runs' directories elsewhere (a results.csv mailed to a colleague
    with the runs on a shared disk). Returns (the folder results.csv is in, the runs' folder)."""
    runs = tmp_path / "runs"
    shutil.copytree(DEMO, runs)
    top = runs if beside else tmp_path / "csv"
    top.mkdir(exist_ok=True)
    df = pd.read_csv(runs / "results.csv")
    df.assign(run_dir=[str(runs / r) for r in df.run_id]).to_csv(top / "results.csv", index=False)
    if not beside:
        (runs / "results.csv").unlink()
    return top, runs


def _point(top: Path, run_id: str, to: Path) -> None:
    _edit(top, lambda df: df.assign(run_dir=np.where(df.run_id == run_id, str(to), df.run_dir)))


@pytest.mark.parametrize("beside", [False, True], ids=["csv-alone", "sweep-dir"])
def test_a_run_dir_naming_another_runs_directory_is_refused(tmp_path, beside):
    """Before: with results.csv apart from its runs, fit_envelope read tiny-13k's curve as
    tiny-9k's and fitted it without a word (a sweep directory read the right one beside it and
    kept the wrong cell)."""
    top, runs = _demo(tmp_path, beside)
    A.fit_envelope(top, n_boot=5)  # every cell right: fitted
    _point(top, SMALL, runs / OTHER)
    for call in (lambda: A.fit_envelope(top, n_boot=5), lambda: A.read_curves(top)):
        with pytest.raises(ValueError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith(f"{top / 'results.csv'}: the row of run {SMALL!r}: column "
                              f"'run_dir' names {runs / OTHER}, which holds another run "
                              "(model 'tiny-13k', the row 'tiny-9k'; n_params 13,440, the row "
                              "8,928; tokens 266,240, the row 176,128; val_loss 4.645, the row "
                              "5.084)"), msg


def test_a_run_of_another_seed_is_told_by_its_config(tmp_path):
    """Two seeds of one model and budget differ only in config.yaml's train.seed."""
    top, _ = _demo(tmp_path)
    _edit(top, lambda df: df.assign(seed=np.where(df.run_id == SMALL, 1, df.seed)))
    with pytest.raises(ValueError, match=rf"the row of run {SMALL!r}: column 'run_dir' names "
                       r".* holds another run \(seed 0, the row 1\)"):
        A.read_curves(top)


def test_a_moved_sweep_still_reads_its_runs_beside_results(tmp_path):
    """run_dir naming where the sweep ran (gone now) is no error: the runs are beside it."""
    top, runs = _demo(tmp_path)
    _edit(top, lambda df: df.assign(run_dir="/nonexistent/" + df.run_id))
    assert A.read_curves(top)["run_id"].nunique() == 6


def test_noise_table_checks_the_run_directory_too(tmp_path):
    """Runs of one model, budget and seed that differ in batch and LR: told apart by val_loss
    and peak_lr."""
    from analysis import gns

    d = tmp_path / "cb"
    shutil.copytree(Path(__file__).resolve().parents[2] / "notebooks" / "data" /
                    "critical_batch" / "batch_sweep", d)
    rows = pd.read_csv(d / "results.csv")
    first, second = rows.run_id[0], rows.run_id[1]
    _point(d, first, d / second)
    with pytest.raises(ValueError, match=rf"the row of run {first!r}: column 'run_dir' names "
                       rf".*{second}, which holds another run \(peak_lr 0.002, the row 0.001; "
                       r"val_loss "):
        gns.noise_table(d)


@pytest.mark.parametrize("name", ["demo", "critical_batch/batch_sweep", "critical_batch"])
def test_every_bundled_sweep_holds_its_own_runs(name):
    from analysis.results import locate_run

    df = A.finished(A.load_results(DEMO.parent / name))
    assert len(df) and all(locate_run(df, r, "metrics.jsonl", "").is_dir()
                           for r in df.itertuples())


def test_the_sweeps_own_folder_of_a_run_holding_another_is_named(tmp_path):
    top, runs = _demo(tmp_path)
    _point(top, SMALL, Path("/nonexistent") / SMALL)  # where it ran: gone
    shutil.rmtree(runs / SMALL)
    shutil.copytree(runs / OTHER, runs / SMALL)  # a folder copied over another
    with pytest.raises(ValueError, match=rf"the row of run {SMALL!r}: the sweep's directory of "
                       rf"that run, {runs / SMALL}, which holds another run \(model 'tiny-13k'"):
        A.read_curves(top)


def test_a_log_value_that_is_not_a_number_is_named_with_its_line(tmp_path):
    """`"tokens": [122880]` on one line of a run's metrics.jsonl ended read_curves in pandas'
    `'<' not supported between instances of 'list' and 'int'`, with no file."""
    import json

    d = tmp_path / "demo"
    shutil.copytree(DEMO, d)
    log = d / "tiny-13k_d269k_s0" / "metrics.jsonl"
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    rows[2]["tokens"] = [rows[2]["tokens"]]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 3: 'tokens' is \[\d+\], not a "):
        A.read_curves(d)



def test_a_bad_mup_cell_names_results_csv(tmp_path):
    d = tmp_path / "demo"
    shutil.copytree(DEMO, d)
    text = (d / "results.csv").read_text().splitlines()
    col = text[0].split(",").index("mup")
    cells = text[1].split(",")
    cells[col] = "maybe"
    (d / "results.csv").write_text("\n".join([text[0], ",".join(cells), *text[2:]]) + "\n")
    with pytest.raises(ValueError, match=r"results.csv: column 'mup': cannot read 'maybe'"):
        A.load_results(d)



@pytest.mark.parametrize("edit, named", [
    (lambda s: s.pop("seq_len"), r"summary.json: 'seq_len' is missing, not a positive whole"),
    (lambda s: s.update(seq_len="long"), r"summary.json: 'seq_len' is 'long', not a positive"),
    (lambda s: s.update(batch_size=0), r"summary.json: 'batch_size' is 0, not a positive"),
])
def test_noise_table_names_a_summary_count_it_cannot_use(tmp_path, edit, named):
    """A summary.json without seq_len ended gns.noise_table in `KeyError: 'seq_len'`; a text
    seq_len in int()'s message, without the file."""
    import json

    from analysis import gns

    d = tmp_path / "cb"
    shutil.copytree(DEMO.parent / "critical_batch", d)
    p = d / "tiny-30k_d597k_s0" / "summary.json"
    s = json.loads(p.read_text())
    edit(s)
    p.write_text(json.dumps(s))
    with pytest.raises(ValueError, match=named):
        gns.noise_table(d)



def test_noise_table_names_the_run_whose_noise_estimate_is_unusable(tmp_path):
    """A run whose |G|^2 estimates are all negative: the error did not say which of the sweep's
    runs it was."""
    import json

    from analysis import gns

    d = tmp_path / "cb"
    shutil.copytree(DEMO.parent / "critical_batch", d)
    log = d / "tiny-30k_d597k_s0" / "metrics.jsonl"
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    log.write_text("".join(json.dumps({**r, "gns_g2": -abs(r.get("gns_g2") or 1.0)}) + "\n"
                           for r in rows))
    with pytest.raises(ValueError, match=r"tiny-30k_d597k_s0/metrics.jsonl \(run "
                                         r"tiny-30k_d597k_s0\): the mean \|G\|\^2"):
        gns.noise_table(d)

