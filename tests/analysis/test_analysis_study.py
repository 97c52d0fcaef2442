"""analysis.study: a published table in its own units converted once to the columns every
estimator reads (issue 48 item 1); bad units are one line naming the column and the fix."""
import numpy as np
import pandas as pd
import pytest

from analysis import ChinchillaLaw, fit_chinchilla
from analysis.batch_tradeoff import measure_critical_batch
from analysis.study import bring_in, lr_every_step

LAW = ChinchillaLaw(E=1.8, A=400.0, B=1200.0, alpha=0.34, beta=0.3)


def paper_table():
    """A study as a paper might release it: non-embedding N, data in sequences of 2048
    tokens, the validation loss, embeddings 50257 x d_model."""
    d_model = np.array([256, 512, 768, 1024, 1536])
    embed = 50257 * d_model
    n_nonembed = 12 * 12 * d_model ** 2
    rows = []
    for ne, e in zip(n_nonembed, embed):
        for mult in (10, 20, 40, 80):
            tokens = mult * (ne + e)
            rows.append({"params_nonembed": ne, "embed": e, "seqs": tokens / 2048,
                         "val": LAW(ne + e, tokens)})
    return pd.DataFrame(rows)


def test_a_paper_table_in_its_units_fits_as_the_law_it_came_from():
    t = bring_in(paper_table(), N="params_nonembed", params="nonembed", embed="embed",
                 D="seqs", data="sequences", seq_len=2048, loss="val", metric="val_loss")
    assert np.allclose(t["N_total"], t["N"] + paper_table()["embed"])
    assert np.allclose(t["C"], 6 * t["N_total"] * t["D"])
    assert t.attrs["units"]["flops"] == "6nd" and t.attrs["units"]["metric"] == "val_loss"
    fit = fit_chinchilla(t["N_total"], t["D"], t["loss"], n_boot=0, profile_params=())
    assert fit.params["alpha"] == pytest.approx(0.34, abs=0.01)
    assert fit.params["beta"] == pytest.approx(0.30, abs=0.01)


def test_a_steps_table_in_tokens_feeds_the_critical_batch():
    b_tok = np.array([64, 128, 256, 512, 1024, 4096]) * 512
    tab = pd.DataFrame({"n_params": 85e6, "target_loss": 3.42, "batch_tokens": b_tok,
                        "steps": 1300 + 2.8e6 / (b_tok / 512)})
    t = bring_in(tab, N="n_params", D=None, loss=None, batch="tokens",
                 batch_size="batch_tokens", seq_len=512, target="target_loss")
    assert list(t["batch_size"]) == [64, 128, 256, 512, 1024, 4096]
    res, _ = measure_critical_batch(t, n_boot=20, definition="overhead", b_ref=256)
    assert res["b_crit"].iloc[0] == pytest.approx(0.2 * 2.8e6 / 1300 + 1.2 * 256)
    assert res["seq_len"].iloc[0] == 512


def test_lr_every_step_rebuilds_a_schedule_from_points():
    eta = lr_every_step([1, 100, 1000], [0.0, 3e-4, 3e-5])
    assert eta.size == 1000 and eta[99] == 3e-4 and eta[-1] == 3e-5
    assert eta[49] == pytest.approx(3e-4 * 49 / 99)
    steps = np.arange(1, 24001, 128)
    cos = 3e-5 + 0.5 * 2.7e-4 * (1 + np.cos(np.pi * steps / 24000))
    full = 3e-5 + 0.5 * 2.7e-4 * (1 + np.cos(np.pi * np.arange(1, 24001) / 24000))
    assert np.abs(lr_every_step(steps, cos, 24000) - full).max() < 1e-4 * 3e-4
    with pytest.raises(ValueError, match="total=500: shorter than the last"):
        lr_every_step([1, 1000], [1e-3, 1e-4], total=500)


def test_bad_units_are_one_line_naming_the_column_and_the_fix():
    p = paper_table()
    with pytest.raises(ValueError, match="data='sequences': column 'seqs' counts sequences; "
                                         "pass seq_len="):
        bring_in(p, N="params_nonembed", params="nonembed", embed="embed", D="seqs",
              data="sequences", loss="val")
    with pytest.raises(ValueError, match="column 'seqs' counts sequences, its header says, "
                                         "but data='tokens'; pass data='sequences'"):
        bring_in(p.assign(N=p["params_nonembed"] + p["embed"]), D="seqs", loss="val")
    with pytest.raises(ValueError, match="column 'D' is below column 'N'.*data='sequences'"):
        bring_in(p.assign(N=p["params_nonembed"] + p["embed"]).rename(columns={"seqs": "D"}),
                 loss="val")
    with pytest.raises(ValueError, match="flops='6nd' with params='nonembed'.*embed="):
        bring_in(p, N="params_nonembed", params="nonembed", D="seqs", data="sequences",
              seq_len=2048, loss="val")
    with pytest.raises(ValueError, match="no column 'loss' .*loss="):
        bring_in(p, N="params_nonembed", params="nonembed", embed="embed", D="seqs",
              data="sequences", seq_len=2048)
    with pytest.raises(ValueError, match="column 'val' .* has 'x' at row 3"):
        bring_in(p.assign(val=p["val"].astype(object).where(p.index != 3, "x")),
              N="params_nonembed", params="nonembed", embed="embed", D="seqs",
              data="sequences", seq_len=2048, loss="val")
    with pytest.raises(ValueError, match="embedding parameters exceed column 'N'"):
        bring_in(p.assign(N=p["params_nonembed"]), embed="embed", D=None, loss="val")
    with pytest.raises(ValueError, match=r"no column 'C' \(FLOPs as counted\); name .* C="):
        bring_in(p, flops="counted", N="params_nonembed", params="nonembed", embed="embed",
              D="seqs", data="sequences", seq_len=2048, loss="val")
    with pytest.raises(ValueError, match="params='all'"):
        bring_in(p, params="all")
