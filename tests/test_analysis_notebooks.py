"""The analysis notebooks: committed stripped, in sync with their generator, and they run
top to bottom (nbclient) on the fixture sweep."""
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
FIXTURE = ROOT / "tests" / "fixtures" / "analysis"
sys.path.insert(0, str(FIXTURE))
import make_notebooks  # noqa: E402  (the notebooks' generator)

CASES = {"01_scaling_law.ipynb": make_notebooks.NB01,
         "02_cerebras_gpt_published.ipynb": make_notebooks.NB02,
         "04_three_approaches.ipynb": make_notebooks.NB04,
         "05_plan_next_runs.ipynb": make_notebooks.NB05}


def run(name, kernel, env, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name=kernel,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    images = sum("image/png" in o.get("data", {})
                 for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    return text, images


@pytest.mark.parametrize("name", sorted(CASES))
def test_committed_stripped_and_in_sync(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    assert [c.source for c in nb.cells] == [c.source for c in CASES[name]], \
        "notebook differs from tests/fixtures/analysis/make_notebooks.py: rerun it"


def test_01_scaling_law_on_fixture_sweep(kernel, tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    shutil.copytree(FIXTURE / "sweep", sweep)
    text, images = run("01_scaling_law.ipynb", kernel,
                       {"CGPT_SWEEP_DIR": str(sweep), "CGPT_N_BOOT": "100"}, monkeypatch)
    assert images >= 2
    assert "21 runs (18 done, 1 failed, 1 running, 1 pending)" in text
    assert "fit on 12 runs" in text                          # extrapolation check ran
    assert "skipped with too few distinct x" in text         # the calibrated bootstrap's summary
    assert "no training curves" in text                      # a results.csv without run dirs
    assert (sweep / "loss_vs_compute.png").stat().st_size > 0


def test_02_cerebras_gpt_published(kernel, monkeypatch):
    text, images = run("02_cerebras_gpt_published.ipynb", kernel, {"CGPT_N_BOOT": "100"},
                       monkeypatch)
    assert images >= 2
    assert "b = 0.073293" in text                             # paper: 0.0737
    assert "c is not identified by these data" in text        # 7 points: the profile over c
    assert "b = 0.066808" in text                             # Huber delta=1e-3 on log loss
    assert "muP vs SP law: mean -0.43%" in text               # paper: 0.43% better


def test_04_three_approaches_on_a_real_sweep(kernel, tmp_path, monkeypatch):
    """A real run of sweeps/approaches.yaml (15 tiny runs; training curves kept)."""
    sweep = tmp_path / "approaches"
    shutil.copytree(FIXTURE / "approaches", sweep)
    text, images = run("04_three_approaches.ipynb", kernel,
                       {"CGPT_APPROACHES_DIR": str(sweep), "CGPT_N_BOOT": "20",
                        "CGPT_FIG_DIR": str(tmp_path)}, monkeypatch)
    assert images >= 3                 # envelope (with the curves), isoFLOP, side by side
    assert "approach 1 (training-curve envelope)" in text
    assert "isoFLOP fit over 2 budgets" in text and "left out: ['1e+11']" in text
    assert "N_opt ~ C^" in text and "1: envelope" in text and "3: parametric" in text
    assert (tmp_path / "approaches.png").stat().st_size > 5000


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
