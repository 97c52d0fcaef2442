"""Issue 42, class 4: what a killed process leaves is cleaned by the next launch, and the
messages around a crash are one line naming the file, variable or job."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cgpt.config.model import get_config

REPO = Path(__file__).resolve().parents[2]


def test_a_resume_prunes_to_keep_checkpoints(tmp_path):
    """A kill between a save's commit and Orbax's pruning left keep + 1 checkpoints for good:
    the resume keeps the newest `keep` up to the one it restored."""
    from cgpt.model.gpt import init_params
    from cgpt.train import checkpoint

    cfg = get_config("tiny-17k")
    ck = checkpoint.Checkpointer(tmp_path, keep=4)  # as if the pruning after 4 never ran
    for step in (1, 2, 3, 4):
        ck.save(step, init_params(cfg, step), {"count": np.int32(step)})
    ck.close()
    ck = checkpoint.Checkpointer(tmp_path, keep=3)
    try:
        step, _, opt = ck.restore_latest(init_params(cfg, 0), {"count": np.zeros((), np.int32)})
        assert step == 4 and int(opt["count"]) == 4
        assert ck.steps() == [2, 3, 4]
    finally:
        ck.close()
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [2, 3, 4]


def test_an_old_checkpoint_that_cannot_be_deleted_is_one_line_and_the_save_stands(
        tmp_path, monkeypatch, capsys, caplog):
    """EBUSY (NFS, a file held open) while Orbax pruned an older checkpoint after committing
    the new one: the line of the error, then Orbax's traceback, and the run failed. Now one
    warning, the save stands, and the old one is pruned later."""
    import errno
    import logging
    import os
    import shutil

    from cgpt.model.gpt import init_params
    from cgpt.train import checkpoint

    cfg = get_config("tiny-17k")
    real, fired = shutil.rmtree, []

    def busy(path, *a, **k):  # what Orbax's deleter calls (etils), once
        if str(path).endswith(f"checkpoints{os.sep}1") and not fired:
            fired.append(path)
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(shutil, "rmtree", busy)
    # ERROR records are what must not be there; INFO would let a handler another test left
    # on the root logger (a library's rich console handler) print Orbax's INFO lines
    caplog.set_level(logging.WARNING)
    ck = checkpoint.Checkpointer(tmp_path, keep=2)
    try:
        for step in (1, 2, 3):
            ck.save(step, init_params(cfg, step), {"count": np.int32(step)})
        assert ck.steps() == [1, 2, 3]  # 3 is committed and listed; 1 could not go
    finally:
        ck.close()
    assert fired
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert lines == [f"warning: checkpoint 3 saved, but the older {tmp_path.absolute()}/"
                     "checkpoints/1 could not be deleted (Device or resource busy); it is kept "
                     "until a later save or --resume prunes it (or delete it yourself)"], lines
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    ck = checkpoint.Checkpointer(tmp_path, keep=2)  # the next save prunes it
    try:
        ck.save(4, init_params(cfg, 4), {"count": np.int32(4)})
        assert ck.steps() == [3, 4]
    finally:
        ck.close()


def test_results_csv_cells_that_a_spreadsheet_would_run_are_quoted_and_read_back(tmp_path):
    """A model or error beginning with `=` became a formula (`=HYPERLINK(...)`) in a
    spreadsheet: such cells get a leading single quote (OWASP), which load_results strips."""
    import csv

    import analysis
    from cgpt import sweep as sw
    from tests.sweep_helpers import make_spec

    s = sw.load_sweep(make_spec(tmp_path, "s", {"model": ["tiny-17k"], "seed": [0, 1, 2, 3, 4]}))
    values = ['=HYPERLINK("http://evil","x")', "+1+2", "-2+3", "@SUM(A1)", "'quoted"]
    failures = {r.run_id: v for r, v in zip(s.runs, values)}
    out = tmp_path / "out"
    out.mkdir()
    sw.write_results(s.runs, out, failures)
    with open(out / "results.csv", newline="") as f:
        raw = {r["run_id"]: r["error"] for r in csv.DictReader(f)}
    assert all(raw[k] == "'" + v for k, v in failures.items()), raw
    df = analysis.load_results(out)
    assert dict(zip(df["run_id"], df["error"])) == failures


def test_a_spec_name_never_leads_out_of_the_sweeps_folder(tmp_path, monkeypatch, capsys):
    """`name: ../../../x` with no --out resolved runs/sweeps/../../../x, outside the folder."""
    import yaml

    from cgpt.cli import main as cli_main
    from tests.sweep_helpers import make_spec

    monkeypatch.chdir(tmp_path)
    for name in ("../../../x", "a/b", ".."):
        p = make_spec(tmp_path, "s", {"model": ["tiny-17k"]})
        spec = yaml.safe_load(p.read_text())
        p.write_text(yaml.safe_dump({**spec, "name": name}))
        assert cli_main(["sweep", str(p)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"name {name!r}" in err[0], err
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "x").exists()


def test_a_refused_pickle_is_one_line_naming_the_file(tmp_path):
    """A malicious pytorch_model.bin ran no code, but the refusal was 8 lines repeating
    torch's advice to retry with weights_only=False."""
    import json
    import os

    import pytest
    import torch

    import cgpt

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 16,
        "vocab_size": 64, "activation_function": "gelu", "layer_norm_epsilon": 1e-5}))
    torch.save({"transformer.wte.weight": Evil()}, d / "pytorch_model.bin")
    with pytest.raises(cgpt.LoadError) as e:
        cgpt.load(d)
    msg = str(e.value)
    assert "\n" not in msg and str(d / "pytorch_model.bin") in msg and "system" in msg, msg
    assert "weights_only=False" not in msg and not (tmp_path / "pwned").exists()


