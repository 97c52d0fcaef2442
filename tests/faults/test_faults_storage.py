"""Faults of storage: a cache several users share (another user's preparer lock, folders made
in a sticky cache, a second user's store beside the first's), and what a run is told when its
storage refuses (a full disk, permissions, a read-only filesystem, an I/O error, a failed
atomic write). Each test reproduces its fault first. Fast: nothing below trains."""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def shared():
    """A folder another user can reach (pytest's tmp_path lies under an owner-only folder)."""
    d = Path(tempfile.mkdtemp(prefix="cgpt-shared-"))
    d.chmod(0o755)
    yield d
    for p in (d, *d.rglob("*")):
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(d)


TAKE_LOCK = """
import os, sys
from pathlib import Path
from cgpt.data import batches  # everything the lock needs, imported before the drop
if os.geteuid() == 0:
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
try:
    with batches._one_preparer(Path(sys.argv[1])):
        pass
except PermissionError as e:
    print(e, file=sys.stderr)
    sys.exit(3)
"""


def _lock_as_other_user(lock: Path) -> subprocess.CompletedProcess:
    """Take `lock` as a user who cannot write what this user made: uid 65534 under root, else
    this user with the write bits the caller removed."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", TAKE_LOCK, str(lock)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_another_users_preparer_lock_in_a_shared_cache_is_taken_read_only(shared):
    """User B training on a store user A prepared in one $CGPT_CACHE (umask 022: A's lock file
    0644) used to be refused: the lock was opened for append, so B got `Permission denied` on a
    file flock does not need to write."""
    lock = shared / "locks" / "x.lock"
    lock.parent.mkdir()
    lock.write_text("")
    lock.chmod(0o444 if os.geteuid() else 0o644)
    lock.parent.chmod(0o555 if os.geteuid() else 0o755)
    r = _lock_as_other_user(lock)
    assert r.returncode == 0, r.stderr


def test_a_lock_that_cannot_be_made_is_still_refused(shared):
    """Read-only is the fallback for an existing lock only: where the lock cannot be created
    (a folder of another user), the PermissionError still reaches the caller's one line."""
    (shared / "locks").mkdir()
    (shared / "locks").chmod(0o555)
    r = _lock_as_other_user(shared / "locks" / "new.lock")
    assert r.returncode == 3 and "Permission denied" in r.stderr, r.stderr


def test_folders_made_in_a_sticky_shared_cache_stay_shared(tmp_path):
    """User A's first run in a lab's cache (mode 1777, like /tmp) made tokenizers/, locks/ and
    tokens/ 0755 under umask 022, so user B could not prepare a store of its own there. Folders
    made in such a cache take its mode; in an ordinary one they keep the umask's."""
    from cgpt.fileio import shared_subfolder

    lab, own = tmp_path / "lab", tmp_path / "own"
    lab.mkdir()
    lab.chmod(0o1777)
    own.mkdir(mode=0o777)
    own.chmod(0o777)  # world-writable but not sticky: not a shared cache's convention
    old = os.umask(0o022)
    try:
        for name in ("tokenizers", "locks", "tokens"):
            assert (shared_subfolder(lab, name).stat().st_mode & 0o7777) == 0o1777
            assert (shared_subfolder(own, name).stat().st_mode & 0o7777) == 0o755
    finally:
        os.umask(old)
    (lab / "tokens").chmod(0o755)  # an existing folder is never changed
    assert (shared_subfolder(lab, "tokens").stat().st_mode & 0o7777) == 0o755


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")
def test_a_second_user_prepares_a_store_in_a_sticky_cache_the_first_user_made(shared):
    """End to end through `load_data`: A (this user) prepares a store in a 1777 cache, B (uid
    65534) prepares another (a different vocabulary) beside it, and A's files are untouched."""
    from cgpt.data import batches

    cache, corpus = shared / "cache", shared / "corpus"
    cache.mkdir()
    cache.chmod(0o1777)
    corpus.mkdir()
    (corpus / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 400)
    data = batches.DataConfig(source=str(corpus), vocab_size=300, seq_len=16,
                              cache_dir=str(cache))
    batches.load_data(data)
    before = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    script = ("import mmap, os, sys\nfrom cgpt.data import batches\n"  # (stdlib under /root)
              "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
              f"batches.load_data(batches.DataConfig(source={str(corpus)!r}, vocab_size=280, "
              f"seq_len=16, cache_dir={str(cache)!r}))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(list((cache / "tokens").iterdir())) == 2
    assert {p: p.stat().st_mtime_ns for p in before} == before


@pytest.mark.parametrize("err,fix", [
    (28, "free space on its disk"), (13, "fix its permissions"), (30, "make its filesystem "
                                                                     "writable")])
def test_a_run_stopped_by_its_storage_is_told_the_fix_for_that_refusal(tmp_path, err, fix):
    """Every storage refusal used to end in "free space (or fix the permissions)": a folder
    of another user's is not a full disk."""
    from cgpt.train.launch import kept, storage_error

    said, how = storage_error(OSError(err, os.strerror(err), str(tmp_path / "x")))
    assert said == f"cannot write {tmp_path / 'x'}: {os.strerror(err)}" and how == fix
    assert kept(tmp_path, how) == f"no checkpoint was written yet; {fix} and rerun"


def test_an_io_error_is_not_called_a_failed_write():
    """EIO while reading a run's tokenizer was reported as "cannot write" it."""
    from cgpt.train.launch import storage_error

    said, how = storage_error(OSError(5, os.strerror(5), "/r/tokenizer.json"))
    assert said.startswith("the storage failed on /r/tokenizer.json: ") and how == "check the disk"


def test_a_failed_atomic_write_names_its_file_not_the_temp_name(tmp_path):
    """An ESTALE while writing metrics.jsonl was reported on `metrics.jsonl.bsr4rztx.tmp`."""
    from cgpt.fileio import atomic_write

    def stale(tmp):
        raise OSError(116, os.strerror(116), str(tmp))

    with pytest.raises(OSError) as e:
        atomic_write(tmp_path / "metrics.jsonl", stale)
    assert e.value.filename == str(tmp_path / "metrics.jsonl")
    assert list(tmp_path.iterdir()) == []
