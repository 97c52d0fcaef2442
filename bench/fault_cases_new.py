"""The second campaign's cases (#23 follow-up) for bench/fault_campaign.py: a wrong type or value
for every CLI flag of train/eval/generate/sweep/data/plan, signals at every phase of `cgpt train`
found by what the process did (not by timing), bad files in more places of a run directory,
concurrent launches on one data cache, and the analysis functions' arguments. Groups: flags,
phases, rundir2, concurrent2, analysis (select with -k)."""
from __future__ import annotations

import json
import shutil
import signal
import sys
from pathlib import Path

import yaml

from fault_cases import CASES, Case, _gen, _resume, _to_dir, _write, complete

SPEC = {"name": "camp", "base": {"preset": "tiny-17k", "data": {"vocab_size": 512, "seq_len": 16},
                                 "train": {"batch_size": 4, "tokens": 640}},
        "grid": {"model": ["tiny-17k"], "seed": [0]}}


def _add(name, expect, group, make, text=None):
    def mk(ctx):
        spec = make(ctx)
        if text:
            spec["expect_text"] = text
        return spec
    CASES.append(Case(name, expect, mk, group))


# ---- flags: every command's flags with a wrong type or value ---------------------------------
TRAIN_BAD = {  # name -> (extra argv, what the error must name)
    "tokens_abc": (["--tokens", "abc"], "tokens"), "tokens_negative": (["--tokens=-5"], "tokens"),
    "tokens_zero": (["--tokens", "0"], "tokens"), "tokens_nan": (["--tokens", "nan"], "tokens"),
    "tokens_inf": (["--tokens", "inf"], "tokens"),
    "mesh_garbage": (["--mesh", "data=x"], "mesh"), "mesh_unknown_axis": (["--mesh", "foo=2"], "foo"),
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
    "peak_lr_nan": (["train.peak_lr=nan"], "peak_lr"), "peak_lr_negative": (["train.peak_lr=-1"], "peak_lr"),
    "peak_lr_list": (["train.peak_lr=[1,2]"], "peak_lr"),
    "seq_len_zero": (["data.seq_len=0"], "seq_len"), "n_layer_zero": (["model.n_layer=0"], "n_layer"),
    "log_every_zero": (["train.log_every=0"], "log_every"),
    "ckpt_every_negative": (["train.ckpt_every=-1"], "ckpt_every"),
    "keep_checkpoints_zero": (["train.keep_checkpoints=0"], "keep_checkpoints"),
    "checkpoint_minutes_negative": (["train.checkpoint_minutes=-1"], "checkpoint_minutes"),
    "val_sequences_negative": (["data.val_sequences=-1"], "val_sequences"),
    "unknown_train_key": (["train.nonsense=1"], "nonsense"),
    "unknown_model_key": (["model.nonsense=1"], "nonsense"),
    "warmup_steps_negative": (["train.warmup_steps=-3"], "warmup_steps"),
    "weight_decay_str": (["train.weight_decay=lots"], "weight_decay"),
    "train_mode_override_bogus": (["train.mode=bogus"], "bogus"),
    "device_memory_garbage": (["train.device_memory=lots"], "device_memory"),
    "compute_dtype_bogus": (["model.compute_dtype=int3"], "int3"),
    "data_vocab_size_zero": (["data.vocab_size=0"], "vocab_size"),
    "clip_norm_negative": (["train.clip_norm=-1"], "clip_norm"),
}
for _n, (_extra, _text) in TRAIN_BAD.items():
    _add(f"train_{_n}", "error", "flags2",
         lambda ctx, e=_extra: {"argv": ctx.train(ctx.fresh("out"), *e)}, _text)

_add("train_override_empty_value_is_null", "either", "flags2",  # key= is YAML null: the default
     lambda ctx: {"argv": ctx.train(ctx.fresh("out"), "train.warmup_steps=")})
_add("train_out_is_a_file", "error", "flags2", lambda ctx: {"argv": ctx.train(
    _file(ctx.fresh("file"), "x"))}, "file")
_add("train_from_step_negative_resume", "error", "flags2", lambda ctx: {"argv": ctx.train(
    ctx.run_copy(), "--resume", "--from-step=-5")}, "-5")


