"""Faults (#15): non-finite steps, resumed summaries, storage errors, failed launches, the
run-directory lock, and the small mislabels. Each test reproduces its fault first."""
import errno
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import cgpt
from cgpt import rundir
from cgpt.model import orbax_format
from cgpt.train import checkpoint
from cgpt.cli import main as cli_main
from cgpt.config.model import get_config
from cgpt.config.run import RunConfig, from_dict
from cgpt.errors import TrainError
from cgpt.train.loop import train
from tests.run_helpers import tiny_run

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _run(corpus, cache, **train_kw) -> RunConfig:
    return tiny_run(corpus, cache, 40, **{"eval_every": 10, "ckpt_every": 10,
                                          "keep_checkpoints": 3, **train_kw})


def _flags(corpus, cache, out, *extra):
    return ["train", "--model", "tiny-17k", "--data", str(corpus), "--out", str(out),
            "--no-progress", f"--tokens={8 * 16 * 40}", "train.batch_size=8",
            "train.log_every=1", "data.vocab_size=512", "data.seq_len=16",
            "data.val_sequences=16", f"data.cache_dir={cache}", *extra]


def _strict_rows(path: Path) -> list[dict]:
    def bad(c):
        raise ValueError(f"{path}: {c} is not JSON")
    return [json.loads(x, parse_constant=bad) for x in path.read_text().splitlines()]


def _ckpt_steps(out: Path) -> list[int]:
    return sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())


def _all_finite(tree) -> bool:
    return all(bool(np.isfinite(np.asarray(x)).all()) for x in jax.tree.leaves(tree))


# ---- 1, 3: a non-finite step saves nothing, and the advice works -------------------------
@pytest.mark.slow  # test_nonfinite_state_is_never_checkpointed and the fused non-finite test run by default
def test_nan_grad_norm_stops_before_saving_and_the_advice_works(corpus, cache, tmp_path, capsys):
    """The issue's recipe: at step 3 the loss is finite (~6e18) but grad_norm is NaN."""
    out = tmp_path / "run"
    flags = _flags(corpus, cache, out, "train.ckpt_every=1", "train.warmup_steps=1",
                   "train.keep_checkpoints=3")
    assert cli_main([*flags, "train.peak_lr=1e9"]) == 2
    err = capsys.readouterr().err
    assert "grad_norm is nan at step 3" in err, err
    assert "last good checkpoint (step 2, verified finite)" in err
    assert _ckpt_steps(out) == [1, 2]  # nothing saved from the bad step
    assert _all_finite(cgpt.load(out).params)
    rows = _strict_rows(out / "metrics.jsonl")  # strict JSON: no bare NaN
    assert [r["step"] for r in rows] == [1, 2]
    # The advice, as printed: resume from an earlier kept checkpoint with a lower peak LR.
    assert "--allow-train-changes" in err and "--from-step" in err
    # Without the flag a changed learning rate is refused, and the message names the flag.
    assert cli_main([*flags, "train.peak_lr=3e-3", "--resume"]) == 2
    assert "--allow-train-changes" in capsys.readouterr().err
    assert cli_main([*flags, "train.peak_lr=3e-3", "--resume", "--from-step", "1",
                     "--allow-train-changes"]) == 0
    capsys.readouterr()
    rows = _strict_rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 41))
    assert all(math.isfinite(r["loss"]) for r in rows) and rows[-1]["loss"] < rows[0]["loss"]
    assert rows[2]["lr"] < 1  # the new schedule from step 2 on
    s = json.loads((out / "summary.json").read_text())
    assert s["peak_lr"] == 3e-3 and s["config_changes"] == [
        {"step": 1, "train.peak_lr": [1e9, 3e-3]}]
    assert (out / "discarded_checkpoints" / "2").is_dir()
    assert "peak_lr: 0.003" in (out / "config.yaml").read_text()


def test_from_step_must_name_a_kept_checkpoint(corpus, cache, tmp_path):
    out = tmp_path / "run"
    train(_run(corpus, cache, tokens=8 * 16 * 20), out, progress=False)
    (out / "summary.json").unlink()
    with pytest.raises(TrainError, match=r"--from-step 7: no kept checkpoint at step 7.*"
                                         r"\[10, 20\]"):
        train(_run(corpus, cache, tokens=8 * 16 * 20), out, resume=True, progress=False,
              from_step=7)


