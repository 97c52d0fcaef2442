"""Issue #23, the data / sweep-spec / sweep / data-prepare half: each failure found there, on
real files and real processes (`python -m qa.campaign` runs the wider campaign: docs/faults.md)."""
import csv
import fcntl
import gzip
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from cgpt import rundir, sweep as sw
from cgpt.cli import main as cli_main
from cgpt.data.prepare import LOCK_FILE, prepare
from cgpt.data.sources import DataError
from cgpt.data.store import TokenStore
from cgpt.sweep import executors, state

REPO = Path(__file__).resolve().parents[2]
TAG = f"CGPT_TEST_PREPARE_{os.getpid()}"


def _docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = "the of and a to in is was for on that with as by at from it an were are".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) for _ in range(n)]


def _jsonl(docs) -> bytes:
    return "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()


@pytest.fixture(scope="module")
def tok():
    from cgpt.data.tokenizer import train_tokenizer, with_eot
    return with_eot(train_tokenizer([_docs(300)], 300), "test")


def _one_line_error(capsys, argv: list[str]) -> str:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err, err
    return lines[0]


# ---- 4: YAML alias bombs ---------------------------------------------------------------------
def _bomb(where: str, levels: int = 8) -> str:
    anchors = ["&a0 [x, x, x, x, x, x, x, x, x]"] + [
        f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    if where == "overrides":
        return ("name: bomb\nbase: {preset: tiny-17k}\ngrid:\n  model: tiny-17k\n  overrides:\n"
                + "".join(f"    - {a}\n" for a in anchors))
    return ("name: bomb\ndescription:\n" + "".join(f"  l{i}: {a}\n" for i, a in enumerate(anchors))
            + f"base:\n  preset: tiny-17k\n  train:\n    tokens: *a{levels}\ngrid:\n  model: tiny-17k\n")


@pytest.mark.parametrize("where", ["overrides", "tokens"])
def test_alias_bomb_spec_is_refused_before_it_expands(tmp_path, capsys, where):
    """A level-8 billion-laughs spec (9^9 = 3.9e8 values) grew past 6 GB in grid.overrides and
    was printed whole in the base.train.tokens error. It is refused while still a node graph."""
    spec = tmp_path / "bomb.yaml"
    spec.write_text(_bomb(where))
    import cgpt.train  # noqa: F401 - load_sweep's imports, not counted below
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="aliases") as e:
            sw.load_sweep(spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(spec) in str(e.value) and len(str(e.value)) < 300, str(e.value)[:500]
    assert peak < 20 * 2**20, peak  # the file's node graph, never the expansion
    line = _one_line_error(capsys, ["sweep", str(spec), "--dry-run", "--no-fit"])
    assert re.search(r"expand to [\d.]+e\+08 values, over the limit", line), line


def test_small_aliases_recursive_aliases_and_deep_nesting(tmp_path, capsys):
    ok = tmp_path / "ok.yaml"  # an ordinary anchor is still fine
    ok.write_text("name: ok\nbase: {preset: tiny-17k, train: {batch_size: 4, tokens: 640}}\n"
                  "models: {m1: &m {preset: tiny-17k, d_model: 24, n_head: 2}, m2: *m}\n"
                  "grid: {model: [m1, m2]}\n")
    assert [r.config.model.d_model for r in sw.load_sweep(ok).runs] == [24, 24]
    rec = tmp_path / "rec.yaml"
    rec.write_text("a: &a [1, *a]\n")
    assert "refers to a collection that contains it" in _one_line_error(
        capsys, ["sweep", str(rec), "--dry-run"])
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested too deeply" in _one_line_error(capsys, ["sweep", str(deep), "--dry-run"])
    assert "is a directory" in _one_line_error(capsys, ["sweep", str(tmp_path), "--dry-run"])


# ---- 9: spec values of the wrong type -------------------------------------------------------
BASE = {"name": "t", "base": {"preset": "tiny-17k", "train": {"batch_size": 4, "tokens": 640}},
        "grid": {"model": ["tiny-17k"]}}
BAD = [  # (key, value, what the message must name); each was a traceback or silently accepted
    ("filter", {"tokens_per_param": ["a", "b"]}, "filter.tokens_per_param"),
    ("filter", {"tokens_per_param": [None, 2]}, "filter.tokens_per_param"),
    ("grid.branches", {"a": 1}, "grid.branches"), ("grid.branches", ["x"], "grid.branches"),
    ("per_model", {"tiny-17k": 5}, "per_model.tiny-17k"),
    ("per_model", {"tiny-17k": [1]}, "per_model.tiny-17k"),
    ("slurm", 5, "slurm"), ("slurm", [1], "slurm"),
    ("slurm", {"gpus_per_node": -1}, "slurm.gpus_per_node"),
    ("estimate", 5, "estimate"), ("estimate", [1], "estimate"),
    ("estimate", {"flops_per_s": 0}, "estimate.flops_per_s"),
    ("estimate", {"flops_per_s": -1e9}, "estimate.flops_per_s"),
    ("estimate", {"mfu": -0.5, "device_flops": 1e12}, "estimate.mfu"),
    ("base.train", 5, "base.train"), ("name", [1, 2], "name"),
    ("models", {"m": 5}, "models.m"),
    ("grid.overrides", [{"name": [1], "train.peak_lr": 1e-3}], "grid.overrides[0].name"),
    ("base.data", {"source": {"a": 1}}, "data.source"),
]


@pytest.mark.parametrize("key,value,named", BAD, ids=[f"{k}={v}" for k, v, _ in BAD])
def test_spec_value_of_the_wrong_type_is_one_error(tmp_path, key, value, named):
    spec = json.loads(json.dumps(BASE))
    *parents, last = key.split(".")
    d = spec
    for p in parents:
        d = d[p]
    d[last] = value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError) as e:
        sw.load_sweep(path)
    assert type(e.value) is ValueError and str(path) in str(e.value) and named in str(e.value), \
        str(e.value)


