"""Scaling-law analysis for cgpt sweeps. numpy/scipy/pandas/matplotlib, and of cgpt only its
JAX-free contract (`cgpt.rundir`: the file names and their readers; `cgpt.results_schema`:
results.csv's columns; `cgpt.record`: a logged step's fields), so it runs anywhere a sweep
directory can be read, without JAX. cgpt imports it only in its command line (`cgpt.commands`).

Conventions (see analysis.results and docs/analysis.md): parameters are total (embeddings
included) and compute is counted FLOPs (attention included) unless params="nonembed" or
flops="6nd" is passed.

The names below load on first use (PEP 562): `import analysis` pulls neither pandas nor scipy.
The results.csv columns are cgpt's (`cgpt.results_schema`), re-exported by `analysis.results`.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "results": ("load_results", "finished", "compute", "n_params", "COLUMNS"),
    "fit": ("PowerLaw", "PowerLawFit", "fit_power_law"),
    "chinchilla": ("ChinchillaLaw", "ChinchillaFit", "fit_chinchilla"),
    "isoflop": ("IsoFlopFit", "fit_isoflop"),
    "envelope": ("EnvelopeFit", "fit_envelope", "read_curves"),
    "extrapolate": ("Extrapolation", "extrapolation_check"),
    "published": ("CEREBRAS_GPT", "CHINCHILLA", "CHINCHILLA_UNROUNDED", "EPOCH", "KAPLAN_N",
                  "KAPLAN_D", "KAPLAN_C", "KAPLAN_BCRIT", "cerebras_gpt_table",
                  "cerebras_gpt_batches"),
    "multiplier": ("Comparison", "compare"),
    "plots": ("plot_loss_vs_compute", "plot_isoflop", "plot_mup_vs_sp", "plot_envelope",
              "plot_curves", "plot_critical_batch", "plot_batch_tradeoff",
              "plot_compare"),
    "report": ("sweep_report",),
    "gns": ("read_noise", "critical_batch", "noise_table", "fit_critical_batch",
            "BcritScaling", "fit_bcrit_scaling"),
    "batch_tradeoff": ("TradeoffFit", "fit_tradeoff", "measure_critical_batch"),
    "downstream": ("cerebras_gpt_downstream", "fit_downstream", "plot_downstream",
                   "TwoStepFit", "fit_downstream_two_step"),
    "design": ("suggest_runs", "fit_ls", "predict_loss_opt", "profile_loss_opt"),
    "schedule_law": ("ScheduleLawFit", "fit_schedule_law", "read_schedule_curves"),
    "schedule_endpoints": ("PredictedEndpoints", "predict_endpoints"),
    "study": ("bring_in", "lr_every_step"),
    "transfer": ("LrOptimum", "lr_optimum", "seed_optimum", "lr_sweep", "transfer_table",
                 "lr_drift", "lr_drift_ci", "plot_lr_transfer"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = list(_HOME)


def __getattr__(name: str):
    if name in _EXPORTS:  # a submodule: analysis.plots, ...
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME) | set(_EXPORTS))
