"""The step record (`cgpt.record`): every field declared once, and every reader of a logged step
taking its fields from there, so that a new device metric is two edits: the step returns it,
the table declares it. `test_a_device_metric_is_two_edits_end_to_end` makes exactly those two
edits to a copy of the code and follows the metric through real sweeps (a run alone and a
fused group) into metrics.jsonl, TensorBoard, W&B, summary.json, results.csv and `analysis`."""
from __future__ import annotations

import csv
import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cgpt import record, rundir
from cgpt import results_schema as schema
from cgpt.train import lifecycle, loop, metrics, wandb_log

ROOT = Path(__file__).resolve().parents[2]
NEW = 'Field("param_norm", "device", summary="last", results=True)'
# the two edits: the step returns the metric, the table declares it
EDITS = {
    "cgpt/train/step.py": ('metrics = {"loss": l, "grad_norm": optax.global_norm(g)}',
                           'metrics = {"loss": l, "grad_norm": optax.global_norm(g), '
                           '"param_norm": optax.global_norm(params)}'),
    "cgpt/record.py": ('    Field("gns_b_simple", "host", summary="last"),\n',
                       f'    Field("gns_b_simple", "host", summary="last"),\n    {NEW},\n'),
}


def test_fields_are_declared_once_and_consistently():
    names = [f.name for f in record.FIELDS]
    assert len(names) == len(set(names)) and names[0] == "step"
    keys = [f.key for f in record.FIELDS if f.summary]
    assert len(keys) == len(set(keys))
    # a results column the schema places by name is a record field that says so
    placed = set(schema.REQUIRED + schema.OPTIONAL)
    assert {f.key for f in record.FIELDS if f.summary and f.key in placed} == \
        set(record.results_columns())
    assert set(record.results_columns()) <= set(schema.COLUMNS) & set(schema.FROM_SUMMARY)
    with pytest.raises(ValueError, match="needs a summary"):
        record.Field("x", "device", results=True)
    with pytest.raises(ValueError, match="source"):
        record.Field("x", "disk")


def _extended(monkeypatch):
    """The table with one more device field, as the second edit would leave it."""
    monkeypatch.setattr(record, "FIELDS", record.FIELDS + (eval(f"record.{NEW}"),))


def test_a_declared_device_field_is_read_recorded_and_logged(monkeypatch, tmp_path):
    """The in-process half of the end-to-end test (its default twin): with the field declared,
    the reader reads it from the step's output (not an undeclared one), the record writes it
    after the others, metrics.jsonl and TensorBoard get it, and so does W&B."""
    _extended(monkeypatch)
    out = {"loss": np.float32(2.5), "grad_norm": np.float32(0.5), "param_norm": np.float32(7),
           "ok": np.bool_(True)}
    speed = SimpleNamespace(add=lambda *a: None, tokens_per_s=5.0, mfu=lambda: 0.25)
    values = loop.Reader(speed, 64, 0).read(0, out, 0.0)
    assert values == {"loss": 2.5, "grad_norm": 0.5, "param_norm": 7.0}
    assert loop.member({"param_norm": np.array([1.0, 2.0])}, 1) == {"param_norm": 2.0}

    sent = []
    wb = wandb_log.WandbRun(tmp_path)
    wb.attach(SimpleNamespace(log=lambda rec, step: sent.append((step, rec))))
    from tests.train.test_lifecycle import _life

    life = _life(tmp_path)
    life.data = SimpleNamespace(epoch_at=lambda done, bs: done / 50)
    life.log = metrics.MetricsLog(tmp_path, 0, wandb=wb)
    life.record(1, values, 1e-3, speed)
    life.log.close()
    wb._calls.put(None)
    wb._sender.join()
    (rec,) = rundir.read_metrics(tmp_path / rundir.METRICS_FILE)
    assert list(rec) == ["step", "loss", "grad_norm", "lr", "tokens", "epoch", "tokens_per_s",
                         "mfu", "param_norm"]
    assert sent == [(1, {k: v for k, v in rec.items() if k != "step"})]
    from tests.train.test_gns_train import _tb_scalars

    tb = _tb_scalars(tmp_path / rundir.EVENTS_DIR)
    assert tb["train/param_norm"] == {1: 7.0} and "train/tokens" not in tb


