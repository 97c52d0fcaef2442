"""`cgpt eval`: lm-eval `--tasks` runs on a local multiple-choice task (no download) with flags
out of range, an `--output` that cannot be a file, `--include-path` of the wrong kind; the
task-only flags given without `--tasks`; validation loss on stores and corpora of the wrong
kind. As with `lm_eval --model hf`: an unusable flag is one line naming it, never silently
ignored, and results land only where `--output` (or the documented default) says."""
import gzip
import json
import os

from qa.registry import add

QUESTIONS = [("2 + 2 =", ["3", "4"], 1), ("The sky is", ["blue", "loud"], 0),
             ("def f(): return", ["1", "("], 0), ("import", ["os", "=="], 0)]


def tasks(ctx):
    """A folder holding one multiple-choice task on a local JSONL file."""
    def build(ctx):
        root = ctx.root / "lm_tasks"
        (root / "tasks").mkdir(parents=True)
        data = root / "mc.jsonl"
        data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n"
                                for q, c, a in QUESTIONS))
        (root / "tasks" / "local_mc.yaml").write_text(
            "task: qa_local_mc\ndataset_path: json\ndataset_name: null\ndataset_kwargs:\n"
            f"  data_files:\n    test: {data}\n  cache_dir: {root / 'hf_datasets'}\n"
            "test_split: test\noutput_type: multiple_choice\n"
            'doc_to_text: "Question: {{question}}\\nAnswer:"\ndoc_to_choice: "{{choices}}"\n'
            "doc_to_target: answer\nmetric_list:\n  - metric: acc\n    aggregation: mean\n"
            "    higher_is_better: true\n")
        return root / "tasks"
    return ctx.once("lm_tasks", build)


def _task_argv(ctx, src, *extra):
    return ["eval", str(src), "--tasks", "qa_local_mc", "--include-path", str(tasks(ctx)),
            "--bootstrap-iters", "0", *extra]


def _written(p):
    return lambda: None if p.is_file() and "results" in json.loads(p.read_text()) else \
        f"{p} was not written with results"


def _nothing_in(d):
    before = sorted(x.name for x in d.iterdir())
    return lambda: None if sorted(x.name for x in d.iterdir()) == before else \
        f"{d} changed: {sorted(x.name for x in d.iterdir())}"


def _ok_output(ctx):
    src, out = ctx.hf_copy(), ctx.fresh("results.json")
    return {"argv": _task_argv(ctx, src, "--limit", "2", "--output", str(out)),
            "check_ok": _written(out), "check": _nothing_in(src), "timeout": 900}


def _ok_default_output(ctx):
    src = ctx.hf_copy()
    return {"argv": _task_argv(ctx, src, "--limit", "0.5"), "timeout": 900,
            "check_ok": lambda: None if list((src / "lm_eval").glob("results_*.json"))
            else "no SOURCE/lm_eval/results_*.json"}


def _dir(ctx):
    d = ctx.fresh("outdir")
    d.mkdir(parents=True)
    return d


def _under_file(ctx):
    f = ctx.fresh("file")
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("x\n")
    return f / "results.json"


add("tasks_local_with_output", "ok", "evalcli", _ok_output)
add("tasks_local_default_output", "ok", "evalcli", _ok_default_output)
TASKS = {  # name -> (extra argv of ctx, what a refusal must name)
    "tasks_only_commas": (lambda ctx: ["--tasks", ",, ,"], "--tasks"),
    "tasks_unknown": (lambda ctx: ["--tasks", "qa_no_such_task"], "qa_no_such_task"),
    "output_is_a_directory": (lambda ctx: ["--output", str(_dir(ctx))], "outdir"),
    "output_under_a_file": (lambda ctx: ["--output", str(_under_file(ctx))], "file"),
    "limit_nan": (lambda ctx: ["--limit", "nan"], "--limit"),
    "limit_inf": (lambda ctx: ["--limit", "inf"], "--limit"),
    "batch_size_zero": (lambda ctx: ["--batch-size", "0"], "batch"),
    "num_fewshot_str": (lambda ctx: ["--num-fewshot", "two"], "--num-fewshot"),
    "include_path_missing": (lambda ctx: ["--include-path", "/nonexistent/tasks"],
                             "/nonexistent/tasks"),
    "bootstrap_iters_str": (lambda ctx: ["--bootstrap-iters", "many"], "--bootstrap-iters"),
    "dtype_bogus": (lambda ctx: ["--dtype", "int4"], "int4"),
}
for _n, (_extra, _text) in TASKS.items():
    def _make(ctx, e=_extra, t=_text):
        src = ctx.hf_copy()
        argv = _task_argv(ctx, src, "--limit", "2", *e(ctx))
        for flag in ("--tasks", "--include-path", "--limit"):  # the case's value wins
            if argv.count(flag) == 2:
                i = argv.index(flag)
                del argv[i:i + 2]
        return {"argv": argv, "expect_text": t, "check": _nothing_in(src), "timeout": 900}
    add(_n, "error", "evalcli", _make)

WITHOUT_TASKS = {"num_fewshot": ["--num-fewshot", "3"], "limit": ["--limit", "5"],
                 "output": ["--output", "r.json"], "include_path": ["--include-path", "."],
                 "bootstrap_iters": ["--bootstrap-iters", "10"]}
for _n, _extra in WITHOUT_TASKS.items():
    add(f"{_n}_without_tasks", "error", "evalcli", lambda ctx, e=_extra: {
        "argv": ["eval", str(ctx.hf), "--data", str(ctx.corpus), "--sequences", "4", *e],
        "expect_text": "--tasks", "timeout": 600})


def _store(ctx):
    """The tokenizer-trained store of the `data` cases: another tokenizer than the model's."""
    from qa.cases.data import tokenizer
    return os.path.dirname(tokenizer(ctx))


def _gz_truncated(ctx):
    d = ctx.fresh("gz")
    d.mkdir(parents=True)
    (d / "a.jsonl.gz").write_bytes(gzip.compress(b'{"text": "abc def"}\n' * 2000)[:60])
    return str(d / "a.jsonl.gz")


DATA = {  # name -> (--data of ctx, extra, expect, what a refusal must name)
    "data_store_of_another_tokenizer": (_store, [], "error", "tokenizer"),
    "data_truncated_gz": (_gz_truncated, [], "error", "a.jsonl.gz"),
    "data_a_run_directory": (lambda ctx: str(ctx.base), [], "error", "base"),
    "sequences_more_than_the_corpus": (lambda ctx: str(ctx.corpus),
                                       ["--sequences", "100000000"], "either", "sequences"),
    "batch_larger_than_sequences": (lambda ctx: str(ctx.corpus), ["--batch-size", "64"], "ok",
                                    None),
    "dtype_bfloat16": (lambda ctx: str(ctx.corpus), ["--dtype", "bfloat16"], "ok", None),
}
for _n, (_data, _extra, _expect, _text) in DATA.items():
    add(_n, _expect, "evalcli", lambda ctx, d=_data, e=_extra, t=_text: {
        "argv": ["eval", str(ctx.hf), "--data", d(ctx), "--sequences", "4", *e],
        "timeout": 900, **({"expect_text": t} if t else {})})
