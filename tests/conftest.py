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


# The heavy tests kept out of the default run, marked `slow` here (CI runs every `slow` test
# after it: `.ci/run`), each with the default test that checks the same property, or `no twin` when
# none does and it is slow only to keep the default suite within 15 minutes. One table rather
# than marks spread over the files: the split of the suite is read and changed in one place
# (docs/testing.md: the times). A key is a node id under tests/, or a test's name without
# its parameters (every case). Marks written in the files themselves work the same way.
SLOW = {
    # -- cheaper cases of the same test run by default
    "test_sharding.py::test_one_step_matches_single_device[layer_pipelined-stage=2]":
        "stage=4,data=2 pipelines by default",
    "test_sharding.py::test_two_dim_weight_streaming_loss_equals_single_device[axes1-batch_axes1]":
        "data=2,fsdp=4 with the batch over both runs by default",
    "test_sharding.py::test_two_dim_weight_streaming_loss_equals_single_device[axes2-batch_axes2]":
        "data=2,fsdp=4 with the batch over both runs by default",
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
    "test_schedule.py::test_schedule_equals_modelzoo_stepping_in_torch[1.3B]":
        "the same stepping at 111M runs by default",
    "test_faults.py::test_disk_full_during_a_save_is_one_clear_error[tmpfs]":
        "the injected ENOSPC case runs by default",
    "test_faults_bounds.py::test_an_lm_eval_task_with_an_empty_data_file_is_one_error[]":
        "the blank-lines file runs by default",
    "test_faults_paths.py::test_rerun_never_moves_into_a_linked_superseded[dir]":
        "the dangling link runs by default",
    "test_fused.py::test_nonfinite_member_stops_alone":
        "test_a_member_found_nonfinite_a_step_late_fails_there_alone",
    "test_gns_train.py::test_fused_members_log_their_own_noise_scale":
        "fused = solo: test_fused_members_equal_solo_runs; the logged estimate: "
        "test_logged_in_metrics_tensorboard_and_summary",
    "test_gns_train.py::test_data_parallel_estimates_equal_one_device":
        "data parallel = one device: test_sharding; the estimate: test_gns.py",
    "test_gns.py::test_micro_batch_estimator_against_per_example_brute_force":
        "test_least_squares_noise_scale_within_10_percent",
    "test_gns.py::test_gns_off_is_the_step_without_it":
        "test_gns_train's test_off_logs_nothing_of_it",
    "test_wandb.py::test_sweep_groups_its_runs_by_the_sweep_name":
        "test_offline_run_logs_the_metrics_config_and_summary (one run, not a sweep)",
    "test_fit.py::test_train_chooses_what_plan_chooses_and_records_it":
        "test_plan_defaults_are_trains (the plan and train defaults agree), fit's unit tests",
    "test_fit.py::test_small_device_memory_forces_accumulation":
        "test_remat_before_accumulation_then_bisection (the search, without compiles)",
    "test_nodes.py::test_cyclic_processes_are_grouped_by_host":
        "test_nodes_are_the_hosts_processes_run_on",
    "test_nodes.py::test_two_hosts_stream_weights_as_hsdp":
        "test_build_mesh_nodes_on_emulated_devices",
    "test_multihost.py::test_failed_data_preparation_stops_every_process":
        "a failing 2-process job: test_failed_job_exits_cleanly_when_one_process_is_slow_to_fail",
    "test_preempt.py::test_slow_save_on_the_signal_completes_and_the_requeued_job_resumes":
        "signal, checkpoint, resume: test_signal_checkpoints_stops_and_resumes_identically",
    "test_harness.py::test_local_task_same_accuracy_as_hf":
        "lm-eval scoring equal to hf: test_loglikelihood_matches_hf",
    "test_load.py::test_exact_111m_shape":
        "the same checks on a small config: test_small_parity_every_format, "
        "test_small_greedy_generation_matches",
    "test_gpu_check.py::test_plan_row_of_a_one_device_run":
        "test_committed_plan_is_the_full_runs",
    "test_plan.py::test_auto_plan_reports_the_ranking_resolve_made":
        "test_sharding's auto tests (the ranking without a compile)",
    "test_plan.py::test_fits_compares_total_to_usable_memory": "test_fit.py's unit tests",
    "test_faults_dest.py::test_from_step_on_a_finished_run_is_an_error_not_a_no_op[kept-step]":
        "test_faults.py's test_from_step_must_name_a_kept_checkpoint",
    "test_faults_rundir.py::test_a_failed_branch_leaves_nothing_that_blocks_the_next_launch":
        "a failed start leaves nothing: test_usr1_during_startup_is_one_line_and_leaves_nothing",
    "test_harness.py::test_generation_of_many_prompt_lengths_matches_hf_in_few_compilations":
        "test_rolling_and_generation_match_hf",
    # -- no twin: slow only to keep the default suite within 15 minutes
    "test_branch.py::test_branch_equals_independent_wsd_run":
        "no twin (the WSD schedule and branch specs are unit-tested by default)",
    "test_analysis_design.py::test_bench_design_smoke": "no twin",
    "test_train.py::test_trains_far_below_unigram_baseline": "no twin (300 steps, ~90 s of CPU)",
    "test_load.py::test_ragged_generation_equals_each_prompt_alone":
        "no twin (one prompt: test_small_greedy_generation_matches)",
    "test_analysis_honest.py::test_chinchilla_profile_covers_truth_on_a_rich_sweep": "no twin",
    "test_analysis_chinchilla.py::test_recovers_epoch_law_with_ci_covering_truth": "no twin",
    "test_analysis_notebooks.py::test_02_cerebras_gpt_published":
        "no twin; the committed outputs: test_committed_with_outputs_and_in_sync",
    "test_analysis_notebooks.py::test_04_three_approaches_on_a_real_sweep":
        "no twin; the committed outputs: test_committed_with_outputs_and_in_sync",
    "test_analysis_notebooks.py::test_05_plan_next_runs_on_real_rounds":
        "no twin; the committed outputs: test_committed_with_outputs_and_in_sync",
    "test_analysis_notebooks.py::test_07_compare_recipes_on_the_published_table_and_the_"
    "committed_ladders": "no twin; the committed outputs: test_committed_with_outputs_and_in_sync",
    "test_analysis_notebooks.py::test_08_schedule_endpoints_on_real_sweeps":
        "test_analysis_schedule_endpoints.py (predict_endpoints on simulated truth); the "
        "committed outputs: test_committed_with_outputs_and_in_sync",
    "test_faults_dest.py::test_a_sweep_on_a_disk_that_fills_shows_the_run_failed": "no twin",
    "test_faults_sweep.py::test_truncated_summary_is_not_done_and_the_relaunch_writes_it":
        "no twin",
    "test_faults_sweep.py::test_sigkilled_prepare_leaves_no_worker_running": "no twin",
    "test_faults.py::test_run_directory_is_locked_while_training": "no twin",
    "test_faults.py::test_read_only_run_directory_mid_run": "no twin",
    "test_faults_names.py::test_a_full_cache_disk_is_blamed_on_the_cache": "no twin",
    "test_record.py::test_a_device_metric_is_two_edits_end_to_end":
        "a copy of the code with a metric added, through three sweeps' processes (417 s at "
        "load 20); its in-process half runs by default: "
        "test_a_declared_device_field_is_read_recorded_and_logged",
    "test_ahead.py::test_a_step_is_read_once_after_the_next_is_queued":
        "no twin (a late read's stop: test_a_nonfinite_step_read_late_stops_there_...)",
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