def _two_edits(tmp_path: Path) -> Path:
    """A copy of cgpt and analysis with the two edits made; asserts nothing else differs."""
    src = tmp_path / "src"
    for pkg in ("cgpt", "analysis"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, (old, new) in EDITS.items():
        text = (src / rel).read_text()
        assert text.count(old) == 1, f"{rel}: the edit's anchor moved; update EDITS"
        (src / rel).write_text(text.replace(old, new))
    changed = []
    for pkg in ("cgpt", "analysis"):
        for f in (src / pkg).rglob("*.py"):
            rel = f.relative_to(src)
            if not filecmp.cmp(f, ROOT / rel, shallow=False):
                changed.append(str(rel))
    assert sorted(changed) == sorted(EDITS)  # two edits, in two files
    return src


@pytest.mark.slow(reason=(
    "a copy of the code with a metric added, through three sweeps' processes (417 s at load "
    "20); its in-process half runs by default: "
    "test_a_declared_device_field_is_read_recorded_and_logged"))
def test_a_device_metric_is_two_edits_end_to_end(tmp_path, monkeypatch):
    """step -> metrics.jsonl -> TensorBoard and W&B -> summary.json -> results.csv -> analysis,
    for a run trained alone and for each member of a fused group (two seeds, one program)."""
    from tests.sweep_helpers import make_spec
    from tests.train.test_gns_train import _tb_scalars
    from tests.train.test_wandb import launches

    pytest.importorskip("wandb")
    src = _two_edits(tmp_path)
    home = tmp_path / "wandb_home"
    env = {**os.environ, "PYTHONPATH": str(src), "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true",
           "WANDB_CONFIG_DIR": str(home / "config"), "WANDB_CACHE_DIR": str(home / "cache"),
           "WANDB_DATA_DIR": str(home / "data"), "WANDB_ARTIFACT_DIR": str(home / "artifacts")}
    for k in ("WANDB_DIR", "WANDB_RUN_GROUP", "WANDB_API_KEY", "WANDB_PROJECT"):
        env.pop(k, None)
    base = {"train": {"tokens": 8 * 32 * 12, "log_every": 1, "wandb": "cgpt-record"}}
    sweeps = {"alone": (make_spec(tmp_path, "alone", {"model": ["tiny-17k"], "seed": [0]},
                                  base=base), ["--no-fuse"]),
              "fused": (make_spec(tmp_path, "fused", {"model": ["tiny-17k"], "seed": [1, 2]},
                                  base=base), [])}
    for name, (spec, flags) in sweeps.items():
        out = tmp_path / name
        p = subprocess.run([sys.executable, "-m", "cgpt", "sweep", str(spec), "--out", str(out),
                            *flags], env=env, cwd=src, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        with open(out / rundir.RESULTS_FILE, newline="") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == (1 if name == "alone" else 2)
        for row in rows:
            run = out / row["run_id"]
            log = rundir.read_metrics(run / rundir.METRICS_FILE)
            got = {r["step"]: r["param_norm"] for r in log}
            assert len(got) == 12 and all(v > 0 for v in got.values())
            tb = _tb_scalars(run / rundir.EVENTS_DIR)["train/param_norm"]
            assert tb == {s: pytest.approx(v, rel=1e-6) for s, v in got.items()}
            (w,) = launches(run)
            assert {s: h["param_norm"] for s, h in w["history"].items()} == got
            summary = json.loads((run / rundir.SUMMARY_FILE).read_text())
            assert summary["param_norm"] == got[12] and w["summary"]["param_norm"] == got[12]
            assert float(row["param_norm"]) == got[12]
        code = ("import json, sys, analysis; df = analysis.load_results(sys.argv[1]); "
                "print(json.dumps([str(df['param_norm'].dtype), list(df['param_norm'])]))")
        p = subprocess.run([sys.executable, "-c", code, str(out)], env=env, cwd=src,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        dtype, values = json.loads(p.stdout)
        assert dtype == "float64" and values == [float(r["param_norm"]) for r in rows]
    assert "param_norm" not in record.names()  # this checkout's table is untouched
