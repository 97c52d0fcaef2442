"""Weights & Biases (`train.wandb`, cgpt.train.wandb_log), tested offline on the files W&B
writes: the records metrics.jsonl gets, the config, the summary, the run's name and group, the
exit (finished, preempted), the resume into the same W&B run, a sweep grouped by its name, and
one error when the package is missing. Nothing leaves the machine (WANDB_MODE=offline)."""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from cgpt.config.run import RunConfig, from_dict, identity
from cgpt.errors import Preempted
from cgpt.sweep.spec import config_hash
from tests.run_helpers import tiny_run

REPO = Path(__file__).resolve().parents[2]
STEPS = 60


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline, quiet, its per-user files under tmp_path; WANDB_DIR unset (the run
    directory then holds W&B's files). Skips where wandb is not installed."""
    pytest.importorskip("wandb")
    home = tmp_path / "wandb_home"
    for k, v in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
                 "WANDB_DISABLE_CODE": "true", "WANDB_CONFIG_DIR": home / "config",
                 "WANDB_CACHE_DIR": home / "cache", "WANDB_DATA_DIR": home / "data",
                 "WANDB_ARTIFACT_DIR": home / "artifacts"}.items():
        monkeypatch.setenv(k, str(v))
    for k in ("WANDB_DIR", "WANDB_RUN_GROUP", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(k, raising=False)
    return home


def _run(corpus, tmp_path, **train_kw) -> RunConfig:
    return tiny_run(corpus, tmp_path / "cache", STEPS, **{"eval_every": 20, "ckpt_every": 20,
                                                          "wandb": "cgpt-test", **train_kw})


# ---- reading what W&B wrote: its transaction log, with W&B's own record type ---------------
def records(path: Path) -> list:
    """The records of a `.wandb` file: a LevelDB-style log (a 7-byte W&B header, 32 KiB blocks
    of chunks [crc32 u32, length u16, type u8]: 1 full, 2 first, 3 middle, 4 last), each
    record a `wandb_internal_pb2.Record`."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, buf, out = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B", path
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header: padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if n == 0 and kind == 0:  # zero padding to the block's end
            pos += block - pos % block
            continue
        buf, pos = buf + data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def _items(items) -> dict:
    """W&B's {key or nested key: JSON value} items as a dict (nested keys joined by ".")."""
    return {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in items}


def read_offline(run_file: Path) -> dict:
    """One offline launch: its run record, history by step, config, summary, exit code."""
    got = {"history": {}, "config": {}, "summary": {}, "exit": None, "preempting": False}
    for r in records(run_file):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            got["run"] = r.run
            got["config"].update(_items(r.run.config.update))
        elif kind == "history":
            row = _items(r.history.item)
            got["history"][row.pop("_step")] = {k: v for k, v in row.items()
                                                if not k.startswith("_")}
        elif kind == "config":
            got["config"].update(_items(r.config.update))
        elif kind == "summary":
            got["summary"].update(_items(r.summary.update))
        elif kind == "exit":
            got["exit"] = r.exit.exit_code
        elif kind == "preempting":
            got["preempting"] = True
    return got


def launches(run_dir: Path) -> list[dict]:
    """Every offline launch of the run directory's W&B run, oldest first. W&B's service
    process writes a run's file shortly after `finish` returns: `teardown` waits for it (as
    the end of a training process does)."""
    import wandb

    wandb.teardown()
    run_id = json.loads((run_dir / "wandb.json").read_text())["id"]
    files = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    return [read_offline(f) for f in files]


def metrics(run_dir: Path) -> dict:
    return {r["step"]: {k: v for k, v in r.items() if k != "step"}
            for r in map(json.loads, (run_dir / "metrics.jsonl").open())}


# ---- the config key -------------------------------------------------------------------------
def test_wandb_key_is_checked_and_not_part_of_a_runs_identity():
    raw = {"preset": "tiny-17k", "data": {"vocab_size": 512, "seq_len": 32}}
    plain = from_dict(raw)
    for project in ("cgpt", "my-team/cgpt-scaling"):
        logged = from_dict({**raw, "train": {"wandb": project}})
        assert logged.train.wandb == project
        # turning W&B on or off never changes what the run is (resume, the sweep's hash)
        assert identity(logged.to_dict()) == identity(plain.to_dict())
        assert config_hash(logged.to_dict()) == config_hash(plain.to_dict())
    for bad in ("", "a/b/c", "has space", "what?", "x" * 129):
        with pytest.raises(ValueError, match="train.wandb=.*give a W&B project, PROJECT or "
                                             "ENTITY/PROJECT"):
            from_dict({**raw, "train": {"wandb": bad}})


# ---- a run, offline --------------------------------------------------------------------------
def test_offline_run_logs_the_metrics_config_and_summary(corpus, tmp_path, offline,
                                                         monkeypatch):
    from cgpt.train.loop import train

    monkeypatch.setenv("WANDB_RUN_GROUP", "my-sweep")
    out = tmp_path / "run-a"
    summary = train(_run(corpus, tmp_path), out, progress=False)
    (w,) = launches(out)  # W&B's files are in the run directory
    assert w["run"].display_name == "run-a" and w["run"].run_group == "my-sweep"
    assert w["run"].project == "cgpt-test" and w["run"].run_id == \
        json.loads((out / "wandb.json").read_text())["id"]
    logged = metrics(out)
    assert len(logged) == STEPS and w["history"] == logged  # every record, value for value
    # the run as trained: config.yaml's, with the fit's choices (placement keys) filled in
    saved = yaml.safe_load((out / "config.yaml").read_text())
    trained = {k: w["config"][k] for k in saved}
    assert identity(trained) == identity(saved) and trained["train"]["wandb"] == "cgpt-test"
    assert trained["model"]["remat"] == summary["placement"]["remat"]
    assert trained["train"]["micro_batch"] == summary["placement"]["micro_batch"]
    assert w["config"]["derived"]["steps"] == STEPS == summary["steps"]
    assert w["config"]["derived"]["n_params"] == summary["n_params"]
    for k in ("val_loss", "train_loss", "tokens", "flops", "wall_time_s", "mfu"):
        assert w["summary"][k] == summary[k]
    assert w["exit"] == 0 and not w["preempting"]
    assert not (tmp_path / "wandb").exists() and not (REPO / "wandb").exists()


@pytest.mark.slow  # two launches and a stop: ~2 min; the offline run test covers the default suite
def test_preempted_run_is_marked_and_resumes_into_the_same_wandb_run(corpus, tmp_path,
                                                                     offline):
    from cgpt.train.loop import train

    out = tmp_path / "run-p"
    log = out / "metrics.jsonl"

    def stop_after_ten_steps():
        deadline = time.time() + 600
        while time.time() < deadline and not (log.exists() and
                                              len(log.read_text().splitlines()) >= 10):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler would: checkpoint and stop

    t = threading.Thread(target=stop_after_ten_steps, daemon=True)
    t.start()
    with pytest.raises(Preempted) as stop:
        train(_run(corpus, tmp_path), out, progress=False)
    t.join()
    stopped = stop.value.step
    assert 10 <= stopped < STEPS
    first_id = json.loads((out / "wandb.json").read_text())["id"]
    train(_run(corpus, tmp_path), out, resume=True, progress=False)
    assert json.loads((out / "wandb.json").read_text())["id"] == first_id
    a, b = launches(out)  # one W&B run, two launches: `wandb sync` uploads them in order
    assert a["run"].run_id == b["run"].run_id == first_id
    assert a["preempting"] and a["exit"] == 128 + signal.SIGTERM
    assert b["exit"] == 0 and not b["preempting"]
    logged = metrics(out)
    assert set(a["history"]) >= set(range(1, stopped + 1)) and set(b["history"]) == \
        set(range(stopped + 1, STEPS + 1))
    assert {s: b["history"][s] for s in b["history"]} == {s: logged[s] for s in b["history"]}
    for s in range(1, stopped + 1):  # the uninterrupted part: losses as metrics.jsonl's
        assert a["history"][s]["loss"] == logged[s]["loss"]


# ---- a sweep ---------------------------------------------------------------------------------
@pytest.mark.slow(reason=(
    "test_offline_run_logs_the_metrics_config_and_summary (one run, not a sweep)"))
@pytest.mark.parametrize("exported", [None, "my-group"])
def test_sweep_groups_its_runs_by_the_sweep_name(tmp_path, offline, monkeypatch, exported):
    """The sweep's name is the W&B group, unless the user exported WANDB_RUN_GROUP: theirs
    wins (and the sweep leaves the variable as it found it)."""
    from cgpt import sweep as sw
    from tests.sweep_helpers import make_spec

    if exported:
        monkeypatch.setenv("WANDB_RUN_GROUP", exported)
    spec = make_spec(tmp_path, "wbsweep", {"model": ["tiny-17k"], "seed": [0, 1]},
                     base={"train": {"wandb": "cgpt-sweep", "tokens": 8 * 32 * 20}})
    out, sweep = tmp_path / "out", sw.load_sweep(spec)
    assert sw.launch(sweep, out) == 0  # the two train fused, in one process
    assert os.environ.get("WANDB_RUN_GROUP") == exported
    for run in sweep.runs:
        (w,) = launches(out / run.run_id)
        assert w["run"].run_group == (exported or "wbsweep")
        assert w["run"].display_name == run.run_id
        assert w["history"] == metrics(out / run.run_id) and w["exit"] == 0
        assert w["config"]["train"]["seed"] == run.seed
    assert sorted(r.seed for r in sweep.runs) == [0, 1]


# ---- without the package ---------------------------------------------------------------------
def test_missing_package_is_one_error_before_training(corpus, tmp_path):
    """`import wandb` fails (as when it is not installed): one line naming the extra, before
    the run directory is made."""
    out = tmp_path / "run-m"
    argv = ["train", "--model", "tiny-17k", "--data", str(corpus), "--out", str(out),
            "--no-progress", "--tokens=2048", "train.batch_size=8", "data.vocab_size=512",
            "data.seq_len=16", f"data.cache_dir={tmp_path / 'cache'}", "train.wandb=my-project"]
    code = ("import sys; sys.modules['wandb'] = None  # import wandb raises ImportError\n"
            f"from cgpt.cli import main; sys.exit(main({argv!r}))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    assert any("train.wandb=my-project needs the wandb package" in x
               and "pip install 'cgpt[wandb]'" in x for x in lines), p.stderr
    assert not (out / "metrics.jsonl").exists() and not (out / "config.yaml").exists()
