"""cgpt.load against transformers.GPT2LMHeadModel: exact numerics, formats and every error."""
import json
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

import cgpt
from cgpt import LoadError

transformers.logging.set_verbosity_error()


def _hf_model(seed=0, **kw):
    torch.manual_seed(seed)
    base = dict(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=512,
                activation_function="gelu", layer_norm_epsilon=1e-5, resid_pdrop=0.0,
                attn_pdrop=0.0, embd_pdrop=0.0, initializer_range=0.2,
                bos_token_id=0, eos_token_id=0)
    base.update(kw)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**base)).eval()


def _ref_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.numpy()


def _ref_greedy(model, ids, n):
    with torch.no_grad():
        return model.generate(torch.tensor(ids), attention_mask=torch.ones_like(torch.tensor(ids)),
                              max_new_tokens=n, do_sample=False, pad_token_id=0).numpy()


def _save(model, d, fmt):
    """HF safetensors via save_pretrained; `.bin` written as the released 13B files are
    (transformers 5 no longer writes .bin): pytorch_model.bin, or shards plus an index."""
    if fmt.startswith("st"):
        model.save_pretrained(d, max_shard_size="100KB" if fmt == "st_sharded" else "50GB")
        return
    d.mkdir(parents=True)
    model.config.save_pretrained(d)
    sd = {k: v.clone() for k, v in model.state_dict().items()}  # includes the tied lm_head
    if fmt == "bin":
        torch.save(sd, d / "pytorch_model.bin")
        return
    keys = sorted(sd)
    parts = [keys[i::3] for i in range(3)]
    wmap = {}
    for i, part in enumerate(parts):
        name = f"pytorch_model-{i + 1:05d}-of-00003.bin"
        torch.save({k: sd[k] for k in part}, d / name)
        wmap.update({k: name for k in part})
    (d / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": wmap}))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """One small Cerebras-shaped model saved as safetensors, .bin, and sharded."""
    model = _hf_model()
    root = tmp_path_factory.mktemp("small")
    dirs = {}
    for fmt in ("st", "bin", "st_sharded", "bin_sharded"):
        d = root / fmt / "ckpt"  # same basename: same config name, so one compilation
        _save(model, d, fmt)
        dirs[fmt] = d
    ids = np.random.default_rng(0).integers(0, 512, (2, 40))
    return model, dirs, ids


@pytest.mark.parametrize("fmt", ["st", "bin", "st_sharded", "bin_sharded"])
def test_small_parity_every_format(small, fmt):
    model, dirs, ids = small
    files = os.listdir(dirs[fmt])
    if fmt.endswith("sharded"):
        assert any(f.endswith(".index.json") for f in files), files
    lm = cgpt.load(dirs[fmt])
    assert lm.config.num_params() == sum(p.numel() for p in model.parameters())
    out = lm.logits(ids)
    assert out.dtype == np.float32 and out.shape == (2, 40, 512)
    np.testing.assert_allclose(out, _ref_logits(model, ids), atol=1e-4, rtol=0)
    with torch.no_grad():
        ref_loss = model(torch.tensor(ids), labels=torch.tensor(ids)).loss.item()
    assert lm.loss(ids) == pytest.approx(ref_loss, abs=1e-5)


def test_small_greedy_generation_matches(small):
    model, dirs, ids = small
    lm = cgpt.load(dirs["st"])
    prompt = ids[:, :8]
    ours = lm.generate(prompt, max_new_tokens=32)
    ref = _ref_greedy(model, prompt, 32)
    assert ours.shape == (2, 40)
    assert len(set(ref[0, 8:].tolist())) > 3  # a non-degenerate continuation
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.slow(reason="no twin (one prompt: test_small_greedy_generation_matches)")
def test_ragged_generation_equals_each_prompt_alone(small):
    """Prompts of 11 lengths in one right-padded batch: every row continues exactly as the
    prompt alone does (cgpt and transformers), with one compilation per bucket length."""
    from cgpt.eval.lm import _generate

    model, dirs, _ = small
    lm = cgpt.load(dirs["st"])
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 512, n).tolist() for n in (1, 2, 5, 9, 15, 16, 17, 30, 33, 50, 64)]
    _generate.clear_cache()
    got = np.concatenate([lm.generate_ragged(prompts[i:i + 4], 12) for i in (0, 4, 8)])
    assert _generate._cache_size() == 3  # buckets 16, 32 and 64 (batches of 4, 4 and 3)
    lm.generate_ragged([p[:-1] or p for p in prompts[:4]], 12)  # other lengths, same bucket
    assert _generate._cache_size() == 3
    for p, row in zip(prompts, got):
        alone = lm.generate(np.array([p]), 12)[0, len(p):]
        np.testing.assert_array_equal(row, alone)
        np.testing.assert_array_equal(row, _ref_greedy(model, np.array([p]), 12)[0, len(p):])
    sampled = lm.generate_ragged(prompts[:4], 12, temperature=1.0, top_k=1)
    np.testing.assert_array_equal(sampled, got[:4])  # top_k=1 is greedy, ragged too
    for bad, msg in [(dict(prompts=[]), "no prompts"),
                     (dict(prompts=[[1, 2, 3]], pad_to=2), "pad_to=2"),
                     (dict(prompts=[[1], []]), "1..pad_to"),
                     (dict(prompts=[[1] * 120], max_new_tokens=20), "n_ctx=128")]:
        with pytest.raises(ValueError, match=msg):
            lm.generate_ragged(**{"max_new_tokens": 4, **bad})


def test_sampling_is_seeded_and_filtered(small):
    _, dirs, ids = small
    lm = cgpt.load(dirs["st"])
    a = lm.generate(ids[:1, :4], 16, temperature=1.0, top_k=5, seed=1)
    b = lm.generate(ids[:1, :4], 16, temperature=1.0, top_k=5, seed=1)
    c = lm.generate(ids[:1, :4], 16, temperature=1.0, top_k=5, seed=2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # top_k=1 and a tiny nucleus both reduce to greedy.
    greedy = lm.generate(ids[:1, :4], 16)
    np.testing.assert_array_equal(lm.generate(ids[:1, :4], 16, temperature=0.7, top_k=1), greedy)
    np.testing.assert_array_equal(lm.generate(ids[:1, :4], 16, temperature=0.7, top_p=1e-6), greedy)
    with pytest.raises(ValueError, match="n_ctx"):
        lm.generate(ids[:1, :4], 200)
    with pytest.raises(ValueError, match="token ids"):
        lm.logits([[0, 9999]])


def test_key_prefixes_buffers_and_tied_head(small, tmp_path):
    model, dirs, ids = small
    sd = load_file(dirs["st"] / "model.safetensors")
    cfg = json.loads((dirs["st"] / "config.json").read_text())
    stripped = {k.removeprefix("transformer."): v for k, v in sd.items() if k != "lm_head.weight"}
    stripped["h.0.attn.bias"] = np.tril(np.ones((1, 1, 128, 128), np.uint8))
    stripped["h.0.attn.masked_bias"] = np.array(-1e4, np.float32)
    stripped["lm_head.weight"] = stripped["wte.weight"]
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    save_file(stripped, str(d / "model.safetensors"))
    np.testing.assert_allclose(cgpt.load(d).logits(ids), _ref_logits(model, ids), atol=1e-4)


def test_save_hf_round_trip(small, tmp_path):
    model, dirs, ids = small
    lm = cgpt.load(dirs["st"])
    out = cgpt.save_hf(lm, tmp_path / "ckpt")
    back = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    np.testing.assert_allclose(_ref_logits(back, ids), lm.logits(ids), atol=1e-4)
    np.testing.assert_allclose(cgpt.load(out).logits(ids), lm.logits(ids), atol=0)


def test_bfloat16_compute_is_close(small):
    model, dirs, ids = small
    lm = cgpt.load(dirs["st"], dtype="bfloat16")
    assert lm.config.compute_dtype == "bfloat16"
    ref = _ref_logits(model, ids)
    assert np.abs(lm.logits(ids) - ref).max() < 0.1 * np.abs(ref).max()
    with pytest.raises(ValueError, match="dtype"):
        cgpt.load(dirs["st"], dtype="float16")


def test_tokenizer_files(small, tmp_path):
    """A GPT-2 vocab.json + merges.txt pair becomes lm.tokenizer and drives text generation."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["hello world, the quick brown fox"] * 50, vocab_size=300,
                            special_tokens=["<|endoftext|>"])
    model, dirs, _ = small
    d = tmp_path / "ckpt"
    model.save_pretrained(d)
    tok.save_model(str(d))  # writes vocab.json + merges.txt
    lm = cgpt.load(d)
    assert lm.tokenizer is not None
    assert lm.decode(lm.encode("hello world")) == "hello world"
    text = lm.generate("hello", max_new_tokens=5)
    assert isinstance(text, str) and text.startswith("hello")
    assert cgpt.load(dirs["st"]).tokenizer is None
    # save_hf marks the tokenizer's own <|endoftext|> as bos/eos, so HF generation can stop.
    out = cgpt.save_hf(lm, tmp_path / "saved")
    eot = tok.token_to_id("<|endoftext|>")
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == eot


