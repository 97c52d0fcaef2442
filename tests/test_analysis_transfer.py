"""analysis.transfer: each width's best LR with an interval, and the μP vs SP drift."""
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import COLUMNS
from analysis.transfer import lr_drift, lr_optimum, lr_sweep, plot_lr_transfer, transfer_table

LRS = [1.25e-3, 2.5e-3, 5e-3, 1e-2, 2e-2, 4e-2]
WIDTHS = [16, 32, 64, 128]


def _curve(best, lrs=LRS, noise=0.0, seed=0):
    x = np.log(np.asarray(lrs) / best)
    return 4.0 + 0.05 * x ** 2 + noise * np.random.default_rng(seed).standard_normal(len(lrs))


def test_optimum_recovers_the_vertex_with_an_interval():
    o = lr_optimum(LRS, _curve(7e-3))
    assert o.edge == "" and o.lr == pytest.approx(7e-3, rel=1e-6)
    assert o.lo < 7e-3 < o.hi and o.hi / o.lo < 2  # 0.35% noise floor: a narrow interval
    noisy = [lr_optimum(LRS, _curve(7e-3, noise=0.03, seed=s)) for s in range(40)]
    covered = np.mean([n.lo <= 7e-3 <= n.hi for n in noisy])
    assert covered >= 0.8, covered
    assert np.median([n.hi / n.lo for n in noisy]) > o.hi / o.lo  # noise widens it


def test_optimum_on_the_grid_edge_is_open_on_that_side():
    hi = lr_optimum(LRS, _curve(1.0))
    assert hi.edge == "high" and hi.lr == LRS[-1] and hi.lo == LRS[-2] and math.isinf(hi.hi)
    lo = lr_optimum(LRS, _curve(1e-5))
    assert lo.edge == "low" and lo.lr == LRS[0] and lo.lo == 0 and lo.hi == LRS[1]
    assert "grid high edge" in str(hi)
    with pytest.raises(ValueError, match=">= 3 distinct LRs"):
        lr_optimum([1e-3, 2e-3, 2e-3], [1.0, 0.9, np.nan])


def _write_sweep(root):
    """An LR x width sweep directory: μP's optimum fixed at 8e-3, SP's ~ 1/width."""
    rows = []
    for mup in (True, False):
        for w in WIDTHS:
            best = 8e-3 if mup else 8e-3 * 32 / w
            for lr, loss in zip(LRS, _curve(best) - 0.1 * math.log(w)):
                rid = f"w{w}-{'mup' if mup else 'sp'}_lr{lr}"
                (root / rid).mkdir(parents=True)
                (root / rid / "config.yaml").write_text(yaml.safe_dump(
                    {"model": {"d_model": w, "mup": mup}, "train": {"peak_lr": lr}}))
                row = dict.fromkeys(COLUMNS, 0)
                row.update(run_id=rid, model=rid, status="done", val_loss=loss, mup=mup,
                           run_dir=f"elsewhere/{rid}", error="")
                rows.append(row)
    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(root / "results.csv", index=False)
    return root


def test_sweep_table_drift_and_plot(tmp_path):
    sweep = lr_sweep(_write_sweep(tmp_path / "sweep"))
    assert len(sweep) == 2 * len(WIDTHS) * len(LRS)
    assert set(sweep["param"]) == {"μP", "SP"}
    table = transfer_table(sweep)
    mup = table[table["param"] == "μP"]
    np.testing.assert_allclose(mup["lr_opt"], 8e-3, rtol=1e-6)
    drift = lr_drift(table)
    assert abs(drift["μP"]) < 1e-6 and drift["SP"] == pytest.approx(-1.0, abs=0.05)
    out = tmp_path / "lr.png"
    plot_lr_transfer(sweep, table, path=out)
    assert out.stat().st_size > 10_000


def test_sweep_without_peak_lr_is_an_error(tmp_path):
    root = _write_sweep(tmp_path / "sweep")
    f = next(root.glob("*/config.yaml"))
    f.write_text(yaml.safe_dump({"model": {"d_model": 16, "mup": True}, "train": {}}))
    with pytest.raises(ValueError, match="train.peak_lr is unset"):
        lr_sweep(root)
    f.unlink()
    with pytest.raises(FileNotFoundError, match="no config.yaml for run"):
        lr_sweep(root)
