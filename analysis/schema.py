"""The results.csv columns: written by `cgpt sweep` (cgpt/sweep/state.py), read by
`analysis.load_results`. Defined once here, with no imports, so the writer can use it without
pulling pandas (and so `analysis` still never imports cgpt).
"""
REQUIRED = (
    "run_id", "model", "seed", "status", "error", "n_params", "n_params_nonembed", "tokens",
    "flops_6nd", "flops", "train_loss", "val_loss", "wall_time_s", "tokens_per_s", "mfu",
    "epochs", "mup", "run_dir",
)
# Written by every cgpt sweep, empty when a run has no FLOPs budget (isoflop specs set one) or
# no explicit learning rate; a hand-made results.csv may leave them out.
OPTIONAL = ("flops_budget", "peak_lr")
COLUMNS = REQUIRED + OPTIONAL  # the writer's header, in this order
STATUSES = ("done", "failed", "running", "pending")
NUMERIC = ("seed", "n_params", "n_params_nonembed", "tokens", "flops_6nd", "flops", "train_loss",
           "val_loss", "wall_time_s", "tokens_per_s", "mfu", "epochs", "flops_budget", "peak_lr")
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
