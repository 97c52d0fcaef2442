"""`cgpt generate` prompts and sampling values the flags group does not try, the sources a
researcher points it at by mistake, and `cgpt.load` / `LM.generate` misused from Python. As in
nanoGPT's sample.py or HF's `generate`: a prompt that does not fit the context, a seed or top-k
out of range, a source that is not a model is one line naming it; greedy and tiny
temperatures just work."""
import json
import shutil

from qa.context import library
from qa.damage import generate
from qa.registry import add

PROMPTS = {  # name -> (prompt, extra flags, expect, what a refusal must name)
    "prompt_empty": ("", [], "either", "prompt"),
    "prompt_whitespace": ("   \n\t", [], "ok", None),
    "prompt_past_context": ("def f(x):\n    return x\n" * 200, [], "error", "context"),
    "prompt_non_utf8_bytes": ("caf\udce9 \udcff\udcfe", [], "either", "prompt"),
    "prompt_eot_token": ("<|endoftext|>", [], "ok", None),
    "prompt_emoji_and_cjk": ("数据 🚀 données", [], "ok", None),
    "prompt_starting_with_dash": ("-x = 1", [], "ok", None),  # argparse: a space makes it a value
    "temperature_zero_greedy": ("def ", ["--temperature", "0"], "ok", None),
    "temperature_tiny": ("def ", ["--temperature", "1e-30"], "ok", None),
    "temperature_huge": ("def ", ["--temperature", "1e30"], "ok", None),
    "temperature_str": ("def ", ["--temperature", "hot"], "error", "--temperature"),
    "top_k_above_vocab": ("def ", ["--temperature", "1", "--top-k", "100000"], "either",
                          "top-k"),
    "top_k_huge": ("def ", ["--temperature", "1", "--top-k", str(10 ** 20)], "either", "top"),
    "top_k_one": ("def ", ["--temperature", "1", "--top-k", "1"], "ok", None),
    "top_p_tiny": ("def ", ["--temperature", "1", "--top-p", "1e-12"], "ok", None),
    "seed_negative": ("def ", ["--temperature", "1", "--seed=-3"], "either", "seed"),
    "seed_huge": ("def ", ["--temperature", "1", "--seed", str(2 ** 70)], "either", "seed"),
    "seed_float": ("def ", ["--seed", "1.5"], "error", "--seed"),
    "max_new_tokens_float": ("def ", ["--max-new-tokens", "2.5"], "error", "--max-new-tokens"),
    "max_new_tokens_scientific": ("def ", ["--max-new-tokens", "1e1"], "error",
                                  "--max-new-tokens"),
    "dtype_bfloat16": ("def ", ["--dtype", "bfloat16"], "ok", None),
    "dtype_float16": ("def ", ["--dtype", "float16"], "either", "float16"),
    "dtype_empty": ("def ", ["--dtype", ""], "error", "dtype"),
}
for _n, (_prompt, _extra, _expect, _text) in PROMPTS.items():
    def _make(ctx, p=_prompt, e=_extra, t=_text):
        argv = ["generate", str(ctx.hf), p, "--max-new-tokens", "4", *e]
        if "--max-new-tokens" in e:
            argv[3:5] = []
        return {"argv": argv, "timeout": 600, **({"expect_text": t} if t else {})}
    add(_n, _expect, "generate", _make)


def _empty_dir(ctx):
    d = ctx.fresh("empty")
    d.mkdir(parents=True)
    return d


def _run_without_tokenizer(ctx):
    d = ctx.run_copy(resumable=False)
    (d / "tokenizer.json").unlink()
    return d


def _hf_without_tokenizer(ctx):
    d = ctx.hf_copy()
    for f in d.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            f.unlink() if f.is_file() else shutil.rmtree(f)
    return d


def _hf_config_wrong_model(ctx):
    d = ctx.hf_copy()
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "llama", ["LlamaForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _hf_weights_of_another_shape(ctx):
    d = ctx.hf_copy()
    cfg = json.loads((d / "config.json").read_text())
    cfg["n_embd"] = cfg["n_embd"] * 2
    (d / "config.json").write_text(json.dumps(cfg))
    return d


SOURCES = {  # name -> (source, expect, what a refusal must name)
    "source_empty_string": (lambda ctx: "", "error", "source"),
    "source_empty_dir": (lambda ctx: _empty_dir(ctx), "error", "empty"),
    "source_hub_id_offline": (lambda ctx: "nobody-here/not-a-model", "error", "nobody-here"),
    "source_sweep_dir_of_runs": (lambda ctx: ctx.base.parent, "error", str("config")),
    "source_a_checkpoint_step": (lambda ctx: ctx.base / "checkpoints" / "20", "either", "20"),
    "source_run_without_tokenizer": (_run_without_tokenizer, "error", "tokenizer"),
    "source_hf_without_tokenizer": (_hf_without_tokenizer, "error", "tokenizer"),
    "source_hf_llama_config": (_hf_config_wrong_model, "error", "llama"),
    "source_hf_weights_of_another_shape": (_hf_weights_of_another_shape, "error", "n_embd"),
}
for _n, (_src, _expect, _text) in SOURCES.items():
    add(_n, _expect, "generate", lambda ctx, s=_src, t=_text: {
        "argv": generate(s(ctx)), "expect_text": t, "timeout": 600})

API = {  # name -> (code after `lm = cgpt.load(HF)`, or a whole call; what it must name)
    "load_none": ("cgpt.load(None)", "None"),
    "load_int": ("cgpt.load(123)", "123"),
    "load_dtype_bogus": ("cgpt.load(HF, dtype='int3')", "int3"),
    "lm_generate_max_new_zero": ("cgpt.load(HF).generate('def ', 0)", "max_new_tokens"),
    "lm_generate_ids_out_of_vocab": ("cgpt.load(HF).generate([[10 ** 6]], 2)", "range"),
    "lm_generate_ids_negative": ("cgpt.load(HF).generate([[-1, 3]], 2)", "range"),
    "lm_generate_ids_float": ("cgpt.load(HF).generate([[1.5, 2.0]], 2)", "prompt"),
    "lm_generate_ids_3d": ("cgpt.load(HF).generate([[[1, 2]]], 2)", "prompt"),
    "lm_loss_one_token": ("cgpt.load(HF).loss([[5]])", "2 tokens"),
    "lm_ragged_empty_prompt": ("cgpt.load(HF).generate_ragged([[1, 2], []], 2)", "prompt"),
    "save_hf_onto_a_file": ("cgpt.save_hf(cgpt.load(HF), FILE)", "FILE"),
}
for _n, (_call, _text) in API.items():
    def _api(ctx, call=_call, text=_text):
        f = ctx.fresh("file")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("not a directory\n")
        return {"python": library(call.replace("HF", repr(str(ctx.hf))).replace(
            "FILE", repr(str(f))), "load", "import cgpt"),
            "expect_text": text.replace("FILE", f.name), "timeout": 600}
    add(_n, "error", "generate", _api)
