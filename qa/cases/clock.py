"""The wall clock stepping while cgpt runs (NTP correcting a drifted node, a VM resumed after a
pause, a laptop's sleep): time.time() jumps an hour back or a day forward a few seconds into
the command (qa/inject). Durations must come from a monotonic clock: the run's losses equal the
uninterrupted run's, no duration is negative or absurd, no checkpoint is taken or skipped
because of the jump, and a sweep's results are recorded as done."""
import csv
import json

from qa.cases.flaky import fault
from qa.cases.sweepdir import RUN, sweep
from qa.context import checkpoint_steps, same_as_base, strict
from qa.registry import add

BACK, FORWARD = -3600.0, 86400.0


def _clock(jump: float, after_s: float) -> dict:
    return {"CGPT_QA_FAULT": json.dumps({"kind": "clock", "jump": jump, "after_s": after_s})}


def _durations_sane(d):
    def check():
        s = strict((d / "summary.json").read_text())
        bad = {k: s[k] for k in ("wall_time_s", "train_time_s", "tokens_per_s")
               if not 0 <= s[k] < 3600}
        if bad:
            return f"summary.json durations after the clock jump: {bad}"
        st = checkpoint_steps(d)
        return None if st == [10, 15, 20] else f"checkpoints {st}, not [10, 15, 20]"
    return check


def _train(jump, after_s, resume=False, *extra):
    def make(ctx):
        d = ctx.run_copy() if resume else ctx.fresh("out")
        same = same_as_base(ctx, d)
        return {"argv": ctx.train(d, *extra, *(("--resume",) if resume else ())),
                "env": _clock(jump, after_s), "timeout": 900,
                "check_ok": lambda: same() or _durations_sane(d)()}
    return make


add("train_clock_back_1h", "ok", "clock", _train(BACK, 4.0))
add("train_clock_forward_1d_checkpoint_minutes", "ok", "clock",
    _train(FORWARD, 4.0, False, "train.checkpoint_minutes=30"))
add("resume_clock_back_1h", "ok", "clock", _train(BACK, 4.0, True))
add("train_clock_back_at_start", "ok", "clock", _train(BACK, 0.0))


def _sweep_clock(jump):
    def make(ctx):
        d = ctx.fresh("sweep")

        def check():
            with open(d / "results.csv", newline="") as f:
                rows = list(csv.DictReader(f))
            if not rows or rows[0]["status"] != "done":
                return f"results.csv: {rows[:1]}"
            w = float(rows[0]["wall_time_s"])
            return None if 0 <= w < 3600 else f"results.csv wall_time_s {w}"
        return {"argv": sweep(ctx, d), "env": _clock(jump, 3.0), "timeout": 900,
                "check_ok": check}
    return make


add("sweep_clock_back_1h", "ok", "clock", _sweep_clock(BACK))
add("sweep_clock_forward_1d", "ok", "clock", _sweep_clock(FORWARD))
_ = (fault, RUN)  # the same injector as the flaky group
