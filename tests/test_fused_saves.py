"""A fused group's checkpoint saves (#21 item 5): each member's slice comes from one program
compiled once for every member, and the members' saves run in a background thread whose
errors reach the training loop."""
import subprocess
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cgpt.train import fused, fused_prep
from cgpt.train.fused_loop import _Saves
from cgpt.train.fused_prep import member_copy

REPO = Path(__file__).resolve().parents[1]


def test_member_copy_equals_each_members_slice_from_one_program():
    tree = ({"w": jnp.arange(24.0).reshape(3, 2, 4), "b": jnp.arange(3.0) - 1},
            (jnp.arange(3, dtype=jnp.int32), {"m": jnp.ones((3, 5)) * jnp.arange(3.0)[:, None]}))
    assert np.asarray(fused.members_finite(tree)).tolist() == [True] * 3
    member_copy(tree, 0)
    compiled = fused_prep._COPY[None]._cache_size()
    for k in range(3):
        want = fused.member(tree, k)
        got = member_copy(tree, k)
        assert [np.asarray(x).tolist() for x in jax.tree.leaves(got)] == \
            [np.asarray(x).tolist() for x in jax.tree.leaves(want)]
        assert [x.dtype for x in jax.tree.leaves(got)] == \
            [x.dtype for x in jax.tree.leaves(want)]
        assert jax.tree.structure(got) == jax.tree.structure(want)
    assert fused_prep._COPY[None]._cache_size() == compiled  # members 1, 2: no new program
    bad = jax.tree.map(lambda x: x, tree)
    bad[1][1]["m"] = bad[1][1]["m"].at[1, 2].set(jnp.nan)
    assert np.asarray(fused.members_finite(bad)).tolist() == [True, False, True]


class _Fake:
    def __init__(self, name, log, fail=None):
        self.name, self.log, self.fail = name, log, fail

    def save(self, step, params, opt_state):
        if self.fail is not None:
            raise self.fail
        self.log.append((self.name, step, params, opt_state, threading.current_thread().name))


def test_saves_run_in_order_off_the_loop_thread_and_errors_reach_wait():
    log = []
    saves = _Saves()
    saves.start([(_Fake("a", log), 4, 1, 2), (_Fake("b", log), 4, 3, 4)])
    saves.start([(_Fake("a", log), 8, 5, 6)])  # waits for the first batch
    saves.wait()
    assert [x[:4] for x in log] == [("a", 4, 1, 2), ("b", 4, 3, 4), ("a", 8, 5, 6)]
    assert all(x[4] == "cgpt-fused-saves" for x in log)
    # a failing save stops its batch; the error is raised once, in the waiting thread
    saves.start([(_Fake("a", log, OSError(28, "No space left on device")), 12, 0, 0),
                 (_Fake("b", log), 12, 0, 0)])
    with pytest.raises(OSError, match="No space left"):
        saves.wait()
    assert log[-1][1] == 8
    saves.wait()  # raised once only
    saves.start([(_Fake("c", log, KeyboardInterrupt()), 16, 0, 0)])  # BaseExceptions too
    with pytest.raises(KeyboardInterrupt):
        saves.start([])


@pytest.mark.slow  # ~3 min on the 2 shared cores: three sweeps of 2 runs
def test_bench_fuse_prints_the_three_arms(tmp_path):
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "fuse.py"), "--cases", "b", "--runs", "2",
         "--preset", "tiny-17k", "--scale", "0.05", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    for arm in ("fused:", "--no-fuse:", "a process per run:"):
        assert any(line.strip().startswith(arm) and "x the steps" in line for line in lines), arm
    ratios = [line for line in lines if "fused is" in line]
    assert len(ratios) == 2 and "than --no-fuse" in ratios[0] and "process per run" in ratios[1]
    # the three arms trained the same runs: equal val losses
    assert all(float(line.rsplit(" ", 1)[1]) <= 1e-6 for line in ratios)
    assert (tmp_path / "b-procs" / "results.csv").exists()
