"""Faults (#33, class 5): dangerous destinations and silent no-ops. `cgpt train --out /` (as
root) wrote config.yaml, checkpoints/ and .lock into /; `--out ~` passed unexpanded made a
directory named `~`; `--resume --from-step` on a finished run did nothing and exited 0; a
sweep whose disk filled showed the failed run as pending in results.csv."""
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cgpt import rundir
from cgpt.cli import main as cli_main
from cgpt.paths import check_destination

REPO = Path(__file__).resolve().parents[2]

STEPS = 10


def _flags(corpus, cache, out, *extra):
    return ["train", "--model", "tiny-17k", "--data", str(corpus), "--out", str(out),
            "--no-progress", f"--tokens={8 * 16 * STEPS}", "train.batch_size=8",
            "train.log_every=1", "train.ckpt_every=5", "train.peak_lr=0.003",
            "data.vocab_size=512", "data.seq_len=16", "data.val_sequences=16",
            f"data.cache_dir={cache}", *extra]


def _one_line(capsys, argv) -> str:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# ---- where a run may go ------------------------------------------------------------------
@pytest.mark.parametrize("out, named", [
    ("/", "the filesystem root"), ("HOME", "your home directory itself"),
    ("~", "the shell did not expand ~; write $HOME"),
    ("~/runs/x", "the shell did not expand ~; write $HOME/runs/x")])
def test_a_dangerous_out_is_refused_and_nothing_is_written(tmp_path, monkeypatch, capsys,
                                                           out, named):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    out = str(home) if out == "HOME" else out
    before = sorted(os.listdir("/")), sorted(os.listdir(home))
    err = _one_line(capsys, ["train", "--model", "tiny-17k", "--data", str(tmp_path), "--out",
                             out, "--no-progress"])
    assert f"--out {out!r}" in err and named in err, err
    assert (sorted(os.listdir("/")), sorted(os.listdir(home))) == before
    assert not (tmp_path / "~").exists()


def test_the_destination_rule_and_the_sweep(tmp_path, monkeypatch, capsys):
    from cgpt.commands.sweep import main as sweep_main

    monkeypatch.setenv("HOME", str(tmp_path))
    for bad in ("/", str(tmp_path), "~", "~user/x"):
        with pytest.raises(ValueError, match="--out"):
            check_destination(bad, "--out")
    check_destination(str(tmp_path / "runs" / "a"), "--out")  # below home: fine
    check_destination("runs/~x", "--out")  # a ~ inside a name is a name
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nbase: {preset: tiny-17k}\ngrid: {model: [tiny-17k], seed: [0]}\n")
    monkeypatch.chdir(tmp_path)
    assert sweep_main([str(spec), "--out", "~/sw"]) == 2
    assert "the shell did not expand ~" in capsys.readouterr().err
    assert not (tmp_path / "~").exists()


# ---- --from-step on a finished run ----------------------------------------------------------
@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("dest")
    assert cli_main(_flags(corpus, root / "cache", root / "run")) == 0
    return root / "run", root / "cache"


@pytest.mark.parametrize("step", [
    pytest.param(5, id="kept-step", marks=pytest.mark.slow(
        reason="test_faults.py's test_from_step_must_name_a_kept_checkpoint")),
    pytest.param(3, id="no-such-step")])
def test_from_step_on_a_finished_run_is_an_error_not_a_no_op(finished, corpus, capsys, step):
    d, cache = finished
    before = sorted(p.name for p in (d / "checkpoints").iterdir()), \
        (d / "summary.json").read_text()
    capsys.readouterr()
    err = _one_line(capsys, _flags(corpus, cache, d, "--resume", "--from-step", str(step)))
    assert f"--from-step {step}" in err and "finished" in err and "summary.json" in err, err
    assert (sorted(p.name for p in (d / "checkpoints").iterdir()),
            (d / "summary.json").read_text()) == before
    assert not (d / rundir.DISCARDED_DIR).exists()
    assert cli_main(_flags(corpus, cache, d, "--resume")) == 0  # plain --resume: the summary


