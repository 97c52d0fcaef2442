"""Every command line's --help works (a `%` in a help string once crashed `cgpt plan --help`),
is discovered from the parser itself (a new subcommand is covered without editing this file),
and imports no JAX: help is instant and works where no accelerator stack is installed."""
import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def _help(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)


def _commands(parser: argparse.ArgumentParser, words=()) -> list[tuple[str, ...]]:
    """Every command path of `parser`, read from its subparsers (`sweep compare`: one name of
    two words, typed as two)."""
    out = [tuple(words)]
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, p in a.choices.items():
                out += _commands(p, (*words, *name.split()))
    return out


def test_every_subcommand_help():
    from cgpt.cli.commands import parser

    seen, failed, helps = [], [], {}
    for words in _commands(parser()):  # a parent before its subcommands
        r = _help("-m", "cgpt", *words)
        seen.append(" ".join(words))
        helps[words] = r.stdout
        if r.returncode or not r.stdout.startswith(f"usage: {' '.join(('cgpt', *words))}"):
            failed.append(f"cgpt {' '.join(words)} --help: exit {r.returncode}\n{r.stderr[-800:]}")
        elif words and words[-1] not in helps[words[:-1]]:
            failed.append(f"cgpt {' '.join(words[:-1])} --help does not list {words[-1]!r}")
    assert not failed, "\n".join(failed)
    # what cgpt/cli/commands.py registers today; more may come, none may disappear unnoticed
    assert {"", "train", "list", "generate", "eval", "sweep", "sweep compare", "plan", "data",
            "data prepare", "coord-check"} <= set(seen), seen


def test_sweep_compare_is_a_listed_subcommand_whose_help_reads_as_written():
    """Before: `sweep compare` was read from argv before the parser, so `cgpt --help` did not
    list it, and its help said "95%% bootstrap interval" (argparse formats no description)."""
    top = _help("-m", "cgpt")
    assert "sweep compare" in top.stdout, top.stdout
    r = _help("-m", "cgpt", "sweep", "compare")
    assert r.returncode == 0 and r.stdout.startswith("usage: cgpt sweep compare"), r.stderr
    text = " ".join(r.stdout.split())
    assert "95% bootstrap" in text and "%%" not in text, text


def test_module_entry_points_help():
    for module, prog in (("cgpt.plan", "cgpt plan"), ("cgpt.sweep", "cgpt sweep")):
        r = _help("-m", module)
        assert r.returncode == 0 and r.stdout.startswith(f"usage: {prog}"), r.stderr[-800:]
    assert "10% headroom" in _help("-m", "cgpt.plan").stdout  # the `%` argparse choked on


def test_help_imports_no_jax():
    code = """
import contextlib, io, sys
from cgpt.cli import main
for words in ([], ["train"], ["plan"], ["sweep"], ["data", "prepare"], ["coord-check"]):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main([*words, "--help"])
        except SystemExit as e:
            assert e.code == 0, words
heavy = sorted({"jax", "flax", "optax", "pandas"} & set(sys.modules))
sys.exit(f"--help imported {heavy}" if heavy else 0)
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-800:]


def _error(*argv: str) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-m", "cgpt", *argv], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    return r.returncode, r.stderr


def test_bad_suggest_and_vocab_flags_are_one_line_naming_the_flag(tmp_path):
    """Values argparse accepts but the command cannot use: one `error:` line that names the flag
    as typed (they used to name an internal argument, or were accepted)."""
    cases = [(("sweep", "sweeps/demo.yaml", "--suggest", "0"), "--suggest 0"),
             (("sweep", "sweeps/demo.yaml", "--suggest", "2", "--target-flops=-1e18"),
              "--target-flops -1e+18"),
             (("sweep", "sweeps/demo.yaml", "--suggest", "2", "--budget-flops", "0"),
              "--budget-flops 0"),
             (("sweep", "sweeps/demo.yaml", "--suggest", "2", "--fit-min-flops", "nan"),
              "--fit-min-flops nan"),
             (("data", "prepare", str(ROOT / "README.md"), "--tokenizer", "train",
               "--vocab-size", "1", "--out", str(tmp_path / "store")), "--vocab-size 1")]
    for argv, flag in cases:
        rc, err = _error(*argv)
        lines = err.strip().splitlines()
        assert rc != 0 and len(lines) == 1 and "error:" in lines[0] and flag in lines[0], (argv, err)
    assert not (tmp_path / "store").exists()


def test_every_argument_has_help_and_its_default():
    """Every positional and option of every subcommand says what it is, and `--help` names the
    default of each that has one (an omitted flag's meaning is never a guess); every command
    has a description."""
    import argparse

    from cgpt.cli.commands import _parsers, parser

    bare, described = [], []
    for p in _parsers(parser()):
        if not p.description:
            bare.append(p.prog)
        text = p.format_help()
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) or \
                    a.help == argparse.SUPPRESS:
                continue
            if not a.help:
                bare.append(f"{p.prog} {a.option_strings or a.dest}")
            elif a.option_strings and a.default not in (None, False) and not a.default == []:
                described.append((p.prog, a.option_strings[0], str(a.default) in text))
    assert bare == [] and all(ok for *_, ok in described), \
        (bare, [d for d in described if not d[2]])
    generate = " ".join(next(p for p in _parsers(parser())
                             if p.prog == "cgpt generate").format_help().split())
    assert "(default: 0.0)" in generate and "(default: 64)" in generate


def test_the_same_concept_is_the_same_flag_on_every_command():
    """--no-progress on every command with a progress bar, --model for a preset wherever one is
    named (coord-check's --preset stays as its older name)."""
    from cgpt.cli.commands import _parsers, parser

    flags = {p.prog: {o for a in p._actions for o in a.option_strings} for p in _parsers(parser())}
    for prog in ("cgpt train", "cgpt sweep", "cgpt data prepare"):
        assert "--no-progress" in flags[prog], prog
    for prog in ("cgpt train", "cgpt plan", "cgpt coord-check"):
        assert "--model" in flags[prog], prog
    assert parser().parse_args(["coord-check", "--preset", "tiny-17k"]).preset == "tiny-17k"
    assert parser().parse_args(["sweep", "x.yaml", "--no-progress"]).no_progress
