"""Tables typed by hand or exported from other tools into bring_in, the critical batch and
compare: units in a header or a cell, text where a number belongs, a batch in tokens. Each
test reproduces a fault of the code before it (a silent wrong answer, a traceback, or a
message that did not name the column)."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from analysis import (bring_in, compare, finished, fit_tradeoff, measure_critical_batch)

B = np.array([32, 64, 128, 256, 512, 1024], float)
S = 1000 + 64000 / B   # S_min = 1000, E_min = 64000: B_crit = 64 sequences


def _steps_table(tmp_path, steps, **cols) -> pd.DataFrame:
    """A steps-to-target CSV as typed by hand, read back with pandas."""
    p = tmp_path / "steps.csv"
    pd.DataFrame({"batch_size": B.astype(int), "steps": steps, **cols}).to_csv(p, index=False)
    return pd.read_csv(p)


def test_a_steps_cell_that_is_not_a_number_is_named(tmp_path):
    """Before: "3,000" (a thousands separator) was read as NaN, "never reached", and the
    batch size left the fit without a word: B_crit 66.7 instead of 64."""
    steps = [f"{S[0]:,.0f}"] + list(S[1:])
    with pytest.raises(ValueError, match=r"column 'steps' has '3,000' at row 0, not a number"):
        measure_critical_batch(_steps_table(tmp_path, steps), n_boot=20)
    for text in (">10000", "3k", "1:23:45"):
        with pytest.raises(ValueError, match=f"column 'steps' has '{text}'"):
            measure_critical_batch(_steps_table(tmp_path, [text] + list(S[1:])), n_boot=20)
    for empty in ("", "n/a", "-"):   # not reached: still NaN, the rest measured
        t = _steps_table(tmp_path, [empty] + list(S[1:]))
        assert measure_critical_batch(t, n_boot=20)[0]["b_crit"].iloc[0] == pytest.approx(64)


def test_text_in_the_optional_columns_is_named(tmp_path):
    """Before: a target "3.5 nats" became NaN and N "125M" was carried as text (exit 0);
    seq_len "2k" and b_simple "x" ended in a bare `could not convert string to float`."""
    for col, value in (("target", "3.5 nats"), ("N", "125M"), ("seq_len", "2k"),
                       ("b_simple", "x"), ("peak_lr", "x")):
        with pytest.raises(ValueError, match=f"column '{col}' has '{value}' at row 0"):
            measure_critical_batch(_steps_table(tmp_path, S, **{col: value}), n_boot=20)


def test_a_batch_in_tokens_is_refused(tmp_path):
    t = _steps_table(tmp_path, S, seq_len=2048).assign(batch_size=lambda d: d.batch_size * 2048)
    with pytest.raises(ValueError, match=r"tokens in one batch .*is batch_size in tokens\?"):
        measure_critical_batch(t, n_boot=20)


def test_a_target_too_few_batch_sizes_reach_is_warned(tmp_path):
    t = pd.concat([_steps_table(tmp_path, S, target=3.5),
                   _steps_table(tmp_path, [2 * S[0], 2 * S[1]] + [""] * 4, target=3.3)])
    with pytest.warns(UserWarning, match=r"left out target\(s\) 3.3: reached by fewer than 3"):
        out = measure_critical_batch(t, n_boot=20)[0]
    assert out["target"].tolist() == [3.5]


def test_what_is_not_a_table_is_named(tmp_path):
    """Before: AttributeError `'str' object has no attribute 'columns'`."""
    with pytest.raises(TypeError, match=r"table: a DataFrame .*not a str .*pandas.read_csv"):
        measure_critical_batch(str(tmp_path / "steps.csv"))
    with pytest.raises(TypeError, match="not a list"):
        measure_critical_batch([{"batch_size": 32, "steps": 3000}])


def test_fit_tradeoff_names_its_argument():
    """Before: `could not convert string to float: '1,000'`, naming neither argument."""
    with pytest.raises(ValueError, match="steps must be numbers, got '3,000'"):
        fit_tradeoff(B, [f"{v:,.0f}" for v in S], n_boot=20)
    with pytest.raises(TypeError, match="not a dict"):
        fit_tradeoff(dict(enumerate(B)), S, n_boot=20)
    nullable = pd.array([None, *S[1:].round()], dtype="Float64")
    assert fit_tradeoff(pd.array(B.astype(int), dtype="Int64"), nullable,
                        n_boot=20).critical_batch()[0] == pytest.approx(64, rel=0.01)


def _paper(**cols) -> pd.DataFrame:
    n = np.array([125e6, 350e6, 760e6, 1.3e9])
    return pd.DataFrame({"N": n, "D": 20 * n, "loss": [3.2, 2.9, 2.7, 2.55], **cols})


@pytest.mark.parametrize("header,unit", [("params (M)", "millions"), ("params_B", "billions"),
                                         ("N (thousands)", "thousands"), ("Params [M]",
                                                                          "millions")])
def test_a_count_in_the_units_its_header_names_is_refused(header, unit):
    """Before: `params (M)` = 125 was read as 125 parameters (C = 6 N D a millionth)."""
    t = _paper(**{header: [125, 350, 760, 1300]})
    with pytest.raises(ValueError, match=rf"column '{re.escape(header)}' \(parameters, total\) "
                                         rf"is in {unit}"):
        bring_in(t, N=header)


def test_a_loss_header_is_not_read_as_a_unit():
    """`loss_B` is recipe B's loss, not billions: only counts' headers are read for units."""
    t = _paper().rename(columns={"loss": "loss_B"})
    assert bring_in(t, loss="loss_B")["loss"].iloc[0] == 3.2


def test_flops_in_other_units_are_refused():
    """Before: FLOPs in PF-days (8.64e19 FLOPs each), whole or one row, were taken."""
    t = _paper()
    with pytest.raises(ValueError, match=r"column 'FLOPs \(PF-days\)' .*is in PF-days"):
        bring_in(t.assign(**{"FLOPs (PF-days)": 6 * t.N * t.D / 8.64e19}), flops="counted",
                 C="FLOPs (PF-days)")
    c = 6 * t.N * t.D
    c[2] /= 8.64e19
    with pytest.raises(ValueError, match=r"column 'C' \(FLOPs as counted\) is 1.16e-20 x 6 N D "
                                         "at row 2"):
        bring_in(t.assign(C=c), flops="counted")
    assert bring_in(t.assign(C=6 * t.N * t.D * 1.3), flops="counted")["C"].iloc[0] == \
        pytest.approx(6 * 125e6 * 2.5e9 * 1.3)


def test_a_header_in_tokens_read_as_sequences_is_refused():
    """Before: `batch (tokens)` with the default batch='sequences' gave 524288 sequences."""
    t = _paper(**{"batch (tokens)": [524288] * 4})
    with pytest.raises(ValueError, match=r"counts tokens, its header says, but "
                                         "batch='sequences'; pass batch='tokens'"):
        bring_in(t, batch_size="batch (tokens)")
    out = bring_in(t, batch_size="batch (tokens)", batch="tokens", seq_len=2048)
    assert out["batch_size"].iloc[0] == 256


def test_steps_and_targets_as_text_are_named():
    """Before: "1,000" and "3.5 nats" became NaN without a word."""
    with pytest.raises(ValueError, match="column 'steps' has '1,000' at row 0"):
        bring_in(_paper(steps=["1,000"] * 4))
    with pytest.raises(ValueError, match="column 'target' has '3.5 nats' at row 0"):
        bring_in(_paper(target=["3.5 nats"] * 4))


C = np.array([1e17, 3e17, 1e18, 3e18, 1e19, 3e19])
LA = 20 * C ** -0.05 + 1.5


def test_compare_names_a_missing_flops_column():
    """Before: KeyError 'flops'."""
    with pytest.raises(ValueError, match=r"no column 'flops' \(FLOPs, flops='counted'\); "
                                         "pass flops='6nd', or name"):
        compare(pd.DataFrame({"val_loss": LA, "flops_6nd": C}), (C, LA), n_boot=100)


def test_compare_names_what_it_cannot_use():
    """Before: a dict read as its keys ("got 'C'"), a swapped pair ended at the exponent's
    search bound, `at='1e21 FLOPs'` in float()'s words, names=('a',) an IndexError, a ladder
    half in PF-days at the exponent's bound."""
    with pytest.raises(ValueError, match=r"runs_a \(A\): a dict \(C, L\); pass the pair"):
        compare({"C": C, "L": LA}, (C, LA), n_boot=100)
    with pytest.raises(ValueError, match="no loss in nats: the pair swapped"):
        compare((LA, C), (LA, C), n_boot=100)
    with pytest.raises(ValueError, match="at='1e21 FLOPs': the compute to compare at"):
        compare((C, LA), (C, LA), at="1e21 FLOPs", n_boot=100)
    with pytest.raises(ValueError, match=r"names=\('a',\): two names"):
        compare((C, LA), (C, LA), names=("a",), n_boot=100)
    with pytest.raises(ValueError, match="decades in one ladder: some runs in other units"):
        compare((np.r_[C[:3], C[3:] / 8.64e19], LA), (C, LA), n_boot=100)


def test_a_status_of_another_tool_is_named():
    """Before: W&B's state "finished" left no finished run ("no finished runs to fit")."""
    t = pd.DataFrame({"run_id": list("abcdef"), "status": "finished", "val_loss": LA,
                      "flops": C})
    with pytest.raises(ValueError, match=r"column 'status' has \['finished'\]; allowed are"):
        finished(t)
