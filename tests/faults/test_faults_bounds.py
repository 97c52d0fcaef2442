"""Issue 33, classes 3, 4 and 6 outside train/sweep: no hang (special files, a job environment
that does not add up), no unbounded memory (sizes checked before allocation, streams read in
bounded pieces), and one error naming the file, line, key or variable. Tiny generated inputs;
a regression shows as an alarm, never as a stuck test run."""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import socket
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cgpt.errors import LoadError


@contextlib.contextmanager
def within(seconds: int):
    """Fail instead of hanging: what used to block forever must answer in `seconds`."""
    def alarm(*_):
        raise TimeoutError(f"still running after {seconds} s: the hang is back")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---- Hugging Face directories --------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from cgpt.config.model import ModelConfig
    from cgpt.model import gpt, hf

    cfg = ModelConfig(n_layer=2, d_model=16, n_head=2, vocab_size=300, n_ctx=32,
                      compute_dtype="float32")
    d = tmp_path_factory.mktemp("hf") / "m"
    hf.save_hf_dir(gpt.init_params(cfg), cfg, d)
    return d


def _edited(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **changes}))
    return dst


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_fifo_in_a_checkpoint_is_refused_not_opened(hf_dir, tmp_path, name):
    import cgpt

    d = shutil.copytree(hf_dir, tmp_path / "m")
    (d / name).unlink()
    os.mkfifo(d / name)
    with within(60), pytest.raises(LoadError, match=rf"{name} is not a regular file"):
        cgpt.load(str(d))


@pytest.mark.parametrize("changes, match", [
    (dict(n_layer=10**9), r"describes 3,280,000,005,344 parameters .* weight files hold"),
    (dict(n_embd=600_000_000, n_head=2), r"describes .* parameters .* not belong"),
    (dict(vocab_size=2**31 - 1), r"describes .* parameters"),
])
def test_a_config_larger_than_its_weights_is_refused_before_allocating(hf_dir, tmp_path,
                                                                         changes, match):
    import resource

    import cgpt

    d = _edited(hf_dir, tmp_path / "m", **changes)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (min(hard, 16 << 30) if hard > 0 else 16 << 30,
                                            hard))  # a regression fails, not the machine
    try:
        with within(60), pytest.raises(LoadError, match=match):
            cgpt.load(str(d))
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("changes, match", [
    (dict(n_layer=2.5), r"key 'n_layer': not a whole number"),
    (dict(n_head=True), r"key 'n_head': is the boolean true"),
    (dict(n_embd="16x"), r"key 'n_embd': is not a whole number"),
    (dict(layer_norm_epsilon=-1), r"layer_norm_epsilon must be a finite number > 0"),
    (dict(n_head=3), r"n_head=3 does not divide n_embd=16"),
])
def test_hf_config_values_are_read_strictly_and_named_as_in_the_file(hf_dir, tmp_path,
                                                                     changes, match):
    import cgpt

    d = _edited(hf_dir, tmp_path / "m", **changes)
    with pytest.raises(LoadError, match=match) as e:
        cgpt.load(str(d))
    assert "ModelConfig" not in str(e.value) and "ln_eps" not in str(e.value)


# ---- data sources: bounded reads, named rows -----------------------------------------------
def _read_all(path: Path, column: str = "text") -> list[str]:
    from cgpt.data import sources

    files = sources.list_files(path)
    return [t for u in sources.plan_units(files, 1 << 20)
            for texts, _ in sources.read_unit(u, files, column) for t in texts]


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "txt", "json"])
def test_an_oversized_document_is_refused_before_it_is_read_whole(tmp_path, monkeypatch, fmt):
    from cgpt.data import sources
    from cgpt.data.sources import DataError

    monkeypatch.setattr(sources, "MAX_DOCUMENT_BYTES", 4096)
    monkeypatch.setattr(sources, "MAX_JSON_ARRAY_BYTES", 4096)
    small, big = "short row", "x" * 10_000  # big: one line with no newline in it
    f = tmp_path / f"c.{fmt}"
    if fmt == "txt":
        f.write_text(big)
    elif fmt == "json":
        f.write_text(json.dumps([{"text": small}, {"text": big}]))
    else:
        rows = "".join(json.dumps({"text": t}) + "\n" for t in (small, small, big))
        f.write_bytes(gzip.compress(rows.encode()) if fmt.endswith("gz") else rows.encode())
    where = {"jsonl": "line 3", "jsonl.gz": "line 3", "txt": "c.txt", "json": "JSON array"}[fmt]
    with pytest.raises(DataError, match=rf"{where}.*over the limit of 0 MiB"):
        _read_all(f)
    f.write_text(json.dumps({"text": small}) + "\n" if fmt != "txt" else small)
    if fmt != "jsonl.gz":
        assert _read_all(f) == [small]  # under the limit: read as before