def test_an_edited_config_yaml_is_named(tmp_path):
    """config.yaml's n_layer edited 2 -> 3 after training was reported as 'none of the
    checkpoints could be restored', without naming config.yaml."""
    import pytest
    import yaml

    import cgpt
    from cgpt import rundir
    from cgpt.model.gpt import init_params
    from cgpt.train import checkpoint

    cfg = get_config("tiny-17k")
    (tmp_path / rundir.CONFIG_FILE).write_text(yaml.safe_dump({"model": cfg.to_dict()}))
    ck = checkpoint.Checkpointer(tmp_path, keep=3)
    ck.save(1, init_params(cfg, 1), {"count": np.zeros((), np.int32)})
    ck.close()
    assert cgpt.load(tmp_path).config.n_layer == cfg.n_layer
    edited = {"model": {**cfg.to_dict(), "n_layer": cfg.n_layer + 1}}
    (tmp_path / rundir.CONFIG_FILE).write_text(yaml.safe_dump(edited))
    with pytest.raises(cgpt.LoadError) as e:
        cgpt.load(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(tmp_path / rundir.CONFIG_FILE)), msg
    assert f"[{cfg.n_layer + 1}," in msg and f"[{cfg.n_layer}," in msg, msg


def test_an_unwritable_wandb_dir_is_one_line_naming_it(tmp_path, monkeypatch):
    """With WANDB_DIR unwritable, W&B silently wrote to the system temp folder instead."""
    import pytest

    from cgpt.errors import TrainError
    from cgpt.train import wandb_log

    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder should be")
    for bad in (blocked, blocked / "sub"):
        monkeypatch.setenv("WANDB_DIR", str(bad))
        with pytest.raises(TrainError) as e:
            wandb_log.require("proj")
        assert "\n" not in str(e.value) and f"WANDB_DIR={bad}" in str(e.value)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "new"))  # made, as W&B would
    pytest.importorskip("wandb")
    assert wandb_log.require("proj") is not None and (tmp_path / "new").is_dir()
    assert list((tmp_path / "new").iterdir()) == []


