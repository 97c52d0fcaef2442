"""Issue 42, class 1: `cgpt.save_hf` replaces only what an earlier save_hf wrote (its marker),
refuses any other path with one line, recovers from its own leftovers, and writes with the
caller's umask. Each test reproduces the fault the issue found first."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import pytest

from cgpt.errors import CgptError, ExportError


@pytest.fixture(scope="module")
def model():
    from cgpt.config.model import ModelConfig
    from cgpt.model import gpt

    cfg = ModelConfig(n_layer=1, d_model=16, n_head=2, vocab_size=64, n_ctx=16,
                      compute_dtype="float32")
    return gpt.init_params(cfg), cfg


def _save(model, out):
    from cgpt.model import hf

    return hf.save_hf_dir(*model, out)


def _one_line(e: BaseException) -> str:
    assert isinstance(e, CgptError) and "\n" not in str(e), str(e)
    return str(e)


def test_a_users_folder_or_file_at_the_path_is_refused_and_kept(model, tmp_path):
    user = tmp_path / "thesis"
    user.mkdir()
    (user / "chapter1.tex").write_text("years of work")
    with pytest.raises(ExportError) as e:
        _save(model, user)
    assert str(user) in _one_line(e.value) and "did not write" in str(e.value)
    assert (user / "chapter1.tex").read_text() == "years of work"
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    with pytest.raises(ExportError, match="not a folder"):
        _save(model, f)
    assert f.read_text() == "keep me"
    link = tmp_path / "link"
    link.symlink_to(user)
    with pytest.raises(ExportError, match="symbolic link"):
        _save(model, link)
    assert link.is_symlink() and (user / "chapter1.tex").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "notes.txt", "thesis"]


def test_an_earlier_export_is_replaced_whole_and_an_empty_folder_is_used(model, tmp_path):
    import cgpt
    from cgpt.model.export import MARKER

    out = tmp_path / "export"
    out.mkdir()  # empty: nothing to lose
    _save(model, out)
    assert (out / MARKER).is_file() and (out / "model.safetensors").is_file()
    (out / "stale.bin").write_text("from the first export")
    _save(model, out)
    assert not (out / "stale.bin").exists() and (out / "config.json").exists()
    assert cgpt.load(out).config.vocab_size == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no temp folder left


def test_leftovers_of_a_killed_save_are_removed_and_lookalikes_kept(model, tmp_path):
    from cgpt.model.export import MARKER

    out = tmp_path / "export"
    _save(model, out)
    killed = tmp_path / ".export.cgpt-tmp-abc123"  # a save killed after its marker
    killed.mkdir()
    (killed / MARKER).write_text("{}")
    (killed / "model.safetensors").write_bytes(b"half")
    empty = tmp_path / ".export.cgpt-tmp-0000"  # killed before its marker
    empty.mkdir()
    lookalike = tmp_path / ".export.cgpt-tmp-mine"  # a user's folder named like a leftover
    lookalike.mkdir()
    (lookalike / "data.txt").write_text("mine")
    old = tmp_path / "export.old"  # the name the earlier save_hf used: a user's folder now
    old.mkdir()
    (old / "data.txt").write_text("mine too")
    _save(model, out)
    assert not killed.exists() and not empty.exists()
    assert (lookalike / "data.txt").read_text() == "mine"
    assert (old / "data.txt").read_text() == "mine too"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".export.cgpt-tmp-mine", "export", "export.old"]


def test_a_live_saves_temp_folder_is_not_taken_for_a_leftover(model, tmp_path):
    import fcntl

    from cgpt.model.export import MARKER

    live = tmp_path / ".export.cgpt-tmp-live"
    live.mkdir()
    (live / MARKER).write_text("{}")
    fd = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _save(model, tmp_path / "export")
        assert live.exists()
    finally:
        os.close(fd)


def test_an_interrupted_save_keeps_the_earlier_export_and_leaves_nothing(model, tmp_path,
                                                                         monkeypatch):
    from safetensors import numpy as stnp

    out = tmp_path / "export"
    _save(model, out)
    before = (out / "model.safetensors").read_bytes()

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(stnp, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _save(model, out)
    assert (out / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_exports_are_written_with_the_callers_umask(model, tmp_path, mask):
    old = os.umask(mask)
    try:
        out = _save(model, tmp_path / "export")
    finally:
        os.umask(old)
    assert os.stat(out).st_mode & 0o777 == 0o777 & ~mask
    for f in out.iterdir():
        assert os.stat(f).st_mode & 0o777 == 0o666 & ~mask, f.name


def test_a_read_only_destination_is_one_line(model, tmp_path, monkeypatch):
    from cgpt.model import export

    def read_only(*a, dir=None, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))

    monkeypatch.setattr(export.tempfile, "mkdtemp", read_only)
    with pytest.raises(ExportError) as e:
        _save(model, tmp_path / "export")
    assert "Read-only" in _one_line(e.value) and str(tmp_path / "export") in str(e.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file permissions")
def test_an_unwritable_folder_is_one_line(model, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    with pytest.raises(ExportError, match="cannot write"):
        _save(model, ro / "export")


def test_a_sigkilled_save_is_cleaned_by_the_next(model, tmp_path):
    """A real kill mid-write: the next save to the path removes its temp folder."""
    out = tmp_path / "export"
    code = textwrap.dedent(f"""
        import os, signal
        from safetensors import numpy as stnp
        from cgpt.config.model import ModelConfig
        from cgpt.model import gpt, hf
        cfg = ModelConfig(n_layer=1, d_model=16, n_head=2, vocab_size=64, n_ctx=16,
                          compute_dtype="float32")
        def killed(*a, **k):
            open(a[1], "wb").write(b"half")
            os.kill(os.getpid(), signal.SIGKILL)
        stnp.save_file = killed
        hf.save_hf_dir(gpt.init_params(cfg), cfg, {str(out)!r})
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == -9, r.stderr
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".export.cgpt-tmp-"), left
    _save(model, out)
    assert [p.name for p in tmp_path.iterdir()] == ["export"]
