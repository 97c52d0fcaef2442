"""Test setup: emulate an 8-device mesh on the CPU before jax is imported anywhere."""
import os
import shutil
import sysconfig
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402


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
