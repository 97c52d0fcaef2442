"""Fault campaign (#23): run directories, checkpoints and loading, tried as a hostile user would.

Each case damages a copy of a small trained run (or Hugging Face export), runs one `cgpt`
command in a subprocess (some send it a signal, some start two at once) and classifies what
happened:

  ok        the command succeeded, and the case expected it to
  error     one clean `cgpt <cmd>: error: ...` line (or the preemption / interrupt line)
  TRACEBACK a Python traceback, or asyncio/TensorStore noise, or death by an unhandled signal
  ACCEPTED  bad input was accepted (exit 0 where the case expected a refusal)
  REFUSED   a valid request was refused
  LOST      results were lost or mislabelled (the case's own check, e.g. metrics cut short)

    PYTHONPATH=$PWD python bench/fault_campaign.py [--code DIR] [-k SUBSTRING] [--jobs 2]

`--code` runs another checkout's cgpt (e.g. the commit before the fixes) with the same cases.
Slow (~1-2 s of JAX start-up per case, a few seconds for the ones that train): not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

STEPS = 20
TRAIN = ["--model", "tiny-17k", "--no-progress", f"--tokens={8 * 16 * STEPS}",
         "train.batch_size=8", "train.log_every=1", "data.vocab_size=512", "data.seq_len=16",
         "data.val_sequences=16", "train.ckpt_every=5", "train.keep_checkpoints=3"]


@dataclass
class Ctx:
    root: Path
    code: Path
    corpus: Path = None
    cache: Path = None
    base: Path = None  # a finished run: checkpoints 10, 15, 20
    hf: Path = None  # its Hugging Face export
    n: object = field(default_factory=lambda: __import__('itertools').count(1))

    def env(self) -> dict:
        return {**os.environ, "PYTHONPATH": str(self.code), "JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": "", "HF_HUB_OFFLINE": "1"}

    def fresh(self, what: str) -> Path:
        return self.root / "cases" / f"{next(self.n):03d}-{what}"

    def run_copy(self, resumable: bool = True) -> Path:
        """A copy of the base run; `resumable`: as if killed after checkpoint 15."""
        d = self.fresh("run")
        shutil.copytree(self.base, d)
        if resumable:
            (d / "summary.json").unlink()
            shutil.rmtree(d / "checkpoints" / "20")
        return d

    def hf_copy(self) -> Path:
        d = self.fresh("hf")
        shutil.copytree(self.hf, d)
        return d

    def train(self, out: Path, *extra: str) -> list[str]:
        return ["train", "--data", str(self.corpus), "--out", str(out), *TRAIN,
                f"data.cache_dir={self.cache}", *extra]

    def cgpt(self, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cgpt", *argv], env=self.env(),
                              capture_output=True, text=True, timeout=timeout, cwd=self.root)


@dataclass
class Case:
    name: str
    expect: str  # "ok", "error" or "either"
    make: Callable[[Ctx], dict]
    group: str = ""


CASES: list[Case] = []


def case(expect: str, group: str):
    def deco(f):
        CASES.append(Case(f.__name__, expect, f, group))
        return f
    return deco


# ---- checks: what must still be there afterwards ------------------------------------------
def _lines(p: Path) -> list[str]:
    return p.read_bytes().decode(errors="replace").splitlines() if p.is_file() else []


def _steps(d: Path) -> list[int]:
    c = d / "checkpoints"
    return sorted(int(p.name) for p in c.iterdir() if p.name.isdigit()) if c.is_dir() else []


def untouched(d: Path) -> Callable[[], str | None]:
    """The run's log and checkpoints are exactly as before the command."""
    lines, steps = _lines(d / "metrics.jsonl"), _steps(d)

    def check():
        now, st = _lines(d / "metrics.jsonl"), _steps(d)
        if now != lines:
            return f"metrics.jsonl changed: {len(lines)} -> {len(now)} lines"
        if st != steps:
            return f"checkpoints changed: {steps} -> {st}"
        return None
    return check


