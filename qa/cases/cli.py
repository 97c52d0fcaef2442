"""The command line itself: `python -m cgpt` with no or an unknown subcommand, every
subcommand's `--help`, missing positional arguments, the module entry points, and output into a
closed pipe. A researcher expects argparse's usage plus one `error:` line (exit 2), a help page
on stdout with exit 0, and silence when `| head` stops reading."""
import subprocess

from qa.registry import add

SUBCOMMANDS = ["train", "list", "generate", "eval", "sweep", "plan", "data", "data prepare",
               "coord-check"]


def _help_shown(res: subprocess.CompletedProcess) -> str | None:
    return None if "usage:" in res.stdout else "no usage text on stdout"


for _cmd in SUBCOMMANDS:
    add(f"help_{_cmd.replace(' ', '_')}", "ok", "cli",
        lambda ctx, c=_cmd: {"argv": [*c.split(), "--help"], "stdout_check": _help_shown,
                             "timeout": 300})

ERRORS = {  # name -> (argv, what the one line must name)
    "no_subcommand": ([], "command"),
    "unknown_subcommand": (["trian"], "trian"),
    "data_no_subcommand": (["data"], "prepare"),
    "data_unknown_subcommand": (["data", "tokenize"], "tokenize"),
    "list_extra_argument": (["list", "111M"], "111M"),
    "generate_no_prompt": (["generate", "/nonexistent"], "prompt"),
    "generate_no_source": (["generate"], "source"),
    "eval_no_source": (["eval"], "source"),
    "prepare_no_out": (["data", "prepare", "x.jsonl", "--tokenizer", "train"], "--out"),
    "prepare_no_tokenizer": (["data", "prepare", "x.jsonl", "--out", "s"], "--tokenizer"),
    "train_no_model": (["train", "--out", "never-made"], "--model"),
    "train_flag_without_value": (["train", "--model"], "--model"),
    "train_unknown_flag": (["train", "--model", "tiny-17k", "--lr", "1e-3"], "--lr"),
    "train_override_unknown_section": (["train", "--model", "tiny-17k", "optim.lr=1"], "optim"),
    "plan_no_model": (["plan"], "--model"),
    "sweep_no_spec": (["sweep", "--dry-run"], "spec"),
    "coord_check_abbreviated_flag": (["coord-check", "--width", "64"], "--widths"),
}
for _n, (_argv, _text) in ERRORS.items():
    add(_n, "error", "cli", lambda ctx, a=_argv, t=_text: {
        "argv": a, "expect_text": t, "timeout": 300,
        "check": lambda: "a directory was created" if (ctx.root / "never-made").exists()
        or (ctx.root / "s").exists() else None})

PIPE = """
import subprocess, sys
p = subprocess.Popen([sys.executable, "-m", "cgpt", *ARGV], stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)
p.stdout.read(READ)
p.stdout.close()  # `| head -c READ`: the reader has what it wanted
err = p.stderr.read().decode()
rc = p.wait()
sys.stderr.write(err)
sys.exit(0 if rc in (0, 141, -13) and not err.strip() else (rc or 1))
"""
for _n, (_argv, _read) in {"list_into_closed_pipe": (["list"], 10),
                           "help_into_closed_pipe": (["train", "--help"], 10)}.items():
    add(_n, "ok", "cli", lambda ctx, a=_argv, r=_read: {
        "python": PIPE.replace("ARGV", repr(a)).replace("READ", str(r)), "timeout": 300})

add("list_names_every_preset", "ok", "cli", lambda ctx: {
    "argv": ["list"], "timeout": 300,
    "stdout_check": lambda r: None if all(n in r.stdout for n in ("111M", "13B", "tiny-17k",
                                                                  "cpu-1.7m-mup"))
    else "a preset is missing from `cgpt list`"})
for _mod in ("cgpt.plan", "cgpt.sweep"):
    add(f"python_m_{_mod.split('.')[1]}_no_args", "error", "cli", lambda ctx, m=_mod: {
        "python": f"import runpy, sys; sys.argv = [{m!r}]; runpy.run_module({m!r}, "
                  "run_name='__main__')", "timeout": 300})
