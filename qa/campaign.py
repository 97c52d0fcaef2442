"""Fault campaign: every registered case (qa/cases/) run as a hostile user would, one outcome each.

Each case damages a copy of a small run (or store, sweep, export), runs real `python -m cgpt`
commands in subprocesses (some signalled, some started together) and is classified:

  ok          it succeeded, as the case allows
  error       one clean `cgpt <cmd>: error: ...` (or interrupted / stopped by) last line
  ACCEPTED    bad input was accepted (exit 0 where the case wants a refusal)
  REFUSED     a valid request was refused
  TRACEBACK   a traceback, asyncio/TensorStore noise, an unhandled signal, no clean last line
  MISLEADING  refused, but the message does not name what the case says it must
  SILENT      answered, but without the warning the case says it must give
  LOST        results lost or mislabelled (the case's own check)
  ORPHAN      a process of the case outlived its command
  HANG        no end within the case's time limit
  SETUP       the case could not even be prepared (a campaign bug, reported)

    PYTHONPATH=$PWD python -m qa.campaign [--only PATTERN[,PATTERN]] [--jobs 2] [--code DIR]
                                          [--json FILE] [--list] [--keep]

The summary also counts verdicts: OK (ok, error), WEAK (MISLEADING: refused, but the line
does not name what the user typed; SILENT: answered without a warning it owed), TRACEBACK,
SETUP, and FAIL (everything else: bad input
taken, a valid request refused, results lost, a process left running, a hang).

Slow (each command starts JAX; the ones that train take seconds to minutes): not a test. The
exit status is 0 when every selected case is ok or error.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from qa.context import Ctx, tagged_pids
from qa.registry import Case, all_cases

WANTED = ("ok", "error")
_VERDICTS = {"ok": "OK", "error": "OK", "MISLEADING": "WEAK", "SILENT": "WEAK",
             "TRACEBACK": "TRACEBACK",
             "SETUP": "SETUP"}  # any other outcome is a FAIL


def verdict(outcome: str) -> str:
    """OK / WEAK / FAIL / TRACEBACK / SETUP: the issue tracker's classes of an outcome."""
    return _VERDICTS.get(outcome, "FAIL")

_LAST = re.compile(r"^cgpt( [\w -]+)?: (error: |interrupted|stopped by )")  # `cgpt: error:` is
_ERROR = re.compile(r"^cgpt( [\w -]+)?: error: ", re.M)  # argparse's, before a subcommand
_NOISE = ("Traceback", "Event loop is closed", "Exception ignored", "never retrieved")


def classify(expect: str, results: list, sent: int = 0) -> tuple[str, str]:
    """The outcome of a case's commands (`results`, CompletedProcess) against `expect`.

    `sent`: the signal the case sent its first command; SIGTERM's default action before the
    handlers are installed (nothing trained, nothing written) is a clean stop."""
    for r in results:
        if sent == signal.SIGTERM and r.returncode == -sent and not _noisy(r.stderr):
            continue
        if _noisy(r.stderr) or r.returncode < 0 or (r.returncode != 0 and not _clean(r.stderr)):
            tail = (r.stderr.strip().splitlines() or [f"rc={r.returncode}"])[-1]
            return "TRACEBACK", f"rc={r.returncode} {tail[:160]}{_evidence(r.stderr)}"
    ok = all(r.returncode == 0 for r in results)
    last = [x for x in results[-1].stderr.splitlines() if x.strip()]
    msg = last[-1][:200] if last else ""
    if expect == "error" and ok:
        return "ACCEPTED", "exit 0"
    if expect == "ok" and not ok:
        return "REFUSED", msg
    return ("ok" if ok else "error"), msg


def _noisy(err: str) -> bool:
    return any(s in err for s in _NOISE)


def _evidence(err: str) -> str:
    """The noise's first line and the exception that ends it (for the report)."""
    lines = err.splitlines()
    for i, line in enumerate(lines):
        if any(s in line for s in _NOISE):
            after = [x for x in lines[i + 1:] if x.strip() and not x.startswith(" ")][:1]
            return " | " + " / ".join([line.strip()[:120], *(x[:160] for x in after)])
    return ""


