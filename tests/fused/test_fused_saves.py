"""A fused group's checkpoint saves (#21 item 5): each member's slice comes from one program
compiled once for every member, then saved as a run alone saves (`Lifecycle.save`)."""
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cgpt.train import fused, fused_prep
from cgpt.train.fused_prep import member_copy

REPO = Path(__file__).resolve().parents[2]


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