def test_relative_typo_is_not_taken_for_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(LoadError, match="no such directory"):
        cgpt.load("runs/typo")


@pytest.mark.slow(reason=(
    "the same checks on a small config: test_small_parity_every_format, "
    "test_small_greedy_generation_matches"))
@pytest.mark.parametrize("fmt", ["st", pytest.param("bin", marks=pytest.mark.slow)])  # bin: the slow twin
def test_exact_111m_shape(tmp_path_factory, fmt):
    """At exactly the published 111M shape: counts, logits, loss and 32 greedy tokens."""
    ref_cfg = cgpt.get_config("111M")
    model = _hf_model(seed=1, n_layer=10, n_embd=768, n_head=12, n_positions=2048,
                      vocab_size=50257, initializer_range=0.02)
    assert sum(p.numel() for p in model.parameters()) == ref_cfg.num_params() == 111_050_496
    d = tmp_path_factory.mktemp(fmt) / "cerebras-gpt-111m"
    _save(model, d, fmt)
    assert (d / ("model.safetensors" if fmt == "st" else "pytorch_model.bin")).exists()
    lm = cgpt.load(d)
    assert lm.config.num_params() == 111_050_496
    ids = np.random.default_rng(1).integers(0, 50257, (1, 64))
    np.testing.assert_allclose(lm.logits(ids), _ref_logits(model, ids), atol=1e-4, rtol=0)
    with torch.no_grad():
        ref_loss = model(torch.tensor(ids), labels=torch.tensor(ids)).loss.item()
    assert lm.loss(ids) == pytest.approx(ref_loss, abs=1e-5)
    np.testing.assert_array_equal(lm.generate(ids[:, :16], 32), _ref_greedy(model, ids[:, :16], 32))


