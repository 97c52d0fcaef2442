"""A sweep's spec (or its directory) edited by hand while the sweep runs: the YAML changed,
broken, deleted or replaced by a folder after the first run has started; results.csv deleted
or re-saved by a spreadsheet mid-sweep. The running sweep must finish what it planned from the
spec it read (recorded in sweep.yaml), and the next launch of the edited spec must say what
changed (`--on-change`) or run what was added, in one line; results.csv ends complete."""
import csv
import shutil

import yaml

from qa.cases.sweepdir import spec as one_run_spec
from qa.registry import add

RUNS = ["tiny-17k_d640_s0", "tiny-17k_d640_s1"]


def _spec(ctx):
    """A two-run sweep (seeds 0 and 1) on the campaign's corpus: a copy per case, to edit."""
    s = yaml.safe_load(one_run_spec(ctx).read_text())
    s["grid"]["seed"] = [0, 1]
    p = ctx.fresh("spec.yaml")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(s))
    return p


def _argv(p, d):
    return ["sweep", str(p), "--out", str(d), "--no-compile-cache"]


def _started(pid, err, out):
    return (out / RUNS[0] / "config.yaml").exists()


def _rows(d):
    with open(d / "results.csv", newline="") as f:
        return {r["run_id"]: r for r in csv.DictReader(f)}


def _done(d, runs=RUNS):
    try:
        rows = _rows(d)
    except OSError as e:
        return f"results.csv: {e}"
    bad = {r: rows.get(r, {}).get("status") for r in runs
           if rows.get(r, {}).get("status") != "done"}
    return f"runs not done in results.csv: {bad}" if bad else None


def _relaunch(ctx, p, d, want: str, named: str | None = None, runs=RUNS):
    """After the sweep: results complete, then the edited spec relaunched: `want` ok/error."""
    def check():
        bad = _done(d)
        if bad:
            return bad
        r = ctx.cgpt(_argv(p, d) + ["--dry-run", "--no-fit"], timeout=600)
        last = (r.stderr.strip().splitlines() or [""])[-1]
        if want == "ok" and r.returncode != 0:
            return f"the relaunch of the edited spec failed: {last[:200]}"
        if want == "error" and (r.returncode != 2 or "Traceback" in r.stderr
                                or not last.startswith("cgpt sweep: error:")
                                or (named and named not in last)):
            return f"the relaunch of the edited spec: rc {r.returncode}, {last[:200]}"
        return None
    return check


def _edit(p, f):
    def act():
        f(p)
    return act


def _set_tokens(p):
    s = yaml.safe_load(p.read_text())
    s["base"]["train"]["tokens"] = 1280
    p.write_text(yaml.safe_dump(s))


def _add_seed(p):
    s = yaml.safe_load(p.read_text())
    s["grid"]["seed"] = [0, 1, 2]
    p.write_text(yaml.safe_dump(s))


def _lr(p):
    s = yaml.safe_load(p.read_text())
    s["base"]["train"]["peak_lr"] = 0.004
    p.write_text(yaml.safe_dump(s))


CASES = {  # name -> (edit of the spec file, what the relaunch of the edited spec must do, named)
    "tokens_changed": (_set_tokens, "ok", None),  # new tokens are new run ids: new runs
    "peak_lr_changed": (_lr, "error", "peak_lr"),
    "seed_added": (_add_seed, "ok", None),
    "made_invalid_yaml": (lambda p: p.write_text("name: [\n"), "error", None),
    "deleted": (lambda p: p.unlink(), "error", None),
    "replaced_by_folder": (lambda p: (p.unlink(), p.mkdir()), "error", None),
}


def _make(edit, want, named):
    def make(ctx):
        p, d = _spec(ctx), ctx.fresh("sweep")
        return {"argv": _argv(p, d), "signals": [(_edit(p, edit), _started)], "timeout": 900,
                "check": _relaunch(ctx, p, d, want, named)}
    return make


for _n, (_e, _w, _named) in CASES.items():
    add(f"spec_{_n}", "ok", "specedit", _make(_e, _w, _named))


def _dir_edit(act_of, expect="ok"):
    def make(ctx):
        p, d = _spec(ctx), ctx.fresh("sweep")
        return {"argv": _argv(p, d), "signals": [(lambda: act_of(d), _started)],
                "timeout": 900, "check_ok": lambda: _done(d)}
    return make


def _resave_semicolons(d):
    f = d / "results.csv"
    if f.exists():
        f.write_text(f.read_text().replace(",", ";"))


add("results_csv_deleted", "ok", "specedit",
    _dir_edit(lambda d: (d / "results.csv").unlink(missing_ok=True)))
add("results_csv_resaved_by_spreadsheet", "ok", "specedit", _dir_edit(_resave_semicolons))
add("sweep_yaml_copy_deleted", "either", "specedit",
    _dir_edit(lambda d: (d / "sweep.yaml").unlink(missing_ok=True)))
add("second_run_dir_made_by_hand", "either", "specedit",
    _dir_edit(lambda d: (d / RUNS[1]).mkdir(exist_ok=True)))
_ = shutil
