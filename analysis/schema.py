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
