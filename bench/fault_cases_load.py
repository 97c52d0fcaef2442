"""The loading, sampling-flag and config cases of bench/fault_campaign.py (see fault_cases)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

from fault_cases import CASES, Case, _gen, _to_dir, _to_file, case, strict_stdout


# ---- cases: loading (cgpt generate / eval) ------------------------------------------------
def _nan_run(ctx, value):
    """A run whose newest checkpoint holds `value` in one tensor (written with Orbax)."""
    d = ctx.run_copy(resumable=False)
    code = f"""
import sys, numpy as np, jax, orbax.checkpoint as ocp
from pathlib import Path
d = Path(sys.argv[1]) / 'checkpoints' / '20' / 'params'
ck = ocp.StandardCheckpointer()
p = ck.restore(d.absolute())
p['wpe'] = np.asarray(p['wpe']).copy(); p['wpe'][0, 0] = float({str(value)!r})
import shutil; shutil.rmtree(d)
ck.save(d.absolute(), p); ck.wait_until_finished()
"""
    subprocess.run([sys.executable, "-c", code, str(d)], env=ctx.env(), check=True,
                   capture_output=True)
    return d


@case("error", "load")
def load_run_nan_weights_generate(ctx):
    return {"argv": _gen(_nan_run(ctx, float("nan")))}


@case("error", "load")
def load_run_inf_weights_eval(ctx):
    d = _nan_run(ctx, float("inf"))
    return {"argv": ["eval", str(d), "--data", str(ctx.corpus), "--sequences", "4"],
            "stdout_check": strict_stdout}


@case("error", "load")
def load_run_config_deleted(ctx):
    d = ctx.run_copy(resumable=False)
    (d / "config.yaml").unlink()
    return {"argv": _gen(d), "expect_text": "config.yaml"}


@case("error", "load")
def load_run_checkpoints_empty(ctx):
    d = ctx.run_copy(resumable=False)
    shutil.rmtree(d / "checkpoints")
    (d / "checkpoints").mkdir()
    return {"argv": _gen(d)}


@case("error", "load")
def load_run_checkpoints_is_file(ctx):
    d = ctx.run_copy(resumable=False)
    _to_file("checkpoints")(d)
    return {"argv": _gen(d)}


@case("error", "load")
def load_run_all_corrupt(ctx):
    d = ctx.run_copy(resumable=False)
    for f in (d / "checkpoints").rglob("ocdbt.process_0/d/*"):
        f.write_bytes(b"\0" * f.stat().st_size)
    return {"argv": _gen(d)}


@case("ok", "load")
def load_run_latest_corrupt_falls_back(ctx):
    d = ctx.run_copy(resumable=False)
    for f in (d / "checkpoints" / "20" / "params").rglob("ocdbt.process_0/d/*"):
        f.write_bytes(b"\0" * f.stat().st_size)
    return {"argv": _gen(d)}


@case("error", "load")
def load_run_config_binary(ctx):
    d = ctx.run_copy(resumable=False)
    (d / "config.yaml").write_bytes(b"\xff\xfe\x00\x01")
    return {"argv": _gen(d)}


@case("error", "load")
def load_run_tokenizer_garbage(ctx):
    d = ctx.run_copy(resumable=False)
    (d / "tokenizer.json").write_text("{oops")
    return {"argv": _gen(d)}


@case("either", "load")
def load_run_params_item_missing(ctx):
    d = ctx.run_copy(resumable=False)
    shutil.rmtree(d / "checkpoints" / "20" / "params")
    return {"argv": _gen(d)}


def _index(ctx, weight_map):
    d = ctx.hf_copy()
    (d / "model.safetensors").rename(d / "shard-1.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d


@case("error", "load")
def hf_index_parent_path(ctx):
    other = ctx.hf_copy()
    d = _index(ctx, {"transformer.wte.weight": f"../{other.name}/model.safetensors"})
    return {"argv": _gen(d)}


@case("error", "load")
def hf_index_absolute_path(ctx):
    return {"argv": _gen(_index(ctx, {"transformer.wte.weight": "/etc/passwd"}))}


@case("error", "load")
def hf_index_value_not_string(ctx):
    return {"argv": _gen(_index(ctx, {"transformer.wte.weight": 7}))}


@case("error", "load")
def hf_index_is_list(ctx):
    d = ctx.hf_copy()
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text("[1, 2]")
    return {"argv": _gen(d)}


@case("error", "load")
def hf_index_symlink_escape(ctx):
    d = _index(ctx, {"transformer.wte.weight": "sub/../../x.safetensors"})
    return {"argv": _gen(d)}


def _hf_tensor(ctx, value):
    d = ctx.hf_copy()
    code = f"""
