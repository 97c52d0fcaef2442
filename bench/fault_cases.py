"""The cases of bench/fault_campaign.py: a small trained run, damaged in one place per case,
and the checks of what must survive. Each case returns how to run it (see `run_case`)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
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

    def cgpt(self, argv: list[str], timeout: float = 1200) -> subprocess.CompletedProcess:
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
        ("only_identity_json_fresh", "ok",
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


def _gen(src, *extra):
    return ["generate", str(src), "def ", "--max-new-tokens", "4", *extra]


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


@case("either", "concurrent")  # the branch is refused; the launch after it must complete
def failed_branch_then_launch(ctx):
    d = ctx.fresh("out")
    return {"sequence": [ctx.train(d, "--branch-from", f"{ctx.base}@15"), ctx.train(d)],
            "after": ("complete", d)}