@pytest.mark.parametrize("flag", ["estimate.flops_per_s=0", "slurm.nodes=0"])
def test_launch_overrides_of_the_wrong_value_are_one_error(tmp_path, capsys, flag):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert flag.partition("=")[0] in _one_line_error(
        capsys, ["sweep", str(path), "--dry-run", "--no-fit", "--set", flag])


# ---- 5 and 9: damaged summary.json, a run directory deleted mid-sweep ------------------------
def _sweep_spec(tmp: Path, seeds: list[int]) -> Path:
    corpus = tmp / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_bytes(_jsonl(_docs(400)))
    base = {"preset": "tiny-17k", "model": {"vocab_size": 300},
            "data": {"source": str(corpus), "vocab_size": 300, "seq_len": 16, "val_sequences": 4,
                     "cache_dir": str(tmp / "cache")},
            "train": {"batch_size": 4, "tokens": 640}}
    p = tmp / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "s", "base": base, "grid": {"model": ["tiny-17k"],
                                                                     "seed": seeds}}))
    return p


def _status(out: Path) -> dict[str, str]:
    with open(out / "results.csv", newline="") as f:
        return {r["run_id"]: r["status"] for r in csv.DictReader(f)}


@pytest.mark.slow(reason="no twin")
def test_truncated_summary_is_not_done_and_the_relaunch_writes_it(tmp_path, capsys):
    """A finished run whose summary.json was cut short: the relaunch printed 'done' while
    results.csv said 'pending', and never retried it. Now it resumes and writes it again."""
    s = sw.load_sweep(_sweep_spec(tmp_path, [0]))
    out = tmp_path / "out"
    assert sw.launch(s, out, compile_cache=None) == 0
    rid = s.runs[0].run_id
    summary = out / rid / "summary.json"
    good = json.loads(summary.read_text())
    summary.write_text(summary.read_text()[:40])
    assert rundir.state(out / rid) == "interrupted"
    assert state.result_row(s.runs[0], out)["status"] == "pending"
    capsys.readouterr()
    assert sw.launch(s, out, compile_cache=None) == 0
    assert "1 to resume" in capsys.readouterr().out
    again = json.loads(summary.read_text())
    assert again["val_loss"] == pytest.approx(good["val_loss"], rel=1e-5)
    assert _status(out) == {rid: "done"}
    assert (out / rid / "summary.json.damaged").is_file()


