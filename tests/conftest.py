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


# The heavy tests kept out of the default run, marked `slow` here (CI runs them after it:
# `.ci/run`), each with the default test that checks the same property, or `no twin` when
# none does and it is slow only to keep the default suite within 15 minutes. One table rather
# than marks spread over the files: the split of the suite is read and changed in one place
# (docs/testing.md: the times). A key is a node id under tests/, or a test's name without
# its parameters (every case). Marks written in the files themselves work as before.
SLOW = {
    # -- cheaper cases of the same test run by default
    "test_sharding.py::test_one_step_matches_single_device[layer_pipelined-stage=2]":
        "stage=4,data=2 pipelines by default",
    "test_sharding.py::test_two_dim_weight_streaming_loss_equals_single_device[axes1-batch_axes1]":
        "data=2,fsdp=4 with the batch over both runs by default",
    "test_sharding.py::test_two_dim_weight_streaming_loss_equals_single_device[axes2-batch_axes2]":
        "data=2,fsdp=4 with the batch over both runs by default",
    "test_wandb.py::test_sweep_groups_its_runs_by_the_sweep_name[my-group]":
        "the sweep's own group [None] runs by default",
    # -- a default test checks the same property
    "test_analysis_notebooks.py::test_03_checkpoints_trains_its_own_run":
        "test_train's test_run_directory_and_summary trains, loads, evaluates and generates; "
        "the notebook's committed outputs: test_committed_with_outputs_and_in_sync",
    "test_data.py::test_default_corpus_has_at_least_5m_tokens":
        "the whole default corpus (~60 s); its 2% sample takes the same path by default: "
        "test_a_fraction_of_the_default_corpus_is_prepared_alone",
    "test_gpu_check.py::test_cpu_smoke_as_the_gpu_machine_runs_it":
        "the smoke run end to end (~60 s); its parts run by default (results saved in order, "
        "the report, the HLO checks, the committed plan)",
    "test_multihost.py::test_killed_process_ends_the_job_and_resume_continues":
        "2 processes killed and resumed (~75 s); real 2-process jobs run by default "
        "(test_failed_job_exits_cleanly_when_one_process_is_slow_to_fail), and resume "
        "(test_train's sigkill test) and the modes' equality (test_sharding)",
    "test_sharding.py::test_plan_shows_the_unsharded_dims":
        "the same report without a compile: test_dims_that_do_not_divide_are_reported",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` selects
def pytest_collection_modifyitems(config, items):
    """Mark SLOW's tests `slow`. When the whole suite is collected, a key that names no test
    (renamed, removed) is an error: the table never silently stops marking."""
    used = set()
    for item in items:
        test = item.nodeid.removeprefix("tests/")
        for key in (test, test.split("[")[0]):
            if key in SLOW:
                item.add_marker(pytest.mark.slow(reason=SLOW[key]))
                used.add(key)
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS and set(SLOW) - used:
        raise pytest.UsageError(f"tests/conftest.py SLOW names no test: {sorted(set(SLOW) - used)}")


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