# ---- bad input: always LoadError naming the file and the key --------------------------
def _copy(small, tmp_path, fmt="st"):
    import shutil
    d = tmp_path / "ckpt"
    shutil.copytree(small[1][fmt], d)
    return d


def test_error_not_a_checkpoint(small, tmp_path):
    with pytest.raises(LoadError, match="no config.json"):
        cgpt.load(tmp_path)
    f = tmp_path / "weights.txt"
    f.write_text("x")
    with pytest.raises(LoadError, match="not a checkpoint directory"):
        cgpt.load(f)
    with pytest.raises(LoadError, match="no such directory"):
        cgpt.load(tmp_path / "missing" / "dir")
    (tmp_path / "config.json").write_text((small[1]["st"] / "config.json").read_text())
    with pytest.raises(LoadError, match="no weights found"):
        cgpt.load(tmp_path)


def test_error_missing_tensor(small, tmp_path):
    d = _copy(small, tmp_path)
    sd = load_file(d / "model.safetensors")
    del sd["transformer.h.1.mlp.c_fc.bias"]
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(LoadError, match=r"missing tensor 'transformer.h.1.mlp.c_fc.bias'"):
        cgpt.load(d)


def test_error_wrong_shape(small, tmp_path):
    d = _copy(small, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["n_inner"] = 128
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LoadError, match=r"model.safetensors: key 'transformer.h.0.mlp.c_fc.weight' "
                                        r"has shape \(64, 256\), expected \(64, 128\)"):
        cgpt.load(d)


@pytest.mark.parametrize("key,value,match", [
    ("model_type", "llama", "model_type"),
    ("architectures", ["GPT2ForSequenceClassification"], "architectures"),
    ("activation_function", "gelu_new", "activation_function"),
    ("scale_attn_by_inverse_layer_idx", True, "scale_attn_by_inverse_layer_idx"),
])
def test_error_unsupported_config(small, tmp_path, key, value, match):
    d = _copy(small, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LoadError, match=rf"config.json: key '{match}'"):
        cgpt.load(d)


def test_error_unexpected_and_untied_keys(small, tmp_path):
    d = _copy(small, tmp_path)
    sd = load_file(d / "model.safetensors")
    sd["lm_head.weight"] = sd["transformer.wte.weight"] + 1
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(LoadError, match="lm_head.weight"):
        cgpt.load(d)
    del sd["lm_head.weight"]
    sd["transformer.h.0.attn.q_proj.weight"] = np.zeros((2, 2), np.float32)
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(LoadError, match="unexpected key 'transformer.h.0.attn.q_proj.weight'"):
        cgpt.load(d)


