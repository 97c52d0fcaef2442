"""Sweep directories: a copy of a finished one-run sweep with one file damaged, then the same
`cgpt sweep` again (a relaunch must redo what is damaged or refuse with one line); signals to a
sweep while its run trains; a second launch while one runs.

Retired: a truncated summary.json (tests/faults/test_faults_sweep.py carries it). The earlier
runner's two concurrent-launch cases (the second refused, the first finishing) are one case
here."""
import csv
import json
import os
import shutil
import signal

import yaml

from qa.registry import add

RUN = "tiny-17k_d640_s0"


def spec(ctx):
    """A one-run sweep spec on the campaign's corpus and cache."""
    def build(ctx):
        s = {"name": "dirs", "base": {
            "preset": "tiny-17k",
            "data": {"source": str(ctx.corpus), "cache_dir": str(ctx.root / "cache"),
                     "vocab_size": 512, "seq_len": 16, "val_sequences": 8},
            "train": {"batch_size": 4, "tokens": 640, "eval_every": 10}},
            "grid": {"model": ["tiny-17k"], "seed": [0]}}
        p = ctx.root / "sweep_dirs.yaml"
        p.write_text(yaml.safe_dump(s))
        return p
    return ctx.once("sweep_spec", build)


def sweep(ctx, out) -> list[str]:
    return ["sweep", str(spec(ctx)), "--out", str(out), "--no-compile-cache"]


def reference(ctx):
    """The sweep, finished."""
    def build(ctx):
        out = ctx.root / "sweep_ref"
        r = ctx.cgpt(sweep(ctx, out))
        if r.returncode:
            raise RuntimeError(f"the reference sweep failed:\n{r.stderr[-1000:]}")
        return out
    return ctx.once("sweep_reference", build)


def finished(d):
    """After a relaunch: the run is done in results.csv and its summary reads."""
    def check():
        with open(d / "results.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        try:
            json.loads((d / RUN / "summary.json").read_text())
        except (OSError, ValueError) as e:
            return f"summary.json after the relaunch: {e}"
        if not rows or rows[0]["status"] != "done":
            return f"results.csv status {rows[0]['status'] if rows else None}"
        return None
    return check


def _half(p):
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])


def _to_dir(p):
    p.unlink(missing_ok=True)
    p.mkdir()


def _to_file(p):
    shutil.rmtree(p)
    p.write_text("x")


def _bytes(data):
    return lambda p: p.write_bytes(data)


BOMB = ("name: bomb\ndescription:\n" + "\n".join(
    f"    l{i}: " + ("&a0 [x, x, x, x, x, x, x, x, x]" if i == 0 else
                     f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]") for i in range(9))
    + "\nbase:\n  preset: tiny-17k\n  train:\n    tokens: *a8\ngrid:\n  model: tiny-17k\n")

DAMAGE = {  # name -> (path in the sweep, damage, summary removed first, expect)
    "summary-list": (f"{RUN}/summary.json", _bytes(b"[]"), False, "ok"),
    "summary-random": (f"{RUN}/summary.json", _bytes(os.urandom(64)), False, "ok"),
    "summary-empty": (f"{RUN}/summary.json", _bytes(b""), False, "ok"),
    "failed-json-truncated": (f"{RUN}/failed.json", _bytes(b'{"error": "bo'), True, "ok"),
    "config-truncated": (f"{RUN}/config.yaml", _half, True, "error"),
    "config-binary": (f"{RUN}/config.yaml", _bytes(b"\xff\x00\xfe" * 30), False, "error"),
    "config-alias-bomb": (f"{RUN}/config.yaml", _bytes(BOMB.encode()), False, "error"),
    "results-csv-directory": ("results.csv", _to_dir, False, "error"),
    "sweep-yaml-directory": ("sweep.yaml", _to_dir, False, "error"),
    "sweep-lock-directory": (".sweep.lock", _to_dir, False, "error"),
    "sweep-lock-garbage": (".sweep.lock", _bytes(b"\xff\xfe garbage"), False, "ok"),
    "run-dir-is-file": (RUN, _to_file, False, "error"),
    "identity-garbage": (f"{RUN}/identity.json", _bytes(b"\x00\x01"), False, "ok"),
    "run-yaml-deleted-unfinished": (f"{RUN}/run.yaml", lambda p: p.unlink(), True, "ok"),
    "run-dir-deleted": (RUN, shutil.rmtree, False, "ok"),
}


def _damaged(name, rel, damage, unfinished, expect):
    def make(ctx):
        d = ctx.fresh(f"sweep-{name}")
        shutil.copytree(reference(ctx), d, symlinks=True)
        if unfinished:
            (d / RUN / "summary.json").unlink()
        damage(d / rel)
        return {"argv": sweep(ctx, d), "check_ok": finished(d), "timeout": 600}
    add(name, expect, "sweepdir", make)


for _n, _how in DAMAGE.items():
    _damaged(_n, *_how)


def _signalled(sig):
    def make(ctx):
        d = ctx.fresh("sweep")
        argv = sweep(ctx, d)
        return {"argv": argv, "signals": [(sig, lambda pid, err, out: (
            out / RUN / "config.yaml").exists())], "then": argv, "check_ok": finished(d),
            "timeout": 600}
    add(f"{sig.name}-while-training", "either", "sweepdir", make)


for _sig in (signal.SIGKILL, signal.SIGINT, signal.SIGTERM):
    _signalled(_sig)


def _second_launch(ctx):
    d = ctx.fresh("sweep")
    return {"parallel": [sweep(ctx, d), sweep(ctx, d)], "stagger": 8.0,
            "check": finished(d), "timeout": 600}


add("second-launch-while-one-runs", "either", "sweepdir", _second_launch)
