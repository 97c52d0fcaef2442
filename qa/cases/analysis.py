"""`analysis` functions called with bad arguments: one ValueError/TypeError/OSError naming the
argument (printed here as `cgpt analysis: error: ...`), never a traceback from inside a fit."""
from qa.registry import add

X = "[1e17, 3e17, 1e18, 3e18, 1e19]"
Y = "[3.2, 3.0, 2.8, 2.65, 2.5]"
CALLS = {  # name -> (call, what the message must name)
    "fit_level_95": (f"fit_power_law({X}, {Y}, level=95, n_boot=5)", "level"),
    "fit_level_zero": (f"fit_power_law({X}, {Y}, level=0, n_boot=5)", "level"),
    "fit_n_boot_float": (f"fit_power_law({X}, {Y}, n_boot=10.5)", "n_boot"),
    "fit_x_strings": (f"fit_power_law(['a','b','c','d','e'], {Y}, n_boot=5)", "x"),
    "fit_y_nan": (f"fit_power_law({X}, [3.2, float('nan'), 2.8, 2.65, 2.5], n_boot=5)", "y"),
    "fit_length_mismatch": (f"fit_power_law({X}, [3.2, 3.0], n_boot=5)", "x"),
    "fit_space_bogus": (f"fit_power_law({X}, {Y}, space='cubic', n_boot=5)", "space"),
    "fit_delta_negative": (f"fit_power_law({X}, {Y}, delta=-1, n_boot=5)", "delta"),
    "fit_groups_wrong_length": (f"fit_power_law({X}, {Y}, groups=[1, 2], n_boot=5)", "groups"),
    "fit_x_negative": (f"fit_power_law([-1, 2, 3, 4, 5], {Y}, n_boot=5)", "x"),
    "chinchilla_n_negative": ("fit_chinchilla([-1e6, 2e6, 3e6], [1e8, 2e8, 3e8], [3, 2.9, 2.8], "
                              "n_boot=5)", "N"),
    "chinchilla_n_boot_negative": ("fit_chinchilla([1e6, 2e6, 3e6], [1e8, 2e8, 3e8], "
                                   "[3, 2.9, 2.8], n_boot=-1)", "n_boot"),
    "load_results_binary": ("load_results(_binary())", "results"),
    "load_results_empty": ("load_results(_empty())", "results"),
    "load_results_directory": ("load_results(tempfile.mkdtemp())", "results"),
    "isoflop_missing_column": ("fit_isoflop(__import__('pandas').DataFrame({'N': [1, 2]}))", "D"),
    "lr_optimum_window_zero": ("lr_optimum([1e-3, 2e-3, 4e-3], [3.0, 2.9, 3.1], window=0)",
                               "window"),
    "extrapolation_holdout_zero": (f"extrapolation_check({X}, {Y}, n_holdout=0, n_boot=5)",
                                   "n_holdout"),
    "extrapolation_holdout_all": (f"extrapolation_check({X}, {Y}, n_holdout=5, n_boot=5)",
                                  "n_holdout"),
}
PRELUDE = """
import os, sys, tempfile
from analysis import *
def _binary():
    fd, p = tempfile.mkstemp(suffix='.csv'); os.write(fd, os.urandom(500)); os.close(fd)
    return p
def _empty():
    fd, p = tempfile.mkstemp(suffix='.csv'); os.close(fd)
    return p
try:
    CALL
except (ValueError, TypeError, OSError) as e:
    print(f"cgpt analysis: error: {e}".splitlines()[0], file=sys.stderr)
    sys.exit(2)
"""


def _make(call: str, text: str):
    return lambda ctx: {"python": PRELUDE.replace("CALL", call), "expect_text": text}


for _name, (_call, _text) in CALLS.items():
    add(_name, "error", "analysis", _make(_call, _text))
