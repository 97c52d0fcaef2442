"""analysis.plots and analysis.report: figures render to PNG; the end-of-sweep text."""
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from analysis import (CEREBRAS_GPT, EPOCH, cerebras_gpt_table, fit_isoflop, fit_power_law,
                      plot_isoflop, plot_loss_vs_compute, plot_mup_vs_sp, sweep_report)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "analysis" / "sweep"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    data = Path(path).read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000


def test_plot_loss_vs_compute(tmp_path):
    t = cerebras_gpt_table()
    fit = fit_power_law(t["flops"], t["loss"], n_boot=30)
    fig = plot_loss_vs_compute(t["flops"], t["loss"], fit, path=tmp_path / "sub" / "lc.png")
    assert isinstance(fig, Figure)
    assert_png(tmp_path / "sub" / "lc.png")
    labels = [l.get_label() for l in fig.axes[0].get_lines()]
    assert CEREBRAS_GPT.name in labels and any(l.startswith("fit") for l in labels)
    assert len(fig.axes[0].collections) == 2                  # the points and the band
    assert plot_loss_vs_compute(t["flops"], t["loss"], overlays=()).axes[0].get_lines() == []
    # A published law is drawn only over the compute it was fitted on: not at CPU scale.
    x = np.geomspace(1e12, 1e15, 5)
    small = plot_loss_vs_compute(x, CEREBRAS_GPT(x), fit, residuals=True)
    assert CEREBRAS_GPT.name not in [l.get_label() for l in small.axes[0].get_lines()]
    lines = fig.axes[0].get_lines()
    cg = next(l for l in lines if l.get_label() == CEREBRAS_GPT.name)
    assert cg.get_xdata().min() >= 2.6e18 and cg.get_xdata().max() <= 2.3e22
    assert len(small.axes) == 2 and small.axes[1].get_ylabel() == "run / fit - 1 (%)"


def test_plot_isoflop(tmp_path):
    rows = [dict(budget=c, C=c, N=EPOCH.n_opt(c) * f, D=c / (6 * EPOCH.n_opt(c) * f))
            for c in (1e18, 1e19, 1e20) for f in np.logspace(-0.7, 0.7, 5)]
    df = pd.DataFrame(rows)
    df["loss"] = EPOCH(df["N"], df["D"])
    fig = plot_isoflop(fit_isoflop(df), path=tmp_path / "iso.png")
    assert len(fig.axes) == 2
    assert_png(tmp_path / "iso.png")


def test_plot_mup_vs_sp(tmp_path):
    t = cerebras_gpt_table()
    mu = t.dropna()
    x = np.r_[t["flops"], mu["flops"]]
    y = np.r_[t["loss"], mu["loss_mup"]]
    is_mup = np.r_[np.zeros(len(t), bool), np.ones(len(mu), bool)]
    fig = plot_mup_vs_sp(x, y, is_mup, reference=CEREBRAS_GPT, path=tmp_path / "mup.png")
    assert_png(tmp_path / "mup.png")
    legend = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert any("muP: mean -0.43%" in s for s in legend), legend
    plot_mup_vs_sp(x, y, is_mup)                               # default: fit the SP runs
    with pytest.raises(ValueError, match="mup"):
        plot_mup_vs_sp(x, y, np.zeros_like(is_mup))


def test_sweep_report(tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(FIXTURE, sweep)
    text = sweep_report(sweep, n_boot=200)
    assert_png(sweep / "loss_vs_compute.png")
    assert "21 runs (18 done, 1 failed, 1 running, 1 pending)" in text
    assert "fitted 14 SP runs" in text and "muP: 4 runs" in text
    b, lo, hi = map(float, re.search(r"b\s+=\s+(\S+)\s+\[(\S+), (\S+)\]", text).groups())
    assert lo <= 0.12 <= hi and abs(b - 0.12) < 0.03          # the fixture's true exponent
    assert "Cerebras-GPT: 0.0737" in text
    assert "seeds of a model resampled together" in text
    res = re.search(r"residuals \(run / fit - 1.*\): (.*); rms (\S+)%", text)
    assert res and res.group(1).count("%") == 7 and float(res.group(2)) < 1.0   # 0.5% noise
    ex = re.search(r"extrapolation check: fitted without the largest compute .* error (\S+)%; "
                   r"the band (covers|does NOT cover) it", text)
    assert ex and abs(float(ex.group(1))) < 2.0
    text6 = sweep_report(sweep / "results.csv", out_png=tmp_path / "r6.png", flops="6nd", n_boot=0)
    assert "flops_6nd (6nd)" in text6
    assert_png(tmp_path / "r6.png")


def test_sweep_report_too_few_runs(tmp_path):
    df = pd.read_csv(FIXTURE / "results.csv")
    df.loc[df.index[2:], "status"] = "failed"
    df.to_csv(tmp_path / "results.csv", index=False)
    with pytest.raises(ValueError, match=r"results\.csv: 2 finished run\(s\).*at least 3"):
        sweep_report(tmp_path)
