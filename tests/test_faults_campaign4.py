"""Faults found by the fourth fault campaign (qa/cases/: sharedcache, flagodd, clock, ...), each
reproduced here first. Fast: nothing below trains."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


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


def test_a_stopped_sweep_gives_its_runs_their_grace_when_the_wall_clock_jumps(monkeypatch):
    """The sweep's deadlines and run durations were wall-clock (time.time()): a clock stepped a
    day forward (NTP, a resumed VM) while a Ctrl-C'd sweep waited for its runs SIGKILLed a run
    in its clean stop, one stepped back would wait an hour more, and the printed run time was
    negative or a day. They are monotonic now; here the stop's grace under a forward jump."""
    from cgpt.sweep import executors

    child = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys, time\n"
         "signal.signal(signal.SIGINT, lambda *a: (time.sleep(0.5), sys.exit(130)))\n"
         "print('ready', flush=True)\ntime.sleep(120)"], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    real, calls = time.time, []

    def stepped() -> float:  # a day later from the second reading on
        calls.append(1)
        return real() + (86400.0 if len(calls) > 1 else 0.0)
    monkeypatch.setattr(time, "time", stepped)
    monkeypatch.setitem(executors._live, "run", child)
    try:
        executors.stop_local(grace_s=20.0)
    finally:
        executors._stopping.clear()
        child.kill()
        child.wait()
    assert child.returncode == 130, "the run was killed inside its grace"


def test_a_dry_run_of_a_spec_edited_after_its_runs_trained_says_what_the_launch_would(
        tmp_path, capsys):
    """A spec whose peak_lr was edited while its sweep ran: the dry run showed both runs
    `done`, `0s still to run` and exited 0, while the launch it previews refuses (the runs
    trained with another config). The table says `changed` and the dry run refuses alike."""
    import argparse
    import json

    from cgpt.sweep import command
    from cgpt.sweep.spec import load_sweep
    from tests.sweep_helpers import make_spec

    spec = make_spec(tmp_path, "edit", {"model": ["tiny-17k"]})
    out = tmp_path / "out"
    run = load_sweep(spec).runs[0]
    d = out / run.run_id
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(run.config.to_yaml())
    (d / "summary.json").write_text(json.dumps({"model": run.model, "val_loss": 3.0,
                                                "train_loss": 3.0, "tokens": run.tokens}))
    def dry_run(*extra: str) -> int:
        ap = argparse.ArgumentParser()
        command.add_arguments(ap)
        return command.cmd_sweep(ap.parse_args([str(spec), "--out", str(out), "--dry-run",
                                                "--no-fit", *extra]))
    assert dry_run() == 0  # unchanged: done
    assert re.search(rf"{run.run_id}\s+done\s", capsys.readouterr().out)
    with pytest.raises(ValueError, match=r"train.peak_lr: None -> 0.004.*--on-change rerun"):
        dry_run("--set", "train.peak_lr=0.004")
    table = capsys.readouterr().out
    assert re.search(rf"{run.run_id}\s+changed\s", table), table
    assert dry_run("--set", "train.peak_lr=0.004", "--on-change", "rerun") == 0
    assert (d / "summary.json").exists()  # a dry run moves nothing


