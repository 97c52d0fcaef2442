"""Faults (#33, class 6): one line naming what the user set. `JAX_PLATFORMS=cuda` on a CPU
machine was a bare AssertionError traceback from `cgpt generate` and `cgpt eval`; a full
cache disk (the tokenizer a run trains into data.cache_dir) was blamed on the run directory
("cannot write the run directory"), because the Rust writer's error carries no path."""
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cgpt.fileio import atomic_write

REPO = Path(__file__).resolve().parents[2]


def _cgpt(*argv, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cgpt", *argv], cwd=REPO, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                          capture_output=True, text=True)


@pytest.mark.parametrize("argv", [["generate", "runs/none", "hi"], ["eval", "runs/none"],
                                  ["eval", "runs/none", "--tasks", "hellaswag"]],
                         ids=["generate", "eval", "eval-tasks"])
def test_a_platform_this_machine_lacks_is_one_line(tmp_path, argv):
    r = _cgpt(*argv, env={"JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": ""})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith(f"cgpt {argv[0]}: error: JAX_PLATFORMS=cuda: JAX cannot start "
                               "that platform on this machine"), lines
    assert "unset JAX_PLATFORMS" in lines[0]


def test_a_failed_write_names_its_file(tmp_path):
    target = tmp_path / "cache" / "tok.json"

    def rust_writer(tmp):  # tokenizers' save(): the OS error's text, no path, no errno
        raise Exception("No space left on device (os error 28)")

    def c_writer(tmp):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    for write, n in ((rust_writer, errno.ENOSPC), (c_writer, errno.EDQUOT)):
        with pytest.raises(OSError) as e:
            atomic_write(target, write)
        assert e.value.errno == n and e.value.filename == str(target)
        assert [p.name for p in target.parent.iterdir()] == []  # no temp file left
    with pytest.raises(ValueError, match="not storage"):  # other errors pass unchanged
        atomic_write(target, lambda tmp: (_ for _ in ()).throw(ValueError("not storage")))


@pytest.mark.slow(reason="no twin")
def test_a_full_cache_disk_is_blamed_on_the_cache(tmp_path):
    """End to end (root only: a full 64 kB tmpfs as data.cache_dir)."""
    full = tmp_path / "full"
    full.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)],
            capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a tmpfs (the test above covers the logic)")
    try:
        try:
            with open(full / "fill", "wb") as f:  # to the last block
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass
        corpus = tmp_path / "corpus"
        corpus.mkdir()
        (corpus / "a.txt").write_text(" ".join(f"w{i % 89} the data" for i in range(3000)))
        r = _cgpt("train", "--model", "tiny-17k", "--data", str(corpus), "--out",
                  str(tmp_path / "run"), "--no-progress", "--tokens", "256",
                  "train.batch_size=8", "data.seq_len=16", "data.vocab_size=512",
                  "data.val_sequences=4", f"data.cache_dir={full / 'cache'}",
                  env={"JAX_PLATFORMS": "cpu"})
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert f"cannot write {full / 'cache'}" in lines[-1], lines[-1]
        assert "No space left on device" in lines[-1] and "run directory" not in lines[-1]
    finally:
        subprocess.run(["umount", str(full)], check=False)