@pytest.mark.slow  # a rarer fault; the sweep's resume tests run by default
def test_run_directory_deleted_mid_sweep_is_made_again(tmp_path, monkeypatch):
    """A run's directory is deleted after the launch made it and before its training process
    starts: the sweep used to stop with a traceback and never attempt that run (the default
    local path, one worker process; --no-fuse prepares the directory the same way)."""
    from cgpt.sweep import worker

    s = sw.load_sweep(_sweep_spec(tmp_path, [0, 1]))
    real = worker._spawn
    out = tmp_path / "out"

    def deleting(jobs, *a, **k):
        for j in jobs:
            shutil.rmtree(j.run_dir, ignore_errors=True)
        return real(jobs, *a, **k)

    monkeypatch.setattr(worker, "_spawn", deleting)
    assert sw.launch(s, out, compile_cache=None) == 0
    assert set(_status(out).values()) == {"done"}


# ---- 9: damaged data files ------------------------------------------------------------------
def _damaged(tmp: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    good = _jsonl(_docs(200))
    files = {"truncated.jsonl.gz": gzip.compress(good)[:300],
             "crc.jsonl.gz": gzip.compress(good)[:-8] + b"\0" * 8,
             "truncated.jsonl.zst": zstandard.ZstdCompressor().compress(good)[:300],
             "random.jsonl.zst": os.urandom(2000), "random.parquet": os.urandom(3000),
             "deep.jsonl": ("[" * 100000 + "]" * 100000 + "\n").encode(),
             "deep.json": ("[" * 100000 + "]" * 100000).encode()}
    out = {}
    for name, data in files.items():
        p = tmp / name.split(".")[0] / name
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(data)
        out[name] = p
    p = tmp / "cut" / "cut.parquet"
    p.parent.mkdir()
    pq.write_table(pa.table({"text": _docs(300)}), p)
    p.write_bytes(p.read_bytes()[:-200])
    out["cut.parquet"] = p
    return out


def test_damaged_data_files_are_one_error_naming_the_file(tmp_path, tok):
    for name, path in _damaged(tmp_path).items():
        with pytest.raises(DataError) as e:
            prepare(str(path), tok, tmp_path / f"out_{name}", num_proc=1, progress=False)
        msg = str(e.value)
        assert type(e.value) is DataError and str(path) in msg and len(msg) < 600, (name, msg)


def test_damaged_store_records_are_one_error(tmp_path, tok):
    src = tmp_path / "a.jsonl"
    src.write_bytes(_jsonl(_docs(200)))
    store = tmp_path / "store"
    prepare(str(src), tok, store, num_proc=1, progress=False)
    manifest = json.loads((store / "manifest.json").read_text())
    for bad in ([], {**manifest, "dtype": None}, {**manifest, "shards": [1]}):
        (store / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(DataError, match="manifest.json"):
            TokenStore(store)
    # a shard record cut short (a crash of the disk, not of cgpt: writes are atomic) is redone
    (store / "manifest.json").unlink()
    rec = store / "shards" / "000000.json"
    rec.write_text(rec.read_text()[:30])
    again = prepare(str(src), tok, store, num_proc=1, progress=False)
    assert [s["sha256"] for s in again.manifest["shards"]] == \
        [s["sha256"] for s in manifest["shards"]]
    (store / "manifest.json").unlink()
    (store / "plan.json").write_text("[1]")
    with pytest.raises(DataError, match="plan.json is damaged"):
        prepare(str(src), tok, store, num_proc=1, progress=False)


# ---- 3: data prepare: one writer per --out, no orphan workers --------------------------------
def test_second_prepare_of_one_out_is_refused(tmp_path, tok, capsys):
    src = tmp_path / "a.jsonl"
    src.write_bytes(_jsonl(_docs(50)))
    out = tmp_path / "store"
    out.mkdir()
    (tmp_path / "tok.json").write_text(tok.to_str())
    with open(out / LOCK_FILE, "w") as held:  # as a running prepare holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        line = _one_line_error(capsys, ["data", "prepare", str(src), "--tokenizer",
                                        str(tmp_path / "tok.json"), "--out", str(out),
                                        "--no-progress"])
    assert "another data prepare (pid 4242)" in line and str(out) in line
    assert not (out / "plan.json").exists()
    assert cli_main(["data", "prepare", str(src), "--tokenizer", str(tmp_path / "tok.json"),
                     "--out", str(out), "--no-progress"]) == 0  # lock released: it runs