@pytest.mark.parametrize("escape", ["\\ud800", "ok \\udfff then"])
def test_a_lone_surrogate_is_named_by_file_and_line(tmp_path, escape):
    from cgpt.data.sources import DataError

    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "fine \\u00e9 \\ud83d\\ude00"}\n' + '{"text": "' + escape + '"}\n')
    with pytest.raises(DataError, match=r"c.jsonl, line 2: column 'text' holds a lone UTF-16 "
                                        r"surrogate \(\\ud[8f]"):
        _read_all(f)
    f.write_text('{"text": "fine \\u00e9 \\ud83d\\ude00"}\n')  # a valid pair is text
    assert _read_all(f) == ["fine é 😀"]


# ---- a job environment that does not add up: an error within seconds -----------------------
@pytest.mark.parametrize("env, match", [
    ({"JAX_COORDINATOR_ADDRESS": "not a host", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"},
     r"JAX_COORDINATOR_ADDRESS='not a host': expected host:port"),
    ({"JAX_COORDINATOR_ADDRESS": "h:99999", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"},
     r"expected host:port"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1234", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"},
     r"JAX_PROCESS_ID=2 with JAX_NUM_PROCESSES=2: .* 0 \.\. 1"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1234", "JAX_NUM_PROCESSES": "two"},
     r"JAX_NUM_PROCESSES='two': must be a whole number"),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_NODELIST": "n1"},
     r"SLURM_NTASKS=2 .* not started by `srun`"),
])
def test_a_job_environment_that_does_not_add_up_is_named(env, match):
    from cgpt.sharding.distributed import check_env

    with pytest.raises(ValueError, match=match):
        check_env(env)
    check_env({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "n[1-2]"})
    check_env({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"})  # one task: nothing to join
    check_env({"JAX_COORDINATOR_ADDRESS": "node01:12345", "JAX_NUM_PROCESSES": "2",
               "JAX_PROCESS_ID": "1"})


def test_a_held_coordinator_port_is_named():
    from cgpt.sharding.distributed import DistributedError, _check_port_free

    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(DistributedError, match=rf"port {port} on this host is held"):
            _check_port_free(f"localhost:{port}")
    _check_port_free(f"localhost:{port}")  # released: free again


@pytest.mark.parametrize("n, want", [(2**31 - 1, [2**31 - 1, 1]), (36, [36, 18, 12, 9, 6, 4, 3,
                                                                      2, 1])])
def test_the_micro_batch_divisor_search_is_bounded(n, want):
    from cgpt.sharding.fitrule import divisors_desc

    with within(20):  # 2**31 - 1 (a prime) took a scan of every count up to it
        assert divisors_desc(n) == want


# ---- cgpt plan on absurd values: answered in seconds, or one line naming the flag ----------
@pytest.mark.parametrize("model,flags", [
    ("13B", ["--batch", "100000000"]),  # every count up to 1e8 scanned for divisors (1e9: 65 s)
    ("tiny-17k", ["--nodes", "2", "--gpus-per-node", "100000000"]),  # stage counts up to 2e8
])
def test_an_absurd_plan_is_answered_in_seconds(model, flags, capsys):
    from cgpt.cli import main

    with within(30):
        assert main(["plan", "--model", model, "--no-compile", "--json", *flags]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["batch"] % r["micro_batch"] == 0 and r["num_devices"] >= 8


def test_a_plan_of_a_batch_beyond_the_whole_budget_is_refused(capsys):
    """`--batch 1e9` on tiny-17k: one step is 128B tokens, the model's budget 337k; the plan
    timed one step of it (the budget rounded up to a step) as if that were the run."""
    from cgpt.cli import main

    assert main(["plan", "--model", "tiny-17k", "--no-compile", "--batch", "1000000000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batch 1000000000: one step of" in err[0], err
    assert "give --batch at most 2,630" in err[0], err


def test_a_compiled_plan_of_more_tokens_than_a_step_counts_names_batch():
    """JAX's OverflowError from inside the loss (a traceback) after the step was traced."""
    from cgpt.plan.planning import plan

    with pytest.raises(ValueError, match=r"^--batch 10000000: .* 20,480,000,000 tokens per "
                       r"step, .* at most 1,048,575 \(at --seq-len 2048\), or add --no-compile"):
        plan("13B", "auto", batch=10**7)


@pytest.mark.parametrize("value", ["1e400", "1e30GB", "1.2.3"])
def test_an_impossible_device_memory_is_one_line_naming_the_flag(value, capsys):
    from cgpt.cli import main

    assert main(["plan", "--model", "tiny-17k", "--no-compile", "--device-memory", value]) == 2
    err = capsys.readouterr().err  # 1e400: int(inf) raised OverflowError (a traceback)
    assert err.count("\n") == 1 and err.startswith(f"cgpt plan: error: --device-memory "
                                                    f"{value!r}: ") and "such as 80GB" in err


# ---- lm-eval tasks: the real cause, not 'unknown task' or a traceback ----------------------
def _task_yaml(root: Path, name: str, data: Path) -> None:
    root.mkdir(exist_ok=True)
    (root / f"{name}.yaml").write_text(f"""\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
""")


def test_an_lm_eval_task_whose_yaml_does_not_parse_is_named(tmp_path):
    pytest.importorskip("lm_eval")
    from cgpt.eval.harness import _unparsable_yamls

    tasks = tmp_path / "tasks"
    _task_yaml(tasks, "fine_task", tmp_path / "d.jsonl")
    (tasks / "bad.yaml").write_text("task: bad_task\ndataset_path: json\n  oops: [\n")
    (tasks / "fn.yaml").write_text("task: fn_task\nprocess_docs: !function utils.x\n")
    (broken,) = _unparsable_yamls(tasks)
    assert broken.startswith(f"{tasks / 'bad.yaml'}: ") and "line 3" in broken


@pytest.mark.parametrize("content", [
    pytest.param("", marks=pytest.mark.slow(reason="the blank-lines file runs by default")),
    "\n\n"])
def test_an_lm_eval_task_with_an_empty_data_file_is_one_error(tmp_path, monkeypatch, content):
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    from cgpt.eval.harness import _checked_manager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    data = tmp_path / "empty.jsonl"
    data.write_text(content)
    _task_yaml(tmp_path / "tasks", "empty_mc", data)
    manager = _checked_manager(TaskManager)(include_path=str(tmp_path / "tasks"))
    with pytest.raises(ValueError, match=r"(could not build task\(s\) \['empty_mc'\]|"
                                         r"'empty_mc' has no documents)"):
        manager.load(["empty_mc"])


# ---- sweep_report on a huge results.csv ----------------------------------------------------
def test_least_squares_in_blocks_equals_one_block(monkeypatch):
    from analysis import solve

    rng = np.random.default_rng(0)
    u = np.linspace(-2, 2, 30)
    Y = 2.0 + np.exp(0.5 - 0.3 * u) * (1 + 0.01 * rng.standard_normal((5, 30)))
    whole = solve.least_squares(u, Y, True)
    monkeypatch.setattr(solve, "_BLOCK", 7 * 30)  # 7 exponents of one resample at a time
    blocked = solve.least_squares(u, Y, True)
    for a, b in zip(whole, blocked):
        np.testing.assert_allclose(a, b)
    monkeypatch.setattr(solve, "_BLOCK", 2 * 241 * 30)  # two resamples at a time
    for a, b in zip(whole, solve.least_squares(u, Y, True)):
        np.testing.assert_allclose(a, b)


def test_sweep_report_on_a_huge_results_csv_is_one_error(tmp_path):
    from analysis import sweep_report
    from analysis.fit import bootstrap_indices
    from cgpt.results_schema import REQUIRED

    n = 20_001
    rng = np.random.default_rng(0)
    N = np.exp(rng.uniform(np.log(1e5), np.log(1e8), n))
    df = pd.DataFrame({c: 0 for c in REQUIRED} | dict(
        run_id=[f"r{i}" for i in range(n)], model="m", status="done", error="", n_params=N,
        n_params_nonembed=N, tokens=20 * N, flops=120 * N * N, flops_6nd=120 * N * N,
        val_loss=2 + 50 * (120 * N * N) ** -0.1, train_loss=2 + 50 * (120 * N * N) ** -0.1,
        mup=False, run_dir="x"))
    df.to_csv(tmp_path / "results.csv", index=False)
    with within(120), pytest.raises(ValueError, match=r"20,001 finished runs, more than the "
                                                      r"5,000 a sweep report fits"):
        sweep_report(tmp_path, n_boot=1000)
    with within(60):  # one group per run: grouped from one sort, not one scan per group
        (idx,) = bootstrap_indices(n, 1, 0, groups=N)
    assert idx.shape == (n,)
