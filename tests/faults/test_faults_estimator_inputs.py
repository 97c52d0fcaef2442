"""#49: the critical-batch and schedule-law estimators refuse input that would silently bend
their fit: each test reproduces its fault first."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis import fit_schedule_law, fit_tradeoff, read_noise, read_schedule_curves


def _log(d, rows):
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_a_null_loss_in_a_runs_log_is_named_not_dropped(tmp_path):
    """Before: read_noise kept the hole (NaN), the smoothed curve never crossed the target
    and the run fell out of the critical-batch fit without a word."""
    rows = [{"step": s, "lr": 1e-3, "loss": 5.0 - 0.01 * s, "gns_g2": 1.0, "gns_trace": 8.0}
            for s in range(1, 21)]
    rows[11]["loss"] = None  # cgpt writes null for a non-finite number
    d = _log(tmp_path / "run", rows)
    with pytest.raises(ValueError, match=r"metrics\.jsonl: the loss is null .* at step\(s\) "
                       r"\[12\]; the critical batch reads the loss of every logged step"):
        read_noise(d)


def test_runs_of_one_name_in_two_sweeps_stay_two_curves(tmp_path):
    """Before: both became run 'r1', one curve with every step twice, and the error blamed
    train.log_every."""
    rows = [{"step": s, "lr": 1e-3, "loss": 5.0 - 0.01 * s} for s in range(1, 11)]
    a, b = _log(tmp_path / "sp" / "r1", rows), _log(tmp_path / "mup" / "r1", rows)
    curves = read_schedule_curves([a, b])
    assert sorted(curves["run_id"].unique()) == ["mup/r1", "sp/r1"]
    assert len(curves) == 20
    with pytest.raises(ValueError, match=r"given more than once \(the same run\)"):
        read_schedule_curves([a, tmp_path / "sp" / ".." / "sp" / "r1"])


def _curve(steps):
    return pd.DataFrame({"run_id": "r", "step": steps, "lr": 1e-3,
                         "loss": np.linspace(5, 4, len(steps))})


def test_schedule_law_steps_are_whole_and_each_logged_once():
    """Before: step 2.5 was truncated to 2 and then named a missing step; a duplicated step
    was named a missing one (train.log_every=1 blamed)."""
    with pytest.raises(ValueError, match=r"run 'r' has step 2\.5, not a whole number"):
        fit_schedule_law(_curve([1, 2.5, 3, 4, 5, 6]), "tissue", n_boot=10)
    with pytest.raises(ValueError, match=r"run 'r' has 2 records of step 3; one per step"):
        fit_schedule_law(_curve([1, 2, 3, 3, 4, 5, 6]), "tissue", n_boot=10)


def test_fit_tradeoff_refuses_a_negative_batch_and_steps_that_grow_with_it():
    """Before: a negative batch was dropped without a word, and steps growing with the batch
    were fitted (an E_min near 0)."""
    b = np.array([8.0, 16, 32, 64, 128])
    s = 1000 + 16000 / b
    with pytest.raises(ValueError, match=r"batch: batch sizes are > 0 sequences, got \[-8\.0\]"):
        fit_tradeoff(np.r_[-8.0, b[1:]], s, n_boot=0)
    with pytest.raises(ValueError, match=r"steps grow with the batch size \(1125 at B = "
                       r"8, 3000 at B = 128\)"):
        fit_tradeoff(b, s[::-1], n_boot=0)
    fit = fit_tradeoff(b, s, n_boot=0)
    assert fit.e_min == pytest.approx(16000, rel=1e-3)