def _tagged() -> list[int]:
    """Live processes that inherited TAG (the prepare and its workers), zombies excluded."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env, stat = (d / "environ").read_bytes(), (d / "stat").read_text()
        except OSError:
            continue
        if f"{TAG}=1".encode() in env.split(b"\0") and stat.rpartition(")")[2].split()[0] != "Z":
            pids.append(int(d.name))
    return pids


@pytest.mark.slow(reason="no twin")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkilled_prepare_leaves_no_worker_running(tmp_path, tok):
    """SIGKILL of `cgpt data prepare` left its 2 workers (and the resource tracker) running
    and writing into --out while the rerun wrote it too."""
    src = tmp_path / "big"
    src.mkdir()
    for i in range(4):  # enough work that the workers are busy when the parent dies
        (src / f"p{i}.jsonl").write_bytes(_jsonl(_docs(25000, i)))
    (tmp_path / "tok.json").write_text(tok.to_str())
    argv = [sys.executable, "-m", "cgpt", "data", "prepare", str(src), "--tokenizer",
            str(tmp_path / "tok.json"), "--out", str(tmp_path / "store"), "--no-progress",
            "--num-proc", "2"]
    env = {**os.environ, TAG: "1", "PYTHONPATH": str(REPO)}
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while len(_tagged()) < 3 and time.time() < deadline and p.poll() is None:
            time.sleep(0.05)
        assert p.poll() is None and len(_tagged()) >= 3, "the workers never started"
        p.kill()
        p.wait()
        deadline = time.time() + 20
        while _tagged() and time.time() < deadline:
            time.sleep(0.1)
        survivors = _tagged()
        assert survivors == [], f"processes outlived the killed prepare: {survivors}"
    finally:
        for pid in _tagged():
            os.kill(pid, signal.SIGKILL)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    TokenStore(tmp_path / "store").verify()


@pytest.mark.parametrize("n", ["0", "-2"])
def test_sweep_parallel_below_one_is_refused(tmp_path, capsys, n):
    """Campaign 2: --parallel 0 / -2 were accepted (0 read as the default)."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert f"--parallel {n}" in _one_line_error(
        capsys, ["sweep", str(path), "--dry-run", "--no-fit", f"--parallel={n}"])


def _launch_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}


def test_a_sweep_worker_starts_without_a_runpy_warning():
    """The worker was run as `python -m cgpt.sweep.worker`, a second copy (`__main__`) of a
    module its package had imported: every worker printed `<frozen runpy>:128: RuntimeWarning:
    'cgpt.sweep.worker' found in sys.modules ...`, which a user reads as an error. The sweep's
    own launcher, with no jobs (slow twin: a whole sweep)."""
    p = subprocess.run([sys.executable, "-c", executors._LAUNCH, "", str(os.getpid()), "",
                        "cgpt.sweep.worker", "--report"], input="[]", capture_output=True,
                       text=True, timeout=300, env=_launch_env(), cwd=REPO)
    assert p.returncode == 0 and p.stdout == "", (p.stdout, p.stderr)
    assert "Warning" not in p.stderr, p.stderr


@pytest.mark.slow  # a whole sweep (two runs, two workers); twin: the launcher above
def test_a_sweep_prints_no_runpy_warning(tmp_path):
    from tests.sweep_helpers import make_spec

    spec = make_spec(tmp_path, "quiet", {"model": ["tiny-17k"], "seed": [0, 1]},
                     base={"train": {"tokens": 2560}})
    p = subprocess.run([sys.executable, "-m", "cgpt", "sweep", str(spec), "--out",
                        str(tmp_path / "sw"), "--parallel", "2", "--no-fit"],
                       capture_output=True, text=True, timeout=1200, env=_launch_env(),
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    logs = "".join(f.read_text() for f in (tmp_path / "sw").rglob("train.log"))
    assert "RuntimeWarning" not in p.stdout + p.stderr + logs, p.stderr


@pytest.mark.parametrize("key, value, fix", [
    ("flops", 1e40, r"give grid.flops at most 1.38e\+16 for this model"),  # 6 N x 1.37e11
    ("tokens_per_param", 1e40, r"give grid.tokens_per_param at most 8.16e\+06 for"),
    ("tokens", 1e40, r"give grid.tokens at most 1.37e\+11 for this model")])
def test_a_grid_budget_beyond_any_run_names_its_grid_key(tmp_path, capsys, key, value, fix):
    """The token budget the grid set was refused as `train.tokens=9.9e+34 ...`, a key the
    spec does not have."""
    spec = tmp_path / "absurd.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "absurd", "base": {"preset": "tiny-17k", "data": {"vocab_size": 512,
                                                                  "seq_len": 16},
                                   "train": {"batch_size": 4, "tokens": 640}},
        "grid": {"model": ["tiny-17k"], key: [value]}}))
    line = _one_line_error(capsys, ["sweep", str(spec), "--dry-run", "--no-fit"])
    assert f"{spec}: grid.{key} entry 1e+40 gives model tiny-17k (16,832 parameters)" in line
    assert re.search(fix, line) and "train.tokens" not in line, line


