"""Storage that fails the way network filesystems do (NFS, Lustre, a FUSE mount): one rename,
open or delete refused with EIO, ESTALE, ETIMEDOUT or EBUSY, or every write slowed. The fault
is injected into the command's own Python calls (qa/inject/sitecustomize.py) once; a command
that meets it must finish or stop with one line naming the file, and the same command again
(`--resume` where it had begun) must give exactly the uninterrupted run's losses."""
import json

from qa.context import same_as_base
from qa.registry import add


def fault(ctx, **f) -> tuple[dict, callable]:
    """The environment injecting fault `f` once (unless f says otherwise), and whether it fired."""
    state = ctx.fresh("fault-count")
    state.parent.mkdir(parents=True, exist_ok=True)
    f = {"kind": "error", "times": 1, "after": 0, **f, "state": str(state)}

    def fired():
        return f["kind"] == "slow" or (state.is_file() and int(state.read_text() or 0) > f["after"])
    return {"CGPT_QA_FAULT": json.dumps(f)}, fired


# name -> (fault, fresh launch (else a resume of a run killed after step 15), what the line names);
# `{run}` in a match is the run directory's name (the run's own file, not the cache's)
CASES = {
    "summary_rename_eio": ({"call": "replace", "match": "summary.json"}, True, "summary.json"),
    "summary_rename_etimedout": ({"call": "replace", "match": "summary.json",
                                 "errno": "ETIMEDOUT"}, True, "summary.json"),
    "config_rename_eio_at_launch": ({"call": "replace", "match": "config.yaml"}, True,
                                    "config.yaml"),
    "tokenizer_rename_estale": ({"call": "replace", "match": "tokenizer.json",
                                 "errno": "ESTALE"}, True, "tokenizer.json"),
    "metrics_open_eio": ({"call": "open_w", "match": "metrics.jsonl"}, True, "metrics.jsonl"),
    "metrics_open_estale_on_resume": ({"call": "open_w", "match": "metrics.jsonl",
                                       "errno": "ESTALE"}, False, "metrics.jsonl"),
    "metrics_read_eio_on_resume": ({"call": "open_r", "match": "metrics.jsonl"}, False,
                                   "metrics.jsonl"),
    "config_read_estale_on_resume": ({"call": "open_r", "match": "config.yaml",
                                      "errno": "ESTALE"}, False, "config.yaml"),
    "tokenizer_read_eio_on_resume": ({"call": "tokenizer_file", "match": "{run}/tokenizer.json"},
                                     False, "tokenizer.json"),
    "lock_open_eio": ({"call": "open_w", "match": ".lock"}, True, ".lock"),
    "checkpoint_commit_rename_eio": ({"call": "rename", "match": "checkpoints", "after": 1},
                                     True, "checkpoints"),
    "checkpoint_mkdir_eio": ({"call": "mkdir", "match": "checkpoints/15"}, True, "checkpoints"),
    "checkpoint_prune_unlink_ebusy": ({"call": "rmtree", "match": "checkpoints/5",
                                       "errno": "EBUSY"}, True, "checkpoints"),
    "store_manifest_rename_eio": ({"call": "replace", "match": "manifest"}, True, "manifest"),
    "store_read_estale": ({"call": "open_r", "match": "manifest", "errno": "ESTALE"}, True,
                          "manifest"),
    "slow_renames": ({"kind": "slow", "call": "replace", "match": "/", "seconds": 0.5}, True,
                     None),
    "slow_checkpoint_renames": ({"kind": "slow", "call": "rename", "match": "checkpoints",
                                 "seconds": 2.0}, True, None),
    "slow_metrics_open_on_resume": ({"kind": "slow", "call": "open_w", "match": "metrics.jsonl",
                                     "seconds": 3.0}, False, None),
}


def _make(f, fresh, text):
    def make(ctx):
        d = ctx.fresh("out") if fresh else ctx.run_copy()
        env, fired = fault(ctx, **{**f, "match": f.get("match", "").replace("{run}", d.name)})
        extra = ()
        if "manifest" in f.get("match", ""):  # the store must be prepared (or read) anew
            extra = (f"data.cache_dir={ctx.fresh('cache')}",)
        argv = ctx.train(d, *extra, *(() if fresh else ("--resume",)))
        # after a failure the same command again, or --resume where training had begun
        again = ctx.train(d, *extra, "--resume")
        spec = {"argv": argv, "then": again, "env": env, "fired": fired,
                "check_ok": same_as_base(ctx, d), "timeout": 900}
        if text:
            spec["expect_text"] = text
        return spec
    return make


for _n, (_f, _fresh, _text) in CASES.items():
    add(_n, "either" if _text else "ok", "flaky", _make(_f, _fresh, _text))
