"""Every command line's --help works (a `%` in a help string once crashed `cgpt plan --help`),
is discovered from the parser itself (a new subcommand is covered without editing this file),
and imports no JAX: help is instant and works where no accelerator stack is installed."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def _help(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)


def _subcommands(help_text: str) -> list[str]:
    # argparse's usage line shows subcommands as "{a,b} ..." (flag choices lack the "...")
    m = re.search(r"\{([\w,\-]+)\} \.\.\.", help_text.split("\n\n")[0])
    return m.group(1).split(",") if m else []


def test_every_subcommand_help():
    seen, failed, todo = [], [], [[]]
    while todo and len(seen) < 50:
        words = todo.pop(0)
        r = _help("-m", "cgpt", *words)
        seen.append(" ".join(words))
        if r.returncode or not r.stdout.startswith("usage: cgpt"):
            failed.append(f"cgpt {' '.join(words)} --help: exit {r.returncode}\n{r.stderr[-800:]}")
            continue
        todo += [[*words, w] for w in _subcommands(r.stdout)]
    assert not failed, "\n".join(failed)
    # what cgpt/cli.py registers today; more may come, none may disappear unnoticed
    assert {"", "train", "list", "generate", "eval", "sweep", "plan", "data", "data prepare",
            "coord-check"} <= set(seen), seen


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