def test_a_job_that_never_joins_ends_with_one_line_naming_it(tmp_path):
    """SLURM variables of a job step copied into a shell without SLURM waited ~100 s, then
    ended in a C++ abort naming neither the job nor the processes that never came. Here the
    join is made to hang (JAX's initialize replaced) and the wait shortened to 2 s."""
    import os
    import subprocess
    import sys

    code = ("import time, jax\n"
            "from cgpt.sharding import distributed as d\n"
            "jax.distributed.initialize = lambda **kw: time.sleep(600)\n"
            "d.joinwatch.INIT_MIN_S = 2\n"
            "d.initialize(1)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_"))}
    env.update(JAX_PLATFORMS="cpu", SLURM_JOB_ID="4242", SLURM_NTASKS="3", SLURM_PROCID="1",
               SLURM_LOCALID="1", SLURM_JOB_NUM_NODES="1", SLURM_TASKS_PER_NODE="3",
               SLURM_STEP_NODELIST="node01", SLURM_NODELIST="node01")
    r = subprocess.run([sys.executable, "-c", code, "train"], env=env, capture_output=True,
                       text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("cgpt train: error: SLURM job 4242: process 1 waited 2 s"), lines
    assert "0, 2" in lines[0] and "srun" in lines[0], lines


def test_a_killed_saves_temp_folder_is_removed_before_orbax_meets_it(tmp_path, caplog):
    """A resume after a kill mid-checkpoint printed Orbax's warning about removing a temporary
    directory 'which already exists' (13 of 42 resumes): read as an error."""
    import logging

    from cgpt.model.gpt import init_params
    from cgpt.train import checkpoint

    cfg = get_config("tiny-17k")
    ck = checkpoint.Checkpointer(tmp_path, keep=3)
    ck.save(1, init_params(cfg, 1), {"count": np.zeros((), np.int32)})
    ck.close()
    ckpts = tmp_path / "checkpoints"
    for name in ("2.orbax-checkpoint-tmp", "2.orbax-checkpoint-tmp-1764351000123"):
        (ckpts / name / "params").mkdir(parents=True)
        (ckpts / name / "params" / "half").write_bytes(b"x")
    (ckpts / "notes").mkdir()  # not Orbax's: left alone
    with caplog.at_level(logging.WARNING):
        ck = checkpoint.Checkpointer(tmp_path, keep=3)
        try:
            ck.restore_latest(init_params(cfg, 0), {"count": np.zeros((), np.int32)})
            ck.save(2, init_params(cfg, 2), {"count": np.zeros((), np.int32)})
        finally:
            ck.close()
    assert sorted(p.name for p in ckpts.iterdir()) == ["1", "2", "notes"]
    assert not [r for r in caplog.records if "temporary" in r.getMessage()], caplog.text


def test_a_worker_whose_sweep_was_killed_ends_quietly(tmp_path):
    """Killing a `--parallel 2` sweep's parent left its workers printing BrokenPipeError
    tracebacks when they reported their next result. Here the job is a stand-in that returns
    at once, and the report pipe's reader is gone."""
    import json
    import os
    import subprocess
    import sys

    code = ("import sys\n"
            "from cgpt.sweep import worker\n"
            "worker.run_job = lambda job, **k: [{'run_id': job.run_id, 'status': 'done'}]\n"
            "worker._emulate_devices = lambda jobs: None\n"
            "sys.exit(worker.main(['--report']))\n")
    jobs = [{"run_id": f"r{i}", "run_dir": str(tmp_path / f"r{i}"), "resume": False}
            for i in range(3)]
    r, w = os.pipe()
    os.close(r)  # the sweep is gone
    try:
        p = subprocess.run([sys.executable, "-c", code], input=json.dumps(jobs).encode(),
                           stdout=w, stderr=subprocess.PIPE, timeout=300)
    finally:
        os.close(w)
    assert p.returncode == 141 and b"Traceback" not in p.stderr and b"BrokenPipe" not in \
        p.stderr, p.stderr.decode()[-2000:]


@pytest.mark.parametrize("command", ["train", "sweep", "data"])
def test_a_non_utf8_out_under_a_posix_locale_is_one_line(tmp_path, command):
    """`--out` with a byte the POSIX locale cannot decode ended in tokenizers' codec error
    (`'utf-8' codec can't encode character '\\udcff'`), after config.yaml was written."""
    import os
    import subprocess
    import sys

    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/out\xff")
    argv = {"train": ["train", "--model", "tiny-17k", "--out", out],
            "sweep": ["sweep", str(REPO / "sweeps" / "demo.yaml"), "--out", out],
            "data": ["data", "prepare", str(tmp_path), "--tokenizer", "train", "--out", out]
            }[command]
    env = {**os.environ, "LC_ALL": "POSIX", "LANG": "", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "cgpt", *argv], env=env, capture_output=True,
                       timeout=300)
    lines = r.stderr.decode("utf-8", "replace").strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, lines[-5:]
    assert "not UTF-8" in lines[0] and "out\\xff" in lines[0], lines
    assert list(tmp_path.iterdir()) == []


def test_a_killed_prepare_of_other_data_is_started_over(tmp_path, capsys):
    """A killed `data prepare` left plan.json behind, and a prepare of other data into the same
    --out was refused until the user deleted it: the unfinished store's own files are replaced
    (a note says so), and a finished store is still refused."""
    import json

    from cgpt.cli import main as cli_main
    from cgpt.data.tokenizer import train_tokenizer

    src = tmp_path / "src"
    src.mkdir()
    docs = [f"document {i} about shards and tokens and stores" * 20 for i in range(40)]
    (src / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    train_tokenizer([docs], 280).save(str(tmp_path / "tok.json"))
    out = tmp_path / "store"
    argv = ["data", "prepare", str(src), "--tokenizer", str(tmp_path / "tok.json"), "--out",
            str(out), "--no-progress", "--num-proc", "1"]
    assert cli_main(argv) == 0
    (out / "manifest.json").unlink()  # as if killed before its manifest
    (src / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[::2]))
    capsys.readouterr()
    assert cli_main(argv) == 0
    assert "unfinished prepare of other data (sources differ); starting over" in \
        capsys.readouterr().err
    m = json.loads((out / "manifest.json").read_text())
    assert m["num_documents"] == 20
    (src / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    assert cli_main(argv) == 2  # a finished store of other data: refused, kept
    assert json.loads((out / "manifest.json").read_text()) == m
