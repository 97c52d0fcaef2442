"""Flags: every command's flags and overrides with a wrong type or value. Each must be one
`error:` line naming the flag or key (the text after each case), before anything is written.

Retired (carried by tests): `--config` a directory or binary, absurd d_model / n_layer,
clip_norm -1, peak_lr a list, `plan --seq-len 0`, `generate --top-p 0 / --top-k -1 /
--max-new-tokens -1`, `eval --limit -1 / --num-fewshot -2` (tests/faults/test_faults_rundir.py);
`sweep --parallel 0 / -2` (tests/faults/test_faults_sweep.py); `sweep --suggest 0`, `--target-flops
-1e18`, `--budget-flops 0`, `data prepare --vocab-size 1` (tests/structure/test_cli_help.py)."""
from pathlib import Path

import yaml

from qa.damage import generate
from qa.registry import add

SPEC = {"name": "camp", "base": {"preset": "tiny-17k", "data": {"vocab_size": 512, "seq_len": 16},
                                 "train": {"batch_size": 4, "tokens": 640}},
        "grid": {"model": ["tiny-17k"], "seed": [0]}}


def _error(name, argv_of, text=None, expect="error"):
    def make(ctx):
        spec = {"argv": argv_of(ctx)}
        if text:
            spec["expect_text"] = text
        return spec
    add(name, expect, "flags", make)


def _file(p: Path, text: str) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def _spec(ctx) -> Path:
    def build(ctx):
        return _file(ctx.root / "camp_spec.yaml", yaml.safe_dump(SPEC))
    return ctx.once("flags_spec", build)


TRAIN = {  # name -> (extra argv, what the error must name)
    "tokens_abc": (["--tokens", "abc"], "tokens"), "tokens_negative": (["--tokens=-5"], "tokens"),
    "tokens_zero": (["--tokens", "0"], "tokens"), "tokens_nan": (["--tokens", "nan"], "tokens"),
    "tokens_inf": (["--tokens", "inf"], "tokens"),
    "mesh_garbage": (["--mesh", "data=x"], "mesh"),
    "mesh_unknown_axis": (["--mesh", "foo=2"], "foo"),
    "mesh_zero": (["--mesh", "data=0"], "mesh"), "mode_bogus": (["--mode", "bogus"], "bogus"),
    "seed_str": (["--seed", "x"], "--seed"), "from_step_str": (["--from-step", "x"], "--from-step"),
    "from_step_without_resume": (["--from-step", "10"], "--resume"),
    "peer_timeout_zero": (["--peer-timeout", "0"], "peer-timeout"),
    "peer_timeout_negative": (["--peer-timeout=-5"], "peer-timeout"),
    "branch_from_no_at": (["--branch-from", "nowhere"], "RUN@STEP"),
    "branch_from_bad_step": (["--branch-from", "x@abc"], "branch-from"),
    "branch_from_missing_run": (["--branch-from", "/nonexistent@5"], "nonexistent"),
    "data_empty_string": (["--data", ""], "data"),
    "batch_size_zero": (["train.batch_size=0"], "batch_size"),
    "batch_size_negative": (["train.batch_size=-4"], "batch_size"),
    "batch_size_str": (["train.batch_size=abc"], "batch_size"),
    "batch_size_float": (["train.batch_size=2.5"], "batch_size"),
    "peak_lr_nan": (["train.peak_lr=nan"], "peak_lr"),
    "peak_lr_negative": (["train.peak_lr=-1"], "peak_lr"),
    "seq_len_zero": (["data.seq_len=0"], "seq_len"),
    "n_layer_zero": (["model.n_layer=0"], "n_layer"),
    "log_every_zero": (["train.log_every=0"], "log_every"),
    "ckpt_every_negative": (["train.ckpt_every=-1"], "ckpt_every"),
    "keep_checkpoints_zero": (["train.keep_checkpoints=0"], "keep_checkpoints"),
    "checkpoint_minutes_negative": (["train.checkpoint_minutes=-1"], "checkpoint_minutes"),
    "val_sequences_negative": (["data.val_sequences=-1"], "val_sequences"),
    "unknown_train_key": (["train.nonsense=1"], "nonsense"),
    "unknown_model_key": (["model.nonsense=1"], "nonsense"),
    "warmup_steps_negative": (["train.warmup_steps=-3"], "warmup_steps"),
    "weight_decay_str": (["train.weight_decay=lots"], "weight_decay"),
    "mode_override_bogus": (["train.mode=bogus"], "bogus"),
    "device_memory_garbage": (["train.device_memory=lots"], "device_memory"),
    "compute_dtype_bogus": (["model.compute_dtype=int3"], "int3"),
    "data_vocab_size_zero": (["data.vocab_size=0"], "vocab_size"),
    "n_head_absurd": (["model.n_head=100000000000000000000"], "n_head"),
    "vocab_absurd": (["model.vocab_size=100000000000000000000"], "vocab_size"),
    "d_model_negative": (["model.d_model=-64"], "d_model"),
}
for _n, (_extra, _text) in TRAIN.items():
    _error(f"train_{_n}", lambda ctx, e=_extra: ctx.train(ctx.fresh("out"), *e), _text)
_error("train_override_empty_value_is_null",  # key= is YAML null: the default
       lambda ctx: ctx.train(ctx.fresh("out"), "train.warmup_steps="), expect="either")
