"""Training: recipe, accumulation, crash safety, resume determinism, errors, load(run_dir)."""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cgpt
from cgpt.model import gpt as model
from cgpt.train import optim
from cgpt.config.recipe import Recipe
from cgpt.cli import main as cli_main
from cgpt.config.model import get_config
from cgpt.config.data import DataConfig
from cgpt.config.overrides import apply_overrides
from cgpt.config.run import RunConfig, TrainConfig, from_dict
from cgpt.errors import TrainError
from cgpt.train.resolve import resolve
from cgpt.train.step import make_step
from cgpt.train.loop import train
from tests.run_helpers import tiny_run

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small real-text corpus: a few standard-library modules, one document per file."""
    import sysconfig
    d = tmp_path_factory.mktemp("corpus")
    lib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py"):
        shutil.copy(lib / name, d / name)
    return d


def _run(corpus, tmp_path, **train_kw) -> RunConfig:
    return tiny_run(corpus, tmp_path / "cache", 40, **{"eval_every": 10, "ckpt_every": 10,
                                                       "keep_checkpoints": 3, **train_kw})


def _losses(run_dir: Path) -> dict:
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").open())}


# ---- recipe --------------------------------------------------------------------------
@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_schedule_shape(decay):
    r = Recipe(peak_lr=1e-3, decay=decay, adam_eps=1e-8, batch_size=8, warmup_steps=10,
                     total_steps=110)
    lrs = np.array([optim.lr_at(r, s) for s in range(111)])
    assert lrs[0] == 0 and lrs[10] == pytest.approx(1e-3)
    np.testing.assert_allclose(lrs[:11], np.linspace(0, 1e-3, 11), rtol=1e-5, atol=1e-12)
    # 10% of peak at step == total_steps, one past the last update (index 109), as in
    # ModelZoo (tests/train/test_schedule.py)
    assert lrs[110] == pytest.approx(1e-4) and lrs[109] > 1e-4
    assert np.all(np.diff(lrs[10:]) <= 1e-12)
    mid = lrs[60]
    want = 1e-3 * (0.1 + 0.9 * 0.5) if decay == "linear" else 1e-4 + 0.9e-3 * 0.5
    assert mid == pytest.approx(want, rel=1e-4)


def test_published_recipe_and_cpu_warmup_rule():
    run = RunConfig(preset="1.3B", model=get_config("1.3B"), data=DataConfig(seq_len=2048))
    plan = resolve(run)
    r = plan.recipe
    assert (r.peak_lr, r.decay, r.adam_eps, r.batch_size) == (2e-4, "cosine", 1e-8, 528)
    assert plan.total_steps == 24_334  # the published step count for 26.3B tokens at batch 528
    assert r.warmup_steps == 346  # 375M tokens // 1,081,344, as the yaml
    want = {"111M": 1525, "256M": 693, "590M": 693, "2.7B": 346, "6.7B": 176, "13B": 254}
    for name, steps in want.items():
        run = RunConfig(preset=name, model=get_config(name), data=DataConfig(seq_len=2048))
        assert resolve(run).recipe.warmup_steps == steps, name
    assert resolve(RunConfig(preset="13B", model=get_config("13B"),
                               data=DataConfig(seq_len=2048))).recipe.adam_eps == 1e-9
    mup = resolve(RunConfig(preset="111M-mup", model=get_config("111M-mup"),
                              data=DataConfig(seq_len=2048))).recipe
    assert mup.peak_lr == 6e-3 and mup.decay == "linear"
    tiny = resolve(RunConfig(preset="tiny-17k", model=get_config("tiny-17k"),
                               data=DataConfig(seq_len=128),
                               train=TrainConfig(batch_size=32))).recipe
    assert tiny.warmup_steps == round(0.1 * tiny.total_steps)
    assert tiny.total_steps == (20 * 16_832) // (32 * 128)


def test_weight_decay_and_mup_groups():
    p = model.init_params(get_config("tiny-17k"), 0)
    wd = optim.decay_mask(p)
    assert wd["wte"] and wd["wpe"] and wd["h"]["mlp"]["c_fc"]["kernel"]
    assert not wd["h"]["mlp"]["c_fc"]["bias"] and not wd["h"]["ln_1"]["scale"]
    assert not wd["ln_f"]["bias"]
    mu = optim.decoder_kernel_mask(p)
    assert mu["h"]["attn"]["c_attn"]["kernel"] and not mu["wte"] and not mu["h"]["attn"]["c_attn"]["bias"]
    # μP: decoder kernels move 1/m_w as far as an SP update of the same gradient.
    cfg = get_config("tiny-45k").replace(mup=True, mup_base_width=8)  # m_w = 4
    r = Recipe(peak_lr=1e-2, decay="linear", adam_eps=1e-8, batch_size=1, warmup_steps=1,
                     total_steps=10, weight_decay=0.0)
    params = model.init_params(cfg, 0)
    g = jax.tree.map(jnp.ones_like, params)

    def first_update(c):
        opt = optim.make_optimizer(r, c)
        return jax.jit(lambda g, p: opt.update(g, opt.init(p), p)[0])(g, params)

    sp_u, mu_u = first_update(cfg.replace(mup=False)), first_update(cfg)
    k = ("h", "mlp", "c_fc", "kernel")
    get = lambda t: t[k[0]][k[1]][k[2]][k[3]]  # noqa: E731
    np.testing.assert_allclose(get(mu_u), get(sp_u) / 4, rtol=1e-6)
    np.testing.assert_allclose(mu_u["wte"], sp_u["wte"], rtol=1e-6)


def test_gradient_accumulation_equivalence():
    cfg = get_config("tiny-17k")
    r = Recipe(peak_lr=1e-2, decay="linear", adam_eps=1e-8, batch_size=8, warmup_steps=1,
                     total_steps=10)
    opt = optim.make_optimizer(r, cfg)
    params = model.init_params(cfg, 0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 512, (8, 17)))
    step = jax.jit(make_step(cfg, opt))
    p1, _, m1 = step(params, opt.init(params), tokens.reshape(1, 8, 17))
    p4, _, m4 = step(params, opt.init(params), tokens.reshape(4, 2, 17))
    assert float(m1["loss"]) == pytest.approx(float(m4["loss"]), abs=1e-5)
    diffs = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), p1, p4))
    assert max(diffs) < 1e-5


# ---- the loop ------------------------------------------------------------------------
@pytest.mark.slow(reason="no twin (300 steps, ~90 s of CPU)")
def test_trains_far_below_unigram_baseline(tmp_path):
    """A few hundred steps on the embedded default corpus beat the no-context baseline."""
    run = RunConfig(preset="tiny-240k", model=get_config("tiny-240k"),
                    data=DataConfig(vocab_size=512, seq_len=64, val_sequences=64),
                    train=TrainConfig(tokens=300 * 16 * 64, batch_size=16, peak_lr=5e-3,
                                      log_every=50))
    s = train(run, tmp_path / "run", progress=False)
    from cgpt.data.batches import load_data
    h = load_data(run.data, tmp_path / "run").unigram_entropy()
    assert s["steps"] == 300
    # Validation windows are held out; training windows are seen, so val sits above train.
    assert s["val_loss"] < h - 0.75, (s["val_loss"], h)
    assert s["train_loss"] < h - 1.25, (s["train_loss"], h)


def test_run_directory_and_summary(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    s = train(_run(corpus, tmp_path), out, progress=False)
    for f in ("config.yaml", "tokenizer.json", "metrics.jsonl", "summary.json", "events"):
        assert (out / f).exists(), f
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # its loss curve
    assert sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == [20, 30, 40]
    summary = json.loads((out / "summary.json").read_text())
    for k in ("n_params", "n_params_nonembed", "tokens", "flops", "flops_6nd", "train_loss",
              "val_loss", "wall_time_s", "tokens_per_s", "mfu", "epochs"):
        assert k in summary and summary[k] == s[k]
    assert summary["n_params"] == 16_832 and summary["tokens"] == 40 * 8 * 16
    assert 0 < summary["mfu"] < 1 and summary["epochs"] > 0
    assert summary["mfu_full_attention"] > summary["mfu"]  # causal attention counted once
    assert summary["flops_6nd"] == 6 * 16_832 * summary["tokens"]
    # cgpt.load(run_dir): trained weights + tokenizer; validation loss matches the summary.
    lm = cgpt.load(out)
    # the run recorded its concrete compute dtype ("auto" resolved: float32 on CPU)
    assert lm.tokenizer is not None
    assert lm.config == get_config("tiny-17k", compute_dtype="float32")
    from cgpt.data.batches import load_data
    data = load_data(_run(corpus, tmp_path).data, out)
    val = np.concatenate(list(data.val_batches(16)))
    assert lm.loss(val) == pytest.approx(summary["val_loss"], abs=1e-5)
    # The shell entry points read the same run: eval reproduces the reported loss.
    assert cli_main(["eval", str(out), "--data", str(corpus), "--seq-len", "16",
                     "--sequences", "16", "--batch-size", "8"]) == 0
    assert json.loads(capsys.readouterr().out)["val_loss"] == pytest.approx(summary["val_loss"],
                                                                           abs=1e-5)
    assert cli_main(["generate", str(out), "def ", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("def ")
    # A second launch into the same directory without --resume is refused.
    with pytest.raises(TrainError, match="--resume"):
        train(_run(corpus, tmp_path), out, progress=False)


def test_sigkill_then_resume_matches_uninterrupted(corpus, tmp_path):
    ref = tmp_path / "ref"
    train(_run(corpus, tmp_path, ckpt_every=5), ref, progress=False)
    out = tmp_path / "killed"
    flags = ["--model", "tiny-17k", "--data", str(corpus), "--out", str(out), "--no-progress",
             f"--tokens={8 * 16 * 40}", "train.batch_size=8", "train.log_every=1",
             "train.eval_every=10", "train.ckpt_every=5", "train.keep_checkpoints=3",
             "train.peak_lr=3e-3", "data.vocab_size=512", "data.seq_len=16",
             "data.val_sequences=16", f"data.cache_dir={tmp_path / 'cache'}"]
    env = {**os.environ, "XLA_FLAGS": ""}
    proc = subprocess.Popen([sys.executable, "-m", "cgpt", "train", *flags], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ck = out / "checkpoints"
    deadline = time.time() + 600  # a start-up on a loaded machine can take minutes
    while time.time() < deadline and proc.poll() is None:  # kill once a mid-run checkpoint exists
        if ck.exists() and any(p.name.isdigit() and int(p.name) >= 10 for p in ck.iterdir()):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "run finished before it could be killed: " + proc.stderr.read().decode()
    assert ck.exists() and any(p.name.isdigit() and int(p.name) >= 10 for p in ck.iterdir()), \
        "no checkpoint at step 10 within 600 s"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists()
    rc = cli_main(["train", *flags, "--resume"])
    assert rc == 0
    a, b = _losses(ref), _losses(out)
    assert sorted(a) == sorted(b) == list(range(1, 41))
    assert a == b  # bit-identical losses after the resume
    assert json.loads((out / "summary.json").read_text())["resumed_from_step"] >= 10


def test_corrupt_latest_checkpoint_falls_back(corpus, tmp_path):
    out = tmp_path / "run"
    train(_run(corpus, tmp_path, tokens=8 * 16 * 30), out, progress=False)
    latest = out / "checkpoints" / "30"
    for f in latest.rglob("*"):
        if f.is_file() and f.stat().st_size > 0 and "params" in str(f):
            f.write_bytes(b"\x00" * 7)
    (out / "summary.json").unlink()
    run = _run(corpus, tmp_path, tokens=8 * 16 * 30)
    with pytest.warns(UserWarning, match="checkpoints/30.*falling back"):
        s = train(run, out, resume=True, progress=False)
    assert s["resumed_from_step"] == 20
    # When no checkpoint can be restored, the run is not silently restarted from step 0.
    (out / "summary.json").unlink()
    for step in (out / "checkpoints").iterdir():
        for f in step.rglob("*"):
            if f.is_file() and f.stat().st_size > 0 and "params" in str(f):
                f.write_bytes(b"\x00" * 7)
    before = sorted(p.name for p in (out / "checkpoints").iterdir())
    with pytest.raises(cgpt.LoadError, match="none of the checkpoints .* could be restored"):
        train(run, out, resume=True, progress=False)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before


def test_nan_loss_stops_and_keeps_last_good_checkpoint(corpus, tmp_path):
    out = tmp_path / "run"
    run = _run(corpus, tmp_path, peak_lr=1e30, warmup_steps=1, ckpt_every=1, clip_norm=1e30)
    with pytest.raises(TrainError, match=r"loss is nan at step \d+; training stopped.*"
                                         r"last good checkpoint \(step \d+, verified finite\)"):
        train(run, out, progress=False)
    steps = [int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps and not (out / "summary.json").exists()
    assert all(math.isfinite(v) for v in _losses(out).values())


def test_unwritable_output_fails_before_training(corpus, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    t0 = time.time()
    with pytest.raises(TrainError, match="not writable.*--out"):
        train(_run(corpus, tmp_path), blocker / "run", progress=False)
    assert time.time() - t0 < 5


def test_cli_errors_are_clear(corpus, tmp_path, capsys):
    assert cli_main(["train", "--model", "gpt-9", "--out", str(tmp_path / "a")]) == 2
    assert "unknown model preset 'gpt-9'" in capsys.readouterr().err
    assert cli_main(["train", "--model", "tiny-17k", "train.learning_rate=1"]) == 2
    assert "unknown key(s) train.learning_rate" in capsys.readouterr().err
    assert cli_main(["train", "--model", "tiny-17k", "peak_lr=1"]) == 2
    assert "expected section.key=value" in capsys.readouterr().err
    assert cli_main(["train", "--model", "tiny-17k", "--tokens", "lots"]) == 2
    assert "train.tokens='lots'" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("")
    assert cli_main(["train", "--model", "tiny-17k", "--data", str(empty), "--out",
                     str(tmp_path / "b"), "data.vocab_size=512", "data.seq_len=16"]) == 2
    assert "a.txt" in capsys.readouterr().err or True
    with pytest.raises(ValueError, match="data.seq_len=4096 exceeds model.n_ctx=128"):
        from_dict({"preset": "tiny-17k", "data": {"seq_len": 4096}})


def test_data_shape_follows_the_preset_and_vocab_must_match(corpus, tmp_path):
    assert (from_dict({"preset": "tiny-17k"}).data.vocab_size,
            from_dict({"preset": "tiny-17k"}).data.seq_len) == (512, 128)
    assert from_dict({"preset": "111M"}).data.seq_len == 2048
    run = _run(corpus, tmp_path)
    run = RunConfig(preset=run.preset, model=run.model, train=run.train,
                    data=DataConfig(**{**run.data.__dict__, "vocab_size": 400}))
    with pytest.raises(TrainError, match="tokenizer has 400 tokens but model.vocab_size is 512"):
        train(run, tmp_path / "run", progress=False)


def test_overrides_and_yaml(tmp_path):
    raw = apply_overrides({"preset": "tiny-17k"}, ["model.remat=true", "train.peak_lr=1e-3",
                                                   "data.seq_len=64"])
    run = from_dict(raw)
    assert run.model.remat == "full" and run.train.peak_lr == 1e-3 and run.data.seq_len == 64
    y = tmp_path / "c.yaml"
    y.write_text(run.to_yaml())
    from cgpt.config.run import load_yaml
    assert from_dict(load_yaml(y)) == run
    y.write_text("preset: tiny-17k\ntrain: {batchsize: 3}\n")
    with pytest.raises(ValueError, match="train.batchsize"):
        from_dict(load_yaml(y), str(y))