def test_nonfinite_state_is_never_checkpointed(corpus, cache, tmp_path, monkeypatch):
    """Even with a finite loss and grad_norm, non-finite state is never written to disk."""
    import jax.numpy as jnp

    import cgpt.train.step as tr  # the fit compiles the step it makes
    real = tr.make_step

    def poisoned(cfg, optimizer, loss=tr.model.loss_fn, gns=False):
        step = real(cfg, optimizer, loss, gns)

        def f(params, opt_state, batch):  # Adam's moments go NaN; this step's loss is fine
            p, o, m = step(params, opt_state, batch)
            o = jax.tree.map(lambda x: x * jnp.nan if jnp.issubdtype(x.dtype, jnp.floating)
                             else x, o)
            return p, o, m
        return f

    monkeypatch.setattr(tr, "make_step", poisoned)
    out = tmp_path / "run"
    with pytest.raises(TrainError, match=r"non-finite parameters or optimizer state at step 1; "
                                         r"training stopped. No checkpoint was written yet"):
        train(_run(corpus, cache, ckpt_every=1), out, progress=False)
    assert _ckpt_steps(out) == []


# ---- 2: the summary is a function of checkpointed state and logged metrics ----------------
WALL_CLOCK = {"wall_time_s", "train_time_s", "tokens_per_s", "mfu", "mfu_full_attention",
              "resumed_from_step"}


@pytest.mark.slow  # a kill around the summary: test_faults_sweep's truncated summary covers it by default
def test_summary_after_a_late_kill_equals_uninterrupted(corpus, cache, tmp_path, monkeypatch):
    kw = dict(tokens=8 * 16 * 100, ckpt_every=97, eval_every=50, log_every=10)
    ref = train(_run(corpus, cache, **kw), tmp_path / "ref", progress=False)

    import cgpt.train.setup as tr
    real = tr.load_data

    class Killed(Exception):
        pass

    def dying(cfg, run_dir=None):
        data = real(cfg, run_dir)
        batch = data.train_batch

        def train_batch(step, bs, **kw):
            if step == 98:  # after checkpoint 97, before the end: like a SIGKILL
                raise Killed
            return batch(step, bs, **kw)
        data.train_batch = train_batch
        return data

    monkeypatch.setattr(tr, "load_data", dying)
    out = tmp_path / "killed"
    with pytest.raises(Killed):
        train(_run(corpus, cache, **kw), out, progress=False)
    monkeypatch.setattr(tr, "load_data", real)
    got = train(_run(corpus, cache, **kw), out, resume=True, progress=False)
    assert got["resumed_from_step"] == 97
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(got))
    same = {k: v for k, v in got.items() if k not in WALL_CLOCK}
    assert same == {k: v for k, v in ref.items() if k not in WALL_CLOCK}  # bit for bit
    assert set(ref) - set(same) == WALL_CLOCK


# ---- 4: storage errors --------------------------------------------------------------------
def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True)
    return r.returncode == 0


# The tmpfs variant is the real thing (a separate process fills a small disk: Orbax's threads,
# TensorStore's pending writes and asyncio all see ENOSPC); without root it injects the OSError.
@pytest.mark.parametrize("real", [
    pytest.param(True, id="tmpfs", marks=pytest.mark.slow(
        reason="the injected ENOSPC case runs by default")),
    pytest.param(False, id="injected")])
