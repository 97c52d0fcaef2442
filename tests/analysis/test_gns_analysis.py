"""analysis.gns (JAX-free): a run's critical batch from its logged noise scale, a sweep's table
and power-law trend, the plot; the published Cerebras-GPT batches it is drawn beside."""
import json

import numpy as np
import pandas as pd
import pytest

from analysis import gns
from analysis.plots import plot_critical_batch
from analysis.published import KAPLAN_BCRIT, cerebras_gpt_batches
from cgpt.results_schema import REQUIRED

SEQ = 64


def _write_run(d, b_crit: float, late_loss: float, steps: int = 100, seed: int = 0):
    """A run directory whose logged estimates have B_crit = b_crit late in training (the first
    half logs a different, early noise scale that `late=0.5` must leave out)."""
    rng = np.random.default_rng(seed)
    d.mkdir()
    with open(d / "metrics.jsonl", "w") as f:
        for step in range(5, steps + 1, 5):
            late = step >= steps / 2
            g2 = 1.0 + 0.3 * rng.standard_normal()
            trace = (b_crit if late else b_crit / 10) * (1.0 + 0.1 * rng.standard_normal())
            f.write(json.dumps({"step": step, "tokens": step * 32 * SEQ,
                                "loss": late_loss if late else late_loss + 1,
                                "gns_g2": g2, "gns_trace": trace}) + "\n")
    (d / "summary.json").write_text(json.dumps({"seq_len": SEQ, "batch_size": 32,
                                                "gns_b_simple": b_crit}))


def _sweep(tmp_path, exponent: float = 5.0):
    losses = np.array([4.0, 3.6, 3.3, 3.1])
    b_crit = 50 * (losses / 4.0) ** -exponent
    rows = []
    for i, (loss, b) in enumerate(zip(losses, b_crit)):
        rid = f"run{i}"
        # trace/g2 averages to b only in expectation: compare the table with the means
        _write_run(tmp_path / rid, b, loss, seed=i)
        rows.append({c: np.nan for c in REQUIRED} | {
            "run_id": rid, "model": f"m{i}", "seed": 0, "status": "done", "error": "",
            "n_params": 1e4 * 2 ** i, "n_params_nonembed": 1e4 * 2 ** i, "tokens": 2e5 * 2 ** i,
            "flops": 1e11 * 4 ** i, "flops_6nd": 1e11 * 4 ** i, "val_loss": loss + 0.05,
            "mup": False, "run_dir": str(tmp_path / rid)})
    pd.DataFrame(rows).to_csv(tmp_path / "results.csv", index=False)
    return losses, b_crit


def test_critical_batch_is_the_late_ratio_of_means(tmp_path):
    _write_run(tmp_path / "r", b_crit=40.0, late_loss=3.0)
    log = gns.read_noise(tmp_path / "r")
    tail = log[log["step"] >= 50]
    assert gns.critical_batch(log) == pytest.approx(tail["gns_trace"].mean()
                                                    / tail["gns_g2"].mean())
    assert gns.critical_batch(log) == pytest.approx(40.0, rel=0.25)
    assert gns.critical_batch(log, late=1.0) < 0.7 * gns.critical_batch(log)  # early is smaller
    with pytest.raises(ValueError, match="late=0"):
        gns.critical_batch(log, late=0)


def test_table_and_trend_recover_the_power_law(tmp_path):
    losses, b_crit = _sweep(tmp_path)
    t = gns.noise_table(tmp_path)
    assert list(t["late_loss"]) == list(losses)
    assert np.allclose(t["b_crit_tokens"], t["b_crit"] * SEQ)
    assert list(t["D"]) == [2e5 * 2 ** i for i in range(4)]             # tokens trained
    assert np.allclose(t["b_crit"], b_crit, rtol=0.25)
    fit = gns.fit_critical_batch(t, "loss", n_boot=50)
    assert fit.params["b"] == pytest.approx(5.0, abs=1.0)
    fit_c = gns.fit_critical_batch(t, "compute", n_boot=50)
    assert fit_c.params["b"] > 0  # B_crit grows with compute
    fig = plot_critical_batch(t, fit, fit_c, path=tmp_path / "cb.png")
    assert len(fig.axes) == 2 and (tmp_path / "cb.png").stat().st_size > 5000


def test_runs_without_the_noise_scale_are_a_clear_error(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    with pytest.raises(ValueError, match="train.gns=true"):
        gns.read_noise(tmp_path / "r")
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        gns.read_noise(tmp_path / "missing")


def test_published_batches_match_the_recipe_cgpt_trains_with():
    from cgpt.config.recipe import PUBLISHED_RECIPE

    t = cerebras_gpt_batches().set_index("model")
    assert {m: int(t.loc[m, "batch_size_start"]) for m in t.index} == {
        m: v[3] for m, v in PUBLISHED_RECIPE.items()}
    assert t.loc["111M", "batch_tokens"] == 245_760 and t.loc["13B", "batch_size"] == 1080
    assert KAPLAN_BCRIT(3.0) == pytest.approx(2e8 * 3.0 ** (-1 / 0.21))


def test_analysis_gns_imports_no_jax():
    """(Of cgpt it loads only the directories' contract: tests/structure/test_imports.py.)"""
    import subprocess
    import sys

    code = ("import sys, analysis.gns, analysis.plots; "
            "sys.exit(any(m.split('.')[0] == 'jax' for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
