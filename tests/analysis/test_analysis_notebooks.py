"""The notebooks: committed with their outputs (figures as PNG, printed fits), in sync with
their generator (tests/fixtures/analysis/make_notebooks.py), small enough to review, and they
run top to bottom (nbclient) here; a cell that errors fails the test."""
import base64
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
FIXTURE = ROOT / "tests" / "fixtures" / "analysis"
sys.path.insert(0, str(FIXTURE))
import make_notebooks  # noqa: E402  (the notebooks' generator)

CASES = make_notebooks.CELLS
MAX_NOTEBOOK = 400_000  # bytes: the committed file, outputs included
MAX_IMAGE = 120_000  # bytes of one PNG
PNG = b"\x89PNG\r\n\x1a\n"


def outputs(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def text_of(nb) -> str:
    return "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                   for o in outputs(nb))


def run(name, kernel, env, monkeypatch):
    for k in make_notebooks.ENV_KEYS:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    nb = make_notebooks.execute(make_notebooks.notebook(CASES[name]), kernel=kernel, timeout=300)
    return text_of(nb), sum("image/png" in o.get("data", {}) for o in outputs(nb))


@pytest.mark.parametrize("name", sorted(CASES))
def test_committed_with_outputs_and_in_sync(name):
    path = NOTEBOOKS / name
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert [c.source for c in nb.cells] == [c.source for c in CASES[name]], \
        "notebook differs from tests/fixtures/analysis/make_notebooks.py: rerun it"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
        "not executed top to bottom in one go: rerun tests/fixtures/analysis/make_notebooks.py"
    assert all(c.outputs for c in code[:1]) and sum(bool(c.outputs) for c in code) >= len(code) - 1
    assert path.stat().st_size <= MAX_NOTEBOOK, f"{name}: {path.stat().st_size} bytes"
    for o in outputs(nb):
        assert o.output_type != "error", o.get("ename")
        assert o.get("name") != "stderr" or "Traceback" not in o.get("text", "")
        data = o.get("data", {})
        assert not set(data) & {"image/svg+xml", "application/vnd.jupyter.widget-view+json"}
        if "image/png" in data:
            png = base64.b64decode(data["image/png"])
            assert png.startswith(PNG) and len(png) <= MAX_IMAGE
    # paths printed are the repository's, never the machine that made the outputs
    assert not re.search(r"/(tmp|home|root|work|Users)/", text_of(nb))


def test_committed_outputs_show_the_figures_and_fits():
    text = {n: text_of(nbformat.read(NOTEBOOKS / n, as_version=4)) for n in CASES}
    images = {n: sum("image/png" in o.get("data", {})
                     for o in outputs(nbformat.read(NOTEBOOKS / n, as_version=4))) for n in CASES}
    assert images["01_scaling_law.ipynb"] >= 2 and images["02_cerebras_gpt_published.ipynb"] >= 2
    assert images["04_three_approaches.ipynb"] >= 3 and images["05_plan_next_runs.ipynb"] >= 1
    assert re.search(r"b  = [\d.]+  \[[\d.]+, [\d.]+\]", text["01_scaling_law.ipynb"])
    assert "extrapolation" in text["01_scaling_law.ipynb"]
    assert "b = 0.073" in text["02_cerebras_gpt_published.ipynb"]
    assert "validation loss matches summary.json" in text["03_checkpoints.ipynb"]
    assert "N_opt ~ C^" in text["04_three_approaches.ipynb"]
    assert "interval width by round" in text["05_plan_next_runs.ipynb"]


def test_committed_demo_data_is_a_real_demo_run():
    """notebooks/data/demo: every run of sweeps/demo.yaml, done, with its training curve."""
    import pandas as pd
    import yaml

    res = pd.read_csv(NOTEBOOKS / "data" / "demo" / "results.csv")
    grid = yaml.safe_load((ROOT / "sweeps" / "demo.yaml").read_text())["grid"]["model"]
    assert sorted(res["model"]) == sorted(grid) and (res["status"] == "done").all()
    for rid in res["run_id"]:
        assert (NOTEBOOKS / "data" / "demo" / rid / "metrics.jsonl").stat().st_size > 0


def test_01_scaling_law_on_fixture_sweep(kernel, tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    shutil.copytree(FIXTURE / "sweep", sweep)
    text, images = run("01_scaling_law.ipynb", kernel,
                       {"CGPT_SWEEP_DIR": str(sweep), "CGPT_N_BOOT": "100",
                        "CGPT_FIG_DIR": str(tmp_path)}, monkeypatch)
    assert images >= 2
    assert "21 runs (18 done, 1 failed, 1 running, 1 pending)" in text
    assert "fit on 12 runs" in text                          # extrapolation check ran
    assert "skipped with too few distinct x" in text         # the calibrated bootstrap's summary
    assert "no training curves" in text                      # a results.csv without run dirs
    assert (tmp_path / "loss_vs_compute.png").stat().st_size > 0


@pytest.mark.slow(reason="no twin; the committed outputs: test_committed_with_outputs_and_in_sync")
def test_02_cerebras_gpt_published(kernel, monkeypatch):
    text, images = run("02_cerebras_gpt_published.ipynb", kernel, {"CGPT_N_BOOT": "100"},
                       monkeypatch)
    assert images >= 2
    assert "b = 0.073293" in text                             # paper: 0.0737
    assert "c is not identified by these data" in text        # 7 points: the profile over c
    assert "b = 0.066808" in text                             # Huber delta=1e-3 on log loss
    assert "muP vs SP law: mean -0.43%" in text               # paper: 0.43% better


@pytest.mark.slow(reason=(
    "test_train's test_run_directory_and_summary trains, loads, evaluates and generates; the "
    "notebook's committed outputs: test_committed_with_outputs_and_in_sync"))
def test_03_checkpoints_trains_its_own_run(kernel, monkeypatch):
    """No CGPT_RUN_DIR (as the committed outputs): it trains a tiny run with `cgpt train`,
    loads it, recomputes the reported validation loss and generates."""
    text, _ = run("03_checkpoints.ipynb", kernel, {}, monkeypatch)
    assert "trained: cgpt train --model tiny-17k" in text
    assert "validation loss matches summary.json" in text
    assert "greedy : " in text and "sampled: " in text and "def " in text


@pytest.mark.slow(reason="no twin; the committed outputs: test_committed_with_outputs_and_in_sync")
def test_04_three_approaches_on_a_real_sweep(kernel, tmp_path, monkeypatch):
    """A real run of sweeps/approaches.yaml (15 tiny runs; training curves kept)."""
    sweep = tmp_path / "approaches"
    shutil.copytree(FIXTURE / "approaches", sweep)
    text, images = run("04_three_approaches.ipynb", kernel,
                       {"CGPT_APPROACHES_DIR": str(sweep), "CGPT_N_BOOT": "20",
                        "CGPT_FIG_DIR": str(tmp_path)}, monkeypatch)
    assert images >= 3                 # envelope (with the curves), isoFLOP, side by side
    assert "approach 1 (training-curve envelope)" in text
    assert "isoFLOP fit over 2 of 3 budgets" in text
    assert "budget '1e+11' left out: loss is not convex" in text
    assert "budget '3e+11' kept: lowest loss at the smallest size" in text
    assert "N_opt ~ C^" in text and "1: envelope" in text and "3: parametric" in text
    assert (tmp_path / "approaches.png").stat().st_size > 5000


@pytest.mark.slow(reason="no twin; the committed outputs: test_committed_with_outputs_and_in_sync")
def test_05_plan_next_runs_on_real_rounds(kernel, monkeypatch):
    """The committed rounds of bench/plan_rounds.py (real cgpt training): each round's runs are
    the suggestions recomputed from the rounds before it, and the refits print the interval."""
    text, images = run("05_plan_next_runs.ipynb", kernel, {"CGPT_N_BOOT": "100"}, monkeypatch)
    data = NOTEBOOKS / "data" / "plan_rounds"
    k = len(list(data.glob("round*.csv"))) - 1
    assert images >= 1 and k >= 1 and "round 0: 15 runs" in text
    for r in range(1, k + 1):
        assert (f"round {r}: suggested after rounds 0..{r - 1} == round{r}.yaml runs: True; "
                "== trained (within one batch): True") in text
    widths = re.search(r"interval width by round: ([\d. >-]+)", text).group(1).split(" -> ")
    assert len(widths) == k + 1
    # The notebook's reading: the runs >= 2e11 fit predicts every later run better than the fit
    # to all runs, and its interval is narrower after the rounds than before them.
    err = [float(v) for v in
           re.findall(r"later runs vs the fit before them .*mean \|\.\| ([\d.]+)", text)]
    assert len(err) == 2 and err[1] < err[0]
    assert "fit on runs >= 2e+11 FLOPs:" in text and float(widths[-1]) < float(widths[0])


def test_06_critical_batch_on_the_committed_sweep(kernel, tmp_path, monkeypatch):
    """notebooks/data/critical_batch: a real sweep with train.gns (its sweep.yaml), and
    batch_sweep/ in it, a real run of sweeps/critical_batch.yaml."""
    sweep = tmp_path / "critical_batch"
    shutil.copytree(NOTEBOOKS / "data" / "critical_batch", sweep)
    text, images = run("06_critical_batch.ipynb", kernel,
                       {"CGPT_CRITICAL_BATCH_DIR": str(sweep), "CGPT_N_BOOT": "50"}, monkeypatch)
    assert images >= 3
    assert re.search(r"B_crit ~ loss\^-[\d.]+  \[", text) and "B_crit ~ C^" in text
    assert text.count("the critical batch") == 4 and "tiny-65k  trained at 32 seq" in text
    # the batch-size sweep (batch_sweep/, a real run of sweeps/critical_batch.yaml): B_crit
    # measured per target beside the noise scale, and the N-D fit (one model: D and loss only)
    assert len(re.findall(r"B_crit/B_simple [\d.]+ \[[\d.]+, [\d.]+\]  within 2x: (?:yes|NO)",
                          text)) >= 4
    assert "noise scale within 2x of the measured critical batch at" in text
    assert "exponent of D:" in text and "exponent of target:" in text
    assert "column 'N' takes one value" in text and "collinear" in text
    assert "exponent of N:" in text            # the simulated N-D grid


@pytest.mark.slow(reason="no twin; the committed outputs: test_committed_with_outputs_and_in_sync")
def test_07_compare_recipes_on_the_published_table_and_the_committed_ladders(kernel, tmp_path,
                                                                              monkeypatch):
    """notebooks/data/recipes: real runs of sweeps/mup_ladder.yaml in SP and in μP."""
    recipes = tmp_path / "recipes"
    shutil.copytree(NOTEBOOKS / "data" / "recipes", recipes)
    text, images = run("07_compare_recipes.ipynb", kernel,
                       {"CGPT_RECIPES_DIR": str(recipes), "CGPT_N_BOOT": "300"}, monkeypatch)
    assert images == 2
    assert "mean deviation -0.43%" in text          # the paper's figure, from its table
    mults = re.findall(r"compute multiplier at C = ([\d.e+]+): ([\d.]+) \[([\d.]+), ([\d.]+)\]",
                       text)
    assert len(mults) == 5
    published, ours = mults[:3], mults[3:]
    for at, m, lo, hi in published:                 # what the markdown says of them
        assert at == "1.1e+21" and 1.0 < float(m) < 1.12 and float(lo) < 1 < float(hi)
    assert float(ours[0][1]) > 1.2 and float(ours[1][1]) > float(ours[0][1])
    assert text.count("no evidence the exponents differ") == 2
    assert re.search(r"held it in (3[4-9]|40) of 40 ladder pairs", text)


@pytest.mark.slow(reason=(
    "test_analysis_schedule_endpoints.py (predict_endpoints on simulated truth); the committed "
    "outputs: test_committed_with_outputs_and_in_sync"))
def test_08_schedule_endpoints_on_real_sweeps(kernel, monkeypatch):
    """notebooks/data/endpoints: real runs of sweeps/endpoints_wsd.yaml (WSD + branches),
    sweeps/endpoints_cosine.yaml (the cosine endpoints the predictions are judged against) and
    sweeps/endpoints_wsd_eval.yaml (the WSD runs with fixed-set evaluations every 10 steps)."""
    text, images = run("08_schedule_endpoints.ipynb", kernel, {"CGPT_N_BOOT": "20"}, monkeypatch)
    assert images >= 1
    assert re.search(r"9 cosine runs: the recipe's LRs equal the logged ones to \d\.\de-\d\d", text)
    assert re.search(r"predicted cosine endpoints: max \|error\| [\d.]+%", text)
    assert re.search(r"predicted cosine val_loss endpoints \(fixed-set evaluations\): max "
                     r"\|error\| [\d.]+%, mean \|error\| [\d.]+%, \d/9 inside", text)
    assert text.count("from trained endpoints: ") == 1 and "from predicted endpoints: " in text
    assert "the two laws on the nine (N, D): max |difference|" in text
    assert re.search(r"WSD runs \+ branches: [\d.e+]+ FLOPs \(9 runs\): \d+% saved", text)


def test_09_downstream_two_step_on_the_published_table(kernel, monkeypatch):
    """Fitted on 111M-2.7B, the two steps (compute -> loss -> accuracy) predict 6.7B and 13B
    better than a power law in compute: over the 16 predictions and at 13B's average."""
    text, images = run("09_downstream_two_step.ipynb", kernel, {"CGPT_N_BOOT": "100"},
                       monkeypatch)
    assert images == 1
    two, one, covers = re.search(r"over the 16 predictions \(points of accuracy\): two-step "
                                 r"([\d.]+), one-step ([\d.]+); the two-step interval covers "
                                 r"(\d+) of 16", text).groups()
    assert float(two) < 3 < 4.5 < float(one) and int(covers) >= 12
    avg = re.search(r"13B average: published 0.570, two-step [\d.]+ \(([+-][\d.]+) pts\), "
                    r"one-step [\d.]+ \(([+-][\d.]+) pts\)", text).groups()
    assert abs(float(avg[0])) < 2 and float(avg[1]) < -5
