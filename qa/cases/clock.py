"""The wall clock stepping while cgpt runs (NTP correcting a drifted node, a VM resumed after a
pause, a laptop's sleep): time.time() jumps an hour back or a day forward a few seconds into
the command (qa/inject). Durations must come from a monotonic clock: the run's losses equal the
uninterrupted run's, no duration is negative or absurd, no checkpoint is taken or skipped
because of the jump, and a sweep's results are recorded as done."""
import csv
import json
import math
import re
import time

from qa.cases.flaky import fault
from qa.cases.sweepdir import RUN, sweep
from qa.context import checkpoint_steps, lines, same_as_base, strict
from qa.registry import add

BACK, FORWARD = -3600.0, 86400.0


def _clock(jump: float, after_s: float) -> dict:
    return {"CGPT_QA_FAULT": json.dumps({"kind": "clock", "jump": jump, "after_s": after_s})}


def _durations_sane(d, started: float):
    """What a clock jump must not change: every duration (summary.json's wall and train time,
    each logged step's throughput) measured on a monotonic clock, so none is negative or longer
    than the command took (`started`: time.monotonic() before it began), the throughput is the
    timed tokens over the train time (at most this launch's tokens), and the checkpoints are the
    ones the step count asks for. What it may change: the wall-clock timestamps in the logs."""
    def check():
        took = time.monotonic() - started
        s = strict((d / "summary.json").read_text())
        wall, train, tps = s["wall_time_s"], s["train_time_s"], s["tokens_per_s"]
        if not 0 < wall <= took:
            return f"summary.json wall_time_s {wall} outside (0, {took:.1f}] s the command took"
        if not 0 < train <= wall:
            return f"summary.json train_time_s {train} outside (0, wall_time_s {wall}]"
        launch = s["tokens"] - s["resumed_from_step"] * s["batch_size"] * s["seq_len"]
        if not 0 < tps * train <= launch * (1 + 1e-9):
            return (f"summary.json tokens_per_s {tps} x train_time_s {train} = {tps * train:.0f} "
                    f"tokens, not within (0, {launch}] trained by this launch")
        step_tokens, first = s["batch_size"] * s["seq_len"], s["resumed_from_step"] + 1
        for x in lines(d / "metrics.jsonl"):
            r = strict(x)
            if r["step"] < first or r["step"] == first and r.get("tokens_per_s") == 0:
                continue  # an earlier launch's; this launch's first step (a compile) is untimed
            if "tokens_per_s" in r and not step_tokens / took <= r["tokens_per_s"] < math.inf:
                return (f"metrics.jsonl step {r['step']}: tokens_per_s {r['tokens_per_s']} "
                        f"means a step longer than the {took:.1f} s the command took (or < 0)")
        st = checkpoint_steps(d)
        return None if st == [10, 15, 20] else f"checkpoints {st}, not [10, 15, 20]"
    return check


def _train(jump, after_s, resume=False, *extra):
    def make(ctx):
        d = ctx.run_copy() if resume else ctx.fresh("out")
        same, started = same_as_base(ctx, d), time.monotonic()
        return {"argv": ctx.train(d, *extra, *(("--resume",) if resume else ())),
                "env": _clock(jump, after_s), "timeout": 900,
                "check_ok": lambda: same() or _durations_sane(d, started)()}
    return make


add("train_clock_back_1h", "ok", "clock", _train(BACK, 4.0))
add("train_clock_forward_1d_checkpoint_minutes", "ok", "clock",
    _train(FORWARD, 4.0, False, "train.checkpoint_minutes=30"))
add("resume_clock_back_1h", "ok", "clock", _train(BACK, 4.0, True))
add("train_clock_back_at_start", "ok", "clock", _train(BACK, 0.0))

_DONE = re.compile(r"^done +\S+: val_loss \S+ +(-?[\d.]+)s$", re.M)


def _sweep_clock(jump):
    def make(ctx):
        d, started = ctx.fresh("sweep"), time.monotonic()

        def check():
            took = time.monotonic() - started
            with open(d / "results.csv", newline="") as f:
                rows = list(csv.DictReader(f))
            if not rows or rows[0]["status"] != "done":
                return f"results.csv: {rows[:1]}"
            w = float(rows[0]["wall_time_s"])
            return None if 0 < w <= took else f"results.csv wall_time_s {w} (took {took:.0f} s)"

        def printed(res):
            """The sweep's `done RUN: val_loss X  Ns` line: N seconds of this command."""
            took = time.monotonic() - started
            secs = [float(x) for x in _DONE.findall(res.stdout + res.stderr)]
            if not secs:
                return "no `done RUN: ... Ns` line printed"
            bad = [x for x in secs if not 0 <= x <= took + 1]
            return f"the sweep printed run durations {bad} s (took {took:.0f} s)" if bad else None
        return {"argv": sweep(ctx, d), "env": _clock(jump, 3.0), "timeout": 900,
                "check_ok": check, "stdout_check": printed}
    return make


add("sweep_clock_back_1h", "ok", "clock", _sweep_clock(BACK))
add("sweep_clock_forward_1d", "ok", "clock", _sweep_clock(FORWARD))
_ = (fault, RUN)  # the same injector as the flaky group
