"""results.csv edited by hand while the sweep that writes it runs (a row deleted, a column
added, the rows sorted, a run marked done with an invented loss, the file made read-only or
replaced): the sweep ends with every run `done`, each row's val_loss the one its run's
summary.json holds, and `analysis.load_results` reads the file (specedit.py has the file
deleted and re-saved with semicolons)."""
import csv
import json
import os

from qa.cases.specedit import RUNS, _argv, _spec, _started
from qa.registry import add


def _true_results(d):
    """None when every run is done in results.csv with its summary.json's val_loss, and the
    file loads; else what is wrong."""
    try:
        with open(d / "results.csv", newline="") as f:
            rows = {r["run_id"]: r for r in csv.DictReader(f)}
    except OSError as e:
        return f"results.csv: {e}"
    for run in RUNS:
        r = rows.get(run, {})
        if r.get("status") != "done":
            return f"{run}: status {r.get('status')!r} in results.csv"
        want = json.loads((d / run / "summary.json").read_text())["val_loss"]
        if abs(float(r["val_loss"]) - want) > 1e-9:
            return f"{run}: val_loss {r['val_loss']} in results.csv, {want} in summary.json"
    import analysis
    try:
        analysis.load_results(d)
    except ValueError as e:
        return f"load_results after the sweep: {e}"
    return None


def _edit_rows(f):
    """An edit of results.csv's rows (a list of dicts) as a spreadsheet would save them."""
    def act(d):
        p = d / "results.csv"
        if not p.exists():
            return
        with open(p, newline="") as fh:
            rows = list(csv.DictReader(fh))
        rows, fields = f(rows)
        with open(p, "w", newline="") as fh:
            w = csv.DictWriter(fh, fields)
            w.writeheader()
            w.writerows(rows)
    return act


def _fields(rows):
    return list(rows[0]) if rows else ["run_id"]


def _drop_second(rows):
    return [r for r in rows if r["run_id"] != RUNS[1]], _fields(rows)


def _notes(rows):
    return [dict(r, notes="looks good") for r in rows], _fields(rows) + ["notes"]


def _sorted(rows):
    return sorted(rows, key=lambda r: r["run_id"], reverse=True), _fields(rows)


def _invented(rows):
    return [dict(r, status="done", val_loss="1.234") if r["run_id"] == RUNS[1] else r
            for r in rows], _fields(rows)


def _extra_row(rows):
    return rows + [dict(rows[0], run_id="my_note_row", status="pending")], _fields(rows)


EDITS = {
    "row_of_a_pending_run_deleted": _edit_rows(_drop_second),
    "notes_column_added": _edit_rows(_notes),
    "rows_sorted_by_hand": _edit_rows(_sorted),
    "pending_run_marked_done_with_invented_loss": _edit_rows(_invented),
    "row_of_no_run_added": _edit_rows(_extra_row),
    "made_read_only": lambda d: os.chmod(d / "results.csv", 0o444)
    if (d / "results.csv").exists() else None,
}


def _make(act):
    def make(ctx):
        p, d = _spec(ctx), ctx.fresh("sweep")
        seen = []   # whether results.csv was there to edit (else the case tested nothing)

        def edit():
            seen.append((d / "results.csv").exists())
            act(d)
        return {"argv": _argv(p, d), "signals": [(edit, _started)], "timeout": 900,
                "check_ok": lambda: _true_results(d), "fired": lambda: any(seen)}
    return make


for _n, _act in EDITS.items():
    add(_n, "ok", "csvedit", _make(_act))
