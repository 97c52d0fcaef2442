"""Test setup: emulate an 8-device mesh on the CPU before jax is imported anywhere, and give
the session one cache directory of its own."""
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# One cache for the whole session, in a temp dir removed at its end: cgpt's (prepared data, and
# the sweep's compilation cache `CGPT_CACHE/jax`) and JAX's persistent compilation cache, which
# every `cgpt train`/`sweep` subprocess inherits. Most heavy tests launch processes that
# compile the same tiny programs; with the cache a later one loads them instead of running XLA
# again (a hit is the same executable: JAX keys an entry by the program, devices, compile
# options, XLA flags and versions). Nothing is written to the user's ~/.cache. A variable
# already set wins (a persistent dir across sessions: docs/testing.md). Tests of the cache
# itself set their own dirs (test_warm.py, test_multihost.py).
_OWN_CACHE = None if os.environ.get("CGPT_CACHE") else tempfile.mkdtemp(prefix="cgpt-tests-")
if _OWN_CACHE:
    os.environ["CGPT_CACHE"] = _OWN_CACHE
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(os.environ["CGPT_CACHE"]) / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def jax_devices():
    """JAX starts before the first test, on the devices XLA_FLAGS asks for (8). An in-process
    sweep or plan asks `emulate_cpu_devices` for its own count, which JAX honours only before
    it starts: were such a test the first to start JAX, every later test of the process would
    see its count (4), not the 8 the mesh tests expect. Once JAX has started the request is a
    no-op, as it is in any process that already computed (a SLURM task asks before)."""
    import jax

    return jax.devices()


def pytest_unconfigure(config):
    """The session's own cache goes with it (a cache the caller named stays)."""
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def kernel(tmp_path_factory):
    """A Jupyter kernelspec for this very interpreter, installed into a temp prefix: works on a
    fresh machine with only `pip install ipykernel`, and never picks up some other Python."""
    from ipykernel.kernelspec import install

    prefix = tmp_path_factory.mktemp("jupyter")
    name = "cgpt-test"
    install(kernel_name=name, prefix=str(prefix))
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    yield name
    mp.undo()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Six stdlib modules as a tiny text corpus: real prose and code, offline, in one module's
    temp dir (shared by the training, fault, branch, preemption and multi-process tests)."""
    d = tmp_path_factory.mktemp("corpus")
    lib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py"):
        shutil.copy(lib / name, d / name)
    return d
