"""What every case shares: the workspace, the command line of a small run, the fixtures a case
damages a copy of (built once, on first use, so `--only` pays only for what it selects), and
the checks of what must survive a command."""
from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Callable

STEPS = 20
TRAIN = ["--model", "tiny-17k", "--no-progress", f"--tokens={8 * 16 * STEPS}",
         "train.batch_size=8", "train.log_every=1", "data.vocab_size=512", "data.seq_len=16",
         "data.val_sequences=16", "train.ckpt_every=5", "train.keep_checkpoints=3"]
INJECT = Path(__file__).resolve().parent / "inject"  # the fault injector (a sitecustomize)
TAG = "CGPT_QA_CASE"  # every command a case starts carries TAG=<case number>: its processes


class Ctx:
    """One campaign's workspace under `root`, running the cgpt of the checkout `code`."""

    def __init__(self, root: Path, code: Path):
        self.root, self.code = root, code
        self._n = itertools.count(1)
        self._once: dict[str, object] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.tag = threading.local()  # the running case's tag, per worker thread
        self.tmp = root / "tmp"  # the commands' TMPDIR: nothing is left outside the workspace
        self.tmp.mkdir(parents=True, exist_ok=True)

    # ---- processes --------------------------------------------------------------------------
    def env(self) -> dict:
        """The commands' environment; a case's `env` (run_case) is added last, and a fault
        in it ($CGPT_QA_FAULT) puts qa/inject (its sitecustomize) first on PYTHONPATH."""
        extra = getattr(self.tag, "env", {})
        path = str(self.code)
        if "CGPT_QA_FAULT" in extra:
            path = os.pathsep.join([str(INJECT), path])
        return {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": "", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "TMPDIR": str(self.tmp), "CGPT_CACHE": str(self.root / "cgpt-cache"),
                TAG: getattr(self.tag, "value", "setup"), **extra}

    def popen(self, argv: list[str], stderr, group: bool = False) -> subprocess.Popen:
        """`python -m cgpt ARGV` in its own session when `group` (a signal to the group)."""
        return subprocess.Popen([sys.executable, "-m", "cgpt", *argv], env=self.env(),
                                stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=self.root,
                                start_new_session=group)

    def cgpt(self, argv: list[str], timeout: float = 1200) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cgpt", *argv], env=self.env(),
                              capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def python(self, code: str, timeout: float = 1200) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], env=self.env(), capture_output=True,
                              text=True, timeout=timeout, cwd=self.root)

    # ---- paths and fixtures -----------------------------------------------------------------
    def fresh(self, what: str) -> Path:
        """A new path in the workspace (not created)."""
        return self.root / "cases" / f"{next(self._n):04d}-{what}"

    def once(self, name: str, build: Callable[["Ctx"], object]) -> object:
        """`build(self)` the first time `name` is asked for (by any thread), then its value."""
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if name not in self._once:
                self._once[name] = build(self)
            return self._once[name]

    @property
    def corpus(self) -> Path:
        """Six standard-library sources: a few seconds of tokenizer training."""
        def build(ctx):
            d = ctx.root / "corpus"
            d.mkdir(parents=True)
            lib = Path(sysconfig.get_paths()["stdlib"])
            for name in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py",
                         "heapq.py"):
                shutil.copy(lib / name, d / name)
            return d
        return self.once("corpus", build)

    def train(self, out: Path, *extra: str) -> list[str]:
        """The argv of the small run (20 steps of tiny-17k, checkpoints every 5)."""
        cache = self.root / "cache"
        return ["train", "--data", str(self.corpus), "--out", str(out), *TRAIN,
                f"data.cache_dir={cache}", *extra]

    @property
    def base(self) -> Path:
        """A finished small run: checkpoints 10, 15, 20."""
        def build(ctx):
            d = ctx.root / "base"
            r = ctx.cgpt(ctx.train(d))
            if r.returncode:
                raise RuntimeError(f"the base run failed:\n{r.stderr[-2000:]}")
            return d
        return self.once("base", build)

    @property
    def hf(self) -> Path:
        """The base run exported with `cgpt.save_hf`."""
        def build(ctx):
            d = ctx.root / "hf"
            r = ctx.python(f"import cgpt; cgpt.save_hf(cgpt.load({str(ctx.base)!r}), "
                           f"{str(d)!r})")
            if r.returncode:
                raise RuntimeError(f"the HF export failed:\n{r.stderr[-2000:]}")
            return d
        return self.once("hf", build)

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


