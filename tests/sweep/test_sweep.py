"""Sweep launcher: grid expansion, dry-run, skip/resume/failure isolation, results contract,
the submitit path. Real `python -m cgpt train` subprocesses on a tiny corpus the test writes."""
import csv
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cgpt import results_schema, rundir, sweep as sw
from cgpt.commands import sweep as command
from cgpt.config import flops as flops_mod
from cgpt.config.model import get_config
from tests.sweep_helpers import make_spec as _spec, result_rows as _rows
from tests.sweep_helpers import sigkill_once_checkpointed

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "sweeps"
# ---- expansion (no training) ------------------------------------------------------------
def test_grid_expansion_counts_ids_and_overrides(tmp_path):
    spec = _spec(tmp_path, "g", {
        "model": ["tiny-17k", "tiny-45k"], "tokens": ["chinchilla", 1e5],
        "seed": [0, 3], "overrides": [{"name": "lo", "train.peak_lr": 1e-3},
                                      {"train.peak_lr": 4e-3, "model.remat": True}]},
        per_model={"tiny-45k": {"train.batch_size": 16}})
    s = sw.load_sweep(spec, ["train.warmup_steps=5"])
    assert len(s.runs) == 2 * 2 * 2 * 2
    ids = [r.run_id for r in s.runs]
    assert len(set(ids)) == len(ids)
    assert ids[0] == "tiny-17k_d269k_s0_lo"  # 20 x 13,440 params (tiny-17k at vocab 300)
    assert "tiny-45k_d100k_s3_peak_lr0.004-rematTrue" in ids
    r = next(r for r in s.runs if r.run_id == "tiny-45k_d100k_s3_peak_lr0.004-rematTrue")
    assert r.config.train.peak_lr == 4e-3 and r.config.model.remat and r.seed == 3
    assert r.config.train.batch_size == 16  # per_model
    assert r.config.train.warmup_steps == 5  # --set reaches every run
    assert r.tokens == r.steps * 16 * 32 and r.config.train.tokens == 100_000
    c = next(r for r in s.runs if r.run_id == "tiny-17k_d269k_s0_lo")
    assert c.config.train.tokens == get_config("tiny-17k", vocab_size=300).chinchilla_tokens()
    assert c.flops == pytest.approx(flops_mod.train_flops(c.config.model, c.tokens, 32))
    one = _spec(tmp_path, "one", {"model": ["tiny-17k"], "tokens": ["chinchilla"]})
    assert sw.load_sweep(one, ["train.tokens=5e4"]).runs[0].config.train.tokens == 50_000
    with pytest.raises(ValueError, match="duplicate run ids"):  # --set collapses the budgets
        sw.load_sweep(spec, ["train.tokens=5e4"])
    assert [r.run_id for r in sw.select(s.runs, "tiny-45k*_s0_*")] == [
        i for i in ids if i.startswith("tiny-45k") and "_s0_" in i]
    assert len(sw.select(s.runs, "d100k,_lo")) == 12


def test_flops_budget_key_and_filter(tmp_path):
    spec = _spec(tmp_path, "iso", {"model": ["tiny-17k", "tiny-45k", "tiny-116k"],
                                   "flops": [1e11, 1e12]},
                 filter={"tokens_per_param": [2, 1000]})
    s = sw.load_sweep(spec)
    for r in s.runs:
        budget = float(r.run_id.split("_")[1][1:])
        assert r.config.train.tokens == round(budget / (6 * r.n_params))
        assert 2 <= r.config.train.tokens / r.n_params <= 1000
    assert {r.run_id for r in s.runs} == {"tiny-17k_c1e11_s0", "tiny-45k_c1e11_s0",
                                          "tiny-17k_c1e12_s0", "tiny-45k_c1e12_s0",
                                          "tiny-116k_c1e12_s0"}
    assert s.dropped == 1  # tiny-116k at 1e11: 1.25 tokens/param


