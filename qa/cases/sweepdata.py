"""`analysis` on damaged copies of real sweeps (the notebooks' demo and critical-batch data):
results.csv re-saved by a spreadsheet, cut short or edited by hand; a run's metrics.jsonl or
summary.json torn, emptied, of the wrong kind or without the keys a reader needs; run
directories moved or missing. What a notebook does with a sweep directory: `load_results`,
`read_curves`, `fit_envelope`, `sweep_report`, `gns.noise_table`. Each must work or be one
ValueError / TypeError / OSError naming the file and what to do (printed here as
`cgpt analysis: error: ...`), never a KeyError or a parser's message without the file.
The `notebookdata` group feeds the functions made-up arrays and frames; these are the files."""
import json
import shutil
from pathlib import Path

from qa.context import library
from qa.registry import add

DEMO, CB = "demo", "critical_batch"
RUN = {DEMO: "tiny-13k_d269k_s0", CB: "tiny-30k_d597k_s0"}
PRELUDE = "import analysis as A\nfrom analysis import gns\nimport numpy as np\n"
CALL = {  # what a notebook calls on the sweep directory D
    "load": "print(len(A.finished(A.load_results(D))))",
    "report": "print(A.sweep_report(D, OUT, n_boot=20))",
    "curves": "print(len(A.read_curves(D)))",
    "envelope": "print(A.fit_envelope(D, n_boot=10).summary())",
    "plot_curves": "A.plot_curves(A.read_curves(D), path=OUT)",
    "noise": "print(gns.noise_table(D).to_string())",
    "fit_bcrit": "print(gns.fit_critical_batch(gns.noise_table(D), n_boot=10).params)",
}


def copy(ctx, which: str) -> Path:
    d = ctx.fresh(f"sweep-{which}")
    shutil.copytree(ctx.code / "notebooks" / "data" / which, d)
    return d


def _csv_edit(edit):
    """results.csv rewritten by edit(text) -> str | bytes."""
    def damage(d: Path):
        p = d / "results.csv"
        new = edit(p.read_text())
        p.write_bytes(new if isinstance(new, bytes) else new.encode())
    return damage


def _log_edit(edit, run=None, name="metrics.jsonl"):
    """One run's metrics.jsonl (or another file) rewritten by edit(path)."""
    def damage(d: Path):
        edit(d / (run or RUN[d.name.split("sweep-")[1]]) / name)
    return damage


def _lines(f):
    """Rewrite a JSON-lines file through f(list of dicts) -> list of dicts."""
    def edit(p: Path):
        rows = [json.loads(x) for x in p.read_text().splitlines()]
        p.write_text("".join(json.dumps(r) + "\n" for r in f(rows)))
    return edit


def _text(data):
    return lambda p: p.write_bytes(data if isinstance(data, bytes) else data.encode())


def _tear(p: Path):
    p.write_bytes(p.read_bytes()[:-40])


def _to_dir(p: Path):
    p.unlink()
    p.mkdir()


def _semicolons(t: str) -> str:  # a European spreadsheet's "Save as CSV"
    return "\n".join(x.replace(",", ";").replace(".", ",") for x in t.splitlines()) + "\n"


def _cols(t: str, f) -> str:
    import csv
    import io
    rows = list(csv.reader(io.StringIO(t)))
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(f(rows))
    return out.getvalue()


def _set(col: str, value: str, row: int = 1):
    """results.csv with `col` of data row `row` set to `value`."""
    def f(rows):
        rows[row][rows[0].index(col)] = value
        return rows
    return lambda t: _cols(t, f)


def _drop_col(col: str):
    def f(rows):
        i = rows[0].index(col)
        return [r[:i] + r[i + 1:] for r in rows]
    return lambda t: _cols(t, f)


