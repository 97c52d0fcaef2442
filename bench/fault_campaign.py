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

    PYTHONPATH=$PWD python bench/fault_campaign.py [--code DIR] [-k SUBSTRING] [--group G] [--jobs 2]

Groups: rundir, signals, concurrent, load, flags, config (first campaign); flags2, phases, rundir2,
concurrent2, analysis (the second: bench/fault_cases_new.py).

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
from pathlib import Path

import fault_cases_load  # noqa: F401 - registers the loading, flag and config cases
import fault_cases_new  # noqa: F401 - the second campaign: flags, phases, analysis, ...
from fault_cases import CASES, Case, Ctx, complete

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
         "tokenizer_garbage_resume": "tokenizer.json", "metrics_binary_resume": "metrics.jsonl"}


# ---- running and classifying --------------------------------------------------------------
def _noise(err: str) -> bool:
    return any(s in err for s in ("Traceback", "Event loop is closed", "Exception ignored",
                                  "never retrieved"))


def _clean_line(res) -> bool:
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    return bool(lines) and lines[-1].startswith("cgpt ") and (
        ": error:" in lines[-1] or "stopped by" in lines[-1] or "interrupted" in lines[-1])


def classify(expect: str, results: list, check: str | None, sent: int = 0) -> tuple[str, str]:
    if check:
        return "LOST", check
    if sent == signal.SIGTERM and results[0].returncode == -sent and not _noise(results[0].stderr):
        return "error", "ended by SIGTERM before the loop (its default action; nothing trained)"
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
    if "python" in spec:  # an analysis call: its one line is `cgpt analysis: error: ...`
        results.append(subprocess.run([sys.executable, "-c", spec["python"]], env=ctx.env(),
                                      capture_output=True, text=True, timeout=1200, cwd=ctx.root))
    elif "argv" in spec and "signals" in spec:
        results.append(_signalled(ctx, spec))
    elif "argv" in spec and "signal" in spec:
        sig, delay = spec["signal"]
        p = subprocess.Popen([sys.executable, "-m", "cgpt", *spec["argv"]], env=ctx.env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ctx.root)
        time.sleep(delay)
        p.send_signal(sig)
        out, err = p.communicate(timeout=1200)
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
            out, err = p.communicate(timeout=1200)
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
        if results[-1].returncode == 0:
            check = complete(d)()  # finished before the signal acted: a complete result
        elif (d / "config.yaml").exists() or "signals" in spec:  # (nothing there: fresh)
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
    sent = spec.get("signal", (0, 0))[0] or (spec["signals"][0][0] if "signals" in spec else 0)
    return (c.name, *classify(c.expect, results, check, sent))


def _signalled(ctx: Ctx, spec: dict) -> subprocess.CompletedProcess:
    """Run spec['argv']; send each (signal, when) in turn, `when` a delay in seconds after the
    previous one or a predicate (pid, stderr so far, run dir) -> ready; 'group': to the group."""
    err_path = ctx.fresh("stderr")
    d = Path(spec["argv"][spec["argv"].index("--out") + 1])
    with open(err_path, "w") as err:
        p = subprocess.Popen([sys.executable, "-m", "cgpt", *spec["argv"]], env=ctx.env(),
                             stdout=subprocess.PIPE, stderr=err, text=True, cwd=ctx.root,
                             start_new_session=bool(spec.get("group")))
        for sig, when in spec["signals"]:
            end = time.monotonic() + 300
            while p.poll() is None and time.monotonic() < end:
                if callable(when) and when(p.pid, err_path.read_text(errors="replace"), d):
                    break
                if not callable(when):
                    time.sleep(when)
                    break
                time.sleep(0.01)
            if p.poll() is None:
                (os.killpg if spec.get("group") else os.kill)(p.pid, sig)
        out, _ = p.communicate(timeout=1200)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err_path.read_text())


def _guarded(ctx: Ctx, c: Case) -> tuple[str, str, str]:
    try:
        return run_case(ctx, c)
    except subprocess.TimeoutExpired as e:  # a loaded machine, or a real hang: reported
        return c.name, "HANG", f"no end within {e.timeout:.0f} s"


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
    ap.add_argument("--group", default="", help="only cases of these groups (comma-separated)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", help="write the per-case outcomes here")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cgpt-campaign-"))
    ctx = Ctx(root=root, code=Path(args.code).resolve())
    setup(ctx)
    cases = [c for c in CASES if any(k in c.name for k in args.k.split(","))
             and (not args.group or c.group in args.group.split(","))]
    rows: list = []
    counts: dict[str, int] = {}
    with ThreadPoolExecutor(args.jobs) as pool:
        for (name, outcome, msg), c in zip(pool.map(lambda c: _guarded(ctx, c), cases), cases):
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
