"""The sweep's `branches:` axis: one WSD run per grid point plus cooldown branches at
fractions of its budget (cgpt.train.branch.plan_branches), launched after their parent's checkpoint."""
import json
import shutil
import sysconfig
from pathlib import Path

import pandas as pd
import pytest

from cgpt.sweep import launch, load_sweep
from cgpt.train.resolve import resolve

SPEC = """
name: wsd
base:
  data: {{source: "{corpus}", vocab_size: 512, seq_len: 16, val_sequences: 16, cache_dir: "{cache}"}}
  train: {{batch_size: 8, log_every: 5, peak_lr: 3.0e-3, ckpt_every: 8}}
grid:
  model: [tiny-17k]
  tokens: [{tokens}]
  branches: [0.25, 0.5]
"""


@pytest.fixture
def spec(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "shlex.py", "fnmatch.py", "bisect.py"):
        shutil.copy(lib / name, corpus / name)
    p = tmp_path / "wsd.yaml"
    p.write_text(SPEC.format(corpus=corpus, cache=tmp_path / "cache", tokens=8 * 16 * 80))
    return p


def test_branches_axis_expands_to_parent_and_branches(spec):
    sw = load_sweep(spec)
    parent, b1, b2 = sw.runs
    assert [r.run_id for r in sw.runs] == [parent.run_id, parent.run_id + "_b0.25",
                                            parent.run_id + "_b0.5"]
    assert parent.config.train.schedule == "wsd" and parent.branch_from is None
    assert parent.config.train.keep_checkpoints >= 80 // 8 + 1
    assert (b1.steps, b2.steps) == (20, 40)
    for b in (b1, b2):
        assert b.config.train.warmup_steps == parent.config.train.warmup_steps == 8
        run_id, step = b.branch_from
        assert run_id == parent.run_id and step % 8 == 0
        assert step <= resolve(b.config).recipe.decay_start             # still stable
    assert b1.branch_from[1] == 16 and b2.branch_from[1] == 32
    bad = spec.read_text().replace("[0.25, 0.5]", "[1.5]")
    spec.write_text(bad)
    with pytest.raises(ValueError, match=r"grid.branches: entries are fractions"):
        load_sweep(spec)


@pytest.mark.slow
def test_branches_axis_runs_and_matches_independent_runs(spec, tmp_path):
    out = tmp_path / "out"
    assert launch(load_sweep(spec), out) == 0
    df = pd.read_csv(out / "results.csv")
    assert (df["status"] == "done").all() and len(df) == 3
    for rid in df["run_id"]:
        if "_b" in rid:
            assert json.loads((out / rid / "branch.json").read_text())["parent"].endswith(
                rid.rsplit("_b", 1)[0])
