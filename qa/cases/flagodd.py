"""Odd spellings of flag and override values: what Python's int()/float() and YAML quietly
accept (Unicode digits, `1_000`, spaces, `1e400`, `true` for a count), override items split or
doubled by the shell, values that parse but cannot be meant (a 1e11 batch, a 1e9 context, a
seed past 64 bits). Each must be refused with one line naming the flag or key before anything
is built, or do what was meant; never allocate without bound or fail deep inside JAX. The
`flags` group tries the plainly wrong values; these are the strange ones."""
from qa.damage import generate
from qa.registry import add

TRAIN = {  # name -> (extra argv, expect, what a refusal must name)
    "tokens_overflow_1e400": (["--tokens", "1e400"], "error", "tokens"),
    "tokens_trailing_junk": (["--tokens", "2e6x"], "error", "tokens"),
    "tokens_minus_zero": (["--tokens=-0"], "error", "tokens"),
    "tokens_tiny_fraction": (["--tokens", "1e-300"], "error", "tokens"),
    "tokens_chinchilla_typo": (["--tokens", "chinchila"], "error", "chinchila"),
    "seed_past_64_bits": (["--seed", str(2 ** 70)], "error", "seed"),
    "seed_unicode_digits": (["--seed", "\u0661\u0662", "--tokens", "0"], "error", "tokens"),
    "out_empty_string": (["--out", ""], "error", "--out"),
    "mesh_upper_axis": (["--mesh", "DATA=2"], "error", "DATA"),
    "mesh_trailing_comma_only": (["--mesh", ","], "error", "mesh"),
    "override_spaces_around_equals": (["train.peak_lr", "=", "1e-3"], "error", "train.peak_lr"),
    "override_two_equals": (["train.peak_lr=1e-3=2"], "error", "peak_lr"),
    "override_no_key": (["=1"], "error", "=1"),
    "override_empty_key": (["train.=1"], "error", "train."),
    "override_no_section": ([".peak_lr=1"], "error", ".peak_lr"),
    "override_too_deep": (["train.peak_lr.x=1"], "error", "peak_lr.x"),
    "override_section_upper": (["TRAIN.peak_lr=1"], "error", "TRAIN"),
    "batch_size_true": (["train.batch_size=true"], "error", "batch_size"),
    "n_layer_yes": (["model.n_layer=yes"], "error", "n_layer"),
    "tokens_override_list": (["train.tokens=[1, 2]"], "error", "tokens"),
    "vocab_size_fraction": (["data.vocab_size=512.5"], "error", "vocab_size"),
    "peak_lr_inf": (["train.peak_lr=.inf"], "error", "peak_lr"),
    "peak_lr_1e999": (["train.peak_lr=1e999"], "error", "peak_lr"),
    "ckpt_every_fraction": (["train.ckpt_every=0.5"], "error", "ckpt_every"),
    "seq_len_1e9": (["data.seq_len=1000000000"], "error", "seq_len"),
    "batch_size_1e11": (["train.batch_size=100000000000"], "error", "batch_size"),
    "val_sequences_1e12": (["data.val_sequences=1000000000000"], "error", "val_sequences"),
    "d_model_not_divisible_by_heads": (["model.d_model=30", "model.n_head=4"], "error",
                                       "d_model"),
    "data_whitespace": (["--data", "   "], "error", "data"),
    "model_padded_name": (["--model", " tiny-17k"], "either", "tiny-17k"),
    "config_dev_null": (["--config", "/dev/null", "--tokens", "0"], "error", "tokens"),
    "mode_upper": (["--mode", "SINGLE", "--tokens", "0"], "error", "tokens"),
}
for _n, (_extra, _expect, _text) in TRAIN.items():
    add(f"train_{_n}", _expect, "flagodd", lambda ctx, e=_extra, t=_text: {
        "argv": ctx.train(ctx.fresh("out"), *e), "expect_text": t, "timeout": 600})

GENERATE = {  # sampling values at the edge of floating point: text, or one line, never NaN
    "temperature_1e-30": (["--temperature", "1e-30"], "either", "temperature"),
    "temperature_1e30": (["--temperature", "1e30"], "either", "temperature"),
    "top_p_1e-30": (["--temperature", "1", "--top-p", "1e-30"], "either", "top-p"),
    "seed_negative": (["--temperature", "1", "--seed=-1"], "either", "seed"),
    "max_new_tokens_underscores": (["--max-new-tokens", "1_0"], "ok", None),
    "dtype_upper": (["--dtype", "BFLOAT16"], "either", "BFLOAT16"),
}
for _n, (_extra, _expect, _text) in GENERATE.items():
    add(f"generate_{_n}", _expect, "flagodd", lambda ctx, e=_extra, t=_text: {
        "argv": generate(ctx.hf, *e), "timeout": 600, **({"expect_text": t} if t else {})})
add("generate_prompt_longer_than_context", "either", "flagodd", lambda ctx: {
    "argv": ["generate", str(ctx.hf), "def f(x): return x\n" * 400, "--max-new-tokens", "4"],
    "timeout": 600, "expect_text": "prompt"})
add("generate_prompt_empty", "either", "flagodd", lambda ctx: {
    "argv": ["generate", str(ctx.hf), "", "--max-new-tokens", "4"], "timeout": 600,
    "expect_text": "prompt"})
add("eval_seq_len_above_context", "error", "flagodd", lambda ctx: {
    "argv": ["eval", str(ctx.hf), "--data", str(ctx.corpus), "--sequences", "4", "--seq-len",
             "100000"], "timeout": 600, "expect_text": "seq-len"})
add("eval_sequences_1e9", "either", "flagodd", lambda ctx: {
    "argv": ["eval", str(ctx.hf), "--data", str(ctx.corpus), "--sequences", "1000000000"],
    "timeout": 600, "expect_text": "sequences"})