def test_disk_full_during_a_save_is_one_clear_error(corpus, cache, tmp_path, monkeypatch, capsys,
                                                    real):
    mnt = tmp_path / "small"
    out = mnt / "run"
    flags = [*_flags(corpus, cache, out, "train.ckpt_every=10", "train.keep_checkpoints=100"),
             f"--tokens={8 * 16 * 200}"]
    if real and _mount_tmpfs(mnt, "1200k"):  # the real thing: a separate process fills a small disk
        try:
            proc = subprocess.run([sys.executable, "-m", "cgpt", *flags], cwd=REPO,
                                  capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "XLA_FLAGS": ""})
            rc, err, steps = proc.returncode, proc.stderr, _ckpt_steps(out)
        finally:
            subprocess.run(["umount", "-l", str(mnt)])
    else:  # no tmpfs here: inject the OSError the kernel would raise at the third save
        import cgpt.train.checkpoint as ck
        real_save = ck.Checkpointer.save

        def save(self, step, params, opt_state):
            if step == 30:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_save(self, step, params, opt_state)

        monkeypatch.setattr(ck.Checkpointer, "save", save)
        rc = cli_main(flags)
        err, steps = capsys.readouterr().err, _ckpt_steps(out)
    assert rc == 2
    assert "Traceback" not in err and "ERROR" not in err, err
    errors = [x for x in err.splitlines() if x.startswith("cgpt train: error:")]
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    assert "No space left on device" in errors[0] and str(out) in errors[0]
    assert steps and steps == list(range(10, 10 * len(steps) + 1, 10))  # older ones intact
    kept = ", ".join(map(str, steps))
    assert (f"checkpoints {kept} are kept" if len(steps) > 1
            else f"checkpoint {kept} is kept") in errors[0]
    assert "--resume" in errors[0]


@pytest.mark.slow(reason="no twin")
def test_read_only_run_directory_mid_run(corpus, cache, tmp_path, monkeypatch):
    out = tmp_path / "run"
    import cgpt.train.summary as tr
    real = tr.atomic_write_text

    def ro(path, text):
        if Path(path).name == "summary.json":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, text)

    monkeypatch.setattr(tr, "atomic_write_text", ro)
    with pytest.raises(rundir.RunDirError, match=r"cannot write .*summary.json: Read-only file "
                                                  r"system.*checkpoints 20, 30, 40 are kept"):
        train(_run(corpus, cache), out, progress=False)


# ---- 5, 8: a failed launch leaves nothing behind that the next one reuses ------------------
@pytest.mark.slow  # test_faults_rundir's start-up signal test checks "leaves nothing" by default
def test_failed_launch_leaves_nothing_behind(corpus, cache, tmp_path, capsys):
    out = tmp_path / "new" / "run"
    bad = _flags(corpus, cache, out, "data.vocab_size=400")  # fails after making a tokenizer
    assert cli_main(bad) == 2
    assert "tokenizer has 400 tokens" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # no empty --out folders
    # A pre-existing --out keeps its own files, and gets none of the failed launch's.
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    assert cli_main(bad) == 2
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    # A leftover tokenizer.json (a launch killed before it wrote its config) is not reused.
    shutil.copy(next((cache / "tokenizers").glob("bpe400-*.json")), out / "tokenizer.json")
    assert cli_main(_flags(corpus, cache, out)) == 0, capsys.readouterr().err
    from cgpt.data.batches import load_tokenizer
    assert load_tokenizer(out / "tokenizer.json").get_vocab_size() == 512


# ---- 7: one trainer per run directory ------------------------------------------------------
_HOLD = r"""
import sys, time
from cgpt import rundir
lock = rundir.RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(600)
"""


