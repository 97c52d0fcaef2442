"""Faults (#23), run directories and checkpoints: a run is recognised by more than its
config.yaml, the log is read strictly, the summary never averages the wrong steps, damaged
checkpoints and misplaced files give one error, early signals are kept. Each test
reproduces its fault first (`python -m qa.campaign` runs the wider campaign: docs/faults.md)."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cgpt
from cgpt import LoadError
from cgpt.errors import NotStarted
from cgpt.stop import GUARD
from cgpt.train import preempt
from cgpt import rundir
from cgpt.train import launch
from cgpt.cli import main as cli_main
from cgpt.config.run import RunConfig
from cgpt.train.loop import train
from tests.run_helpers import tiny_run

REPO = Path(__file__).resolve().parents[2]
STEPS = 20


def _run(corpus, cache, **kw) -> RunConfig:
    return tiny_run(corpus, cache, STEPS, **{"ckpt_every": 5, "keep_checkpoints": 3, **kw})


def _flags(corpus, cache, out, *extra):
    return ["train", "--model", "tiny-17k", "--data", str(corpus), "--out", str(out),
            "--no-progress", f"--tokens={8 * 16 * STEPS}", "train.batch_size=8",
            "train.log_every=1", "train.ckpt_every=5", "train.keep_checkpoints=3",
            "train.peak_lr=0.003", "data.vocab_size=512", "data.seq_len=16",
            "data.val_sequences=16", f"data.cache_dir={cache}", *extra]


@pytest.fixture(scope="module")
def base(corpus, tmp_path_factory):
    """A finished 20-step run (checkpoints 10, 15, 20) and its data cache."""
    root = tmp_path_factory.mktemp("rundir")
    cache = root / "cache"
    summary = train(_run(corpus, cache), root / "base", progress=False)
    return root / "base", cache, summary


def _copy(base, tmp_path, killed=True) -> Path:
    """A copy of the base run; `killed`: as if stopped after checkpoint 15."""
    d = tmp_path / "run"
    shutil.copytree(base[0], d)
    if killed:
        (d / "summary.json").unlink()
        shutil.rmtree(d / "checkpoints" / "20")
    return d


def _state(d: Path):
    steps = sorted(p.name for p in (d / "checkpoints").iterdir()) \
        if (d / "checkpoints").is_dir() else []
    return (d / "metrics.jsonl").read_text() if (d / "metrics.jsonl").exists() else None, steps


# ---- 1: a run without its config.yaml ------------------------------------------------------
@pytest.mark.parametrize("extra", [[], ["--resume"], ["--resume", "train.peak_lr=0.01"],
                                   ["--resume", f"--tokens={8 * 16 * 40}"]],
                         ids=["fresh", "resume", "resume-new-lr", "resume-new-budget"])
def test_a_run_without_config_yaml_is_still_a_run(base, corpus, tmp_path, capsys, extra):
    d = _copy(base, tmp_path)
    (d / "config.yaml").unlink()
    before = _state(d)
    assert cli_main(_flags(corpus, base[1], d, *extra)) == 2
    err = capsys.readouterr().err
    assert "config.yaml is missing" in err and "checkpoints/" in err, err
    assert "metrics.jsonl" in err and "Traceback" not in err
    assert _state(d) == before  # 78 -> 15 lines and deleted checkpoints, before the fix
    assert not (d / "config.yaml").exists()


def test_what_marks_a_run(tmp_path):
    (tmp_path / "identity.json").write_text("{}")  # a sweep's run before its first launch
    assert rundir.recognise(tmp_path) == ["identity.json"]
    assert launch.check_launch(tmp_path, resume=False)
    with pytest.raises(LoadError, match=r"config.yaml is missing \(the directory holds a run: "
                                        r"identity.json\)"):
        cgpt.load(tmp_path)
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(rundir.RunDirError, match=r"holds a run \(summary.json\)"):
        launch.check_launch(tmp_path, resume=False)
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "metrics.jsonl").write_text("")
    assert rundir.recognise(empty) == [] and launch.check_launch(empty, resume=False)


# ---- 2: the log is read strictly ----------------------------------------------------------
@pytest.mark.parametrize("line,match", [
    ("}{garbage", r"line 4: not a JSON object"),
    ("[1, 2]", r"line 4: expected a JSON object, got list"),
    ('{"loss": 1.0}', r"line 4: 'step' must be an integer"),
    ('{"step": 4, "loss": NaN}', r"line 4: not a JSON object \(NaN is not JSON"),
])
def test_a_damaged_log_line_is_named_not_dropped(base, corpus, tmp_path, capsys, line, match):
    d = _copy(base, tmp_path)
    lines = (d / "metrics.jsonl").read_text().splitlines()
    lines[3] = line
    (d / "metrics.jsonl").write_text("".join(x + "\n" for x in lines))
    before = _state(d)
    assert cli_main(_flags(corpus, base[1], d, "--resume")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{d / 'metrics.jsonl'}, " in err, err
    import re
    assert re.search(match, err), err
    assert _state(d) == before  # every line after it was dropped before the fix


def test_a_torn_last_line_is_the_only_one_dropped(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    assert [r["step"] for r in rundir.read_metrics(p)] == [1, 2]
    p.write_text('{"step": 1}\n{"step": 1}\n')
    with pytest.raises(rundir.RunDirError, match="line 2: 'step' must be an integer above"):
        rundir.read_metrics(p)


def test_a_deleted_log_never_gives_a_wrong_train_loss(base, corpus, tmp_path):
    """Killed after checkpoint 15 of 20 with the log deleted: steps 1-15 are lost. A short
    run's train_loss is the loss of step 20 alone (window 1), so a resume is refused only when
    the window reaches back before the checkpoint; with an empty file (explicitly) it goes on."""
    d = _copy(base, tmp_path)
    (d / "metrics.jsonl").unlink()
    with pytest.raises(rundir.RunDirError, match=r"metrics.jsonl is missing, but the run "
                                                 r"resumes from checkpoint 15.*touch"):
        train(_run(corpus, base[1]), d, resume=True, progress=False)
    assert not (d / "metrics.jsonl").exists() and _state(d)[1] == ["10", "15"]
    (d / "metrics.jsonl").touch()  # the researcher accepts the lost curve
    got = train(_run(corpus, base[1]), d, resume=True, progress=False)
    assert got["train_loss"] == base[2]["train_loss"]  # the window (step 20) was retrained
    # A longer window (100 steps: the mean of steps 96-100) that reaches before the checkpoint:
    log = tmp_path / "m.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 91)))
    with pytest.raises(rundir.RunDirError, match=r"lacks step\(s\) 96, 97"):
        launch.resume_log(log, 97, 100)
    launch.resume_log(log, 90, 100)  # the window is still ahead: fine
    with pytest.raises(rundir.RunDirError, match=r"no logged loss for step\(s\) 96"):
        rundir.window_mean(log, 100, "loss", "train_loss")


def test_a_garbage_summary_or_changes_file_is_named(base, corpus, tmp_path, capsys):
    d = _copy(base, tmp_path, killed=False)
    (d / "summary.json").write_text("{not json")
    assert cli_main(_flags(corpus, base[1], d, "--resume")) == 2
    err = capsys.readouterr().err
    assert "summary.json: not valid JSON" in err and "delete it" in err, err
    d = _copy(base, tmp_path / "killed")
    (d / "config_changes.json").write_text('{"a": 1}')
    before = _state(d)
    assert cli_main(_flags(corpus, base[1], d, "--resume")) == 2
    assert "config_changes.json: expected a JSON list" in capsys.readouterr().err
    assert _state(d) == before  # refused before the log was cut back to the checkpoint


# ---- 6, 7: checkpoints that are damaged or non-finite ----------------------------------------
def test_nan_weights_in_a_run_checkpoint_are_refused(base, tmp_path):
    import orbax.checkpoint as ocp
    d = _copy(base, tmp_path, killed=False)
    item = (d / "checkpoints" / "20" / "params").absolute()
    ck = ocp.StandardCheckpointer()
    params = ck.restore(item)
    params["wpe"] = np.asarray(params["wpe"]).copy()
    params["wpe"][0, 0] = np.nan
    shutil.rmtree(item)
    ck.save(item, params)
    ck.wait_until_finished()
    with pytest.raises(LoadError, match=r"checkpoints/20: tensor 'wpe' holds NaN or inf"):
        cgpt.load(d)


def test_loading_a_run_without_config_yaml_names_it(base, tmp_path):
    d = _copy(base, tmp_path, killed=False)
    (d / "config.yaml").unlink()  # before the fix: "no config.json", as if it were an HF dir
    with pytest.raises(LoadError, match=r"config.yaml is missing \(the directory holds a run"):
        cgpt.load(d)


def test_a_checkpoint_replaced_while_it_is_read_is_retried(base, tmp_path, monkeypatch):
    """A run that saves while it is loaded deletes old checkpoints: listing them may fail."""
    from cgpt.model import orbax_format
    d = _copy(base, tmp_path, killed=False)
    real, calls = orbax_format.manager, []

    def racing(run_dir, keep=None, create=True):
        calls.append(1)
        if len(calls) == 1:
            raise FileNotFoundError(2, "No such file or directory", str(run_dir / "ckpt" / "15"))
        return real(run_dir, keep, create)

    monkeypatch.setattr(orbax_format, "manager", racing)
    assert cgpt.load(d).config.name == "tiny-17k" and len(calls) == 2


# ---- 9: paths of the wrong kind, configs, absurd sizes, branches ----------------------------
@pytest.mark.parametrize("name,kind", [("checkpoints", "file"), ("events", "file"),
                                       (".lock", "dir"), ("metrics.jsonl", "dir"),
                                       ("config.yaml", "dir")])
def test_a_path_of_the_wrong_kind_is_one_error(base, corpus, tmp_path, capsys, name, kind):
    d = _copy(base, tmp_path)
    p = d / name
    shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    p.mkdir() if kind == "dir" else p.write_text("x")
    assert cli_main(_flags(corpus, base[1], d, "--resume")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{p} is a " in err and "move it away" in err, err


@pytest.mark.parametrize("content", ["dir", b"\x89PNG\r\n\x1a\n\x00\xff\xfe"])
def test_config_flag_of_the_wrong_kind(tmp_path, capsys, content):
    f = tmp_path / "cfg.yaml"
    f.mkdir() if content == "dir" else f.write_bytes(content)
    assert cli_main(["train", "--config", str(f), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cgpt train: error: ") and str(f) in err, err


@pytest.mark.parametrize("override", ["model.d_model=10000000000000000000000",
                                      "model.n_layer=100000000000000000000"])
def test_absurd_sizes_are_one_error(tmp_path, capsys, override):
    out = tmp_path / "o"
    assert cli_main(["train", "--model", "tiny-17k", "--out", str(out), override]) == 2
    err = capsys.readouterr().err
    # refused as the value is parsed, naming the override as typed (cgpt.config.values)
    assert override in err and "the largest count cgpt takes" in err, err
    assert "Traceback" not in err and not out.exists(), err
    assert not out.exists()


@pytest.mark.parametrize("override, named", [
    ("train.clip_norm=-1", "train.clip_norm"), ("train.weight_decay=-0.1", "train.weight_decay"),
    ("train.adam_eps=0", "train.adam_eps"), ("train.end_lr_fraction=2", "train.end_lr_fraction"),
    ("train.peak_lr=[1,2]", "train.peak_lr")])
def test_optimizer_values_out_of_range_are_one_error(tmp_path, capsys, override, named):
    """Campaign 2: a negative clip norm trained (and diverged) silently; a list for a number
    failed inside a comparison without naming the key."""
    out = tmp_path / "o"
    assert cli_main(["train", "--model", "tiny-17k", "--out", str(out), override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cgpt train: error: ") and named in err[0], err
    assert not out.exists()


def test_plan_seq_len_zero_is_refused(capsys):
    assert cli_main(["plan", "--model", "tiny-17k", "--mode", "data_parallel",
                     "--seq-len", "0"]) == 2
    assert "--seq-len 0" in capsys.readouterr().err


@pytest.mark.slow(reason=(
    "a failed start leaves nothing: test_usr1_during_startup_is_one_line_and_leaves_nothing"))
def test_a_failed_branch_leaves_nothing_that_blocks_the_next_launch(base, corpus, tmp_path,
                                                                    capsys):
    out = tmp_path / "branch"
    # the base run is not WSD: the branch is refused before anything is written
    assert cli_main(_flags(corpus, base[1], out, "--branch-from", f"{base[0]}@15")) == 2
    assert "train.schedule=wsd" in capsys.readouterr().err
    assert not out.exists()
    assert cli_main(_flags(corpus, base[1], out, "--tokens", str(8 * 16 * 5))) == 0


# ---- 9: a scheduler's signal before the training loop ---------------------------------------
def test_a_signal_before_the_loop_stops_with_one_line():
    old = GUARD.defer("train")
    try:
        with pytest.raises(NotStarted, match="stopped by SIGUSR1 before the first "
                                                     "training step") as e:
            os.kill(os.getpid(), signal.SIGUSR1)  # before the fix: the process just died
            for _ in range(1000):  # the handler runs between bytecodes
                pass
        assert e.value.exit_code == 128 + signal.SIGUSR1
        t = preempt.CheckpointTriggers().install()  # in the loop: checkpoint, then stop
        os.kill(os.getpid(), signal.SIGUSR1)
        assert t.poll() == (True, signal.SIGUSR1)
        t.uninstall()
        os.kill(os.getpid(), signal.SIGUSR1)  # after the loop (the summary): ignored
    finally:
        GUARD.restore(old)
    assert signal.getsignal(signal.SIGUSR1) == old[signal.SIGUSR1]


def test_usr1_during_startup_is_one_line_and_leaves_nothing(base, corpus, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "cgpt", *_flags(corpus, base[1], out)],
                            cwd=REPO, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "XLA_FLAGS": ""})
    err = ""
    for line in proc.stderr:  # the placement line: JAX is up, the loop has not started
        err += line
        if line.startswith("tiny-17k:"):
            proc.send_signal(signal.SIGUSR1)
            break
    err += proc.stderr.read()
    assert proc.wait(timeout=300) == 128 + signal.SIGUSR1, err  # before the fix: -10, silent
    assert err.rstrip().splitlines()[-1].startswith("cgpt train: stopped by SIGUSR1 before the "
                                                    "first training step"), err
    assert "Traceback" not in err
    assert cli_main(_flags(corpus, base[1], out, "--resume")) == 0
    assert [r["step"] for r in rundir.read_metrics(out / "metrics.jsonl")] == \
        list(range(1, STEPS + 1))


@pytest.mark.parametrize("argv, named", [
    (["generate", "/nonexistent", "x", "--top-p", "0"], "--top-p 0.0"),
    (["generate", "/nonexistent", "x", "--top-k=-1"], "--top-k -1"),
    (["generate", "/nonexistent", "x", "--max-new-tokens=-1"], "--max-new-tokens -1"),
    (["eval", "/nonexistent", "--tasks", "hellaswag", "--limit=-1"], "--limit -1.0"),
    (["eval", "/nonexistent", "--tasks", "hellaswag", "--num-fewshot=-2"], "--num-fewshot -2")])
def test_sampling_and_task_flags_are_named_before_anything_loads(capsys, argv, named):
    """Campaign 2: the library's names (top_p) after the model loaded, or a Hub error for
    `--limit -1`; now the flag as typed, before the model or the tasks load."""
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"cgpt {argv[0]}: error: {named}"), err


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

