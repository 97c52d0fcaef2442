"""`cgpt sweep SPEC --suggest K` on sweeps whose results.csv cannot carry a fit: too few or
failed runs, NaN / negative / infinite losses, rows of another sweep, a damaged file; and the
planner's flags given without `--suggest`. A researcher expects one line saying how many
usable runs there are and how many the fit needs, never a fit silently made from garbage,
never a KeyError from inside the planner."""
import csv
import json

import yaml

from cgpt.results_schema import COLUMNS
from qa.registry import add

SPEC = {"name": "sugg", "base": {"preset": "tiny-17k", "data": {"vocab_size": 512, "seq_len": 16},
                                 "train": {"batch_size": 4}},
        "grid": {"model": ["tiny-17k", "tiny-45k", "tiny-116k"],
                 "tokens_per_param": [10, 20, 40], "seed": [0]}}


def runs(ctx):
    """(spec path, [(run_id, model, n_params, tokens)]) of the 9-run sweep, as cgpt plans it."""
    def build(ctx):
        p = ctx.root / "suggest_spec.yaml"
        p.write_text(yaml.safe_dump(SPEC))
        r = ctx.python("import json; from cgpt.sweep.spec import load_sweep; print(json.dumps("
                       f"[(r.run_id, r.model, r.n_params, r.tokens) for r in load_sweep({str(p)!r})"
                       ".runs]))")
        if r.returncode:
            raise RuntimeError(r.stderr[-1000:])
        return p, [tuple(x) for x in json.loads(r.stdout)]
    return ctx.once("suggest_runs", build)


def _loss(n, d):
    return 1.7 + 400 / n ** 0.34 + 410 / d ** 0.28


def _rows(ctx, edit=None):
    rows = []
    for run_id, model, n, d in runs(ctx)[1]:
        row = dict.fromkeys(COLUMNS, "")
        row.update(run_id=run_id, model=model, seed=0, status="done", n_params=n,
                   n_params_nonembed=n // 2, tokens=d, flops_6nd=6 * n * d, flops=6.3 * n * d,
                   train_loss=_loss(n, d) + 0.01, val_loss=_loss(n, d), mup=False,
                   run_dir=run_id)  # no epochs: the corpus does not bound the suggestions
        rows.append(row)
    return edit(rows) if edit else rows


def _sweep_dir(ctx, rows=None, raw: bytes | None = None):
    d = ctx.fresh("sweep")
    d.mkdir(parents=True)
    if raw is not None:
        (d / "results.csv").write_bytes(raw)
    elif rows is not None:
        with open(d / "results.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else list(COLUMNS))
            w.writeheader()
            w.writerows(rows)
    return d


def _argv(ctx, d, *extra):
    return ["sweep", str(runs(ctx)[0]), "--out", str(d), "--suggest", "2", *extra]


def _set(key, value, which=slice(None)):
    def edit(rows):
        for r in rows[which]:
            r[key] = value
        return rows
    return edit


def _another_sweep(rows):
    for r in rows:
        r["n_params"] = r["n_params"] * 3 + 1
    return rows


def _loss_up(rows):
    for r in rows:
        r["val_loss"] = 2.0 + 1e-6 * r["n_params"] ** 0.5  # bigger runs worse: no law
    return rows


BAD = {  # name -> (rows edit / raw bytes, what the one line must name)
    "no_results_file": (None, "results.csv"),
    "header_only": (lambda rows: [], "finished"),
    "three_runs": (lambda rows: rows[:3], "finished"),
    "all_failed": (_set("status", "failed"), "finished"),
    "all_val_loss_nan": (_set("val_loss", "nan"), "finished"),
    "six_val_loss_inf": (_set("val_loss", "inf", slice(0, 6)), "finished"),
    "val_loss_negative": (_set("val_loss", -1.0, slice(0, 3)), "val_loss"),
    "val_loss_text": (_set("val_loss", "oops", slice(0, 1)), "val_loss"),
    "tokens_zero": (_set("tokens", 0, slice(0, 2)), "tokens"),
    "n_params_negative": (_set("n_params", -5, slice(0, 1)), "n_params"),
    "rows_of_another_sweep": (_another_sweep, "n_params"),
    "status_upper_case": (_set("status", "DONE"), "status"),
    "binary_file": (b"\x00\xff" * 300, "results.csv"),
}
for _n, (_edit, _text) in BAD.items():
    def _make(ctx, e=_edit, t=_text):
        if e is None:
            d = _sweep_dir(ctx)
        elif isinstance(e, bytes):
            d = _sweep_dir(ctx, raw=e)
        else:
            d = _sweep_dir(ctx, _rows(ctx, e))
        return {"argv": _argv(ctx, d), "expect_text": t, "timeout": 600}
    add(_n, "error", "suggest", _make)


def _ok(*extra, edit=None, check=None):
    def make(ctx):
        d = _sweep_dir(ctx, _rows(ctx, edit))
        return {"argv": _argv(ctx, d, *extra), "timeout": 900,
                **({"check_ok": lambda: check(ctx)} if check else {})}
    return make


def _next_written(ctx):
    p = runs(ctx)[0]
    nxt = p.with_name(p.stem + "_next.yaml")
    return None if nxt.is_file() and yaml.safe_load(nxt.read_text()).get("runs") else \
        f"{nxt} not written with runs"


add("nine_runs", "ok", "suggest", _ok())
add("duplicate_rows", "either", "suggest", _ok(edit=lambda rows: rows + rows))
add("losses_rise_with_size", "either", "suggest", _ok(edit=_loss_up))
add("target_below_the_largest_run", "either", "suggest", _ok("--target-flops", "1e3"))
add("write_next_spec", "ok", "suggest", _ok("--write", check=_next_written))
add("fit_min_flops_above_every_run", "error", "suggest",
    lambda ctx: {"argv": _argv(ctx, _sweep_dir(ctx, _rows(ctx)), "--fit-min-flops", "1e30"),
                 "expect_text": "--fit-min-flops", "timeout": 600})
for _flag, _value in (("--write", None), ("--target-flops", "1e20"), ("--budget-flops", "1e20"),
                      ("--fit-min-flops", "1e10")):
    add(f"{_flag[2:].replace('-', '_')}_without_suggest", "error", "suggest",
        lambda ctx, f=_flag, v=_value: {
            "argv": ["sweep", str(runs(ctx)[0]), "--out", str(_sweep_dir(ctx, _rows(ctx))),
                     "--dry-run", "--no-fit", f, *([v] if v else [])],
            "expect_text": "--suggest", "timeout": 600})