def _clean(err: str) -> bool:
    """The last line is cgpt's one line, and at most one error line was printed."""
    lines = [x for x in err.splitlines() if x.strip()]
    return bool(lines) and bool(_LAST.match(lines[-1])) and len(_ERROR.findall(err)) <= 1


def run_case(ctx: Ctx, c: Case) -> tuple[str, str]:
    """Run one case. `c.make(ctx)` returns a dict with one way to run it:

      argv      one `cgpt` command (a list of arguments)
      python    `python -c` code (a library call; its one line is `cgpt analysis: error: ...`)
      parallel  several argv started together (`stagger`: seconds before the second)
      sequence  several argv run one after another

    and optionally:

      signals       with argv: [(signal, when), ...], `when` seconds after the previous one or a
                    predicate (pid, stderr so far, the --out directory) -> ready; `group`: True
                    sends them to the command's process group; a callable in place of the
                    signal is called then instead (an edit made while the command runs)
      then          argv run after a signalled command that did not finish (a resume or a
                    rerun): it must succeed; after SIGKILL it is the command classified
      check         () -> None or what was lost (LOST), after every command
      check_ok      the same, only when the command (or `then`) succeeded
      stdout_check  (CompletedProcess) -> None or what is wrong with its stdout (LOST)
      silent_check  (CompletedProcess) -> None or the warning a success did not give (SILENT)
      expect_text   what a refusal's message must name (else MISLEADING)
      timeout       seconds per command (default 1200; past it: HANG)
      fired         () -> whether the case's fault happened at all (else SETUP: the case
                    tested nothing)
      env           variables added to every command's environment (a fault for qa/inject:
                    CGPT_QA_FAULT)
    """
    ctx.tag.env = {}
    try:
        spec = c.make(ctx)
    except Exception as e:  # noqa: BLE001 - a broken setup is reported, not fatal
        return "SETUP", repr(e)[:300]
    ctx.tag.env = dict(spec.get("env", {}))
    timeout = spec.get("timeout", 1200)
    first = spec["signals"][0][0] if "signals" in spec else 0
    results, sent = [], 0 if callable(first) else first
    if "python" in spec:
        results.append(ctx.python(spec["python"], timeout))
    elif "argv" in spec and "signals" in spec:
        results.append(_signalled(ctx, spec, timeout))
    elif "argv" in spec:
        results.append(ctx.cgpt(spec["argv"], timeout))
    elif "parallel" in spec:
        procs = []
        for argv in spec["parallel"]:
            procs.append(ctx.popen(argv, subprocess.PIPE))
            time.sleep(spec.get("stagger", 0) if len(procs) == 1 else 0.5)
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    else:
        results.extend(ctx.cgpt(argv, timeout) for argv in spec["sequence"])
    check, done = None, results[-1].returncode == 0
    if spec.get("then") and not done:
        if _outlived(ctx, wait=30):
            return "ORPHAN", "a process of the stopped command outlived it"
        again = ctx.cgpt(spec["then"], timeout)
        done = again.returncode == 0
        if sent == signal.SIGKILL and results[-1].returncode == -signal.SIGKILL:
            results[-1], sent = again, 0  # the kill is the fault; the rerun is what is judged
        elif not done:
            check = f"the command after the signal failed: {again.stderr.strip()[-200:]}"
    if not check and spec.get("check"):
        check = spec["check"]()
    if not check and spec.get("check_ok") and done:
        check = spec["check_ok"]()
    if not check and spec.get("stdout_check"):
        check = spec["stdout_check"](results[-1])
    if spec.get("fired") and not spec["fired"]():
        return "SETUP", "the injected fault never happened (the case tested nothing)"
    if check:
        return "LOST", check
    outcome, text = classify(c.expect, results, sent), spec.get("expect_text")
    if outcome[0] == "ok" and spec.get("silent_check"):
        quiet = spec["silent_check"](results[-1])
        if quiet:
            return "SILENT", quiet
    if outcome[0] == "error" and text and text not in results[-1].stderr:  # a clean refusal
        return "MISLEADING", f"message does not name {text!r}"  # (a traceback stays one)
    return outcome


