"""Faults (#33, class 3): the processes of one job must train one run. Given different
configs (`--tokens 4e4` on one, `8e4` on the other), process 0 used to train to the end and
hang at exit while process 1 died by SIGABRT with a C++ stack. Now each process publishes its
resolved config at start-up (`cgpt.sharding.distributed.agree`) and every one of them stops
within seconds with one line naming the keys that differ, exit code 2, no core dump. Real
processes: 2 x `python -m cgpt train` on 127.0.0.1, generous timeouts (nothing timed)."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cgpt.sharding import distributed

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300  # generous: a loaded 2-core machine; the check itself takes seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(tmp_path: Path, extra: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """`cgpt train` as 2 processes of one JAX job; `extra[i]`: process i's own flags."""
    port, procs = _free_port(), []
    for i, more in enumerate(extra):
        env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
               "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2",
               "JAX_PROCESS_ID": str(i)}
        argv = [sys.executable, "-m", "cgpt", "train", "--model", "tiny-17k", "--data",
                str(tmp_path), "--out", str(tmp_path / "run"), "--no-progress",
                "--peer-timeout", "30", *more]
        procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    done = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the job did not stop: a disagreement must end every process")
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


@pytest.mark.parametrize("flags, named", [
    ([["--tokens", "4e4"], ["--tokens", "8e4"]], "train.tokens: process 0 has 40000"),
    ([["--seed", "1"], ["--seed", "2", "train.peak_lr=0.001"]], "data.seed, train.peak_lr, "
                                                                 "train.seed"),
], ids=["tokens", "seed-and-lr"])
def test_processes_given_different_configs_stop_with_one_line(tmp_path, flags, named):
    res = _job(tmp_path, flags)
    for i, r in enumerate(res):
        assert r.returncode == 2, (i, r.returncode, r.stderr[-3000:])  # not -SIGABRT, not 0
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("cgpt train: error: the processes of "
                                                        "this job disagree"), r.stderr[-3000:]
        assert named in lines[0], lines[0]
    assert not (tmp_path / "run").exists()  # nothing was written


def test_the_difference_names_keys_and_values():
    a = {"train": {"tokens": 40000, "seed": 0}, "data": {"seed": 0}, "resume": False}
    b = {"train": {"tokens": 80000, "seed": 0}, "data": {"seed": 1}, "resume": True}
    msg = distributed.disagreement([a, b, a])
    assert msg.startswith("data.seed, resume, train.tokens differ")
    assert "train.tokens: process 0 has 40000, process 1 has 80000" in msg
    assert distributed.disagreement([a, dict(a)]) is None
