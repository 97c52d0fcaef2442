"""Per-platform kernels and dtypes (cgpt.config.backend): the chooser, the attention kernels and the
padded vocabulary against the CPU path, and how an "auto" dtype is recorded and resumed."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from cgpt.config import backend
from cgpt.model import gpt as model
from cgpt.config.model import ModelConfig
from cgpt.config.run import from_dict

TINY = ModelConfig(name="tiny", n_layer=1, d_model=16, n_head=2, vocab_size=97, n_ctx=256)


def test_platform_defaults():
    cpu = backend.defaults("cpu")
    assert (cpu.compute_dtype, cpu.attention, cpu.vocab_multiple, cpu.custom_dense_backward) == \
        ("float32", "chunked", 1, True)
    for name in ("gpu", "cuda", "GPU"):
        gpu = backend.defaults(name)
        assert (gpu.platform, gpu.compute_dtype, gpu.attention, gpu.vocab_multiple,
                gpu.custom_dense_backward) == ("gpu", "bfloat16", "cudnn", 128, False)
    assert (backend.defaults("tpu").attention, backend.defaults("rocm").attention) == ("xla", "xla")
    with pytest.raises(ValueError, match="unknown platform 'metal'"):
        backend.defaults("metal")
    assert backend.current_platform() == "cpu"  # the test machine


def test_explicit_settings_win_over_platform_defaults():
    auto = ModelConfig()
    assert backend.kernels(auto, "gpu").compute_dtype == "bfloat16"
    f32 = ModelConfig(compute_dtype="float32")
    k = backend.kernels(f32, "gpu")
    assert (k.compute_dtype, k.attention) == ("float32", "xla")  # cuDNN flash is bf16-only
    assert backend.kernels(ModelConfig(attention="xla", vocab_multiple=64), "cpu").attention == "xla"
    assert backend.padded_vocab(ModelConfig(vocab_size=50257), "gpu") == 50304
    assert backend.padded_vocab(ModelConfig(vocab_size=50257), "cpu") == 50257
    with pytest.raises(ValueError, match="model.attention=cudnn needs model.compute_dtype=bfloat16"):
        backend.kernels(ModelConfig(attention="cudnn", compute_dtype="float32"), "gpu")
    with pytest.raises(ValueError, match="vocab_multiple"):
        ModelConfig(vocab_multiple=0)
    with pytest.raises(ValueError, match="attention"):
        ModelConfig(attention="flash")


def test_resolve_records_a_concrete_dtype_and_keeps_a_saved_one():
    auto = ModelConfig()
    assert backend.resolve(auto, "cpu").compute_dtype == "float32"
    assert backend.resolve(auto, "gpu").compute_dtype == "bfloat16"
    old_run = ModelConfig(compute_dtype="float32")
    assert backend.resolve(auto, "gpu", saved=old_run).compute_dtype == "float32"
    assert backend.resolve(ModelConfig(compute_dtype="bfloat16"), "cpu").compute_dtype == "bfloat16"
    # plan: GPU choices, lowered on CPU (cuDNN cannot lower there)
    planned = backend.for_platform(auto, "gpu", compile_on="cpu")
    assert (planned.compute_dtype, planned.attention, planned.vocab_multiple) == \
        ("bfloat16", "xla", 128)
    assert backend.for_platform(auto, "gpu").attention == "cudnn"
    assert backend.for_platform(ModelConfig(compute_dtype="float32"), "tpu").compute_dtype == "float32"


def _loss_and_grads(cfg, params, tokens):
    return jax.jit(jax.value_and_grad(model.loss_fn), static_argnums=2)(params, tokens, cfg)


def _assert_close(a, b, tol):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y),
                                                         atol=tol, rtol=tol), a, b)


def test_padded_vocabulary_gives_the_same_logits_loss_and_gradients():
    cfg = TINY.replace(compute_dtype="float32", attention="chunked", vocab_multiple=1)
    padded = cfg.replace(vocab_multiple=128)
    assert backend.padded_vocab(padded) == 128
    params = model.init_params(cfg, seed=11)
    tokens = jnp.asarray(np.random.default_rng(11).integers(0, cfg.vocab_size, (3, 17)))
    logits = model.forward(params, tokens, padded)[0]
    assert logits.shape == (3, 17, cfg.vocab_size)  # padded columns never returned
    _assert_close(logits, model.forward(params, tokens, cfg)[0], 1e-6)
    (l0, g0), (l1, g1) = _loss_and_grads(cfg, params, tokens), _loss_and_grads(padded, params, tokens)
    assert g1["wte"].shape == params["wte"].shape
    assert abs(float(l0) - float(l1)) <= 1e-6
    _assert_close(g0, g1, 1e-6)


def test_xla_attention_matches_chunked():
    T = 200  # 4 query chunks, the last ragged
    cfg = TINY.replace(compute_dtype="float32", attention="chunked")
    xla = cfg.replace(attention="xla")
    params = model.init_params(cfg, seed=12)
    tokens = jnp.asarray(np.random.default_rng(12).integers(0, cfg.vocab_size, (2, T + 1)))
    _assert_close(model.forward(params, tokens[:, :-1], xla)[0],
                  model.forward(params, tokens[:, :-1], cfg)[0], 1e-5)
    (l0, g0), (l1, g1) = _loss_and_grads(cfg, params, tokens), _loss_and_grads(xla, params, tokens)
    assert abs(float(l0) - float(l1)) <= 1e-6
    _assert_close(g0, g1, 1e-5)


def test_accelerator_kernels_in_bf16_on_cpu():
    # GPU/TPU settings that can lower on a CPU (XLA attention, padded vocabulary, bf16).
    acc = backend.for_platform(TINY, "tpu")
    params = model.init_params(TINY, seed=13)
    tokens = jnp.asarray(np.random.default_rng(13).integers(0, TINY.vocab_size, (2, 33)))
    lo = model.forward(params, tokens, acc)[0]
    assert lo.dtype == jnp.float32 and lo.shape == (2, 33, TINY.vocab_size)
    np.testing.assert_allclose(lo, model.forward(params, tokens, TINY)[0], atol=0.05)
    loss, grads = _loss_and_grads(acc, params, tokens)
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
    assert abs(float(loss) - float(_loss_and_grads(TINY, params, tokens)[0])) < 0.02


def _old_run_dir(tmp_path, **model_keys):
    """A run directory as written before "auto" existed: compute_dtype float32 and no
    attention / vocab_multiple keys."""
    raw = from_dict({"preset": "tiny-17k"}).to_dict()
    raw["model"].update(compute_dtype="float32", **model_keys)
    for k in ("attention", "vocab_multiple"):
        raw["model"].pop(k)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return tmp_path


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_resume_of_an_old_float32_run_keeps_float32(tmp_path, monkeypatch, platform):
    from cgpt.errors import TrainError
    from cgpt.train.resume import check_config

    monkeypatch.setattr(backend, "current_platform", lambda: platform)
    out = _old_run_dir(tmp_path / "old")
    asked = from_dict({"preset": "tiny-17k"})
    assert asked.model.compute_dtype == "auto"
    assert check_config(asked, out, resume=True).model.compute_dtype == "float32"
    fresh = check_config(asked, tmp_path / "new", resume=False)
    assert fresh.model.compute_dtype == ("bfloat16" if platform == "gpu" else "float32")
    assert "compute_dtype: auto" not in fresh.to_yaml()  # what config.yaml will say
    explicit = from_dict({"preset": "tiny-17k", "model": {"compute_dtype": "bfloat16"}})
    with pytest.raises(TrainError, match="model.compute_dtype"):
        check_config(explicit, out, resume=True)


def test_sweep_relaunch_accepts_an_auto_dtype_against_the_saved_one(tmp_path):
    from cgpt.sweep.state import config_change

    class Run:  # the two fields config_change reads from a cgpt.sweep.spec.Run
        def __init__(self, model=None):
            self.run_id = "r0"
            self.config = from_dict({"preset": "tiny-17k", "model": model or {}})

    _old_run_dir(tmp_path / "r0")
    assert config_change(Run(), tmp_path) == []
    assert config_change(Run({"compute_dtype": "bfloat16"}), tmp_path) == \
        ["model.compute_dtype: 'float32' -> 'bfloat16'"]


def test_gpu_xla_flags_reach_xla_flags_on_gpu_only_and_the_users_win():
    user = "--xla_gpu_enable_latency_hiding_scheduler=false --xla_dump_to=/tmp/hlo"
    env = {"XLA_FLAGS": user}
    added = backend.gpu_xla_flags(env, "gpu")
    flags = env["XLA_FLAGS"].split()
    assert flags[:2] == user.split()  # the user's own first, untouched
    assert flags.count("--xla_gpu_enable_latency_hiding_scheduler=false") == 1
    assert not any(f.startswith("--xla_gpu_enable_latency_hiding_scheduler=true") for f in flags)
    assert "--xla_gpu_enable_pipelined_all_gather=true" in flags
    assert "--xla_gpu_all_reduce_combine_threshold_bytes=1073741824" in flags
    assert added == flags[2:] and len(added) == len(backend.GPU_XLA_FLAGS) - 1
    assert backend.gpu_xla_flags(env, "gpu") == []  # idempotent: nothing twice
    assert env["XLA_FLAGS"].split() == flags
    for platform in ("cpu", "tpu", "rocm"):  # nothing changes off NVIDIA GPUs
        other = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
        assert backend.gpu_xla_flags(other, platform) == []
        assert other == {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    empty = {}
    assert backend.gpu_xla_flags(empty, "cuda") and "--xla_gpu_enable_while_loop_double_buffering" \
        "=true" in empty["XLA_FLAGS"]
    off = {"CGPT_GPU_XLA_FLAGS": "0"}
    assert backend.gpu_xla_flags(off, "gpu") == [] and "XLA_FLAGS" not in off
    assert backend.launch_platform({"JAX_PLATFORMS": "cpu"}, gpus=8) == "cpu"
    assert backend.launch_platform({"JAX_PLATFORMS": "cuda,cpu"}, gpus=0) == "gpu"
    assert backend.launch_platform({}, gpus=8) == "gpu"
    assert backend.launch_platform({}, gpus=0) == "cpu"


def test_gpu_xla_flags_are_known_to_the_installed_xla():
    """XLA aborts a process whose XLA_FLAGS name a flag it does not know (on every backend,
    so the CPU-only jaxlib checks the GPU flags' names)."""
    import os
    import subprocess
    import sys

    flags = backend.compose_xla_flags("", "gpu")
    assert len(flags.split()) == len(backend.GPU_XLA_FLAGS)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
    r = subprocess.run([sys.executable, "-c", "import jax; print(jax.jit(lambda x: x + 1)(1))"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "2", r.stderr[-1500:]