_error("train_out_is_a_file", lambda ctx: ctx.train(_file(ctx.fresh("file"), "x")), "file")
_error("train_from_step_negative_resume",
       lambda ctx: ctx.train(ctx.run_copy(), "--resume", "--from-step=-5"), "-5")

EVAL = {"seq_len_zero": (["--seq-len", "0"], None), "seq_len_one": (["--seq-len", "1"], None),
        "seq_len_negative": (["--seq-len", "-5"], None),
        "sequences_zero": (["--sequences", "0"], None),
        "batch_size_zero": (["--batch-size", "0"], None),
        "batch_size_negative": (["--batch-size", "-2"], None),
        "bootstrap_negative": (["--tasks", "hellaswag", "--bootstrap-iters=-1"], "bootstrap"),
        "dtype_bogus": (["--dtype", "int7"], "int7"),
        "data_missing": (["--data", "/nonexistent/corpus"], "nonexistent"),
        "sequences_str": (["--sequences", "x"], "--sequences")}
for _n, (_extra, _text) in EVAL.items():
    _error(f"eval_{_n}", lambda ctx, e=_extra: ["eval", str(ctx.hf), "--data", str(ctx.corpus),
                                                "--sequences", "4", *e], _text)
_error("eval_source_missing", lambda ctx: ["eval", "/nonexistent/run", "--data",
                                           str(ctx.corpus)], "nonexistent")
_error("eval_data_empty_dir", lambda ctx: ["eval", str(ctx.base), "--data",
                                           str(_mkdir(ctx.fresh("empty")))], "empty")

GENERATE = {"temperature_nan": (["--temperature", "nan"], None),
            "temperature_inf": (["--temperature", "inf"], None),
            "temperature_negative": (["--temperature", "-1"], None),
            "top_p_nan": (["--temperature", "1", "--top-p", "nan"], None),
            "top_k_zero": (["--temperature", "1", "--top-k", "0"], None),
            "max_new_tokens_zero": (["--max-new-tokens", "0"], None),
            "dtype_bogus": (["--dtype", "float8"], None),
            "top_p_above_one": (["--top-p", "1.5"], "top-p"),
            "top_p_negative": (["--top-p=-0.5"], "top-p"),
            "max_new_tokens_str": (["--max-new-tokens", "x"], "--max-new-tokens"),
            "max_new_tokens_huge": (["--max-new-tokens", "100000000"], "max-new-tokens")}
for _n, (_extra, _text) in GENERATE.items():
    _error(f"generate_{_n}", lambda ctx, e=_extra: generate(ctx.hf, *e), _text)
_error("generate_source_missing", lambda ctx: generate("/nonexistent/run"), "nonexistent")

SWEEP = {"parallel_str": (["--parallel", "x"], "--parallel"),
         "executor_bogus": (["--executor", "bogus"], "--executor"),
         "on_change_bogus": (["--on-change", "maybe"], "--on-change"),
         "suggest_negative": (["--suggest=-3"], "suggest"),
         "set_tokens_str": (["--set", "train.tokens=abc"], "tokens")}
for _n, (_extra, _text) in SWEEP.items():
    _error(f"sweep_{_n}", lambda ctx, e=_extra: [
        "sweep", str(_spec(ctx)), "--out", str(ctx.fresh("sw")), "--dry-run", "--no-fit", *e],
        _text)
_error("sweep_spec_missing", lambda ctx: ["sweep", "/nonexistent/spec.yaml", "--dry-run"],
       "nonexistent")
_error("sweep_out_is_a_file", lambda ctx: [
    "sweep", str(_spec(ctx)), "--out", str(_file(ctx.fresh("f"), "x"))], "f")

DATA = {"num_proc_str": (["--num-proc", "x"], "--num-proc", "error"),
        "vocab_size_negative": (["--tokenizer", "train", "--vocab-size=-5"], "vocab", "error"),
        "train_without_vocab_size": (["--tokenizer", "train"], None, "either"),
        "source_missing": (None, "nonexistent", "error")}
for _n, (_extra, _text, _expect) in DATA.items():
    _error(f"data_{_n}", lambda ctx, e=_extra: [
        "data", "prepare", "/nonexistent/src" if e is None else str(ctx.corpus),
        "--out", str(ctx.fresh("store")), "--no-progress", "--num-proc", "1",
        *(e or ["--tokenizer", str(ctx.base / "tokenizer.json")])], _text, _expect)

PLAN = ["plan", "--model", "tiny-17k", "--mode", "data_parallel"]
PLAN_BAD = {"devices_negative": (["--devices=-2"], "devices"),
            "remat_bogus": (["--remat", "maybe"], "--remat"),
            "devices_zero": (["--devices", "0"], "devices"),
            "device_memory_garbage": (["--device-memory", "lots"], "device-memory"),
            "batch_zero": (["--batch", "0"], "batch"),
            "micro_batch_zero": (["--micro-batch", "0"], "micro"),
            "micro_batches_zero": (["--micro-batches", "0"], "micro"),
            "dtype_bogus": (["--dtype", "int3"], "int3"),
            "mesh_garbage": (["--mesh", "data=x"], "mesh"),
            "platform_bogus": (["--platform", "npu"], "npu"),
            "model_unknown": (["--model", "nope-1b"], "nope-1b")}
for _n, (_extra, _text) in PLAN_BAD.items():
    _error(f"plan_{_n}", lambda ctx, e=_extra: PLAN + e, _text)
