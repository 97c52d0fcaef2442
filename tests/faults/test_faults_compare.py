"""#49: what `analysis.compare` and `cgpt sweep compare` refuse or warn about, rather than
print a number the runs do not say."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest

from analysis import PowerLaw, compare
from analysis.simulate import recipe_ladders

LAW = PowerLaw.from_scale(5.984e22, 0.0737, 0.5066)
C = np.geomspace(2.6e18, 2.3e22, 6)


def test_a_law_that_does_not_reproduce_its_own_points_is_an_error_naming_the_ladder():
    """Before: B's fitted law predicted 3.1, 0.099, 0.003 ... at B's own runs (all 3.0), and
    the answer was m = inf [6e-13, inf] with no warning."""
    ya = 60 * C ** -0.15 + 2
    with pytest.raises(ValueError, match=r"runs_b \(B\): its fitted law .* predicts 3\.1, "
                       r"0\.0985.* whose losses are 3, 3, 3.*does not fit this ladder"):
        compare((C, ya), (C, np.full(6, 3.0)), n_boot=300)


def test_an_interval_the_resamples_cannot_form_is_refused_with_the_reason():
    """Before: method='cases' on 3 sizes printed 2.06 [2.11, 2.11], a zero-width interval
    excluding its estimate: the only usable resamples were the data itself."""
    a, b = recipe_ladders(LAW, lambda x: LAW(2 * np.asarray(x, float)), C[::2], noise=0.005,
                          seeds=1)
    with pytest.raises(ValueError, match=r"no 95% interval can be formed: \d+ of 2000 cases "
                       r"resamples are usable, 1 of them distinct.*3 and 3 sizes.*method='wild'"):
        compare(a, b, method="cases")
    r = compare(a, b)  # the wild bootstrap keeps every size: its interval holds the estimate
    assert r.lo < r.multiplier < r.hi


def _sweeps(tmp_path):
    from tests.analysis.test_analysis_compare import _sweep, scaled

    return _sweep(tmp_path / "a", LAW), _sweep(tmp_path / "b", scaled(1.3), seed=1)


def _cli(*argv, cwd=None):
    return subprocess.run([sys.executable, "-m", "cgpt", "sweep", "compare", *map(str, argv)],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def test_a_sweep_with_unfinished_runs_is_refused_naming_them_unless_partial(tmp_path):
    """Before: a sweep still running was compared on its finished half without a word."""
    a, b = _sweeps(tmp_path)
    df = pd.read_csv(b / "results.csv")
    df.loc[[3, 7], "status"] = ["running", "pending"]
    df.loc[[3, 7], "val_loss"] = np.nan
    df.to_csv(b / "results.csv", index=False)
    with pytest.raises(ValueError, match=r"runs_b \(B\): 2 of 13 runs not finished \(pending, "
                       r"running: m3_s1, m7_s1\).*partial=True \(--partial\)"):
        compare(a, b, n_boot=100)
    with pytest.warns(UserWarning, match="2 of 13 runs not finished.*compared without them"):
        r = compare(a, b, n_boot=100, partial=True)
    assert r.n_b == 10
    out = _cli(a, b, "--partial", "--plot", tmp_path / "p.png")
    assert out.returncode == 0 and "warning: runs_b (b): 2 of 13 runs not finished" in out.stdout


def test_extrapolations_far_outside_the_ladders_are_warned_with_the_span():
    """Before: --at 13 decades beyond both ladders, or ladders 15 decades apart (a unit
    mix-up), extrapolated silently."""
    a, b = recipe_ladders(LAW, lambda x: LAW(1.5 * np.asarray(x, float)), C, noise=0.0)
    with pytest.warns(UserWarning, match=r"at=2\.3e\+35 is 1e\+13 times beyond the compute "
                      r"either ladder trained \(A spans 2\.6e\+18-2\.3e\+22 FLOPs.*more than 100x"):
        compare(a, b, at=2.3e35, n_boot=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compare(a, b, at=2.3e23, n_boot=100)  # 10x beyond: a law's ordinary use, no warning
    far = (b[0] * 1e15, b[1])
    with pytest.warns(UserWarning, match=r"the ladders do not overlap in compute \(A spans "
                      r"2\.6e\+18-2\.3e\+22 FLOPs, B 2\.6e\+33-2\.3e\+37\)"):
        compare(a, far, n_boot=100)


def test_the_plot_path_is_printed_as_written_and_an_unwritable_one_names_plot(tmp_path):
    """Before: --plot out/figure wrote out/figure.png but printed out/figure; a plot that
    could not be written (a read-only sweep) said 'fix or remove it', not --plot."""
    a, b = _sweeps(tmp_path)
    out = _cli(a, b, "--plot", tmp_path / "out" / "figure")
    assert out.returncode == 0, out.stderr
    assert f"plot: {tmp_path / 'out' / 'figure.png'}" in out.stdout
    assert (tmp_path / "out" / "figure.png").is_file()
    (b / "compare_a.png").mkdir()  # the default place cannot take the file
    out = _cli(a, b)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"cgpt sweep: error: the plot {b / 'compare_a.png'} (--plot's default): cannot be "
        "written (Is a directory); pass --plot PATH.png in a writable folder"], out.stderr


def test_a_sweep_folder_whose_name_is_not_utf8_is_compared(tmp_path):
    """Before: a matplotlib traceback (a name no font can draw)."""
    a, b = _sweeps(tmp_path)
    odd = os.fsencode(str(tmp_path)) + b"/b\xff"
    os.rename(os.fsencode(str(b)), odd)
    out = subprocess.run([sys.executable, "-m", "cgpt", "sweep", "compare", str(a),
                          os.fsdecode(odd)], capture_output=True, timeout=300)
    assert out.returncode == 0 and b"Traceback" not in out.stderr, out.stderr
    assert "b\ufffd against a" in out.stdout.decode(errors="surrogateescape")
    assert os.path.isfile(odd + b"/compare_a.png")


def test_finished_refuses_a_run_listed_twice_in_a_table_pandas_read(tmp_path):
    """Before: the duplicate check lived in load_results only, so finished() on a table read
    by pandas let one run listed four times into a fit."""
    from analysis import finished
    from tests.analysis.test_analysis_compare import _sweep

    df = pd.read_csv(_sweep(tmp_path / "a", LAW) / "results.csv")
    four = pd.concat([df] + [df.iloc[[2]]] * 3, ignore_index=True)
    with pytest.raises(ValueError, match=r"column 'run_id' lists run\(s\) \['m2_s0', 'm2_s0', "
                       r"'m2_s0', 'm2_s0'\].*more than once"):
        finished(four)
    assert len(finished(df)) == 12
