"""Loading: `cgpt generate` / `cgpt eval` of a damaged run directory or Hugging Face export.

Retired (carried by tests): NaN weights in a run's checkpoint, a run without config.yaml
(tests/faults/test_faults_rundir.py), the latest checkpoint corrupt
(tests/faults/test_faults.py)."""
import json
import shutil

from qa.context import strict_stdout
from qa.damage import generate, to_dir, to_file, zero_checkpoint_data
from qa.registry import case


def _eval(ctx, src):
    return ["eval", str(src), "--data", str(ctx.corpus), "--sequences", "4"]


def _nonfinite_run(ctx, value: float):
    """A finished run whose newest checkpoint holds `value` in one tensor (written with Orbax)."""
    d = ctx.run_copy(resumable=False)
    code = f"""
import shutil, numpy as np, orbax.checkpoint as ocp
from pathlib import Path
d = Path({str(d)!r}) / 'checkpoints' / '20' / 'params'
ck = ocp.StandardCheckpointer()
p = ck.restore(d.absolute())
p['wpe'] = np.asarray(p['wpe']).copy(); p['wpe'][0, 0] = float({str(value)!r})
shutil.rmtree(d)
ck.save(d.absolute(), p); ck.wait_until_finished()
"""
    r = ctx.python(code)
    if r.returncode:
        raise RuntimeError(r.stderr[-500:])
    return d


def _hf_tensor(ctx, value: float):
    d = ctx.hf_copy()
    code = f"""
from safetensors.numpy import load_file, save_file
f = {str(d / 'model.safetensors')!r}
t = load_file(f); k = 'transformer.h.0.attn.c_attn.weight'
t[k] = t[k].copy(); t[k][0, 0] = float({str(value)!r})
save_file(t, f, metadata={{'format': 'pt'}})
"""
    r = ctx.python(code)
    if r.returncode:
        raise RuntimeError(r.stderr[-500:])
    return d


def _index(ctx, weight_map):
    d = ctx.hf_copy()
    (d / "model.safetensors").rename(d / "shard-1.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d


@case("error", "load")
def load_run_inf_weights_eval(ctx):
    return {"argv": _eval(ctx, _nonfinite_run(ctx, float("inf"))),
            "stdout_check": strict_stdout}


@case("error", "load")
def load_run_checkpoints_empty(ctx):
    d = ctx.run_copy(resumable=False)
    shutil.rmtree(d / "checkpoints")
    (d / "checkpoints").mkdir()
    return {"argv": generate(d)}


@case("error", "load")
def load_run_checkpoints_is_file(ctx):
    d = ctx.run_copy(resumable=False)
    to_file("checkpoints")(d)
    return {"argv": generate(d), "expect_text": "checkpoints"}


@case("error", "load")
def load_run_all_corrupt(ctx):
    d = ctx.run_copy(resumable=False)
    zero_checkpoint_data(d)
    return {"argv": generate(d)}


@case("error", "load")
def load_run_config_binary(ctx):
    d = ctx.run_copy(resumable=False)
    (d / "config.yaml").write_bytes(b"\xff\xfe\x00\x01")
    return {"argv": generate(d), "expect_text": "config.yaml"}


@case("error", "load")
def load_run_tokenizer_garbage(ctx):
    d = ctx.run_copy(resumable=False)
    (d / "tokenizer.json").write_text("{oops")
    return {"argv": generate(d), "expect_text": "tokenizer"}


@case("either", "load")
def load_run_params_item_missing(ctx):
    d = ctx.run_copy(resumable=False)
    shutil.rmtree(d / "checkpoints" / "20" / "params")
    return {"argv": generate(d)}


@case("error", "load")
def hf_index_parent_path(ctx):
    other = ctx.hf_copy()
    d = _index(ctx, {"transformer.wte.weight": f"../{other.name}/model.safetensors"})
    return {"argv": generate(d), "expect_text": "outside"}


@case("error", "load")
def hf_index_absolute_path(ctx):
    d = _index(ctx, {"transformer.wte.weight": "/etc/passwd"})
    return {"argv": generate(d), "expect_text": "outside"}


@case("error", "load")
def hf_index_symlink_escape(ctx):
    d = _index(ctx, {"transformer.wte.weight": "sub/../../x.safetensors"})
    return {"argv": generate(d), "expect_text": "outside"}


@case("error", "load")
def hf_index_value_not_string(ctx):
    return {"argv": generate(_index(ctx, {"transformer.wte.weight": 7}))}


@case("error", "load")
def hf_index_is_list(ctx):
    d = ctx.hf_copy()
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text("[1, 2]")
    return {"argv": generate(d)}


@case("error", "load")
def hf_nan_tensor_generate(ctx):
    return {"argv": generate(_hf_tensor(ctx, float("nan"))), "expect_text": "NaN"}


@case("error", "load")
def hf_inf_tensor_eval(ctx):
    return {"argv": _eval(ctx, _hf_tensor(ctx, float("-inf"))), "stdout_check": strict_stdout}


@case("error", "load")
def hf_config_is_dir(ctx):
    d = ctx.hf_copy()
    to_dir("config.json")(d)
    return {"argv": generate(d)}


@case("error", "load")
def hf_config_binary(ctx):
    d = ctx.hf_copy()
    (d / "config.json").write_bytes(b"\xff\xfe\x00\x01")
    return {"argv": generate(d), "expect_text": "config.json"}


@case("error", "load")
def hf_config_list(ctx):
    d = ctx.hf_copy()
    (d / "config.json").write_text("[]")
    return {"argv": generate(d)}


@case("error", "load")
def hf_weights_is_dir(ctx):
    d = ctx.hf_copy()
    to_dir("model.safetensors")(d)
    return {"argv": generate(d)}


@case("error", "load")
def hf_tokenizer_garbage(ctx):
    d = ctx.hf_copy()
    (d / "tokenizer.json").write_text("{oops")
    return {"argv": generate(d)}


@case("error", "load")
def load_a_plain_file(ctx):
    return {"argv": generate(ctx.hf_copy() / "config.json")}
