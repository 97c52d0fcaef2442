"""`cgpt eval RUN` evaluates the run's own validation split by default: its data settings, its
tokenizer and the sequences its val_loss was measured on (whole batches of its micro-batch),
so it prints the val_loss the run reported; another corpus is an explicit --data."""
import json
import shutil
import sysconfig
from pathlib import Path

import pytest

from cgpt.cli import main as cli_main
from cgpt.config.data import DataConfig
from cgpt.config.model import get_config
from cgpt.config.run import RunConfig, TrainConfig
from cgpt.train.loop import train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished run whose validation split (18 sequences) is not a whole number of its
    evaluation batches (micro-batch 4): the run's val_loss reads 16 of them."""
    tmp = tmp_path_factory.mktemp("evalrun")
    corpus = tmp / "corpus"
    corpus.mkdir()
    lib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py"):
        shutil.copy(lib / name, corpus / name)
    run = RunConfig(preset="tiny-17k", model=get_config("tiny-17k"),
                    data=DataConfig(source=str(corpus), vocab_size=512, seq_len=24,
                                    val_sequences=18, cache_dir=str(tmp / "cache")),
                    train=TrainConfig(tokens=8 * 24 * 12, batch_size=8, micro_batch=4,
                                      peak_lr=3e-3))
    out = tmp / "run"
    train(run, out, progress=True)  # the bar too: its rate leaves the first step out
    return out


def _eval(capsys, *argv) -> dict:
    assert cli_main(["eval", *map(str, argv)]) == 0
    return json.loads(capsys.readouterr().out)


def test_eval_of_a_run_reproduces_its_val_loss(run_dir, capsys):
    summary = json.loads((run_dir / "summary.json").read_text())
    got = _eval(capsys, run_dir)
    assert got["sequences"] == 16 and got["seq_len"] == 24  # whole batches of 4, as the run
    assert got["val_loss"] == pytest.approx(summary["val_loss"], abs=1e-7)
    assert got["run_val_loss"] == summary["val_loss"]
    assert got["step"] == 12  # the last of its 12 steps: the checkpoint the loss is of
    # another batch size reads the same sequences: only the rounding may move
    assert _eval(capsys, run_dir, "--batch-size", 3)["val_loss"] == pytest.approx(
        summary["val_loss"], abs=1e-5)


def test_another_corpus_is_an_explicit_data(run_dir, capsys):
    source = next(line.split(": ", 1)[1] for line in (run_dir / "config.yaml").read_text()
                  .splitlines() if line.strip().startswith("source:"))
    got = _eval(capsys, run_dir, "--data", source, "--seq-len", 24, "--sequences", 18)
    assert got["data"] == source and got["sequences"] == 18 and "run_val_loss" not in got


def test_split_flags_without_data_are_refused(run_dir, capsys):
    assert cli_main(["eval", str(run_dir), "--seq-len", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error:" in err[0] and "--seq-len" in err[0] and "--data" in err[0]


def test_a_run_without_summary_reads_its_whole_split(run_dir, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("summary.json", ".lock"))
    assert cli_main(["eval", str(copy)]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert got["sequences"] == 18 and got["run_val_loss"] is None and "summary.json" in err
    newest = max(int(d.name) for d in (copy / "checkpoints").iterdir() if d.name.isdigit())
    assert got["step"] == newest and f"step {newest}" in err  # which checkpoint was read
    assert len(err.strip().splitlines()) == 1  # both facts, one note


def test_the_readme_loss_example_works_on_a_cgpt_run(run_dir):
    """README's `lm.loss` line takes ids of the model's own tokenizer: it ran on no cgpt run
    when it was GPT-2's ids (out of a 512-token vocabulary)."""
    import math
    import re

    import cgpt

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("lm.loss("))
    lm = cgpt.load(run_dir)
    loss = eval(re.sub(r"\s+#.*$", "", line), {"lm": lm})  # noqa: S307 (the README's line)
    assert math.isfinite(loss) and 0 < loss < 10


def test_loss_flags_with_tasks_are_refused_not_ignored(capsys):
    assert cli_main(["eval", "/nonexistent/run", "--tasks", "hellaswag", "--data", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: --data: for the validation loss" in err[0]
