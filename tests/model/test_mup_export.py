"""μP export: save_hf folds the μP multipliers so transformers' GPT-2 gives the same logits."""
import json

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

import cgpt
from cgpt import LoadError
from cgpt.config.model import get_config
from cgpt.eval.lm import LM
from cgpt.model.gpt import init_params

transformers.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def mup_lm():
    """A μP model at m_w = 2 (tiny family, base width 32) with every parameter perturbed, so
    biases, LayerNorms and the query bias all matter."""
    cfg = get_config("tiny-45k-mup", d_model=64, n_head=4, n_layer=2)
    assert cfg.mup and cfg.width_mult == 2.0 and cfg.d_head == 16
    params = init_params(cfg, 0)
    leaves, tree = jax.tree.flatten(params)
    rng = np.random.default_rng(0)
    leaves = [np.asarray(p) + 0.05 * rng.standard_normal(p.shape).astype(np.float32)
              for p in leaves]
    ids = rng.integers(0, cfg.vocab_size, (2, 48))
    return LM(cfg, jax.tree.unflatten(tree, leaves)), ids


def _hf_logits(d, ids):
    model = transformers.GPT2LMHeadModel.from_pretrained(d).eval()
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.numpy()


def test_transformers_reproduces_mup_logits(mup_lm, tmp_path):
    lm, ids = mup_lm
    out = cgpt.save_hf(lm, tmp_path / "mup")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and cfg["cgpt_mup"]["mup_base_width"] == 32
    ours = lm.logits(ids)
    np.testing.assert_allclose(_hf_logits(out, ids), ours, atol=1e-4)
    # The folding is what makes them agree: the same tensors read as a tied SP model do not.
    sd = load_file(out / "model.safetensors")
    assert not np.allclose(sd["lm_head.weight"], sd["transformer.wte.weight"])


def test_load_reads_the_export_back_as_mup(mup_lm, tmp_path):
    lm, ids = mup_lm
    back = cgpt.load(cgpt.save_hf(lm, tmp_path / "mup"))
    assert back.config.mup and back.config.mup_base_width == 32
    assert back.config.width_mult == 2.0 and back.config.mup_embed_mult == 10.0
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 back.params, lm.params)
    np.testing.assert_allclose(back.logits(ids), lm.logits(ids), atol=1e-5)


def test_a_retrained_untied_head_is_an_error(mup_lm, tmp_path):
    lm, _ = mup_lm
    out = cgpt.save_hf(lm, tmp_path / "mup")
    sd = load_file(out / "model.safetensors")
    sd["lm_head.weight"] = sd["lm_head.weight"] + 0.01
    save_file(sd, str(out / "model.safetensors"))
    with pytest.raises(LoadError, match="lm_head.weight.*not the μP head"):
        cgpt.load(out)
    del sd["lm_head.weight"]
    save_file(sd, str(out / "model.safetensors"))
    with pytest.raises(LoadError, match="missing tensor 'lm_head.weight'"):
        cgpt.load(out)
    cfg = json.loads((out / "config.json").read_text())
    del cfg["cgpt_mup"]["mup_base_width"]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LoadError, match="cgpt_mup"):
        cgpt.load(out)