def _file(p: Path, text: str) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def _eval(ctx, *extra, src=None):
    return ["eval", str(src or ctx.base), "--data", str(ctx.corpus), "--sequences", "4", *extra]


EVAL_BAD = {"limit_negative": (["--tasks", "hellaswag", "--limit=-1"], "limit"),
            "num_fewshot_negative": (["--tasks", "hellaswag", "--num-fewshot=-2"], "fewshot"),
            "bootstrap_negative": (["--tasks", "hellaswag", "--bootstrap-iters=-1"], "bootstrap"),
            "dtype_bogus": (["--dtype", "int7"], "int7"),
            "data_missing": (["--data", "/nonexistent/corpus"], "nonexistent"),
            "sequences_str": (["--sequences", "x"], "--sequences")}
for _n, (_extra, _text) in EVAL_BAD.items():
    _add(f"eval_{_n}", "error", "flags2", lambda ctx, e=_extra: {"argv": _eval(ctx, *e)}, _text)
_add("eval_source_missing", "error", "flags2",
     lambda ctx: {"argv": _eval(ctx, src="/nonexistent/run")}, "nonexistent")
_add("eval_data_empty_dir", "error", "flags2", lambda ctx: {"argv": _eval(
    ctx, "--data", str(_mk(ctx.fresh("empty"))))}, "empty")


