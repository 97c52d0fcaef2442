"""analysis.downstream: the published downstream tables and the accuracy-vs-compute fit."""
import numpy as np
import pytest

from analysis.downstream import TASKS, cerebras_gpt_downstream, fit_downstream, plot_downstream


@pytest.mark.parametrize("shots,mup,n", [(0, False, 7), (0, True, 5), (5, False, 7), (5, True, 5)])
def test_tables_are_consistent(shots, mup, n):
    t = cerebras_gpt_downstream(shots, mup)
    assert len(t) == n and list(t["model"])[0] == "111M"
    # the published average is the mean of the seven tasks, rounded to 3 digits
    np.testing.assert_allclose(t[list(TASKS)].mean(axis=1), t["average"], atol=6e-4)
    assert (np.diff(t["flops"]) > 0).all()


def test_spot_values_from_the_paper():
    sp = cerebras_gpt_downstream().set_index("model")
    assert sp.loc["13B", "hellaswag"] == 0.513 and sp.loc["1.3B", "average"] == 0.410
    mup = cerebras_gpt_downstream(0, True).set_index("model")
    assert mup.loc["111M", "average"] == 0.325  # μP 111M: .315 -> .325
    with pytest.raises(ValueError, match="0- and 5-shot"):
        cerebras_gpt_downstream(1)


def test_fit_tracks_the_accuracy_and_plot(tmp_path):
    sp = cerebras_gpt_downstream()
    fit = fit_downstream(sp, n_boot=100)
    pred = 1 - fit.predict(sp["flops"].to_numpy())
    assert np.abs(pred - sp["average"]).max() < 0.03  # within 3 points of accuracy
    assert 0.02 < fit.params["b"] < 0.1  # accuracy rises slowly with compute
    lo, hi = fit.predict_interval(np.array([1e23]))
    assert lo[0] < fit.predict(np.array([1e23]))[0] < hi[0]
    with pytest.raises(ValueError, match="task='mmlu'"):
        fit_downstream(sp, "mmlu")
    out = tmp_path / "d.png"
    plot_downstream(fit=fit, path=out)
    assert out.stat().st_size > 10_000