# ---- processes a case left behind ------------------------------------------------------------
def tagged_pids(value: str) -> list[int]:
    """Live processes whose environment holds TAG=value (a case's commands and their
    children, even once re-parented)."""
    want, out = f"{TAG}={value}".encode(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if want in env.split(b"\0") and state != "Z":
            out.append(int(d.name))
    return out


# ---- checks: what must still be there afterwards (None: fine, else what was lost) -----------
def lines(p: Path) -> list[str]:
    return p.read_bytes().decode(errors="replace").splitlines() if p.is_file() else []


def checkpoint_steps(d: Path) -> list[int]:
    c = d / "checkpoints"
    return sorted(int(p.name) for p in c.iterdir() if p.name.isdigit()) if c.is_dir() else []


def strict(text: str) -> object:
    """JSON without NaN/Infinity (what cgpt promises to write)."""
    def bad(c):
        raise ValueError(f"{c} is not JSON")
    return json.loads(text, parse_constant=bad)


def untouched(d: Path) -> Callable[[], str | None]:
    """The run's log and checkpoints are exactly as before the command."""
    before, steps = lines(d / "metrics.jsonl"), checkpoint_steps(d)

    def check():
        now, st = lines(d / "metrics.jsonl"), checkpoint_steps(d)
        if now != before:
            return f"metrics.jsonl changed: {len(before)} -> {len(now)} lines"
        if st != steps:
            return f"checkpoints changed: {steps} -> {st}"
        return None
    return check


def complete(d: Path) -> Callable[[], str | None]:
    """A finished small run: a strict summary, and one log line per step 1..STEPS."""
    def check():
        try:
            strict((d / "summary.json").read_text())
            steps = [strict(x)["step"] for x in lines(d / "metrics.jsonl")]
        except (OSError, ValueError) as e:
            return f"unreadable result: {e}"
        if steps != list(range(1, STEPS + 1)):
            return f"metrics.jsonl steps {steps[:3]}..{steps[-3:]} ({len(steps)} lines)"
        return None
    return check


def same_as_base(ctx: "Ctx", d: Path) -> Callable[[], str | None]:
    """A finished run equal to the uninterrupted base run: every step's loss and grad norm bit
    for bit, and the summary's losses (what a resume after any fault must give)."""
    def check():
        bad = complete(d)()
        if bad:
            return bad
        ref = [strict(x) for x in lines(ctx.base / "metrics.jsonl")]
        got = [strict(x) for x in lines(d / "metrics.jsonl")]
        for r, g in zip(ref, got):
            for k in ("loss", "grad_norm", "val_loss"):
                if r.get(k) != g.get(k):
                    return f"step {r['step']}: {k} {g.get(k)} != {r.get(k)} uninterrupted"
        a, b = (strict((x / "summary.json").read_text()) for x in (ctx.base, d))
        for k in ("train_loss", "val_loss", "steps", "tokens"):
            if a[k] != b[k]:
                return f"summary.json {k} {b[k]} != {a[k]} uninterrupted"
        return None
    return check


def strict_stdout(res: subprocess.CompletedProcess) -> str | None:
    """The command's last stdout line, if any, is strict JSON."""
    try:
        strict(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else None
    except ValueError as e:
        return f"stdout is not strict JSON: {e}"
    return None


def library(call: str, label: str, prelude: str = "") -> str:
    """`python -c` code running the library call `call` (after `prelude`): an exception a caller
    can catch by its kind (ValueError, TypeError, OSError, cgpt's CgptError) is printed as one
    `cgpt LABEL: error: ...` line with exit status 2; anything else is the traceback it is."""
    body = "\n".join("    " + x for x in call.strip().splitlines())
    return (f"import sys\n{prelude}\nfrom cgpt.errors import CgptError\ntry:\n{body}\n"
            "except (ValueError, TypeError, OSError, CgptError) as e:\n"
            f"    print(f'cgpt {label}: error: {{e}}'.splitlines()[0], file=sys.stderr)\n"
            "    sys.exit(2)\n")
