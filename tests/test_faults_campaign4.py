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
