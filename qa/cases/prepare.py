"""Signals to `cgpt data prepare` (2 worker processes) at five phases, and to its process group:
it stops with one line (or finishes), no worker outlives it, and the same command then gives
the reference store's shards.

Retired: SIGKILL while the workers run, two prepares of one --out
(tests/faults/test_faults_sweep.py)."""
import signal
import time

from qa.cases.data import docs, jsonl, prepare, shas
from qa.context import tagged_pids
from qa.registry import add


def big(ctx):
    """6 x 3 MB of JSONL (seconds of tokenizing per worker) and its reference store."""
    def build(ctx):
        d = ctx.root / "big"
        d.mkdir()
        for i in range(6):
            (d / f"part{i}.jsonl").write_bytes(jsonl(docs(25000, i)))
        ref = ctx.root / "bigref"
        r = ctx.cgpt(prepare(ctx, d, ref, "--num-proc", "2"))
        if r.returncode:
            raise RuntimeError(f"the reference prepare failed:\n{r.stderr[-1000:]}")
        return d, shas(ref)
    return ctx.once("prepare_big", build)


def _phases(ctx):
    t0 = time.monotonic()

    def workers(pid, err, d):
        return len([p for p in tagged_pids(ctx.tag.value) if p != pid]) >= 2
    return {"startup": 0.5,  # Python and cgpt importing
            "plan-written": lambda pid, err, d: (d / "plan.json").exists(),
            "workers": workers,
            "shards-partial": lambda pid, err, d: any((d / "shards").glob("*.json")),
            "tokenizer-training": lambda pid, err, d: time.monotonic() - t0 > 4.0}


def _case(sig, phase, group):
    def make(ctx):
        src, ref = big(ctx)
        out = ctx.fresh("store")
        if phase == "tokenizer-training":
            argv = ["data", "prepare", str(src), "--tokenizer", "train", "--vocab-size", "300",
                    "--out", str(out), "--no-progress", "--num-proc", "2"]
            same = None
        else:
            argv = prepare(ctx, src, out, "--num-proc", "2")
            same = lambda: (None if shas(out) == ref  # noqa: E731
                            else "the store differs from the reference")
        return {"argv": argv, "signals": [(sig, _phases(ctx)[phase])], "group": group,
                "then": argv, "check_ok": same, "timeout": 600}
    name = f"{sig.name}-{phase}" + ("-group" if group else "")
    add(name, "either", "prepare", make)


for _sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    for _phase in ("startup", "plan-written", "workers", "shards-partial", "tokenizer-training"):
        if (_sig, _phase) != (signal.SIGKILL, "workers"):
            _case(_sig, _phase, False)
_case(signal.SIGINT, "workers", True)
_case(signal.SIGTERM, "workers", True)
