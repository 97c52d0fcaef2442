"""notebooks/03_checkpoints.ipynb: stripped, in sync with its generator, and it runs on a real run."""
import shutil
import sys
import sysconfig
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from cgpt.config.model import get_config
from cgpt.config.data import DataConfig
from cgpt.config.run import RunConfig, TrainConfig
from cgpt.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import make_notebook03  # noqa: E402

NB = ROOT / "notebooks" / "03_checkpoints.ipynb"


def test_committed_stripped_and_in_sync():
    nb = nbformat.read(NB, as_version=4)
    nbformat.validate(nb)
    assert all(c.outputs == [] and c.execution_count is None
               for c in nb.cells if c.cell_type == "code")
    assert [c.source for c in nb.cells] == [c.source for c in make_notebook03.NB03]


def test_runs_on_a_trained_run(kernel, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "shlex.py", "glob.py"):
        shutil.copy(lib / name, corpus / name)
    run = RunConfig(preset="tiny-17k", model=get_config("tiny-17k"),
                    data=DataConfig(source=str(corpus), vocab_size=512, seq_len=32,
                                    val_sequences=16, cache_dir=str(tmp_path / "cache")),
                    train=TrainConfig(tokens=8 * 32 * 30, batch_size=8))
    train(run, tmp_path / "run", progress=False)
    monkeypatch.setenv("CGPT_RUN_DIR", str(tmp_path / "run"))
    nb = nbformat.read(NB, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name=kernel,
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "validation loss matches summary.json" in text
    assert "greedy : " in text and "sampled: " in text and "def " in text