def _mk(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


GEN_BAD = {"max_new_tokens_negative": (["--max-new-tokens=-1"], "max-new-tokens"),
           "top_k_negative": (["--top-k=-1"], "top-k"), "top_p_zero": (["--top-p", "0"], "top-p"),
           "top_p_above_one": (["--top-p", "1.5"], "top-p"),
           "top_p_negative": (["--top-p=-0.5"], "top-p"),
           "max_new_tokens_str": (["--max-new-tokens", "x"], "--max-new-tokens"),
           "max_new_tokens_huge": (["--max-new-tokens", "100000000"], "max-new-tokens")}
for _n, (_extra, _text) in GEN_BAD.items():
    _add(f"generate_{_n}", "error", "flags2",
         lambda ctx, e=_extra: {"argv": _gen(ctx.base, *e)}, _text)
_add("generate_source_missing", "error", "flags2",
     lambda ctx: {"argv": _gen("/nonexistent/run")}, "nonexistent")


def _spec(ctx) -> Path:
    p = ctx.root / "camp_spec.yaml"
    if not p.exists():
        p.write_text(yaml.safe_dump(SPEC))
    return p


SWEEP_BAD = {"parallel_zero": (["--parallel", "0"], "parallel"),
             "parallel_negative": (["--parallel=-2"], "parallel"),
             "parallel_str": (["--parallel", "x"], "--parallel"),
             "executor_bogus": (["--executor", "bogus"], "--executor"),
             "on_change_bogus": (["--on-change", "maybe"], "--on-change"),
             "suggest_zero": (["--suggest", "0"], "suggest"),
             "suggest_negative": (["--suggest=-3"], "suggest"),
             "target_flops_negative": (["--suggest", "2", "--target-flops=-1e18"], "target"),
             "budget_flops_zero": (["--suggest", "2", "--budget-flops", "0"], "budget"),
             "set_tokens_str": (["--set", "train.tokens=abc"], "tokens")}
for _n, (_extra, _text) in SWEEP_BAD.items():
    _add(f"sweep_{_n}", "error", "flags2", lambda ctx, e=_extra: {"argv": [
        "sweep", str(_spec(ctx)), "--out", str(ctx.fresh("sw")), "--dry-run", "--no-fit", *e]},
        _text)
_add("sweep_spec_missing", "error", "flags2", lambda ctx: {"argv": [
    "sweep", "/nonexistent/spec.yaml", "--dry-run"]}, "nonexistent")
_add("sweep_out_is_a_file", "error", "flags2", lambda ctx: {"argv": [
    "sweep", str(_spec(ctx)), "--out", str(_file(ctx.fresh("f"), "x"))]}, "f")

DATA_BAD = {"num_proc_str": (["--num-proc", "x"], "--num-proc"),
            "vocab_size_one": (["--tokenizer", "train", "--vocab-size", "1"], "vocab"),
            "vocab_size_negative": (["--tokenizer", "train", "--vocab-size=-5"], "vocab"),
            "train_without_vocab_size": (["--tokenizer", "train"], "either"),
            "source_missing": (None, "nonexistent")}
for _n, (_extra, _text) in DATA_BAD.items():
    _add(f"data_{_n}", "either" if _text == "either" else "error", "flags2",
         lambda ctx, e=_extra: {"argv": [
             "data", "prepare", "/nonexistent/src" if e is None else str(ctx.corpus),
             "--out", str(ctx.fresh("store")), "--no-progress", "--num-proc", "1",
             *(e or ["--tokenizer", str(ctx.base / "tokenizer.json")])]},
         None if _text == "either" else _text)

PLAN = ["plan", "--model", "tiny-17k", "--mode", "data_parallel"]
PLAN_BAD = {"devices_negative": (["--devices=-2"], "devices"),
            "remat_bogus": (["--remat", "maybe"], "--remat"),
            "devices_zero": (["--devices", "0"], "devices"),
            "device_memory_garbage": (["--device-memory", "lots"], "device-memory"),
            "batch_zero": (["--batch", "0"], "batch"), "micro_batch_zero": (["--micro-batch", "0"], "micro"),
            "micro_batches_zero": (["--micro-batches", "0"], "micro"),
            "seq_len_zero": (["--seq-len", "0"], "seq-len"), "dtype_bogus": (["--dtype", "int3"], "int3"),
            "mesh_garbage": (["--mesh", "data=x"], "mesh"), "platform_bogus": (["--platform", "npu"], "npu"),
            "model_unknown": (["--model", "nope-1b"], "nope-1b")}
for _n, (_extra, _text) in PLAN_BAD.items():
    _add(f"plan_{_n}", "error", "flags2", lambda ctx, e=_extra: {"argv": PLAN + e}, _text)


# ---- phases: a signal once the process has done something (not after a fixed delay) ---------
def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


PHASES = {  # name -> (pid, stderr so far, run dir) -> ready
    "jax_loading": lambda pid, err, d: "/jaxlib/" in _maps(pid),
    "placement": lambda pid, err, d: "tiny-17k:" in err,
    "config_written": lambda pid, err, d: (d / "config.yaml").exists(),
    "first_checkpoint": lambda pid, err, d: (d / "checkpoints" / "5").exists(),
    "checkpoint_saving": lambda pid, err, d: any("tmp" in p.name for p in (d / "checkpoints").glob(
        "*")) if (d / "checkpoints").is_dir() else False,
    "last_checkpoint": lambda pid, err, d: (d / "checkpoints" / "20").exists(),
    "summary_written": lambda pid, err, d: (d / "summary.json").exists(),
}
for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    for _ph in PHASES:
        _add(f"{_sig.name}_when_{_ph}", "either", "phases", lambda ctx, s=_sig, ph=_ph: (
            lambda d: {"argv": ctx.train(d, "train.ckpt_every=5"), "signals": [(s, PHASES[ph])],
                       "after": ("resume", d)})(ctx.fresh("out")))
for _ph in ("placement", "first_checkpoint"):
    _add(f"SIGUSR2_when_{_ph}", "either", "phases", lambda ctx, ph=_ph: (
        lambda d: {"argv": ctx.train(d), "signals": [(signal.SIGUSR2, PHASES[ph])],
                   "after": ("resume", d)})(ctx.fresh("out")))
_add("SIGUSR1_repeated_every_second_at_placement", "either", "phases", lambda ctx: (
    lambda d: {"argv": ctx.train(d), "signals": [(signal.SIGUSR1, PHASES["placement"])]
               + [(signal.SIGUSR1, 1.0)] * 4, "after": ("resume", d)})(ctx.fresh("out")))
_add("SIGUSR1_repeated_every_second_in_loop", "either", "phases", lambda ctx: (
    lambda d: {"argv": ctx.train(d), "signals": [(signal.SIGUSR1, PHASES["first_checkpoint"])]
               + [(signal.SIGUSR1, 1.0)] * 4, "after": ("resume", d)})(ctx.fresh("out")))
_add("SIGINT_twice_in_loop", "either", "phases", lambda ctx: (
    lambda d: {"argv": ctx.train(d), "signals": [(signal.SIGINT, PHASES["first_checkpoint"]),
                                                 (signal.SIGINT, 0.2)],
               "after": ("resume", d)})(ctx.fresh("out")))
_add("SIGTERM_then_SIGINT_at_placement", "either", "phases", lambda ctx: (
    lambda d: {"argv": ctx.train(d), "signals": [(signal.SIGTERM, PHASES["placement"]),
                                                 (signal.SIGINT, 0.1)],
               "after": ("resume", d)})(ctx.fresh("out")))
_add("SIGINT_to_group_while_preparing_data", "either", "phases", lambda ctx: (
    lambda d: {"argv": ctx.train(d, f"data.cache_dir={ctx.fresh('cache')}"), "group": True,
               "signals": [(signal.SIGINT, PHASES["placement"])],
               "after": ("resume", d)})(ctx.fresh("out")))
_add("SIGINT_resume_at_placement", "either", "phases", lambda ctx: (
    lambda d: {"argv": ctx.train(d, "--resume"), "signals": [(signal.SIGINT, PHASES["placement"])],
               "after": ("resume", d)})(ctx.run_copy()))


# ---- rundir2: bad files in places of a run directory the first campaign left out -------------
def _ckpt(sub: str, data):
    def damage(d):
        p = d / "checkpoints" / sub
        p.parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            p.mkdir()
        else:
            p.write_bytes(data)
    return damage


def _truncate_meta(d):
    for p in (d / "checkpoints" / "15").rglob("_CHECKPOINT_METADATA"):
        p.write_bytes(p.read_bytes()[:5])


def _empty_latest(d):
    shutil.rmtree(d / "checkpoints" / "15")
    (d / "checkpoints" / "15").mkdir()


RUNDIR2 = {"events_garbage_file": (_write("events/garbage", b"\x00\xff" * 50), True),
           "checkpoint_dir_named_abc": (_ckpt("abc", None), True),
           "checkpoint_stray_file": (_ckpt("notes.txt", b"x"), True),
           "checkpoint_metadata_truncated": (_truncate_meta, True),
           "checkpoint_latest_empty_dir": (_empty_latest, True),
           "lock_garbage_content": (_write(".lock", b"\xff\xfe garbage"), True),
           "identity_garbage": (_write("identity.json", b"\x00{"), False),
           "tokenizer_is_dir": (_to_dir("tokenizer.json"), False),
           "summary_is_dir": (_to_dir("summary.json"), False),
           "config_changes_is_dir": (_to_dir("config_changes.json"), False),
           "config_yaml_bom": (lambda d: (d / "config.yaml").write_bytes(
               b"\xef\xbb\xbf" + (d / "config.yaml").read_bytes()), False),
           "config_yaml_alias_bomb": (_write("config.yaml", "a: &a [x,x,x,x,x,x,x,x,x]\n" + "\n".join(
               f"a{i}: &a{i} [{', '.join(['*a' if i == 1 else f'*a{i - 1}'] * 9)}]"
               for i in range(1, 9)) + "\n"), False)}
for _n, (_damage, _complete) in RUNDIR2.items():
    _add(f"rundir2_{_n}_resume", "ok" if _complete else "either", "rundir2",
         lambda ctx, dm=_damage, c=_complete: _resume(ctx, dm, expect_complete=c))


# ---- concurrent2: launches that share a data cache or a run ---------------------------------
def _concurrent_cache(ctx):
    cache, a, b = ctx.fresh("cache"), ctx.fresh("out"), ctx.fresh("out")
    return {"parallel": [ctx.train(a, f"data.cache_dir={cache}"),
                         ctx.train(b, f"data.cache_dir={cache}")],
            "check": lambda: complete(a)() or complete(b)()}


_add("two_trains_prepare_one_cache", "ok", "concurrent2", _concurrent_cache)
_add("eval_while_training", "either", "concurrent2", lambda ctx: (lambda d: {
    "parallel": [ctx.train(d, f"--tokens={8 * 16 * 200}", "train.ckpt_every=1")]
    + [_eval(ctx, src=d)] * 2, "stagger": 25.0})(ctx.fresh("out")))
_add("resume_and_fresh_same_out", "either", "concurrent2", lambda ctx: (lambda d: {
    "parallel": [ctx.train(d, "--resume"), ctx.train(d)], "after": ("complete", d)})(
    ctx.run_copy()))


# ---- analysis: function arguments (one ValueError naming the argument, never a traceback) ----
X = "[1e17, 3e17, 1e18, 3e18, 1e19]"
Y = "[3.2, 3.0, 2.8, 2.65, 2.5]"
ANALYSIS = {
    "fit_level_95": (f"fit_power_law({X}, {Y}, level=95, n_boot=5)", "level"),
    "fit_level_zero": (f"fit_power_law({X}, {Y}, level=0, n_boot=5)", "level"),
    "fit_n_boot_float": (f"fit_power_law({X}, {Y}, n_boot=10.5)", "n_boot"),
    "fit_x_strings": (f"fit_power_law(['a','b','c','d','e'], {Y}, n_boot=5)", "x"),
    "fit_y_nan": (f"fit_power_law({X}, [3.2, float('nan'), 2.8, 2.65, 2.5], n_boot=5)", "y"),
    "fit_length_mismatch": (f"fit_power_law({X}, [3.2, 3.0], n_boot=5)", "x"),
    "fit_space_bogus": (f"fit_power_law({X}, {Y}, space='cubic', n_boot=5)", "space"),
    "fit_delta_negative": (f"fit_power_law({X}, {Y}, delta=-1, n_boot=5)", "delta"),
    "fit_groups_wrong_length": (f"fit_power_law({X}, {Y}, groups=[1, 2], n_boot=5)", "groups"),
    "fit_x_negative": (f"fit_power_law([-1, 2, 3, 4, 5], {Y}, n_boot=5)", "x"),
    "chinchilla_n_negative": ("fit_chinchilla([-1e6, 2e6, 3e6], [1e8, 2e8, 3e8], [3, 2.9, 2.8], "
                              "n_boot=5)", "N"),
    "chinchilla_n_boot_negative": ("fit_chinchilla([1e6, 2e6, 3e6], [1e8, 2e8, 3e8], "
                                   "[3, 2.9, 2.8], n_boot=-1)", "n_boot"),
    "load_results_binary": ("load_results(_bin())", "results"),
    "load_results_empty": ("load_results(_empty())", "results"),
    "load_results_directory": ("load_results(_dir())", "results"),
    "isoflop_missing_column": ("fit_isoflop(__import__('pandas').DataFrame({'N': [1, 2]}))", "D"),
    "lr_optimum_window_zero": ("lr_optimum([1e-3, 2e-3, 4e-3], [3.0, 2.9, 3.1], window=0)",
                               "window"),
    "extrapolation_holdout_zero": (f"extrapolation_check({X}, {Y}, n_holdout=0, n_boot=5)",
                                   "n_holdout"),
    "extrapolation_holdout_all": (f"extrapolation_check({X}, {Y}, n_holdout=5, n_boot=5)",
                                  "n_holdout"),
}
PRELUDE = """
import sys, os, tempfile
from analysis import *
def _bin():
    p = tempfile.mktemp(suffix='.csv'); open(p, 'wb').write(os.urandom(500)); return p
def _empty():
    p = tempfile.mktemp(suffix='.csv'); open(p, 'wb').close(); return p
def _dir():
    return tempfile.mkdtemp()
try:
    {call}
except (ValueError, TypeError, OSError) as e:
    print(f"cgpt analysis: error: {{e}}".splitlines()[0], file=sys.stderr); sys.exit(2)
"""
for _n, (_call, _text) in ANALYSIS.items():
    _add(f"analysis_{_n}", "error", "analysis",
         lambda ctx, c=_call: {"python": PRELUDE.replace("{call}", c).replace("{{", "{")
                               .replace("}}", "}")}, _text)


def count() -> dict[str, int]:
    """Cases per group (this module's)."""
    out: dict[str, int] = {}
    for c in CASES:
        if c.group in ("flags2", "phases", "rundir2", "concurrent2", "analysis"):
            out[c.group] = out.get(c.group, 0) + 1
    return out


if __name__ == "__main__":
    print(json.dumps(count()), file=sys.stdout)