def test_a_dry_run_of_a_spec_edited_after_its_runs_trained_says_what_the_launch_would(
        tmp_path, capsys):
    """A spec whose peak_lr was edited while its sweep ran: the dry run showed both runs
    `done`, `0s still to run` and exited 0, while the launch it previews refuses (the runs
    trained with another config). The table says `changed` and the dry run refuses alike."""
    import argparse
    import json

    from cgpt.commands import sweep as command
    from cgpt.sweep.spec import load_sweep
    from tests.sweep_helpers import make_spec

    spec = make_spec(tmp_path, "edit", {"model": ["tiny-17k"]})
    out = tmp_path / "out"
    run = load_sweep(spec).runs[0]
    d = out / run.run_id
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(run.config.to_yaml())
    (d / "summary.json").write_text(json.dumps({"model": run.model, "val_loss": 3.0,
                                                "train_loss": 3.0, "tokens": run.tokens}))
    def dry_run(*extra: str) -> int:
        ap = argparse.ArgumentParser()
        command.add_arguments(ap)
        return command.cmd_sweep(ap.parse_args([str(spec), "--out", str(out), "--dry-run",
                                                "--no-fit", *extra]))
    assert dry_run() == 0  # unchanged: done
    assert re.search(rf"{run.run_id}\s+done\s", capsys.readouterr().out)
    with pytest.raises(ValueError, match=r"train.peak_lr: None -> 0.004.*--on-change rerun"):
        dry_run("--set", "train.peak_lr=0.004")
    table = capsys.readouterr().out
    assert re.search(rf"{run.run_id}\s+changed\s", table), table
    assert dry_run("--set", "train.peak_lr=0.004", "--on-change", "rerun") == 0
    assert (d / "summary.json").exists()  # a dry run moves nothing



def test_a_sweep_with_an_empty_out_is_refused(tmp_path, monkeypatch):
    """The same for `cgpt sweep SPEC --out ""`: it planned into runs/sweeps/<name>."""
    import argparse

    from cgpt.commands import sweep as command
    from tests.sweep_helpers import make_spec

    spec = make_spec(tmp_path, "empty", {"model": ["tiny-17k"]})
    monkeypatch.chdir(tmp_path)
    ap = argparse.ArgumentParser()
    command.add_arguments(ap)
    with pytest.raises(ValueError, match=r"--out '': empty"):
        command.cmd_sweep(ap.parse_args([str(spec), "--out", "", "--dry-run", "--no-fit"]))
    assert not (tmp_path / "runs").exists()



@pytest.mark.parametrize("grid,train,named", [
    ("tokens: [3]", "batch_size: 4", "grid.tokens entry 3"),
    ("seed: [0]", "batch_size: 1000000000", "train.batch_size=1,000,000,000"),
])
def test_a_dry_run_refuses_a_budget_below_one_batch(tmp_path, grid, train, named):
    spec = tmp_path / "absurd.yaml"
    spec.write_text(f"name: absurd\nbase: {{preset: tiny-17k, data: {{seq_len: 16}}, train: "
                    f"{{{train}, tokens: 640}}}}\ngrid: {{model: [tiny-17k], {grid}}}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-m", "cgpt", "sweep", str(spec), "--out",
                        str(tmp_path / "out"), "--dry-run", "--no-fit"], env=env,
                       capture_output=True, text=True, timeout=300)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert named in lines[0] and "less than one step" in lines[0], lines[0]