import sys
from safetensors.numpy import load_file, save_file
f = sys.argv[1] + '/model.safetensors'
t = load_file(f); k = 'transformer.h.0.attn.c_attn.weight'; t[k] = t[k].copy(); t[k][0, 0] = float({str(value)!r})
save_file(t, f, metadata={{'format': 'pt'}})
"""
    subprocess.run([sys.executable, "-c", code, str(d)], env=ctx.env(), check=True)
    return d


@case("error", "load")
def hf_nan_tensor_generate(ctx):
    return {"argv": _gen(_hf_tensor(ctx, float("nan")))}


@case("error", "load")
def hf_inf_tensor_eval(ctx):
    d = _hf_tensor(ctx, float("-inf"))
    return {"argv": ["eval", str(d), "--data", str(ctx.corpus), "--sequences", "4"],
            "stdout_check": strict_stdout}


@case("error", "load")
def hf_config_is_dir(ctx):
    d = ctx.hf_copy()
    _to_dir("config.json")(d)
    return {"argv": _gen(d)}


@case("error", "load")
def hf_config_binary(ctx):
    d = ctx.hf_copy()
    (d / "config.json").write_bytes(b"\xff\xfe\x00\x01")
    return {"argv": _gen(d)}


@case("error", "load")
def hf_config_list(ctx):
    d = ctx.hf_copy()
    (d / "config.json").write_text("[]")
    return {"argv": _gen(d)}


@case("error", "load")
def hf_weights_is_dir(ctx):
    d = ctx.hf_copy()
    _to_dir("model.safetensors")(d)
    return {"argv": _gen(d)}


@case("error", "load")
def hf_tokenizer_garbage(ctx):
    d = ctx.hf_copy()
    (d / "tokenizer.json").write_text("{oops")
    return {"argv": _gen(d)}


@case("error", "load")
def load_a_plain_file(ctx):
    d = ctx.hf_copy()
    return {"argv": _gen(d / "config.json")}


# ---- cases: sampling and eval flags -------------------------------------------------------
def _flag_case(name, argv_of):
    CASES.append(Case(name, "error", lambda ctx: {"argv": argv_of(ctx)}, "flags"))


for _name, _extra in [("temperature_nan", ["--temperature", "nan"]),
                      ("temperature_inf", ["--temperature", "inf"]),
                      ("temperature_negative", ["--temperature", "-1"]),
                      ("top_p_nan", ["--temperature", "1", "--top-p", "nan"]),
                      ("top_k_zero", ["--temperature", "1", "--top-k", "0"]),
                      ("max_new_tokens_zero", ["--max-new-tokens", "0"]),
                      ("dtype_bogus", ["--dtype", "float8"])]:
    _flag_case("generate_" + _name, lambda ctx, e=_extra: _gen(ctx.hf, *e))
for _name, _extra in [("seq_len_zero", ["--seq-len", "0"]), ("seq_len_one", ["--seq-len", "1"]),
                      ("seq_len_negative", ["--seq-len", "-5"]),
                      ("sequences_zero", ["--sequences", "0"]),
                      ("batch_size_zero", ["--batch-size", "0"]),
                      ("batch_size_negative", ["--batch-size", "-2"])]:
    _flag_case("eval_" + _name, lambda ctx, e=_extra: ["eval", str(ctx.hf), "--data",
                                                       str(ctx.corpus), *e])


# ---- cases: configs ----------------------------------------------------------------------
@case("error", "config")
def config_flag_is_dir(ctx):
    return {"argv": ctx.train(ctx.fresh("out"), "--config", str(ctx.root))}


@case("error", "config")
def config_flag_binary(ctx):
    f = ctx.fresh("cfg")
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    return {"argv": ctx.train(ctx.fresh("out"), "--config", str(f))}


for _name, _ov in [("d_model_absurd", "model.d_model=10000000000000000000000"),
                   ("n_layer_absurd", "model.n_layer=100000000000000000000"),
                   ("n_head_absurd", "model.n_head=100000000000000000000"),
                   ("vocab_absurd", "model.vocab_size=100000000000000000000"),
                   ("d_model_negative", "model.d_model=-64")]:
    CASES.append(Case(_name, "error",
                      lambda ctx, o=_ov: {"argv": ctx.train(ctx.fresh("out"), o)}, "config"))