def _other_run_dir(d: Path):
    """results.csv's run_dir of one run names another run's (existing) directory."""
    other = d / RUN[d.name.split("sweep-")[1]]
    _csv_edit(lambda t: _cols(t, lambda rows: [
        r if i != 1 else [*r[:rows[0].index("run_dir")], str(other),
                          *r[rows[0].index("run_dir") + 1:]] for i, r in enumerate(rows)]))(d)


CASES = {  # name -> (sweep, damage, call, expect, what a refusal must name)
    # results.csv as a spreadsheet or an editor leaves it
    "csv_semicolon_decimal_comma": (DEMO, _csv_edit(_semicolons), "load", "error", "results.csv"),
    "csv_utf8_bom": (DEMO, _csv_edit(lambda t: "\ufeff" + t), "report", "ok", None),
    "csv_crlf": (DEMO, _csv_edit(lambda t: t.replace("\n", "\r\n")), "report", "ok", None),
    "csv_latin1_model_name": (DEMO, _csv_edit(lambda t: t.replace("tiny-13k,", "tïny-13k,", 1)
                                              .encode("latin-1")), "load", "either",
                              "results.csv"),
    "csv_extra_user_column": (DEMO, _csv_edit(lambda t: _cols(t, lambda rows: [
        r + (["notes"] if i == 0 else ["ok, fine"]) for i, r in enumerate(rows)])),
        "report", "ok", None),
    "csv_columns_reordered": (DEMO, _csv_edit(lambda t: _cols(t, lambda rows: [
        r[::-1] for r in rows])), "report", "ok", None),
    "csv_blank_lines": (DEMO, _csv_edit(lambda t: t.replace("\n", "\n\n")), "report", "ok",
                        None),
    "csv_comment_line": (DEMO, _csv_edit(lambda t: t + "# rerun tiny-76k later\n"), "load",
                         "error", "status"),
    "csv_status_upper": (DEMO, _csv_edit(_set("status", "DONE")), "load", "error", "status"),
    "csv_status_padded": (DEMO, _csv_edit(_set("status", " done")), "load", "error", "status"),
    "csv_mup_yes": (DEMO, _csv_edit(_set("mup", "yes")), "load", "ok", None),
    "csv_mup_garbage": (DEMO, _csv_edit(_set("mup", "maybe")), "load", "error", "results.csv"),
    "csv_tokens_with_unit": (DEMO, _csv_edit(_set("tokens", "266k")), "load", "error",
                             "tokens"),
    "csv_n_params_thousands_sep": (DEMO, _csv_edit(_set("n_params", "13,440")), "load",
                                   "error", "n_params"),
    "csv_header_only": (DEMO, _csv_edit(lambda t: t.splitlines()[0] + "\n"), "report", "error",
                        "finished"),
    "csv_missing_with_runs": (DEMO, lambda d: (d / "results.csv").unlink(), "report", "error",
                              "results.csv"),
    "csv_nul_bytes": (DEMO, _csv_edit(lambda t: t[:300] + "\0\0\0" + t[300:]), "load",
                      "either", "results.csv"),
    "csv_no_run_dir_column": (DEMO, _csv_edit(_drop_col("run_dir")), "load", "error",
                              "run_dir"),
    "csv_no_flops_column_report": (DEMO, _csv_edit(_drop_col("flops")), "report", "error",
                                   "flops"),
    "csv_seed_float": (DEMO, _csv_edit(_set("seed", "0.0")), "report", "ok", None),
    "csv_quoted_numbers": (DEMO, _csv_edit(lambda t: _cols(t, lambda rows: rows)
                                           .replace(",13440,", ',"13440",')), "report", "ok",
                           None),
    "csv_is_symlink_to_copy": (DEMO, lambda d: (
        (d / "results.csv").rename(d / "r.csv"), (d / "results.csv").symlink_to(d / "r.csv")),
        "report", "ok", None),
    "csv_all_failed": (DEMO, _csv_edit(lambda t: t.replace(",done,", ",failed,")), "report",
                       "error", "finished"),
    "csv_two_runs_done": (DEMO, _csv_edit(lambda t: t.replace(",done,", ",running,", 4)),
                          "report", "error", "3"),
    # a run's training log, read by read_curves / fit_envelope / plot_curves
    "log_torn_last_line": (DEMO, _log_edit(_tear), "curves", "either", "metrics.jsonl"),
    "log_garbage_line": (DEMO, _log_edit(lambda p: p.write_text(
        p.read_text().replace("\n", "\n}{garbage\n", 1))), "curves", "error", "metrics.jsonl"),
    "log_empty": (DEMO, _log_edit(_text("")), "curves", "error", "metrics.jsonl"),
    "log_missing": (DEMO, _log_edit(lambda p: p.unlink()), "curves", "error", "metrics.jsonl"),
    "log_is_dir": (DEMO, _log_edit(_to_dir), "curves", "error", "metrics.jsonl"),
    "log_binary": (DEMO, _log_edit(_text(b"\x00\xff\xfe" * 100)), "curves", "error",
                   "metrics.jsonl"),
    "log_utf16": (DEMO, _log_edit(lambda p: p.write_bytes(p.read_text().encode("utf-16"))),
                  "curves", "error", "metrics.jsonl"),
    "log_one_json_array": (DEMO, _log_edit(lambda p: p.write_text(
        json.dumps([json.loads(x) for x in p.read_text().splitlines()]))), "curves", "error",
        "metrics.jsonl"),
    "log_no_tokens_key": (DEMO, _log_edit(_lines(lambda rows: [
        {k: v for k, v in r.items() if k != "tokens"} for r in rows])), "curves", "error",
        "tokens"),
    "log_loss_null_some": (DEMO, _log_edit(_lines(lambda rows: [
        {**r, "loss": None} if i % 3 == 0 else r for i, r in enumerate(rows)])), "curves",
        "ok", None),
    "log_loss_null_all": (DEMO, _log_edit(_lines(lambda rows: [
        {**r, "loss": None} for r in rows])), "curves", "either", "metrics.jsonl"),
    # steps out of order or repeated: refused naming the file and line (cgpt.rundir.read_metrics,
    # the reader resume shares, never sorts or cuts a log silently: its documented contract)
    "log_steps_shuffled": (DEMO, _log_edit(_lines(lambda rows: rows[::-1])), "envelope",
                           "error", "metrics.jsonl, line"),
    "log_steps_repeated": (DEMO, _log_edit(_lines(lambda rows: rows + rows[-5:])), "envelope",
                           "error", "metrics.jsonl, line"),
    "log_loss_string": (DEMO, _log_edit(_lines(lambda rows: [
        {**r, "loss": str(r["loss"])} for r in rows])), "curves", "either", "loss"),
    "log_huge_loss": (DEMO, _log_edit(_lines(lambda rows: [
        {**r, "loss": 1e300} if i == 3 else r for i, r in enumerate(rows)])), "envelope", "ok",
        None),
    "log_nested_value": (DEMO, _log_edit(_lines(lambda rows: [
        {**r, "tokens": [r["tokens"]]} if i == 2 else r for i, r in enumerate(rows)])),
        "curves", "error", "tokens"),
    "run_dir_deleted": (DEMO, lambda d: shutil.rmtree(d / RUN[DEMO]), "curves", "error",
                        RUN[DEMO]),
    "run_dir_is_file": (DEMO, lambda d: (shutil.rmtree(d / RUN[DEMO]),
                                         (d / RUN[DEMO]).write_text("x")), "curves", "error",
                        RUN[DEMO]),
    "run_dir_points_at_another_run": (DEMO, _other_run_dir, "envelope", "error", "run_dir"),
    "envelope_one_run_left": (DEMO, _csv_edit(lambda t: t.replace(",done,", ",failed,", 5)),
                              "envelope", "error", "2 runs"),
    # a figure path in a folder not made yet: made (analysis.plots saves as `mkdir -p` would),
    # checked below by the figure being there
    "plot_curves_png_into_missing_dir": (DEMO, lambda d: None, "plot_curves_missing", "ok",
                                         None),
    "report_png_is_a_directory": (DEMO, lambda d: (d / "out.png").mkdir(), "report", "error",
                                  "out.png"),
    "report_png_unknown_format": (DEMO, lambda d: None, "report_xyz", "error", "xyz"),
    # the critical-batch sweep: gns.noise_table and its fit
    "gns_summary_missing": (CB, _log_edit(lambda p: p.unlink(), name="summary.json"), "noise",
                            "error", "summary.json"),
    "gns_summary_garbage": (CB, _log_edit(_text("{oops"), name="summary.json"), "noise",
                            "error", "summary.json"),
    "gns_summary_list": (CB, _log_edit(_text("[1, 2]"), name="summary.json"), "noise", "error",
                         "summary.json"),
    "gns_summary_no_seq_len": (CB, _log_edit(lambda p: p.write_text(json.dumps(
        {k: v for k, v in json.loads(p.read_text()).items() if k != "seq_len"})),
        name="summary.json"), "noise", "error", "seq_len"),
    "gns_log_torn_last_line": (CB, _log_edit(_tear), "noise", "either", "metrics.jsonl"),
    "gns_not_logged": (CB, _log_edit(_lines(lambda rows: [
        {k: v for k, v in r.items() if not k.startswith("gns")} for r in rows])), "noise",
        "error", "gns=true"),
    "gns_g2_negative": (CB, _log_edit(_lines(lambda rows: [
        {**r, "gns_g2": -abs(r.get("gns_g2") or 1.0)} for r in rows])), "noise", "error",
        RUN[CB]),
    "gns_no_step_key": (CB, _log_edit(_lines(lambda rows: [
        {k: v for k, v in r.items() if k != "step"} for r in rows])), "noise", "error", "step"),
    "gns_values_null": (CB, _log_edit(_lines(lambda rows: [
        {**r, "gns_g2": None, "gns_trace": None} for r in rows])), "noise", "error",
        RUN[CB]),
    "gns_one_run_fit": (CB, _csv_edit(lambda t: t.replace(",done,", ",failed,", 3)),
                        "fit_bcrit", "error", "point"),
    "gns_summary_seq_len_str": (CB, _log_edit(lambda p: p.write_text(json.dumps(
        {**json.loads(p.read_text()), "seq_len": "long"})), name="summary.json"), "noise",
        "error", "seq_len"),
}
EXTRA = {"plot_curves_missing": ("A.plot_curves(A.read_curves(D), "
                                 "path=D + '/nonexistent/c.png')\n"
                                 "from pathlib import Path\n"
                                 "assert Path(D, 'nonexistent', 'c.png').stat().st_size > 1000"),
         "report_xyz": "print(A.sweep_report(D, D + '/fit.xyz', n_boot=20))"}


def _make(which, damage, call, text):
    def make(ctx):
        d = copy(ctx, which)
        damage(d)
        code = EXTRA.get(call) or CALL[call]
        body = f"D = {str(d)!r}\nOUT = D + '/out.png'\n{code}"
        spec = {"python": library(body, "analysis", PRELUDE), "timeout": 600}
        if text:
            spec["expect_text"] = text
        return spec
    return make


for _n, (_w, _dmg, _call, _expect, _text) in CASES.items():
    add(_n, _expect, "sweepdata", _make(_w, _dmg, _call, _text))
for _w, _calls in {DEMO: ("load", "report", "curves", "envelope"),
                   CB: ("noise", "fit_bcrit")}.items():
    for _c in _calls:  # the intact copies: what every damaged case is measured against
        add(f"intact_{_w}_{_c}", "ok", "sweepdata", _make(_w, lambda d: None, _c, None))
