"""`analysis` functions fed the data a notebook really meets: empty, single-point, NaN,
infinite, negative, duplicate and constant inputs, DataFrames without the rows or columns a fit
needs, malformed results.csv files, sweep directories without curves. Each must be one
ValueError / TypeError / OSError naming the argument or column (printed here as
`cgpt analysis: error: ...`), never a fit of garbage, a numpy warning storm or a KeyError.
The `analysis` group tries the wrong argument types; these are the wrong data."""
from cgpt.results_schema import COLUMNS
from qa.context import library
from qa.registry import add

X = "[1e17, 3e17, 1e18, 3e18, 1e19]"
Y = "[3.2, 3.0, 2.8, 2.65, 2.5]"
N9 = "[1e6, 1e6, 1e6, 4e6, 4e6, 4e6, 16e6, 16e6, 16e6]"
D9 = "[2e7, 8e7, 32e7, 2e7, 8e7, 32e7, 2e7, 8e7, 32e7]"
HEADER = ",".join(COLUMNS)  # a results.csv as `cgpt sweep` writes it; rows from _row() below
CALLS = {  # name -> (call, what the message must name)
    "fit_empty": ("fit_power_law([], [], n_boot=5)", "x"),
    "fit_one_point": ("fit_power_law([1e18], [3.0], n_boot=5)", "point"),
    "fit_two_points_with_offset": ("fit_power_law([1e18, 1e19], [3.0, 2.8], n_boot=5)",
                                   "point"),
    "fit_x_all_equal": ("fit_power_law([1e18] * 5, " + Y + ", n_boot=5)", "x"),
    "fit_x_inf": ("fit_power_law([1e17, 3e17, float('inf'), 3e18, 1e19], " + Y + ", n_boot=5)",
                  "x"),
    "fit_y_negative": (f"fit_power_law({X}, [3.2, 3.0, -2.8, 2.65, 2.5], n_boot=5)", "y"),
    "fit_y_zero": (f"fit_power_law({X}, [0, 0, 0, 0, 0], n_boot=5)", "y"),
    "fit_x_2d": (f"fit_power_law([{X}, {X}], {Y}, n_boot=5)", "x"),
    "chinchilla_empty": ("fit_chinchilla([], [], [], n_boot=5)", "N"),
    "chinchilla_lengths": (f"fit_chinchilla({N9}, {D9}, [3.0, 2.9], n_boot=5)", "L"),
    "chinchilla_loss_nan": (f"fit_chinchilla({N9}, {D9}, [float('nan')] * 9, n_boot=5)", "L"),
    "chinchilla_d_zero": (f"fit_chinchilla({N9}, [0] * 9, [3.0] * 9, n_boot=5)", "D"),
    "chinchilla_one_model": ("fit_chinchilla([1e6] * 6, [2e7, 4e7, 8e7, 16e7, 32e7, 64e7], "
                             "[3.1, 3.0, 2.9, 2.85, 2.8, 2.78], n_boot=5)", "N"),
    "isoflop_empty_frame": ("fit_isoflop(pd.DataFrame({'N': [], 'D': [], 'C': [], 'loss': [], "
                            "'budget': []}))", "budget"),
    "isoflop_one_budget_two_runs": ("fit_isoflop(pd.DataFrame({'N': [1e6, 4e6], 'D': [4e7, 1e7],"
                                    " 'C': [2.4e14] * 2, 'loss': [3.0, 3.1], "
                                    "'budget': ['a', 'a']}))", "budget"),
    "isoflop_loss_nan": ("fit_isoflop(pd.DataFrame({'N': [1e6, 2e6, 4e6] * 2, "
                         "'D': [4e7, 2e7, 1e7] * 2, 'C': [2.4e14] * 3 + [4.8e14] * 3, "
                         "'loss': [float('nan')] * 6, 'budget': ['a'] * 3 + ['b'] * 3}))",
                         "loss"),
    "load_results_missing_status": ("load_results(_csv('run_id,val_loss\\na,3.0\\n'))",
                                    "status"),
    "load_results_ragged_rows": (f"load_results(_csv({HEADER!r} + '\\na,b\\n1,2,3,4,5,6,7,8,"
                                 "9,10,11,12\\n'))", "results"),
    "load_results_duplicate_header": (f"load_results(_csv({(HEADER + ',val_loss')!r} + '\\n' "
                                      "+ _row() + ',2.9\\n'))", "val_loss"),
    "load_results_val_loss_text": (f"load_results(_csv({HEADER!r} + '\\n' + "
                                   "_row(val_loss='low')))", "val_loss"),
    "load_results_utf16": ("load_results(_csv('run_id,status\\n'.encode('utf-16')))",
                           "results"),
    "suggest_runs_empty_frame": ("suggest_runs(pd.DataFrame(columns=['n_params', 'tokens', "
                                 "'val_loss', 'status']), 1e20, 1e18)", "run"),
    "suggest_runs_budget_negative": ("suggest_runs(_done(9), 1e20, -1e18)", "budget"),
    "suggest_runs_target_nan": ("suggest_runs(_done(9), float('nan'), 1e18)", "target"),
    "lr_optimum_two_points": ("lr_optimum([1e-3, 2e-3], [3.0, 2.9])", "lr"),
    "lr_optimum_lr_negative": ("lr_optimum([-1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2], "
                               "[3.0, 2.95, 2.9, 3.0, 3.2])", "lr"),
    "lr_optimum_duplicate_lr": ("lr_optimum([1e-3, 1e-3, 1e-3, 1e-3, 1e-3], "
                                "[3.0, 2.95, 2.9, 3.0, 3.2])", "lr"),
    "sweep_report_empty_dir": ("sweep_report(tempfile.mkdtemp())", "results"),
    "sweep_report_no_finished_run": (f"sweep_report(_csv({HEADER!r} + '\\n' + "
                                     "_row(status='failed', val_loss='')))", "finished"),
    "read_curves_no_run_dirs": (f"read_curves(os.path.dirname(_csv({HEADER!r} + '\\n' + "
                                "_row())))", "metrics"),
    "fit_envelope_missing_dir": ("fit_envelope('/nonexistent/sweep')", "/nonexistent/sweep"),
}
PRELUDE = """
import os, tempfile
from cgpt.results_schema import COLUMNS
import numpy as np, pandas as pd
from analysis import *
def _csv(text):
    d = tempfile.mkdtemp(); p = os.path.join(d, 'results.csv')
    open(p, 'wb').write(text if isinstance(text, bytes) else text.encode())
    return p
def _row(**kw):
    row = dict(run_id='r', model='m', seed=0, status='done', error='', n_params=1e6,
               n_params_nonembed=5e5, tokens=2e7, flops_6nd=1.2e14, flops=1.3e14, train_loss=3.1,
               val_loss=3.0, wall_time_s=1, tokens_per_s=1, mfu=0.1, epochs=0.5, mup=False,
               run_dir='r', flops_budget='', peak_lr=1e-3)
    row.update(kw)
    return ','.join(str(row[c]) for c in COLUMNS)
def _done(n):
    N = np.repeat([1e6, 4e6, 16e6], 3)[:n]; D = np.tile([2e7, 8e7, 32e7], 3)[:n]
    return pd.DataFrame({'run_id': [f'r{i}' for i in range(n)], 'status': 'done', 'n_params': N,
                         'tokens': D, 'flops': 6 * N * D, 'flops_6nd': 6 * N * D, 'seed': 0,
                         'val_loss': 1.7 + 400 / N ** 0.34 + 410 / D ** 0.28, 'mup': False})
"""
for _name, (_call, _text) in CALLS.items():
    add(_name, "error", "notebookdata", lambda ctx, c=_call, t=_text: {
        "python": library(c, "analysis", PRELUDE), "expect_text": t, "timeout": 600})
add("fit_n_boot_zero_is_a_point_fit", "ok", "notebookdata", lambda ctx: {  # no band: allowed
    "python": library(f"print(fit_power_law({X}, {Y}, n_boot=0))", "analysis", PRELUDE),
    "timeout": 600})
add("load_results_header_only", "ok", "notebookdata", lambda ctx: {  # a sweep that just began
    "python": library(f"print(len(load_results(_csv({HEADER!r} + '\\n'))))", "analysis",
                      PRELUDE), "timeout": 600})
add("lr_optimum_drops_a_diverged_run", "ok", "notebookdata", lambda ctx: {  # NaN: diverged
    "python": library("print(lr_optimum([1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2], "
                      "[3.0, 2.95, 2.9, 3.0, 3.2, float('nan')]))", "analysis", PRELUDE),
    "timeout": 600})