def strict(text: str) -> object:
    def bad(c):
        raise ValueError(f"{c} is not JSON")
    return json.loads(text, parse_constant=bad)


def complete(d: Path) -> Callable[[], str | None]:
    """A finished run: a strict summary, and one log line per step 1..STEPS."""
    def check():
        try:
            strict((d / "summary.json").read_text())
            steps = [strict(x)["step"] for x in _lines(d / "metrics.jsonl")]
        except (OSError, ValueError) as e:
            return f"unreadable result: {e}"
        if steps != list(range(1, STEPS + 1)):
            return f"metrics.jsonl steps {steps[:3]}..{steps[-3:]} ({len(steps)} lines)"
        return None
    return check


def strict_stdout(res) -> str | None:
    try:
        strict(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else None
    except ValueError as e:
        return f"stdout is not strict JSON: {e}"
    return None


# ---- cases: run-directory files (train --resume / fresh launch) ---------------------------
def _resume(ctx, damage, *extra, fresh=False, expect_complete=False):
    d = ctx.run_copy()
    damage(d)
    if expect_complete:
        check = complete(d)
    else:  # refused: nothing changed; finished anyway: a complete, strict result
        same = untouched(d)
        check = lambda: complete(d)() if (d / "summary.json").exists() else same()  # noqa: E731
    return {"argv": ctx.train(d, *(() if fresh else ("--resume",)), *extra), "check": check}


def _write(name, data):
    def damage(d):
        p = d / name
        if isinstance(data, bytes):
            p.write_bytes(data)
        else:
            p.write_text(data)
    return damage


def _unlink(name):
    return lambda d: (d / name).unlink()


def _to_dir(name):
    def damage(d):
        p = d / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
        p.mkdir()
        (p / "x").write_text("x")
    return damage


def _to_file(name):
    def damage(d):
        p = d / name
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        p.write_text("not a directory\n")
    return damage


def _metrics_line(i, text):
    def damage(d):
        p = d / "metrics.jsonl"
        lines = p.read_text().splitlines()
        lines[i] = text
        p.write_text("".join(x + "\n" for x in lines))
    return damage


def _register_rundir_cases():
    specs = [
        # config.yaml
        ("config_deleted_resume_same_flags", "error", _unlink("config.yaml"), (), False),
        ("config_deleted_resume_new_lr", "error", _unlink("config.yaml"), ("train.peak_lr=1e-2",), False),
        ("config_deleted_resume_new_tokens", "error", _unlink("config.yaml"), ("--tokens=5120",), False),
        ("config_deleted_fresh_launch", "error", _unlink("config.yaml"), (), True),
        ("config_and_checkpoints_deleted_fresh", "error",
         lambda d: (_unlink("config.yaml")(d), shutil.rmtree(d / "checkpoints")), (), True),
        ("only_identity_json_fresh", "error",
         lambda d: ([shutil.rmtree(p) if p.is_dir() else p.unlink() for p in d.iterdir()],
                    (d / "identity.json").write_text("{}")), (), True),
        ("config_empty_resume", "error", _write("config.yaml", ""), (), False),
        ("config_binary_resume", "error", _write("config.yaml", b"\x89PNG\x00\xff\xfe"), (), False),
        ("config_list_resume", "error", _write("config.yaml", "- 1\n- 2\n"), (), False),
        ("config_no_model_resume", "error", _write("config.yaml", "preset: tiny-17k\n"), (), False),
        ("config_bad_key_resume", "error",
         _write("config.yaml", "preset: tiny-17k\nmodel: {d_model: banana}\n"), (), False),
        ("config_is_dir_resume", "error", _to_dir("config.yaml"), (), False),
        ("config_is_dir_fresh", "error", _to_dir("config.yaml"), (), True),
        # metrics.jsonl
        ("metrics_garbage_middle_resume", "error", _metrics_line(3, "}{garbage"), (), False),
        ("metrics_non_object_resume", "error", _metrics_line(3, "[1, 2]"), (), False),
        ("metrics_number_line_resume", "error", _metrics_line(3, "42"), (), False),
        ("metrics_string_step_resume", "error", _metrics_line(3, '{"step": "four"}'), (), False),
        ("metrics_no_step_resume", "error", _metrics_line(3, '{"loss": 1.0}'), (), False),
        ("metrics_deleted_resume", "error", _unlink("metrics.jsonl"), (), False),
        ("metrics_is_dir_resume", "error", _to_dir("metrics.jsonl"), (), False),
        ("metrics_binary_resume", "error", _write("metrics.jsonl", b"\xff\xfe\x00garbage\n"), (), False),
        ("metrics_nan_literal_resume", "error", _metrics_line(3, '{"step": 4, "loss": NaN}'), (), False),
        # files and directories of the wrong kind
        ("checkpoints_is_file_resume", "error", _to_file("checkpoints"), (), False),
        ("checkpoints_is_file_fresh", "error",
         lambda d: [shutil.rmtree(p) if p.is_dir() else p.unlink() for p in d.iterdir()]
         and _to_file("checkpoints")(d), (), True),
        ("events_is_file_resume", "error", _to_file("events"), (), False),
        ("lock_is_dir_resume", "error", _to_dir(".lock"), (), False),
        ("config_changes_garbage_resume", "error", _write("config_changes.json", "{oops"), (), False),
        ("config_changes_dict_resume", "error", _write("config_changes.json", '{"a": 1}'), (), False),
        ("summary_garbage_resume", "error",
         lambda d: (d / "summary.json").write_text("{not json"), (), False),
        ("checkpoint_step_is_file_resume", "either",
         lambda d: (d / "checkpoints" / "25").write_text("x"), (), False),
        ("discarded_is_file_from_step", "error", _to_file("discarded_checkpoints"),
         ("--from-step", "10"), False),
        ("corrupt_dir_is_file_on_fallback", "error",
         lambda d: (_to_file("corrupt_checkpoints")(d),
                    [f.write_bytes(b"\0" * f.stat().st_size) for f in
                     (d / "checkpoints" / "15" / "params").rglob("ocdbt.process_0/d/*")]),
         (), False),
    ]
    for name, expect, damage, extra, fresh in specs:
        def make(ctx, damage=damage, extra=extra, fresh=fresh):
            return _resume(ctx, damage, *extra, fresh=fresh)
        CASES.append(Case(name, expect, make, "rundir"))


_register_rundir_cases()


@case("ok", "rundir")
def metrics_torn_last_line_resume(ctx):
    return _resume(ctx, lambda d: (d / "metrics.jsonl").open("a").write('{"step": 21, "lo'),
                   expect_complete=True)


@case("ok", "rundir")
def metrics_emptied_resume(ctx):
    """An empty log is the documented way to accept a lost curve (the window is ahead)."""
    d = ctx.run_copy()
    (d / "metrics.jsonl").write_text("")

    def check():
        steps = [strict(x)["step"] for x in _lines(d / "metrics.jsonl")]
        return None if steps == list(range(16, STEPS + 1)) else f"log steps {steps}"
    return {"argv": ctx.train(d, "--resume"), "check": check}


@case("ok", "rundir")
def latest_checkpoint_corrupt_falls_back(ctx):
    def damage(d):
        for f in (d / "checkpoints" / "15" / "params").rglob("ocdbt.process_0/d/*"):
            f.write_bytes(b"\0" * f.stat().st_size)
    return _resume(ctx, damage, expect_complete=True)


@case("error", "rundir")
def all_checkpoints_corrupt_resume(ctx):
    def damage(d):
        for f in (d / "checkpoints").rglob("ocdbt.process_0/d/*"):
            f.write_bytes(b"\0" * f.stat().st_size)
    return _resume(ctx, damage)


@case("ok", "rundir")
def stale_lock_file_resume(ctx):
    return _resume(ctx, _write(".lock", "12345@nowhere\n"), expect_complete=True)


@case("ok", "rundir")
def tokenizer_deleted_resume(ctx):
    return _resume(ctx, _unlink("tokenizer.json"), expect_complete=True)


@case("error", "rundir")
def tokenizer_garbage_resume(ctx):
    return _resume(ctx, _write("tokenizer.json", "{not json"))


# ---- cases: loading (cgpt generate / eval) ------------------------------------------------
def _gen(src, *extra):
    return ["generate", str(src), "def ", "--max-new-tokens", "4", *extra]


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


# ---- cases: signals at every phase --------------------------------------------------------
def _signal_case(name, sig, delay, resumable, expect="either"):
    def make(ctx):
        d = ctx.run_copy() if resumable else ctx.fresh("out")
        return {"argv": ctx.train(d, *(("--resume",) if resumable else ())),
                "signal": (sig, delay), "after": ("resume", d)}
    CASES.append(Case(name, expect, make, "signals"))


for _sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
    for _delay in (0.3, 1.5, 4.0):
        _signal_case(f"{_sig.name}_at_{_delay}s_fresh", _sig, _delay, False)
    _signal_case(f"{_sig.name}_at_3s_resume", _sig, 3.0, True)


# ---- cases: concurrency ------------------------------------------------------------------
@case("either", "concurrent")
def two_fresh_launches_same_out(ctx):
    d = ctx.fresh("out")
    return {"parallel": [ctx.train(d), ctx.train(d)], "after": ("complete", d)}


@case("either", "concurrent")
def two_resumes_same_out(ctx):
    d = ctx.run_copy()
    return {"parallel": [ctx.train(d, "--resume"), ctx.train(d, "--resume")],
            "after": ("complete", d)}


@case("either", "concurrent")
def load_while_training(ctx):
    d = ctx.fresh("out")
    return {"parallel": [ctx.train(d, f"--tokens={8 * 16 * 200}", "train.ckpt_every=1")]
            + [_gen(d)] * 3, "stagger": 25.0}


@case("ok", "concurrent")
def failed_branch_then_launch(ctx):
    d = ctx.fresh("out")
    return {"sequence": [ctx.train(d, "--branch-from", f"{ctx.base}@15"), ctx.train(d)],
            "after": ("complete", d)}


# what a case's error must name (else MISLEADING): the damaged file, or the reason
NAMES = {"config_binary_resume": "config.yaml", "summary_garbage_resume": "summary.json",
         "load_run_checkpoints_is_file": "checkpoints", "load_run_config_binary": "config.yaml",
         "load_run_tokenizer_garbage": "tokenizer", "hf_config_binary": "config.json",
         "config_flag_binary": "cfg", "hf_index_absolute_path": "outside",
         "hf_index_symlink_escape": "outside", "hf_index_parent_path": "outside",
         "load_run_nan_weights_generate": "NaN", "hf_nan_tensor_generate": "NaN",
         "metrics_garbage_middle_resume": "line 4", "metrics_deleted_resume": "metrics.jsonl",
         "config_deleted_resume_same_flags": "config.yaml", "d_model_absurd": "d_model",
         "config_changes_garbage_resume": "config_changes.json",
         "tokenizer_garbage_resume": "tokenizer.json"}


# ---- running and classifying --------------------------------------------------------------
def _noise(err: str) -> bool:
    return any(s in err for s in ("Traceback", "Event loop is closed", "Exception ignored",
                                  "never retrieved"))


def _clean_line(res) -> bool:
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    return bool(lines) and lines[-1].startswith("cgpt ") and (
        ": error:" in lines[-1] or "stopped by" in lines[-1] or "interrupted" in lines[-1])


def classify(expect: str, results: list, check: str | None) -> tuple[str, str]:
    if check:
        return "LOST", check
    for r in results:
        if _noise(r.stderr) or r.returncode < 0 or (r.returncode not in (0,) and not _clean_line(r)):
            tail = (r.stderr.strip().splitlines() or [f"rc={r.returncode}"])[-1]
            return "TRACEBACK", f"rc={r.returncode} {tail[:160]}"
    ok = all(r.returncode == 0 for r in results)
    last = [x for x in results[-1].stderr.splitlines() if x.strip()]
    msg = last[-1][:200] if last else ""
    if expect == "error" and ok:
        return "ACCEPTED", "exit 0"
    if expect == "ok" and not ok:
        return "REFUSED", msg
    return ("ok" if ok else "error"), msg


def run_case(ctx: Ctx, c: Case) -> tuple[str, str, str]:
    try:
        spec = c.make(ctx)
    except Exception as e:  # noqa: BLE001 - a broken setup is reported, not fatal
        return c.name, "SETUP", repr(e)
    results = []
    if "argv" in spec and "signal" in spec:
        sig, delay = spec["signal"]
        p = subprocess.Popen([sys.executable, "-m", "cgpt", *spec["argv"]], env=ctx.env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ctx.root)
        time.sleep(delay)
        p.send_signal(sig)
        out, err = p.communicate(timeout=300)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    elif "argv" in spec:
        results.append(ctx.cgpt(spec["argv"]))
    elif "parallel" in spec:
        procs = []
        for argv in spec["parallel"]:
            procs.append(subprocess.Popen([sys.executable, "-m", "cgpt", *argv], env=ctx.env(),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, cwd=ctx.root))
            time.sleep(spec.get("stagger", 0) if len(procs) == 1 else 0.5)
        for p in procs:
            out, err = p.communicate(timeout=600)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    else:
        for argv in spec["sequence"]:
            results.append(ctx.cgpt(argv))
    check = None
    if spec.get("check"):
        check = spec["check"]()
    if not check and spec.get("stdout_check"):
        check = spec["stdout_check"](results[-1])
    after = spec.get("after")
    if not check and after and after[0] == "resume":  # a stopped run must finish on --resume
        d = after[1]
        if (d / "config.yaml").exists():
            r = ctx.cgpt(ctx.train(d, "--resume"))
            check = (f"resume after the signal failed: {r.stderr.strip()[-200:]}"
                     if r.returncode else complete(d)())
    if not check and after and after[0] == "complete":
        check = complete(after[1])()
    text = spec.get("expect_text") or NAMES.get(c.name)
    if not check and text and all(r.returncode for r in results):
        if text not in results[-1].stderr:
            check = f"message does not name {text!r}"
            return c.name, "MISLEADING", check
    return (c.name, *classify(c.expect, results, check))


def setup(ctx: Ctx) -> None:
    ctx.corpus = ctx.root / "corpus"
    ctx.corpus.mkdir(parents=True)
    lib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py"):
        shutil.copy(lib / name, ctx.corpus / name)
    ctx.cache = ctx.root / "cache"
    ctx.base, ctx.hf = ctx.root / "base", ctx.root / "hf"
    r = ctx.cgpt(ctx.train(ctx.base))
    if r.returncode:
        sys.exit(f"setup: the base run failed:\n{r.stderr}")
    code = "import sys, cgpt; cgpt.save_hf(cgpt.load(sys.argv[1]), sys.argv[2])"
    subprocess.run([sys.executable, "-c", code, str(ctx.base), str(ctx.hf)], env=ctx.env(),
                   check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", default=str(Path(__file__).resolve().parents[1]),
                    help="the checkout whose cgpt runs the cases")
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", help="write the per-case outcomes here")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cgpt-campaign-"))
    ctx = Ctx(root=root, code=Path(args.code).resolve())
    setup(ctx)
    cases = [c for c in CASES if any(k in c.name for k in args.k.split(","))]
    rows: list = []
    counts: dict[str, int] = {}
    with ThreadPoolExecutor(args.jobs) as pool:
        for (name, outcome, msg), c in zip(pool.map(lambda c: run_case(ctx, c), cases), cases):
            rows.append((name, outcome, msg))
            counts[outcome] = counts.get(outcome, 0) + 1
            print(f"{outcome:10s} {c.group:10s} {name:40s} {msg}", flush=True)
    print(json.dumps({"cases": len(rows), **counts}))
    if args.json:
        Path(args.json).write_text(json.dumps([dict(zip(("name", "outcome", "msg"), r))
                                               for r in rows], indent=1))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