def test_spec_errors_name_file_and_key(tmp_path):
    bad = _spec(tmp_path, "bad", {"model": ["tiny-17k", "tiny-99k"]})
    with pytest.raises(ValueError, match=r"bad\.yaml: grid\.model: unknown model preset 'tiny-99k'"):
        sw.load_sweep(bad)
    with pytest.raises(ValueError, match=r"unknown grid key\(s\) \['modles'\]"):
        sw.load_sweep(_spec(tmp_path, "typo", {"modles": ["tiny-17k"]}))
    with pytest.raises(ValueError, match=r"key\.yaml: grid\.overrides\[0\]: unknown key\(s\) "
                       r"train\.peak_learning_rate; valid train keys: .*peak_lr"):
        sw.load_sweep(_spec(tmp_path, "key", {"model": ["tiny-17k"],
                                              "overrides": [{"train.peak_learning_rate": 1}]}))
    with pytest.raises(ValueError, match="duplicate run ids"):
        sw.load_sweep(_spec(tmp_path, "dup", {"model": ["tiny-17k"],
                                              "tokens": ["chinchilla"], "tokens_per_param": [20]}))
    with pytest.raises(ValueError, match=r"dup\.yaml: per_model\.tiny-17k: unknown key\(s\) train\.lr;"):
        sw.load_sweep(_spec(tmp_path, "dup", {"model": ["tiny-17k"]},
                            per_model={"tiny-17k": {"train.lr": 1}}))
    req = _spec(tmp_path, "req", {"model": ["tiny-17k"]}, require=["data.tokenizer"])
    with pytest.raises(ValueError, match=r"--set data.tokenizer=\.\.\."):
        sw.launch(sw.load_sweep(req), tmp_path / "out")
    assert not sw.missing_required(sw.load_sweep(req, ["data.tokenizer=train"]))


def test_bad_set_key_is_blamed_on_the_flag(tmp_path):
    """#15: `--set train.nope=1` used to be reported as an unknown key of the spec file."""
    spec = _spec(tmp_path, "ok", {"model": ["tiny-17k"]})
    with pytest.raises(ValueError) as e:
        sw.load_sweep(spec, ["train.nope=1"])
    msg = str(e.value)
    assert msg.startswith("--set 'train.nope=1': unknown key(s) train.nope;") and "ok.yaml" not in msg


def test_set_parses_wherever_it_stands(tmp_path, capsys):
    """`sweep --set a.b=1 spec.yaml` used to swallow the spec path as one more --set value."""
    spec = _spec(tmp_path, "pos", {"model": ["tiny-17k"]})
    for argv in (["--set", "train.batch_size=16", str(spec)],
                 [str(spec), "--set", "train.batch_size=16"],
                 [str(spec), "train.batch_size=16"],
                 ["train.batch_size=16", str(spec), "--set", "data.val_sequences=4"]):
        assert command.main([*argv, "--dry-run"]) == 0, argv
        assert " 16 " in capsys.readouterr().out.splitlines()[2], argv
    assert command.main(["--set", "train.batch_size=16", "--dry-run"]) == 2
    assert "expected one sweep spec" in capsys.readouterr().err


