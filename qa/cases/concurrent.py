"""Concurrency: two launches into one run directory or one data cache, loading while training.

Retired: a failed branch then a launch into the same --out (tests/faults/test_faults_rundir.py)."""
from qa.context import complete
from qa.damage import generate
from qa.registry import case

LONG = [f"--tokens={8 * 16 * 200}", "train.ckpt_every=1"]  # 200 steps, a checkpoint each


@case("either", "concurrent")
def two_fresh_launches_same_out(ctx):
    d = ctx.fresh("out")
    return {"parallel": [ctx.train(d), ctx.train(d)], "check": complete(d)}


@case("either", "concurrent")
def two_resumes_same_out(ctx):
    d = ctx.run_copy()
    return {"parallel": [ctx.train(d, "--resume"), ctx.train(d, "--resume")],
            "check": complete(d)}


@case("either", "concurrent")
def resume_and_fresh_same_out(ctx):
    d = ctx.run_copy()
    return {"parallel": [ctx.train(d, "--resume"), ctx.train(d)], "check": complete(d)}


@case("ok", "concurrent")
def two_trains_prepare_one_cache(ctx):
    cache, a, b = ctx.fresh("cache"), ctx.fresh("out"), ctx.fresh("out")
    return {"parallel": [ctx.train(a, f"data.cache_dir={cache}"),
                         ctx.train(b, f"data.cache_dir={cache}")],
            "check": lambda: complete(a)() or complete(b)()}


@case("either", "concurrent")
def generate_while_training(ctx):
    d = ctx.fresh("out")
    return {"parallel": [ctx.train(d, *LONG)] + [generate(d)] * 3, "stagger": 25.0}


@case("either", "concurrent")
def eval_while_training(ctx):
    d = ctx.fresh("out")
    ev = ["eval", str(d), "--data", str(ctx.corpus), "--sequences", "4"]
    return {"parallel": [ctx.train(d, *LONG)] + [ev] * 2, "stagger": 25.0}
