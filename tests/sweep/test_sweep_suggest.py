"""`cgpt sweep SPEC --suggest K --write` on a real finished sweep (the approaches fixture), and
the spec's `runs:` list it writes."""
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cgpt.commands import sweep as command
from cgpt.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[2]


def test_suggest_prints_and_writes_runs_the_spec_can_launch(tmp_path, capsys):
    out = tmp_path / "approaches"
    shutil.copytree(ROOT / "tests" / "fixtures" / "analysis" / "approaches", out)
    spec = tmp_path / "approaches.yaml"
    shutil.copy(ROOT / "sweeps" / "approaches.yaml", spec)
    assert command.main([str(spec), "--out", str(out), "--suggest", "3", "--write"]) == 0
    text = capsys.readouterr().out
    assert "next 3 run(s)" in text and "C = 1e+14" in text        # 100x the largest run
    # 100x the largest finished run is a short reach for runs as large as the budget: warned.
    assert "warning: target_flops is 1" in text and "x the largest run (under 100x)" in text
    assert "at most 1.503e+07 tokens a run (one pass over the corpus)" in text
    assert ("fit residual sd (log L): 0.0226 on 15 runs, 0.0045 without the 5 at 1e+11 FLOPs; "
            "those runs look off the law: --fit-min-flops 1.7e+11") in text
    nxt = tmp_path / "approaches_next.yaml"
    runs = yaml.safe_load(nxt.read_text())["runs"]
    assert len(runs) == 3 and all(r["seed"] == 1 for r in runs)
    grid = load_sweep(spec).runs
    sweep = load_sweep(nxt)
    assert [r.run_id for r in sweep.runs[:len(grid)]] == [r.run_id for r in grid]
    new = sweep.runs[len(grid):]
    sizes = {r.model: r.n_params for r in grid}
    for r, e in zip(new, runs):                    # a preset of the sweep, tokens as suggested
        assert r.model == e["model"] and r.n_params == sizes[e["model"]] and r.seed == 1
        assert abs(r.tokens - e["tokens"]) <= r.batch_size * 128      # rounded to whole steps


def test_suggest_is_the_robust_planner(tmp_path, capsys):
    """The CLI's runs are suggest_runs' default (robust) planner at the sweep's sizes, capped at
    one pass over the corpus, and --fit-min-flops leaves runs out."""
    import numpy as np

    import analysis
    from cgpt.commands.suggest import PLANNER, corpus_tokens, suggest

    assert PLANNER["method"] == "robust"
    fixture = ROOT / "tests" / "fixtures" / "analysis" / "approaches"
    res = analysis.load_results(fixture, finished_only=True)
    corpus = corpus_tokens(res)
    assert corpus == pytest.approx(15034880, rel=1e-6)        # the embedded corpus's train split
    sweep = load_sweep(ROOT / "sweeps" / "approaches.yaml")
    sizes = sorted({r.n_params for r in sweep.runs})
    c = 6 * res["n_params"] * res["tokens"]
    for fmin in (None, 2e11):
        got = suggest(sweep, fixture, 2, budget_flops=4e12, fit_min_flops=fmin)
        want = analysis.suggest_runs(res, 100 * c.max(), 4e12, max_runs=2, sizes=sizes,
                                     max_tokens=corpus, fit_min_flops=fmin, **PLANNER)
        assert got["n_params"].tolist() == want["n_params"].tolist()
        assert (got["tokens"] - want["tokens"]).abs().max() <= 1 and got["tokens"].max() <= corpus
        assert set(got["n_params"]) <= set(sizes)
        assert np.isclose(got["flops"].max(), 4e12 * 0.3, rtol=0.01)  # the top share's run
        assert got.attrs["warnings"] and "under 100x" in got.attrs["warnings"][0]
    # A long reach from 15 runs (a noise estimate): no warning, printed or recorded.
    far = suggest(sweep, fixture, 2, target_flops=1e16, budget_flops=4e12)
    assert far.attrs["warnings"] == []
    assert command.main([str(ROOT / "sweeps" / "approaches.yaml"), "--out", str(fixture),
                         "--suggest", "1", "--target-flops", "1e16", "--budget-flops",
                         "4e12"]) == 0
    assert "warning" not in capsys.readouterr().out
    assert command.main([str(ROOT / "sweeps" / "approaches.yaml"), "--out", str(fixture),
                         "--suggest", "1", "--fit-min-flops", "2e12"]) == 2
    assert "--fit-min-flops 2e+12 leaves 0 of 15 finished runs to fit" in capsys.readouterr().err


def test_suggest_warns_on_a_one_shot_leap(tmp_path, capsys):
    """A budget over MAX_LEAP (100) x the compute of the runs fitted prints the leap warning (a
    corpus 1000x larger than the fixture's, so runs of 3e14 FLOPs fit in one pass); at 0.57x
    (the sweep's own scale) it does not."""
    out = tmp_path / "approaches"
    shutil.copytree(ROOT / "tests" / "fixtures" / "analysis" / "approaches", out)
    res = pd.read_csv(out / "results.csv")
    res.assign(epochs=res["epochs"] / 1000).to_csv(out / "results.csv", index=False)
    spec = str(ROOT / "sweeps" / "approaches.yaml")
    leap = ("warning: budget_flops is 143x the compute of the runs fitted (over 100x): one plan "
            "puts it all")
    for budget, warned in (("1e15", True), ("4e12", False)):
        assert command.main([spec, "--out", str(out), "--suggest", "2", "--target-flops", "1e18",
                             "--budget-flops", budget]) == 0
        text = capsys.readouterr().out
        assert "next 2 run(s)" in text
        assert (leap in text) is warned and (("warning:" in text) is warned)


def test_runs_entries_are_checked(tmp_path):
    spec = yaml.safe_load((ROOT / "sweeps" / "approaches.yaml").read_text())
    path = tmp_path / "s.yaml"
    for bad, match in (([{"model": "tiny-17k"}], r"runs\[0\] must be a mapping with model, tokens"),
                       ([{"model": "tiny-99k", "tokens": 1e6}], r"runs\[0\]: .*tiny-99k"),
                       ([{"model": "tiny-17k", "tokens": 1e6}] * 2, "duplicate run ids")):
        path.write_text(yaml.safe_dump({**spec, "runs": bad}))
        with pytest.raises(ValueError, match=match):
            load_sweep(path)


def test_suggest_needs_finished_runs(tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    (out / "results.csv").write_text(
        (ROOT / "tests" / "fixtures" / "analysis" / "approaches" / "results.csv").read_text()
        .splitlines()[0] + "\n")
    assert command.main([str(ROOT / "sweeps" / "approaches.yaml"), "--out", str(out),
                         "--suggest", "2"]) == 2
    assert "0 finished run(s); --suggest fits L(N, D)" in capsys.readouterr().err