@pytest.mark.parametrize("argv, named", [
    (["train", "--model", "tiny-17k", "--out", ""], "--out ''"),
    (["train", "--model", "tiny-17k", "--out", "  "], "--out '  '"),
    (["train", "--model", "tiny-17k", "--data", "   "], "--data '   '"),
])
def test_an_empty_out_or_data_is_refused_not_read_as_the_default(tmp_path, argv, named):
    """`--out ""` (an unset `$OUT`) trained into runs/<model>, the default, without a word;
    `--data "   "` was refused as `DataConfig.source`, a name the user never typed."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-m", "cgpt", *argv, "--tokens", "1000"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and named in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written (no runs/tiny-17k)


def test_a_sweep_with_an_empty_out_is_refused(tmp_path, monkeypatch):
    """The same for `cgpt sweep SPEC --out ""`: it planned into runs/sweeps/<name>."""
    import argparse

    from cgpt.sweep import command
    from tests.sweep_helpers import make_spec

    spec = make_spec(tmp_path, "empty", {"model": ["tiny-17k"]})
    monkeypatch.chdir(tmp_path)
    ap = argparse.ArgumentParser()
    command.add_arguments(ap)
    with pytest.raises(ValueError, match=r"--out '': empty"):
        command.cmd_sweep(ap.parse_args([str(spec), "--out", "", "--dry-run", "--no-fit"]))
    assert not (tmp_path / "runs").exists()


def _bpe(vocab: int, text: str):
    from cgpt.data.tokenizer import train_tokenizer, with_eot

    return with_eot(train_tokenizer([[text] * 50], vocab), "test")


def test_a_run_whose_tokenizer_was_swapped_is_refused_by_load(tmp_path):
    """A run's tokenizer.json replaced by another BPE (300 tokens, the model has 512) loaded
    without a word: every prompt was then encoded with a tokenizer the model never saw. The
    hash summary.json recorded (and the model's vocabulary) now tell it; a damaged summary
    still loads (its hash is not trusted, nor needed)."""
    import json

    from cgpt.config.model import ModelConfig
    from cgpt.data.tokenizer import load_checkpoint_tokenizer, sha256
    from cgpt.errors import LoadError
    from cgpt.model.orbax_format import _check_run_tokenizer

    cfg = ModelConfig(n_layer=1, d_model=16, n_head=2, vocab_size=512, n_ctx=32)
    own = _bpe(300, "def f(x): return x + 1 # the run's own text")
    own.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "summary.json").write_text(json.dumps({"data": {"tokenizer_sha256": sha256(own)}}))
    _check_run_tokenizer(tmp_path, load_checkpoint_tokenizer(tmp_path), cfg)  # its own: fine
    _bpe(300, "class A: pass  # another corpus").save(str(tmp_path / "tokenizer.json"))
    swapped = load_checkpoint_tokenizer(tmp_path)
    with pytest.raises(LoadError, match=r"tokenizer.json: not the tokenizer this run trained"):
        _check_run_tokenizer(tmp_path, swapped, cfg)
    (tmp_path / "summary.json").write_text("{oops")
    _check_run_tokenizer(tmp_path, swapped, cfg)  # no trusted hash: the vocabulary fits
    with pytest.raises(LoadError, match=r"tokenizer.json: \d+ tokens, more than the model's "
                                        r"vocab_size 200"):
        _check_run_tokenizer(tmp_path, swapped, ModelConfig(n_layer=1, d_model=16, n_head=2,
                                                            vocab_size=200, n_ctx=32))


@pytest.mark.parametrize("key, value", [("vocab_size", "512"), ("n_layer", "2"),
                                        ("layer_norm_epsilon", "1e-5")])
def test_an_hf_config_with_a_number_written_as_text_names_the_key(tmp_path, key, value):
    """config.json with `"vocab_size": "512"` loaded (the string read as a count), a file that
    transformers cannot load: JSON has numbers, so text is a writer's mistake, named."""
    from cgpt.errors import LoadError
    from cgpt.model.hf import config_from_hf

    cfg = {"model_type": "gpt2", "n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 512,
           "n_positions": 32, "activation_function": "gelu", key: value}
    with pytest.raises(LoadError, match=rf"key '{key}' is the string '{value}', not a number"):
        config_from_hf(cfg, tmp_path / "config.json")
    config_from_hf({**cfg, key: float(value) if "e" in value else int(value)},
                   tmp_path / "config.json")


def _demo(tmp_path) -> Path:
    d = tmp_path / "demo"
    shutil.copytree(REPO / "notebooks" / "data" / "demo", d)
    return d


def test_a_log_value_that_is_not_a_number_is_named_with_its_line(tmp_path):
    """`"tokens": [122880]` on one line of a run's metrics.jsonl ended read_curves in pandas'
    `'<' not supported between instances of 'list' and 'int'`, with no file."""
    import json

    import analysis as A

    d = _demo(tmp_path)
    log = d / "tiny-13k_d269k_s0" / "metrics.jsonl"
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    rows[2]["tokens"] = [rows[2]["tokens"]]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 3: 'tokens' is \[\d+\], not a "):
        A.read_curves(d)


def test_a_bad_mup_cell_names_results_csv(tmp_path):
    import analysis as A

    d = _demo(tmp_path)
    text = (d / "results.csv").read_text().splitlines()
    col = text[0].split(",").index("mup")
    cells = text[1].split(",")
    cells[col] = "maybe"
    (d / "results.csv").write_text("\n".join([text[0], ",".join(cells), *text[2:]]) + "\n")
    with pytest.raises(ValueError, match=r"results.csv: column 'mup': cannot read 'maybe'"):
        A.load_results(d)


@pytest.mark.parametrize("edit, named", [
    (lambda s: s.pop("seq_len"), r"summary.json: 'seq_len' is missing, not a positive whole"),
    (lambda s: s.update(seq_len="long"), r"summary.json: 'seq_len' is 'long', not a positive"),
    (lambda s: s.update(batch_size=0), r"summary.json: 'batch_size' is 0, not a positive"),
])
def test_noise_table_names_a_summary_count_it_cannot_use(tmp_path, edit, named):
    """A summary.json without seq_len ended gns.noise_table in `KeyError: 'seq_len'`; a text
    seq_len in int()'s message, without the file."""
    import json

    from analysis import gns

    d = tmp_path / "cb"
    shutil.copytree(REPO / "notebooks" / "data" / "critical_batch", d)
    p = d / "tiny-30k_d597k_s0" / "summary.json"
    s = json.loads(p.read_text())
    edit(s)
    p.write_text(json.dumps(s))
    with pytest.raises(ValueError, match=named):
        gns.noise_table(d)


def test_noise_table_names_the_run_whose_noise_estimate_is_unusable(tmp_path):
    """A run whose |G|^2 estimates are all negative: the error did not say which of the sweep's
    runs it was."""
    import json

    from analysis import gns

    d = tmp_path / "cb"
    shutil.copytree(REPO / "notebooks" / "data" / "critical_batch", d)
    log = d / "tiny-30k_d597k_s0" / "metrics.jsonl"
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    log.write_text("".join(json.dumps({**r, "gns_g2": -abs(r.get("gns_g2") or 1.0)}) + "\n"
                           for r in rows))
    with pytest.raises(ValueError, match=r"tiny-30k_d597k_s0/metrics.jsonl \(run "
                                         r"tiny-30k_d597k_s0\): the mean \|G\|\^2"):
        gns.noise_table(d)


@pytest.mark.parametrize("argv, named", [
    (["--model", "13B", "--mode", "layer_pipelined", "--mesh", "stage=1000000"],
     "--mesh stage=1000000 does not divide n_layer=40"),
    (["--model", "tiny-17k", "--batch", "8", "--micro-batches", "1000000000"],
     "train.micro_batches=1000000000 (--micro-batches) sets a layer_pipelined run's"),
    (["--model", "tiny-17k", "--mode", "data_parallel", "--micro-batches", "2"],
     "but this run is data_parallel"),
])
def test_the_analytic_plan_refuses_a_pipeline_it_could_not_build(capsys, argv, named):
    """`plan --no-compile` answered `fits: true` (bubble 99.99%) for a million pipeline stages
    of a 40-layer model, and dropped --micro-batches without a word where the mode was not
    layer_pipelined: only the compiled path (the strategy) checked either."""
    from cgpt.plan.command import main

    assert main([*argv, "--no-compile", "--json"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and named in err[0], err


def test_a_token_budget_below_one_batch_is_refused_not_rounded_up_to_a_step():
    """`tokens: 3` (or batch_size 1e9) planned one whole step: a run of 16B tokens for a
    budget of 640. The budget is refused with the key, the batch and the fix."""
    from cgpt.config.recipe import steps_for_tokens

    assert steps_for_tokens(64, 4, 16) == 1 and steps_for_tokens(127, 4, 16) == 1
    with pytest.raises(ValueError, match=r"train.tokens=63 is less than one step of "
                       r"train.batch_size=4 x data.seq_len=16 = 64 tokens: raise train.tokens"):
        steps_for_tokens(63, 4, 16)


@pytest.mark.parametrize("grid,train,named", [
    ("tokens: [3]", "batch_size: 4", "grid.tokens entry 3"),
    ("seed: [0]", "batch_size: 1000000000", "train.batch_size=1,000,000,000"),
])
def test_a_dry_run_refuses_a_budget_below_one_batch(tmp_path, grid, train, named):
    spec = tmp_path / "absurd.yaml"
    spec.write_text(f"name: absurd\nbase: {{preset: tiny-17k, data: {{seq_len: 16}}, train: "
                    f"{{{train}, tokens: 640}}}}\ngrid: {{model: [tiny-17k], {grid}}}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-m", "cgpt", "sweep", str(spec), "--out",
                        str(tmp_path / "out"), "--dry-run", "--no-fit"], env=env,
                       capture_output=True, text=True, timeout=300)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert named in lines[0] and "less than one step" in lines[0], lines[0]


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
