"""The results.csv columns: written by `cgpt sweep` (cgpt/sweep/state.py), read by
`analysis.load_results`. Defined once here, in cgpt beside the directories' contract
(`cgpt.rundir`) and the step record (`cgpt.record`), because cgpt writes the table: the writer
never imports `analysis`, and `analysis` depends on cgpt's JAX-free contract, never the
reverse. The columns a run's log gives (train_loss, val_loss, ...) are the step record's
results fields (`cgpt.record`, no imports), so neither side pulls pandas or JAX through this.
"""
from cgpt import record

REQUIRED = (
    "run_id", "model", "seed", "status", "error", "n_params", "n_params_nonembed", "tokens",
    "flops_6nd", "flops", "train_loss", "val_loss", "wall_time_s", "tokens_per_s", "mfu",
    "epochs", "mup", "run_dir",
)
# Written by every cgpt sweep, empty when a run has no FLOPs budget (isoflop specs set one) or
# no explicit learning rate; a hand-made results.csv may leave them out.
OPTIONAL = ("flops_budget", "peak_lr")
# The step record's results columns not placed above (a metric added since): numbers, after
# the others, and optional for a reader (a results.csv written before has none).
STEPS = tuple(c for c in record.results_columns() if c not in REQUIRED + OPTIONAL)
COLUMNS = REQUIRED + OPTIONAL + STEPS  # the writer's header, in this order
# what a finished run's summary.json fills (the others come from the sweep's plan of the run)
FROM_SUMMARY = ("n_params", "n_params_nonembed", "tokens", "flops_6nd", "flops", "wall_time_s",
                "epochs", "mup", *record.results_columns())
STATUSES = ("done", "failed", "running", "pending")
NUMERIC = ("seed", "n_params", "n_params_nonembed", "tokens", "flops_6nd", "flops", "train_loss",
           "val_loss", "wall_time_s", "tokens_per_s", "mfu", "epochs", "flops_budget",
           "peak_lr", *STEPS)
# Text cells a spreadsheet would run as a formula (OWASP "CSV injection": = + - @ tab CR first)
# are written with a leading single quote, as spreadsheets expect; a cell that begins with a
# quote gets one more, so the reader strips exactly one and every value reads back as written.
TEXT = ("run_id", "model", "error", "run_dir")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "'")


def neutralise(cell):
    """A text cell as results.csv stores it (see FORMULA_START)."""
    return "'" + cell if isinstance(cell, str) and cell.startswith(FORMULA_START) else cell


def restore(cell):
    """The value `neutralise` stored."""
    return cell[1:] if isinstance(cell, str) and cell.startswith("'") else cell