def test_unusable_out_is_a_one_line_error(tmp_path):
    """#15: --out on an existing regular file (or a read-only place) crashed with a traceback."""
    spec = _spec(tmp_path, "o", {"model": ["tiny-17k"]})
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub", Path("/proc/cgpt-sweep-out")):
        p = subprocess.run([sys.executable, "-m", "cgpt", "sweep", str(spec), "--out", str(out)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, p.stderr
        err = p.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"cgpt sweep: error: --out {out}: "), p.stderr
        assert "choose another --out" in err[0]


def test_dry_run_table_and_bundled_specs(tmp_path, capsys):
    rc = command.main([str(SPECS / "cerebras_gpt.yaml"), "--dry-run", "--no-fit", "--out",
                  str(tmp_path / "cg")])
    out = capsys.readouterr().out
    assert rc == 0 and not (tmp_path / "cg").exists()
    for preset, batch in (("111M", 120), ("256M", 264), ("590M", 264), ("1.3B", 528),
                          ("2.7B", 528), ("6.7B", 1040), ("13B", 720)):
        line = next(l for l in out.splitlines() if l.startswith(f"{preset}_"))
        assert f" {batch} " in line
    assert "--set data.source=..." in out and "--set data.tokenizer=..." in out
    # item 7: resources per preset, the wall time at a stated MFU, many checkpoints per limit
    assert "MFU 40% of 9.89e+14 FLOP/s per device" in out
    rows = [l.split() for l in out.splitlines() if l[:1].isdigit() and "_s0" in l][:7]
    # the nodes cgpt.sweep.resources derives (fewest meeting 48 h with only data/stage across)
    assert len(rows) == 7 and [int(r[-4]) for r in rows] == [8, 8, 8, 8, 16, 104, 240]
    assert all(float(r[-1]) >= 6 for r in rows)  # checkpoints within each time limit
    assert rows[-1][-2] == "2"  # 13B: ~62 h at 40% MFU on 240 GPUs -> one time-limit requeue
    assert out.count(" agrees") == 7  # the spec's resources are the derived ones
    cg = sw.load_sweep(SPECS / "cerebras_gpt.yaml")
    assert all(r.config.data.seq_len == 2048 and r.tokens / r.n_params == pytest.approx(20, rel=0.01)
               for r in cg.runs)

    tiny = sw.load_sweep(SPECS / "cpu_tiny.yaml")
    sizes = {r.n_params for r in tiny.runs}
    fl = [r.flops for r in tiny.runs]
    assert len(sizes) >= 6 and max(fl) / min(fl) >= 100
    assert all(r.tokens / r.n_params == pytest.approx(20, rel=0.02) for r in tiny.runs)
    demo = sw.load_sweep(SPECS / "demo.yaml")
    assert len({r.n_params for r in demo.runs}) >= 4
    mup = sw.load_sweep(SPECS / "mup.yaml")
    names = {r.model for r in mup.runs}
    assert any(n.endswith("-mup") for n in names)
    assert all(n + "-mup" in names for n in names if not n.endswith("-mup"))
    iso = sw.load_sweep(SPECS / "isoflop.yaml")
    per_budget: dict[str, set] = {}
    for r in iso.runs:
        per_budget.setdefault(r.run_id.split("_")[1], set()).add(r.n_params)
        c = float(r.run_id.split("_")[1][1:])
        assert 6 * r.n_params * r.config.train.tokens == pytest.approx(c, rel=1e-3)
    assert len(per_budget) >= 3 and all(len(v) >= 5 for v in per_budget.values())

    command.main([str(SPECS / "demo.yaml"), "--dry-run", "--only", "tiny-13k"])
    out = capsys.readouterr().out
    assert "1 runs (of" in out and "tiny-13k_d269k_s0" in out and "tiny-39k" not in out
    assert "fit: not compiled for a local CPU spec" in out  # a CPU spec's dry run stays quick


def test_dry_run_compiles_each_runs_step_for_its_devices(tmp_path, capsys):
    """A spec with GPUs and estimate.device_memory: each run's step is compiled for its
    nodes x gpus_per_node devices (emulated) and its choice and memory shown; one that cannot
    split its batch over the mesh says why."""
    spec = _spec(tmp_path, "gpus", {"model": ["tiny-17k", "tiny-45k"]},
                 base={"train": {"mode": "data_parallel"}},
                 per_model={"tiny-45k": {"train.batch_size": 6}},
                 slurm={"nodes": 2, "gpus_per_node": 2}, estimate={"device_memory": "80GB"})
    assert command.main([str(spec), "--dry-run"]) == 0
    out = capsys.readouterr().out
    rows = {l.split()[0]: l.split() for l in out.split("fit per run")[1].splitlines()[2:4]}
    r17 = rows[next(k for k in rows if k.startswith("tiny-17k"))]
    assert r17[1:8] == ["4", "data_parallel", "data=4", "2", "x", "1", "none"]  # 8 rows / 4
    assert r17[-1] == "yes" and r17[-3:-1] == ["68.4", "GB"]  # 80 GB less 10%, then 5%
    assert "batch_size=6 must be a multiple of the 4 data replicas" in out
    assert "1/2 runs fit" in out
    assert command.main([str(spec), "--dry-run", "--set", "estimate.device_memory=lots"]) == 2
    assert "estimate.device_memory 'lots'" in capsys.readouterr().err


def test_register_adds_the_sweep_subcommand(capsys):
    """What cli.py wires: `sweep.register(sub)`, then dispatch to args.func."""
    import argparse

    ap = argparse.ArgumentParser(prog="cgpt")
    command.register(ap.add_subparsers(dest="command", required=True))
    args = ap.parse_args(["sweep", str(SPECS / "mup.yaml"), "--dry-run", "--only=*-mup_*",
                          "--set", "train.batch_size=16", "data.val_sequences=8"])
    assert args.func is command.cmd_sweep and args.sets == ["train.batch_size=16", "data.val_sequences=8"]
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "4 runs (of 8" in out and " 16 " in out.splitlines()[2]


# ---- launching (real training subprocesses) -----------------------------------------------
@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Two good runs and two with a bad override (a data source that does not exist)."""
    tmp = tmp_path_factory.mktemp("sweep")
    spec = _spec(tmp, "fx", {"model": ["tiny-17k"], "seed": [0, 1], "overrides": [
        {"name": "ok"}, {"name": "bad", "data.source": str(tmp / "no-such-corpus")}]})
    out = tmp / "out"
    t0 = time.time()
    rc = command.main([str(spec), "--out", str(out), "--parallel", "2"])
    return spec, out, rc, time.time() - t0


def test_failure_isolation_and_results_schema(launched):
    spec, out, rc, _ = launched
    assert rc == 1  # some runs failed, and the sweep said so
    with open(out / "results.csv", newline="") as f:
        assert tuple(next(csv.reader(f))) == sw.COLUMNS
    rows = _rows(out)
    assert set(rows) == {"tiny-17k_d20k_s0_ok", "tiny-17k_d20k_s1_ok",
                         "tiny-17k_d20k_s0_bad", "tiny-17k_d20k_s1_bad"}
    for rid in ("tiny-17k_d20k_s0_ok", "tiny-17k_d20k_s1_ok"):
        r = rows[rid]
        summary = json.loads((out / rid / "summary.json").read_text())
        assert r["status"] == "done" and r["error"] == ""
        assert math.isfinite(float(r["val_loss"])) and float(r["val_loss"]) == summary["val_loss"]
        assert int(r["n_params"]) == 13440 and int(r["tokens"]) == 78 * 8 * 32
        assert r["run_dir"] == str(out / rid) and r["mup"] == "False"
        assert "python -m cgpt train --config" in (out / rid / "train.log").read_text()
        assert (out / rid / "loss.png").stat().st_size > 0  # each run's loss curve
    for rid in ("tiny-17k_d20k_s0_bad", "tiny-17k_d20k_s1_bad"):
        r = rows[rid]
        assert r["status"] == "failed" and "no-such-corpus" in r["error"]
        assert r["val_loss"] == "" and int(r["n_params"]) == 13440
    # the runs shared the user's persistent compilation cache (item 8; a later sweep into
    # another --out reuses it), recorded in sweep.yaml
    from cgpt.config.backend import compile_cache_dir
    assert any(compile_cache_dir().iterdir())
    assert yaml.safe_load((out / "sweep.yaml").read_text())["compile_cache"] == \
        str(compile_cache_dir())
    assert sw.compile_cache_env(None) == {}
    analysis = pytest.importorskip("analysis")
    df = analysis.load_results(out)  # the reader accepts every column the writer writes
    assert sw.COLUMNS == results_schema.REQUIRED + results_schema.OPTIONAL
    assert list(df.columns) == list(sw.COLUMNS)
    assert df["peak_lr"].dtype == df["flops_budget"].dtype == float
    assert len(analysis.finished(df)) == 2
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"  # the finished runs' curves


def test_eval_of_a_sweep_run_gives_its_results_val_loss(launched, capsys):
    """`cgpt eval RUN` on a sweep's run: its own split, the val_loss of its results.csv row
    (the run's data settings: the spec's corpus, seq_len 32, 4 validation sequences)."""
    from cgpt.cli import main as cli_main

    _, out, _, _ = launched
    rid = "tiny-17k_d20k_s1_ok"
    capsys.readouterr()
    assert cli_main(["eval", str(out / rid)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["seq_len"] == 32 and got["sequences"] == 4
    assert got["val_loss"] == pytest.approx(float(_rows(out)[rid]["val_loss"]), abs=5e-5)


def test_relaunch_skips_finished_and_rebuilds_results(launched, capsys):
    spec, out, _, _ = launched
    rid = "tiny-17k_d20k_s0_ok"
    mtime = (out / rid / "summary.json").stat().st_mtime_ns
    log = (out / rid / "train.log").read_text()
    (out / "results.csv").unlink()  # the run dirs are the source of truth
    assert command.main([str(spec), "--out", str(out), "--only", "_ok"]) == 0
    assert (out / rid / "summary.json").stat().st_mtime_ns == mtime
    assert (out / rid / "train.log").read_text() == log  # not relaunched at all
    rows = _rows(out)
    assert rows[rid]["status"] == "done" and rows["tiny-17k_d20k_s1_bad"]["status"] == "failed"
    assert "2 done, 0 to resume, 0 to retry, 0 new" in capsys.readouterr().out


def test_resume_interrupted_run(launched):
    """An interrupted run (config + checkpoints, no summary) is resumed with --resume."""
    spec, out, _, _ = launched
    rid = "tiny-17k_d20k_s1_ok"
    d = out / rid
    (d / "summary.json").unlink()
    steps = sorted(int(p.name) for p in (d / "checkpoints").iterdir() if p.name.isdigit())
    shutil.rmtree(d / "checkpoints" / str(steps[-1]))  # as if killed after steps[-2]
    assert rundir.state(d) == "interrupted"
    assert command.main([str(spec), "--out", str(out), "--only", rid]) == 0
    summary = json.loads((d / "summary.json").read_text())
    assert summary["resumed_from_step"] == steps[-2] > 0 and summary["steps"] == 78
    assert "--no-progress --resume" in (d / "train.log").read_text()
    assert _rows(out)[rid]["status"] == "done"


@pytest.mark.slow  # the SLURM tests (-m slurm) run submitit against a real cluster
def test_submitit_local_executor(tmp_path):
    """The SLURM code path (submitit job array of `execute_run`) on submitit's local executor."""
    spec = _spec(tmp_path, "sub", {"model": ["tiny-17k"], "seed": [5]},
                 slurm={"partition": "gpu", "gpus_per_node": 1, "array_parallelism": 4})
    s = sw.load_sweep(spec, ["slurm.timeout_min=30"])
    assert sw.slurm_params(s.slurm, None, 1, s.name) == {
        "slurm_partition": "gpu", "gpus_per_node": 1, "timeout_min": 30,
        "slurm_array_parallelism": 4, "name": "cgpt-sub", "tasks_per_node": 1}
    out = tmp_path / "out"
    assert sw.launch(s, out, executor="submitit-local", poll_s=0.5) == 0
    rid = "tiny-17k_d20k_s5"
    assert json.loads((out / rid / "summary.json").read_text())["steps"] == 78
    assert _rows(out)[rid]["status"] == "done"
    assert any((out / ".submitit").rglob("*_result.pkl"))


@pytest.mark.slow
def test_sigkill_of_the_sweep_then_relaunch_resumes(tmp_path):
    """SIGKILL the sweep mid-run: its train child dies with it, the relaunch resumes it."""
    spec = _spec(tmp_path, "kill", {"model": ["tiny-17k"]},
                 base={"train": {"tokens": 200_000, "ckpt_every": 20}})
    out = tmp_path / "out"
    cmd = sigkill_once_checkpointed(spec, out, "tiny-17k_d200k_s0", 120)  # train dies with it
    d = out / "tiny-17k_d200k_s0"
    assert rundir.state(d) == "interrupted"
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    summary = json.loads((d / "summary.json").read_text())
    assert summary["resumed_from_step"] > 0
    assert _rows(out)["tiny-17k_d200k_s0"]["status"] == "done"


# ---- config identity, results contract, live state (no or little training) ----------------
def _fake_done(out: Path, run, val_loss: float = 3.0) -> None:
    """A finished run directory as train leaves it (config.yaml + summary.json)."""
    d = out / run.run_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text(run.config.to_yaml())
    (d / "summary.json").write_text(json.dumps({"model": run.model, "val_loss": val_loss,
                                                "train_loss": val_loss, "tokens": run.tokens}))


def test_changed_config_is_never_reused_silently(tmp_path):
    spec = _spec(tmp_path, "id", {"model": ["tiny-17k"]})
    out = tmp_path / "out"
    old = sw.load_sweep(spec).runs[0]
    _fake_done(out, old)
    assert sw.launch(sw.load_sweep(spec), out) == 0  # same config: reused
    new = sw.load_sweep(spec, ["train.peak_lr=1e-3", "train.mode=data_parallel"])
    assert new.runs[0].run_id == old.run_id and new.runs[0].config_hash != old.config_hash
    assert sw.config_change(new.runs[0], out) == ["train.peak_lr: None -> 0.001"]  # not mode
    with pytest.raises(ValueError, match=r"(?s)tiny-17k_d20k_s0: train.peak_lr: None -> 0.001.*"
                                         r"--on-change rerun"):
        sw.launch(new, out)
    assert (out / old.run_id / "summary.json").exists()
    from cgpt.sweep.launcher import check_identity
    check_identity(new, new.runs, out, "rerun")
    moved = out / ".superseded" / f"{old.run_id}.{old.config_hash}"
    assert (moved / "summary.json").exists() and not (out / old.run_id).exists()
    rid = new.runs[0].run_id
    sw.state.prepare_run_dir(new.runs[0], out)
    assert json.loads((out / rid / "identity.json").read_text())["config_hash"] == \
        new.runs[0].config_hash


def test_results_hold_exactly_this_spec_with_budget_and_lr(tmp_path):
    analysis = pytest.importorskip("analysis")
    s = sw.load_sweep(SPECS / "isoflop.yaml")
    out = tmp_path / "iso"
    for r in s.runs:  # a convex loss in log N around a budget-dependent optimum
        n_opt = 0.1 * r.flops_budget ** 0.5
        _fake_done(out, r, 3.0 - 0.1 * math.log10(r.flops_budget) + 0.2 * math.log(r.n_params / n_opt) ** 2)
    other = sw.load_sweep(_spec(tmp_path, "other", {"model": ["tiny-17k"]})).runs[0]
    _fake_done(out, other)  # a finished run of another spec in the same directory
    sw.write_results(s.runs, out)
    rows = _rows(out)
    assert set(rows) == {r.run_id for r in s.runs}
    for r in s.runs:
        assert float(rows[r.run_id]["flops_budget"]) == r.flops_budget
        assert float(rows[r.run_id]["peak_lr"]) == r.peak_lr == 2e-3
    df = analysis.finished(analysis.load_results(out))
    fit = analysis.fit_isoflop(df, N="n_params", D="tokens", C="flops", loss="val_loss",
                               budget="flops_budget")
    assert len(fit.used) == 3 and sorted(fit.minima["budget"]) == [1e12, 3e12, 1e13]


def test_sigkilled_sweep_leaves_no_running_claim(tmp_path):
    """#15: results.csv kept saying `running` after the sweep was SIGKILLed."""
    spec = _spec(tmp_path, "k", {"model": ["tiny-17k"]}, base={"train": {"tokens": 2_000_000}})
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "cgpt.sweep", str(spec), "--out", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = out / "tiny-17k_d2M_s0" / "train.log"
    deadline = time.time() + 120
    while time.time() < deadline and not log.exists():
        time.sleep(0.1)
    time.sleep(1.0)
    assert rundir.state(out / "tiny-17k_d2M_s0") == "running"  # live state: from the lock
    p.send_signal(signal.SIGKILL)
    p.wait()
    rows = _rows(out)
    assert rows["tiny-17k_d2M_s0"]["status"] == "pending"
    time.sleep(2)  # PR_SET_PDEATHSIG ends the orphaned train
    assert rundir.state(out / "tiny-17k_d2M_s0") in ("new", "interrupted")


def test_local_parallel_runs_get_their_own_devices(launched, monkeypatch):
    assert sw.device_share(0, 2, gpus=["0", "1", "2", "3"]) == ({"CUDA_VISIBLE_DEVICES": "0,1"}, [])
    assert sw.device_share(1, 2, gpus=["0", "1", "2", "3"]) == ({"CUDA_VISIBLE_DEVICES": "2,3"}, [])
    assert sw.device_share(1, 3, gpus=[], cpus=list(range(8))) == ({}, [2, 3])
    with pytest.raises(ValueError, match="--parallel 3 exceeds the 2 visible GPU"):
        sw.device_share(0, 3, gpus=["0", "1"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert sw.executors.visible_gpus() == ["4", "5"]
    # --parallel 2 on the CPU: two worker processes (`run_workers`), each on its own half of
    # the cores, for the two jobs (the fused 'ok' pair, the 'bad' pair); each log's first
    # header is the launch's (a later relaunch appends its own)
    _, out, _, _ = launched
    first = [re.search(r"worker process, pid (\d+)\] \[cpus ([\d,]+)\]", log.read_text())
             for log in out.glob("*/train.log")]
    assert len({m.group(1) for m in first}) == 2
    shares = {m.group(2) for m in first}
    assert len(shares) == 2
    a, b = (set(map(int, s.split(","))) for s in shares)
    assert not a & b


def test_every_task_of_a_requeued_multitask_job_resumes(tmp_path, monkeypatch):
    """A requeued multi-task job restarted without --resume and train refused the run dir."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.yaml").write_text("preset: tiny-17k\n")
    seen = []

    class FakeProc:
        def __init__(self, cmd, **kw):
            seen.append(cmd)
            self.pid = 0

        def wait(self):
            return 1

    monkeypatch.setattr(sw.executors.subprocess, "Popen", FakeProc)
    for rank in ("0", "1"):
        monkeypatch.setenv("SLURM_PROCID", rank)
        monkeypatch.setenv("SLURM_NTASKS", "2")
        sw.execute_run(sw.Job("r", str(d), resume=False))
    assert len(seen) == 2 and all(cmd[-1] == "--resume" for cmd in seen)
