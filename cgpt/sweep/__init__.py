"""`cgpt sweep`: many training runs from one spec, each its own crash-safe run directory.

spec.py (spec -> validated run list) -> state.py (run directories, results.csv) ->
executors.py (one train process per run: local threads or SLURM arrays) -> launch.py (the
sweep) -> command.py (the command line). None of them imports `cgpt.cli`.
"""
from cgpt.sweep.command import cmd_sweep, main, register
from cgpt.sweep.executors import Job, RunTask, device_share, execute_run, slurm_params, \
    train_argv
from cgpt.sweep.launch import EXECUTORS, compile_cache_env, launch, print_table
from cgpt.sweep.spec import Estimate, Run, Sweep, config_hash, load_sweep, missing_required, \
    read_spec, select
from cgpt.sweep.state import COLUMNS, config_change, result_row, write_results

__all__ = ["COLUMNS", "EXECUTORS", "Estimate", "Job", "Run", "RunTask", "Sweep", "cmd_sweep",
           "compile_cache_env", "config_change", "config_hash", "device_share", "execute_run",
           "launch", "load_sweep", "main", "missing_required", "print_table", "read_spec",
           "register", "result_row", "select", "slurm_params", "train_argv",
           "write_results"]
