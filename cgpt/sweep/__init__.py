"""`cgpt sweep`: many training runs from one spec, each its own crash-safe run directory.

spec.py (spec -> validated run list) -> state.py (run directories, results.csv) ->
executors.py (one train process per run: local threads or SLURM arrays) -> launcher.py (the
sweep). Its command line is `cgpt.commands.sweep`; none of these imports it, `cgpt.cli` or
`analysis` (the report, --suggest and compare are the command line's).

The names below load on first use (PEP 562): `python -m cgpt.sweep` imports this package
before its entry (`cgpt.cli.entry`) installs the stop guard, so it loads nothing.
"""
from __future__ import annotations

import importlib

# public names -> the module that defines them
_EXPORTS = {
    "executors": ("Job", "RunTask", "device_share", "execute_run", "slurm_params",
                  "train_argv"),
    "launcher": ("EXECUTORS", "compile_cache_env", "launch", "print_table"),
    "spec": ("Estimate", "Run", "Sweep", "config_hash", "load_sweep", "missing_required",
             "read_spec", "select"),
    "state": ("COLUMNS", "config_change", "result_row", "write_results"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))