# ---- a full disk in a sweep -------------------------------------------------------------------
def test_a_run_whose_failure_cannot_be_recorded_is_failed_not_pending(tmp_path, monkeypatch):
    """The disk is full: failed.json cannot be written. The run is still failed (in the
    returned result and in results.csv), and the error names the disk."""
    from cgpt.sweep import executors, state
    from cgpt.sweep import spec as sweep_spec

    d = tmp_path / "out" / "r0"
    d.mkdir(parents=True)
    log = d / rundir.LOG_FILE
    log.write_text("cgpt train: error: [Errno 28] No space left on device\n")

    def full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(executors, "atomic_write_text", full)
    job = executors.Job("r0", str(d), resume=False)
    res = executors.outcome(job, 2, 0.0, log)
    assert res["status"] == "failed"
    assert f"could not record the failure in {d / rundir.FAILED_FILE}" in res["error"]
    assert "No space left on device" in res["error"] and str(d) in res["error"]
    assert "free space" in res["error"]

    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nbase: {preset: tiny-17k, train: {tokens: 4096}}\n"
                    "grid: {model: [tiny-17k], seed: [0, 1]}\n")
    runs = sweep_spec.load_sweep(spec).runs
    rows = {r["run_id"]: r for r in (state.result_row(x, tmp_path / "out",
                                                      {runs[0].run_id: res["error"]})
                                     for x in runs)}
    assert rows[runs[0].run_id]["status"] == "failed"
    assert "No space left" in rows[runs[0].run_id]["error"]
    assert rows[runs[1].run_id]["status"] == "pending"


def _tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


@pytest.mark.slow(reason="no twin")
def test_a_sweep_on_a_disk_that_fills_shows_the_run_failed(tmp_path, capsys):
    """End to end on a 1 MB tmpfs (root only): the run's checkpoints fill it; results.csv
    shows the run failed (not pending), with the device's error."""
    import yaml

    from cgpt import sweep as sw

    disk = tmp_path / "disk"
    if not _tmpfs(disk, "1m"):
        pytest.skip("needs root to mount a tmpfs (the test above covers the logic)")
    try:
        corpus = tmp_path / "corpus"
        corpus.mkdir()
        (corpus / "a.txt").write_text(" ".join(f"w{i % 89} the data" for i in range(4000)))
        base = {"preset": "tiny-17k", "model": {"vocab_size": 300},
                "data": {"source": str(corpus), "vocab_size": 300, "seq_len": 16,
                         "val_sequences": 4, "cache_dir": str(tmp_path / "cache")},
                "train": {"batch_size": 4, "tokens": 4 * 16 * 40, "ckpt_every": 1,
                          "keep_checkpoints": 100}}
        spec = tmp_path / "s.yaml"
        spec.write_text(yaml.safe_dump({"name": "s", "base": base,
                                        "grid": {"model": ["tiny-17k"], "seed": [0]}}))
        s = sw.load_sweep(spec)
        out = disk / "out"
        capsys.readouterr()
        assert sw.launch(s, out, compile_cache=None) == 1
        said = capsys.readouterr().out
        assert "0/1 done, 1 failed" in said, said  # was: 0 failed, the run shown pending
        text = (out / "results.csv").read_text()
        if "could not write" not in said:  # results.csv could be written: failed there too
            assert ",failed," in text and "pending" not in text, text
            assert "No space left on device" in text, text
        else:  # the disk had no room left for it either: said so, naming its disk
            assert f"could not write {out / 'results.csv'}" in said and "free space" in said
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.parametrize("argv, named", [
    (["train", "--model", "tiny-17k", "--out", ""], "--out ''"),
    (["train", "--model", "tiny-17k", "--out", "  "], "--out '  '"),
    (["train", "--model", "tiny-17k", "--data", "   "], "--data '   '"),
])
def test_an_empty_out_or_data_is_refused_not_read_as_the_default(tmp_path, argv, named):
    """`--out ""` (an unset `$OUT`) trained into runs/<model>, the default, without a word;
    `--data "   "` was refused as `DataConfig.source`, a name the user never typed."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-m", "cgpt", *argv, "--tokens", "1000"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and named in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written (no runs/tiny-17k)