def _signalled(ctx: Ctx, spec: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run spec['argv'] and send each (signal, when) in turn."""
    err_path = ctx.fresh("stderr")
    err_path.parent.mkdir(parents=True, exist_ok=True)
    argv = spec["argv"]
    d = Path(argv[argv.index("--out") + 1]) if "--out" in argv else ctx.root
    with open(err_path, "w") as err:
        p = ctx.popen(argv, err, group=bool(spec.get("group")))
        for sig, when in spec["signals"]:
            end = time.monotonic() + 300
            while p.poll() is None and time.monotonic() < end:
                if not callable(when):
                    time.sleep(when)
                    break
                if when(p.pid, err_path.read_text(errors="replace"), d):
                    break
                time.sleep(0.01)
            if p.poll() is None and callable(sig):
                sig()  # an action while the command runs (an edit, a deletion), not a signal
            elif p.poll() is None:
                try:
                    (os.killpg if spec.get("group") else os.kill)(p.pid, sig)
                except ProcessLookupError:
                    pass
        out, _ = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err_path.read_text())


def _outlived(ctx: Ctx, wait: float = 10) -> bool:
    """Whether a process of this case is still alive `wait` seconds on (it is then killed)."""
    end = time.monotonic() + wait
    while tagged_pids(ctx.tag.value) and time.monotonic() < end:
        time.sleep(0.1)
    left = tagged_pids(ctx.tag.value)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return bool(left)


def _guarded(ctx: Ctx, c: Case, tag: str) -> tuple[str, str]:
    """Run a case under its own process tag; what it left running is killed and reported."""
    ctx.tag.value = tag
    try:
        outcome = run_case(ctx, c)
    except subprocess.TimeoutExpired as e:  # a loaded machine, or a real hang: reported
        outcome = "HANG", f"no end within {e.timeout:.0f} s"
    if _outlived(ctx) and outcome[0] in WANTED:
        return "ORPHAN", "a process outlived the case (killed)"
    return outcome


def select(cases: list[Case], only: str) -> list[Case]:
    """Cases whose group, name or group:name matches a pattern (glob, or substring)."""
    pats = [p for p in only.split(",") if p]
    if not pats:
        return cases

    def hit(p: str, c: Case) -> bool:
        if any(ch in p for ch in "*?["):
            return any(fnmatch.fnmatchcase(s, p) for s in (c.group, c.name, c.id))
        return p in c.id
    return [c for c in cases if any(hit(p, c) for p in pats)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qa.campaign",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated patterns on group, name or "
                    "group:name (globs, or substrings), e.g. 'flags', 'signals:SIGINT*'")
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    ap.add_argument("--code", default=str(Path(__file__).resolve().parents[1]),
                    help="the checkout whose cgpt runs the cases (e.g. an older commit)")
    ap.add_argument("--json", help="write every case's outcome here")
    ap.add_argument("--list", action="store_true", help="list the selected cases and stop")
    ap.add_argument("--keep", action="store_true", help="keep the workspace")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: must be at least 1")
    cases = select(all_cases(), args.only)
    if args.list:
        for c in cases:
            print(f"{c.expect:6s} {c.id}")
        print(json.dumps(_count(c.group for c in cases)))
        return 0
    root = Path(tempfile.mkdtemp(prefix="cgpt-qa-"))
    ctx = Ctx(root, Path(args.code).resolve())
    rows: list[dict] = []
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            tags = [f"{os.getpid()}-{i}" for i in range(len(cases))]
            for c, (outcome, msg) in zip(cases, pool.map(lambda a: _guarded(ctx, *a),
                                                         zip(cases, tags))):
                rows.append({"case": c.id, "expect": c.expect, "outcome": outcome, "msg": msg})
                print(f"{outcome:10s} {c.id:55s} {msg}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    counts = _count(r["outcome"] for r in rows)
    wanted = sum(r["outcome"] in WANTED for r in rows)
    print(json.dumps({"cases": len(rows), "as_wanted": wanted, **counts,
                      "verdicts": _count(verdict(r["outcome"]) for r in rows)}))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if wanted == len(rows) else 1


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


if __name__ == "__main__":
    sys.exit(main())
