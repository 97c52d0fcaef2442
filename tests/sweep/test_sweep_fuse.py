"""The sweep fuses same-shape runs (#21 items 3, 4): groups, --no-fuse, --dry-run, results and
run directories as unfused, one worker process for a local sweep, SLURM one job per group."""
import json
import math
import re
import subprocess

import pytest

from cgpt import rundir, sweep as sw
from cgpt.commands import sweep as command
from cgpt.sweep.groups import plan_groups
from tests.sweep_helpers import make_spec as _spec, result_rows as _rows
from tests.sweep_helpers import sigkill_once_checkpointed

GRID = {"model": ["tiny-17k", "tiny-45k"], "seed": [0, 1],
        "overrides": [{"name": "a", "train.peak_lr": 2e-3}, {"name": "b", "train.peak_lr": 4e-3}]}


def test_groups_by_shape_and_no_fuse(tmp_path, capsys):
    spec = _spec(tmp_path, "g", GRID, base={"train": {"tokens": 4000}})
    s = sw.load_sweep(spec)
    groups = plan_groups(s.runs)
    assert sorted(len(g) for g in groups) == [4, 4]
    assert {g[0].model.split("+")[0] for g in groups} == {"tiny-17k", "tiny-45k"}
    assert all(len({r.model for r in g}) == 1 for g in groups)
    assert len(plan_groups(s.runs, fuse=False)) == 8
    # what a program is compiled from must be shared: another batch size is another group
    other = sw.load_sweep(spec, ["train.batch_size=4"]).runs
    assert len(plan_groups(s.runs[:2] + other[:2])) == 2
    assert command.main([str(spec), "--dry-run", "--no-fit", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "fused groups: 2 jobs for 8 runs" in out and "tiny-17k+vocab_size=300: 4 runs" in out
    assert command.main([str(spec), "--dry-run", "--no-fit", "--no-fuse"]) == 0
    assert "fusion off (--no-fuse): 8 jobs" in capsys.readouterr().out


def test_members_per_program_from_memory(monkeypatch):
    """Fewer members per program when all do not fit: bytes grow linearly in the members."""
    from types import SimpleNamespace

    from cgpt.errors import TrainError
    from cgpt.train import fit, fused_loop

    calls = []

    def fake(r0, m, spread):  # a program of m members: 1000 + 300 m bytes
        calls.append(m)
        return None, {"total": 1000 + 300 * m}

    monkeypatch.setattr(fused_loop, "_compiled", fake)
    r0 = SimpleNamespace(cfg=SimpleNamespace(name="x"))
    mem = lambda usable: fit.memory_for(usable) + 2  # noqa: E731
    assert fused_loop.members_that_fit(r0, 8, mem(10_000)) == (8, 3400) and calls == [8]
    assert fused_loop.members_that_fit(r0, 8, mem(2_000))[0] == 3  # 1000 + 900 <= 2000
    with pytest.raises(TrainError, match="one run of x needs"):
        fused_loop.members_that_fit(r0, 8, mem(1_200))


@pytest.mark.slow
def test_members_per_program_from_the_compiled_step(tmp_path):
    """A device too small for the whole group: fewer members per program, chosen by compiling."""
    import jax

    from cgpt.train import fit
    from cgpt.train.fused_loop import _compiled, members_that_fit
    from cgpt.train.resolve import resolve

    run = sw.load_sweep(_spec(tmp_path, "m", GRID, base={"train": {"tokens": 4000}})).runs[0]
    r = resolve(run.config, jax.devices()[:1], device_memory=2**34)
    r = r.fitted(r.micro_batch, False)
    b2, b3 = _compiled(r, 2, False)[1]["total"], _compiled(r, 3, False)[1]["total"]
    assert members_that_fit(r, 3, 2**34) == (3, b3)
    # room for the compiled 2-member program, not for 3 (the bytes are not linear in the
    # members on the CPU: the midpoint of 1 and 3 members is below the 2-member program)
    assert b2 < b3
    assert members_that_fit(r, 3, fit.memory_for(b2)) == (2, b2)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One spec trained fused (one worker process) and with --no-fuse."""
    tmp = tmp_path_factory.mktemp("fuse")
    spec = _spec(tmp, "f", {"model": ["tiny-17k"], "seed": [0, 1], "overrides": [
        {"name": "a", "train.peak_lr": 2e-3}, {"name": "b", "train.peak_lr": 4e-3}]},
        base={"train": {"tokens": 4000}}, runs=[{"model": "tiny-45k", "seed": 0, "tokens": 4000}])
    rc_f = command.main([str(spec), "--out", str(tmp / "fused")])
    rc_u = command.main([str(spec), "--out", str(tmp / "solo"), "--no-fuse"])
    return spec, tmp, rc_f, rc_u


@pytest.mark.slow
def test_fused_sweep_rows_and_run_dirs_as_unfused(swept):
    spec, tmp, rc_f, rc_u = swept
    assert rc_f == 0 and rc_u == 0
    fused, solo = _rows(tmp / "fused"), _rows(tmp / "solo")
    assert set(fused) == set(solo) and len(fused) == 5
    pids = set()
    for rid, row in fused.items():
        assert row["status"] == "done" == solo[rid]["status"]
        d = tmp / "fused" / rid
        s = json.loads((d / "summary.json").read_text())
        assert row["run_dir"] == str(d) and float(row["val_loss"]) == s["val_loss"]
        assert math.isclose(float(row["val_loss"]), float(solo[rid]["val_loss"]), rel_tol=1e-5)
        assert (d / "metrics.jsonl").exists() and (d / "config.yaml").exists()
        assert s["placement"].get("fused") == (None if "45k" in rid else 4)
        pids |= set(re.findall(r"worker process, pid (\d+)", (d / "train.log").read_text()))
    assert len(pids) == 1  # item 4: both shapes, all runs, one process


@pytest.mark.slow
def test_relaunch_resumes_one_fused_member(swept):
    spec, tmp, _, _ = swept
    out = tmp / "fused"
    rid = "tiny-17k_d4k_s1_b"
    (out / rid / "summary.json").unlink()
    assert rundir.state(out / rid) == "interrupted"
    assert command.main([str(spec), "--out", str(out)]) == 0
    s = json.loads((out / rid / "summary.json").read_text())
    assert s["resumed_from_step"] > 0 and _rows(out)[rid]["status"] == "done"


@pytest.mark.slow
def test_submitit_submits_one_job_per_group(tmp_path):
    spec = _spec(tmp_path, "sub", {"model": ["tiny-17k"], "seed": [3, 4]},
                 base={"train": {"tokens": 4000}}, slurm={"partition": "gpu"})
    out = tmp_path / "out"
    assert sw.launch(sw.load_sweep(spec), out, executor="submitit-local", poll_s=0.5) == 0
    assert len(list((out / ".submitit").rglob("*_result.pkl"))) == 1
    rows = _rows(out)
    assert [rows[r]["status"] for r in sorted(rows)] == ["done", "done"]
    for r in rows:
        assert json.loads((out / r / "summary.json").read_text())["placement"]["fused"] == 2


@pytest.mark.slow
def test_sigkill_of_a_fused_sweep_then_relaunch_resumes(tmp_path):
    spec = _spec(tmp_path, "kill", {"model": ["tiny-17k"], "seed": [0, 1, 2]},
                 base={"train": {"tokens": 200_000, "ckpt_every": 20}})
    out = tmp_path / "out"
    cmd = sigkill_once_checkpointed(spec, out, "tiny-17k_d200k_s2", 300)  # the worker dies too
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    for s in (0, 1, 2):
        summary = json.loads((out / f"tiny-17k_d200k_s{s}" / "summary.json").read_text())
        assert summary["resumed_from_step"] > 0 and summary["placement"]["fused"] == 3
