"""`cgpt train --branch-from RUN@STEP` (WSD cooldown branches, as in MiniCPM / "Scaling Laws and
Compute-Optimal Training Beyond Fixed Training Durations") from steps, parents and budgets that
cannot make a branch. A branch must be refused in one line naming the step or the key that
differs, must never write into its parent, and must leave nothing in its --out that blocks the
next launch."""
import shutil

from qa.context import STEPS, checkpoint_steps, lines, untouched
from qa.damage import zero_checkpoint_data
from qa.registry import add

LONGER = f"--tokens={8 * 16 * 30}"  # 30 steps: the decay starts after step 20


def wsd(ctx):
    """A finished 20-step WSD run (decay from step 16), checkpoints 10, 15, 20."""
    def build(ctx):
        d = ctx.root / "wsd"
        r = ctx.cgpt(ctx.train(d, "train.schedule=wsd"))
        if r.returncode:
            raise RuntimeError(f"the WSD run failed:\n{r.stderr[-2000:]}")
        return d
    return ctx.once("wsd", build)


def _copy(ctx):
    d = ctx.fresh("wsd")
    shutil.copytree(wsd(ctx), d)
    return d


def _same(parent, out):
    """The parent is as it was, and a refused branch left no run in --out."""
    same = untouched(parent)
    other = untouched(out) if out != parent and out.exists() else None  # a run there already

    def check():
        lost = same()
        if lost:
            return f"the parent changed: {lost}"
        if other is not None:
            lost = other()
            return f"the run in --out changed: {lost}" if lost else None
        if out != parent and out.exists() and any(p.name in ("config.yaml", "checkpoints")
                                                  for p in out.iterdir()):
            return f"the refused branch left a run in {out}"
        return None
    return check


def _branch(spec_of, *extra, text=None, damage=None, out_of=None):
    def make(ctx):
        parent = _copy(ctx)
        if damage:
            damage(parent)
        out = out_of(ctx, parent) if out_of else ctx.fresh("branch")
        argv = ctx.train(out, "--branch-from", spec_of(parent), LONGER, *extra)
        return {"argv": argv, "check": _same(parent, out), "timeout": 900,
                **({"expect_text": text} if text else {})}
    return make


def _other_run(ctx, parent):
    d = ctx.run_copy(resumable=False)
    return d


BAD = {  # name -> make
    "step_not_kept": _branch(lambda p: f"{p}@7", text="7"),
    "step_zero": _branch(lambda p: f"{p}@0", text="0"),
    "step_in_the_decay": _branch(lambda p: f"{p}@20", text="decay"),
    "step_huge": _branch(lambda p: f"{p}@{10 ** 20}"),
    "step_negative": _branch(lambda p: f"{p}@-5", text="RUN@STEP"),
    "budget_decays_before_the_step": _branch(lambda p: f"{p}@15", f"--tokens={8 * 16 * 16}",
                                             text="decay"),
    "model_changed": _branch(lambda p: f"{p}@10", "model.n_layer=3", text="model"),
    "peak_lr_changed": _branch(lambda p: f"{p}@10", "train.peak_lr=0.5", text="peak_lr"),
    "batch_size_changed": _branch(lambda p: f"{p}@10", "train.batch_size=4",
                                  text="batch_size"),
    "parent_path_empty": _branch(lambda p: "@10", text="@10"),
    "parent_not_a_run": _branch(lambda p: f"{p / 'checkpoints'}@10", text="checkpoints"),
    "parent_log_deleted": _branch(lambda p: f"{p}@10", text="metrics.jsonl",
                                  damage=lambda p: (p / "metrics.jsonl").unlink()),
    "parent_checkpoint_zeroed": _branch(lambda p: f"{p}@10",
                                        damage=lambda p: zero_checkpoint_data(p, "10")),
    "out_is_the_parent": _branch(lambda p: f"{p}@10", out_of=lambda ctx, p: p),
    "out_is_another_run": _branch(lambda p: f"{p}@10", out_of=_other_run),
}
for _n, _make in BAD.items():
    add(_n, "error", "branch", _make)


def _published_parent(ctx):
    parent = ctx.run_copy(resumable=False)
    out = ctx.fresh("branch")
    return {"argv": ctx.train(out, "--branch-from", f"{parent}@10", LONGER),
            "check": _same(parent, out), "expect_text": "wsd", "timeout": 900}


def _valid(*extra):
    def make(ctx):
        parent = _copy(ctx)
        out = ctx.fresh("branch")
        same = untouched(parent)

        def check():
            logged = lines(out / "metrics.jsonl")
            if len(logged) != 30 or checkpoint_steps(out)[-1:] != [30]:
                return (f"the branch logged {len(logged)} steps, checkpoints "
                        f"{checkpoint_steps(out)}")
            return same()
        return {"argv": ctx.train(out, "--branch-from", f"{parent}@10", LONGER, *extra),
                "check_ok": check, "check": same, "timeout": 1200}
    return make


add("parent_not_wsd", "error", "branch", _published_parent)
add("valid_branch_leaves_the_parent", "ok", "branch", _valid())
# --resume into a fresh --out starts the branch, as `train --resume` starts a fresh run: the
# same command then continues a killed branch (an error was expected when the case was written)
add("with_resume", "ok", "branch", _valid("--resume"))
assert STEPS == 20  # the steps above (10, 15, 20; decay from 16) are this run's