@pytest.mark.slow(reason="no twin")
def test_run_directory_is_locked_while_training(corpus, cache, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == b"locked"
        for extra in ([], ["--resume"]):
            assert cli_main(_flags(corpus, cache, out, *extra)) == 2
            err = capsys.readouterr().err
            assert f"pid {holder.pid}" in err and "in use" in err, err
        assert not (out / "config.yaml").exists()
    finally:
        holder.kill()  # SIGKILL: the kernel drops the lock with the process
        holder.wait()
    assert (out / rundir.LOCK_FILE).exists()  # a stale lock file does not block
    assert cli_main(_flags(corpus, cache, out)) == 0
    capsys.readouterr()
    assert (out / "summary.json").exists()


def test_lock_inherited_from_a_launcher_is_adopted(tmp_path):
    """A launcher (the sweep) may take the lock and exec train with the descriptor open."""
    import fcntl
    fd = os.open(tmp_path / rundir.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        lock = rundir.RunLock(tmp_path).acquire()
        assert (tmp_path / rundir.LOCK_FILE).read_text().split("@")[0] == str(os.getpid())
        lock.release()
    finally:
        os.close(fd)


# ---- 8: smaller items ----------------------------------------------------------------------
@pytest.mark.slow  # test_train's corrupt-checkpoint fallback runs by default
def test_corrupt_checkpoint_warning_is_short(corpus, cache, tmp_path):
    out = tmp_path / "run"
    run = _run(corpus, cache, tokens=8 * 16 * 20)
    train(run, out, progress=False)
    for f in (out / "checkpoints" / "20" / "params").rglob("ocdbt.process_0/d/*"):
        f.write_bytes(b"\x00" * f.stat().st_size)  # TensorStore then dumps its whole spec
    (out / "summary.json").unlink()
    with pytest.warns(UserWarning) as rec:
        train(run, out, resume=True, progress=False)
    msgs = [str(w.message) for w in rec if "falling back" in str(w.message)]
    assert len(msgs) == 1 and len(msgs[0]) < 400 and "\n" not in msgs[0], msgs


def test_model_vocab_size_error_names_the_model_key():
    with pytest.raises(ValueError, match=r"model\.vocab_size=100") as e:
        from_dict({"preset": "tiny-17k", "model": {"vocab_size": 100}})
    assert "DataConfig" not in str(e.value)


def test_empty_prompt_is_a_clear_error(tmp_path, capsys):
    from cgpt.eval.lm import LM
    from cgpt.model.gpt import init_params
    cfg = get_config("tiny-17k")
    lm = LM(cfg, init_params(cfg, 0))
    for empty in ([], [[]], np.zeros((1, 0), np.int32)):
        with pytest.raises(ValueError, match="prompt: empty"):
            lm.generate(empty, 3)


def test_reshaped_preset_has_its_own_name():
    run = from_dict({"preset": "tiny-17k", "model": {"n_layer": 4}})
    assert run.model.name == "tiny-17k+n_layer=4"
    assert from_dict({"preset": "tiny-17k", "model": {"remat": True}}).model.name == "tiny-17k"
    assert from_dict({"preset": "tiny-17k", "model": {"name": "mine", "n_layer": 4}}
                     ).model.name == "mine"
    # The saved config reads back to the same run (resume compares them).
    assert from_dict(run.to_dict()) == run
    # and the recipe is still the preset's
    from cgpt.train.resolve import resolve
    big = from_dict({"preset": "111M", "model": {"n_layer": 2}, "data": {"seq_len": 2048}})
    assert resolve(big).recipe.peak_lr == 6e-4


def test_metrics_lines_are_strict_json():
    line = rundir.json_line({"step": 3, "loss": 1.5, "val_loss": float("inf"),
                             "grad_norm": float("nan")})
    rec = json.loads(line, parse_constant=lambda c: pytest.fail(c))
    assert rec == {"step": 3, "loss": 1.5, "val_loss": None, "grad_norm": None,
                   "nonfinite": ["val_loss", "grad_norm"]}


def test_load_run_falls_back_past_a_corrupt_checkpoint_and_moves_nothing(tmp_path):
    """cgpt.load(run_dir) shares the trainer's restore loop but only reads: the warning names
    the unreadable step, the previous one loads, and no checkpoint is moved."""
    from cgpt.model.gpt import init_params
    import yaml

    cfg = get_config("tiny-17k")
    (tmp_path / rundir.CONFIG_FILE).write_text(yaml.safe_dump({"model": cfg.to_dict()}))
    ck = checkpoint.Checkpointer(tmp_path, keep=3)
    for step in (1, 2):
        ck.save(step, init_params(cfg, step), {"count": np.int32(step)})
    ck.close()

    def corrupt(step):
        for f in (tmp_path / "checkpoints" / str(step) / "params").rglob("*"):
            if f.is_file() and f.stat().st_size > 0:
                f.write_bytes(b"\x00" * 7)

    corrupt(2)
    with pytest.warns(UserWarning, match=r"checkpoints/2: checkpoint is unreadable.*falling "
                                         r"back to step 1$"):
        got_cfg, params, tok, step = orbax_format.load_run(tmp_path)
    assert got_cfg.n_layer == cfg.n_layer and tok is None and step == 1
    jax.tree.map(np.testing.assert_array_equal, params, init_params(cfg, 1))
    corrupt(1)
    with pytest.raises(cgpt.LoadError, match=r"none of the checkpoints \[2, 1\] could be "
                                             r"restored.*or load another run"):
        orbax_format.load_run(tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1", "2"]
