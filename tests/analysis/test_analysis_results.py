"""analysis.results: the results.csv contract, conventions, the fixture, and import hygiene."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import analysis
from analysis import COLUMNS, compute, finished, load_results, n_params
from cgpt.results_schema import OPTIONAL, REQUIRED

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "analysis"
sys.path.insert(0, str(FIXTURE))
import make_sweep  # noqa: E402  (the documented fixture generator)


def test_import_does_not_pull_jax():
    code = "import sys, analysis; sys.exit(1 if 'jax' in sys.modules or 'cgpt' in sys.modules else 0)"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr or "importing analysis imported jax or cgpt"


def test_fixture_matches_its_generator():
    committed = pd.read_csv(FIXTURE / "sweep" / "results.csv")
    fresh = make_sweep.make_sweep()
    assert list(committed.columns) == list(REQUIRED)
    pd.testing.assert_frame_equal(committed[list(fresh.select_dtypes("number"))],
                                  fresh.select_dtypes("number"), check_dtype=False)
    assert list(committed["run_id"]) == list(fresh["run_id"])


def test_load_dir_or_csv_and_finished():
    a = load_results(FIXTURE / "sweep")
    b = load_results(FIXTURE / "sweep" / "results.csv")
    pd.testing.assert_frame_equal(a, b)
    assert set(a["status"]) == {"done", "failed", "running", "pending"}
    assert a["mup"].dtype == bool and a["mup"].sum() == 4
    done = load_results(FIXTURE / "sweep", finished_only=True)
    assert len(done) == (a["status"] == "done").sum() == 18
    assert np.isfinite(done["val_loss"]).all()
    pd.testing.assert_frame_equal(done, finished(a))


def test_conventions():
    df = load_results(FIXTURE / "sweep", finished_only=True)
    np.testing.assert_array_equal(n_params(df), df["n_params"])          # default: total
    np.testing.assert_array_equal(n_params(df, "nonembed"), df["n_params_nonembed"])
    np.testing.assert_array_equal(compute(df), df["flops"])               # default: counted
    np.testing.assert_allclose(compute(df, "6nd"), 6 * df["n_params"] * df["tokens"])
    assert (n_params(df, "nonembed") < n_params(df)).all()
    with pytest.raises(ValueError, match="params='embed'"):
        n_params(df, "embed")
    with pytest.raises(ValueError, match="flops='6ND'"):
        compute(df, "6ND")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="results.csv"):
        load_results(tmp_path)
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_results(tmp_path / "nope.csv")


def test_missing_column_names_file_and_column(tmp_path):
    df = make_sweep.make_sweep().drop(columns=["val_loss"])
    df.to_csv(tmp_path / "results.csv", index=False)
    with pytest.raises(ValueError, match=r"results\.csv.*'val_loss'"):
        load_results(tmp_path)


def test_bad_status_and_non_numeric(tmp_path):
    df = make_sweep.make_sweep()
    df.loc[0, "status"] = "crashed"
    df.to_csv(tmp_path / "results.csv", index=False)
    with pytest.raises(ValueError, match="'status'.*crashed"):
        load_results(tmp_path)
    df = make_sweep.make_sweep().astype({"flops": object})
    df.loc[0, "flops"] = "lots"
    df.to_csv(tmp_path / "results.csv", index=False)
    with pytest.raises(ValueError, match="'flops' must be numeric"):
        load_results(tmp_path)


def test_optional_columns_are_read_when_written(tmp_path):
    """A cgpt sweep writes REQUIRED + OPTIONAL; the fixture (hand-made) has only REQUIRED."""
    assert COLUMNS == REQUIRED + OPTIONAL and not set(REQUIRED) & set(OPTIONAL)
    df = make_sweep.make_sweep()
    df["flops_budget"] = [1e18] + [np.nan] * (len(df) - 1)  # written as "" where unset
    df["peak_lr"] = 2e-3
    df[list(COLUMNS)].to_csv(tmp_path / "results.csv", index=False)
    got = load_results(tmp_path)
    assert list(got.columns) == list(COLUMNS)
    assert got["flops_budget"].iloc[0] == 1e18 and got["flops_budget"].iloc[1:].isna().all()
    assert (got["peak_lr"] == 2e-3).all()
    df = df.astype({"peak_lr": object})
    df.loc[1, "peak_lr"] = "fast"
    df.to_csv(tmp_path / "results.csv", index=False)
    with pytest.raises(ValueError, match="'peak_lr' must be numeric"):
        load_results(tmp_path)


def test_schema_imports_nothing():
    """cgpt's sweep writer imports cgpt.results_schema: it must not pull pandas, scipy or
    matplotlib."""
    code = ("import sys, cgpt.results_schema; bad = {'pandas', 'scipy', 'matplotlib'} & set(sys.modules);"
            " sys.exit(str(bad) if bad else 0)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_public_names():
    for name in analysis.__all__:
        assert hasattr(analysis, name), name
    assert set(analysis.__all__) <= set(dir(analysis))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        analysis.nope


def test_a_run_is_found_beside_its_results_csv_then_where_recorded(tmp_path):
    """`locate_run`, the one fallback for a moved sweep: DIR/<run_id> beside the results.csv
    read first (a copied sweep reads its own runs), then the recorded run_dir; else one error
    naming both places and what the caller needed."""
    from analysis.results import locate_run

    sweep, elsewhere = tmp_path / "moved", tmp_path / "old" / "r0"
    for d in (sweep / "r0", elsewhere):
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("")
    row = {c: np.nan for c in COLUMNS}
    row.update(run_id="r0", model="m", seed=0, status="done", error="", mup=False,
               n_params=1e6, n_params_nonembed=1e6, tokens=2e7, flops=1.2e14, flops_6nd=1.2e14,
               val_loss=3.0, run_dir=str(elsewhere))
    pd.DataFrame([row], columns=list(COLUMNS)).to_csv(sweep / "results.csv", index=False)
    df = load_results(sweep)
    (r,) = df.itertuples()
    assert locate_run(df, r, "metrics.jsonl", "") == sweep / "r0"
    (sweep / "r0" / "metrics.jsonl").unlink()
    assert locate_run(df, r, "metrics.jsonl", "") == elsewhere
    with pytest.raises(FileNotFoundError, match=f"no summary.json for run 'r0' \\(looked in "
                       f"{sweep / 'r0'} and {elsewhere}\\); the fit reads it"):
        locate_run(df, r, "summary.json", "the fit reads it")