@pytest.mark.parametrize("fmt,name", [("st", "model.safetensors"), ("bin", "pytorch_model.bin")])
def test_error_corrupt_file(small, tmp_path, fmt, name):
    d = _copy(small, tmp_path, fmt)
    (d / name).write_bytes(b"\x00garbage" * 100)
    with pytest.raises(LoadError, match=name):
        cgpt.load(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(LoadError, match="config.json: not valid JSON"):
        cgpt.load(d)


def test_error_missing_shard(small, tmp_path):
    d = _copy(small, tmp_path, "st_sharded")
    shard = sorted(p for p in d.iterdir() if p.suffix == ".safetensors")[0]
    shard.unlink()
    with pytest.raises(LoadError, match=f"lists shard '{shard.name}', which is missing"):
        cgpt.load(d)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_bin_never_runs_pickled_code(small, tmp_path):
    d = _copy(small, tmp_path, "bin")
    with open(d / "pytorch_model.bin", "wb") as fh:
        pickle.dump({"transformer.wte.weight": _Evil()}, fh)
    with pytest.raises(LoadError, match=r"pytorch_model.bin: refused: .*weights-only"):
        cgpt.load(d)


def test_bin_without_torch_says_what_to_do(small, tmp_path, monkeypatch):
    d = _copy(small, tmp_path, "bin")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(LoadError, match=r"pytorch_model.bin: .*needs torch.*safetensors"):
        cgpt.load(d)


def test_library_does_not_import_torch_or_transformers():
    import subprocess
    code = ("import sys, cgpt; cgpt.get_config('111M'); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, "
            "[m for m in sys.modules if m.startswith(('torch', 'transformers'))]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_hub_id_offline_uncached_and_cached(small, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(LoadError, match=r"'cerebras/Cerebras-GPT-111M' is not in the local "
                                        r"Hugging Face cache.*hf download"):
        cgpt.load("cerebras/Cerebras-GPT-111M")
    # A populated cache (the layout huggingface_hub writes) resolves without the network.
    import shutil
    snap = tmp_path / "hub" / "models--cerebras--tiny-gpt" / "snapshots" / "abc123"
    shutil.copytree(small[1]["st"], snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("abc123")
    lm = cgpt.load("cerebras/tiny-gpt")
    np.testing.assert_allclose(lm.logits(small[2]), _ref_logits(small[0], small[2]), atol=1e-4)


# ---- #23: every file an index names lies inside it; weights are finite ----------------
@pytest.mark.parametrize("name,match", [
    ("../other/model.safetensors", "lies outside"),
    ("/etc/passwd", "lies outside"),
    ("sub/../../x.safetensors", "lies outside"),
    (7, "not a file name"),
])
def test_shard_index_names_only_files_inside_it(small, tmp_path, name, match):
    other = _copy(small, tmp_path / "other")  # a whole other model, one directory up
    d = _copy(small, tmp_path / "mine", "st_sharded")
    index = d / "model.safetensors.index.json"
    wmap = json.loads(index.read_text())["weight_map"]
    wmap[next(iter(wmap))] = name if name != "../other/model.safetensors" else \
        os.path.relpath(other / "model.safetensors", d)
    index.write_text(json.dumps({"weight_map": wmap}))
    with pytest.raises(LoadError, match=match):
        cgpt.load(d)
    index.write_text(json.dumps({"weight_map": [1, 2]}))
    with pytest.raises(LoadError, match="weight_map"):
        cgpt.load(d)


@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
def test_nonfinite_weights_are_refused_naming_the_tensor(small, tmp_path, value):
    d = _copy(small, tmp_path)
    sd = load_file(d / "model.safetensors")
    sd["transformer.h.1.attn.c_proj.weight"][3, 4] = value
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(LoadError, match=r"model.safetensors: tensor "
                                        r"'transformer.h.1.attn.c_proj.weight' holds 1 NaN or inf"):
        cgpt.load(d)


@pytest.mark.parametrize("content", ["dir", b"\xff\xfe\x00binary", "[1, 2]"])
def test_config_json_of_the_wrong_kind(small, tmp_path, content):
    d = _copy(small, tmp_path)
    (d / "config.json").unlink()
    if content == "dir":
        (d / "config.json").mkdir()
    elif isinstance(content, bytes):
        (d / "config.json").write_bytes(content)
    else:
        (d / "config.json").write_text(content)
    with pytest.raises(LoadError, match="config.json"):
        cgpt.load(d)


def test_sampling_flags_must_be_finite(small):
    lm = cgpt.load(small[1]["st"])
    for t in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="temperature must be a finite number"):
            lm.generate([1, 2], 2, temperature=t)


@pytest.mark.parametrize("flag,value", [("--seq-len", "0"), ("--seq-len", "1"),
                                        ("--sequences", "0"), ("--batch-size", "0")])
def test_eval_flags_below_their_minimum(small, flag, value, capsys):
    from cgpt.cli import main
    assert main(["eval", str(small[1]["st"]), flag, value]) == 2
    assert f"error: {flag} {value}: must be at least" in capsys.readouterr().err
