"""Scaling-law analysis for cgpt sweeps. Pure numpy/scipy/pandas/matplotlib: never imports jax
or cgpt, so it runs anywhere a results.csv can be read.

Conventions (see analysis.results and docs/analysis.md): parameters are total (embeddings
included) and compute is counted FLOPs (attention included) unless params="nonembed" or
flops="6nd" is passed.
"""
from .chinchilla import ChinchillaFit, ChinchillaLaw, fit_chinchilla
from .design import fit_ls, predict_loss_opt, suggest_runs
from .envelope import EnvelopeFit, fit_envelope, read_curves
from .extrapolate import Extrapolation, extrapolation_check
from .fit import PowerLaw, PowerLawFit, fit_power_law
from .isoflop import IsoFlopFit, fit_isoflop
from .plots import plot_curves, plot_envelope, plot_isoflop, plot_loss_vs_compute, plot_mup_vs_sp
from .published import (CEREBRAS_GPT, CHINCHILLA, CHINCHILLA_UNROUNDED, EPOCH, KAPLAN_C,
                        KAPLAN_D, KAPLAN_N, cerebras_gpt_table)
from .report import sweep_report
from .downstream import cerebras_gpt_downstream, fit_downstream, plot_downstream
from .transfer import LrOptimum, lr_drift, lr_optimum, lr_sweep, plot_lr_transfer, transfer_table
from .results import COLUMNS, compute, finished, load_results, n_params

__all__ = [
    "load_results", "finished", "compute", "n_params", "COLUMNS",
    "PowerLaw", "PowerLawFit", "fit_power_law",
    "ChinchillaLaw", "ChinchillaFit", "fit_chinchilla",
    "suggest_runs", "fit_ls", "predict_loss_opt",
    "IsoFlopFit", "fit_isoflop", "EnvelopeFit", "fit_envelope", "read_curves",
    "Extrapolation", "extrapolation_check",
    "CEREBRAS_GPT", "CHINCHILLA", "CHINCHILLA_UNROUNDED", "EPOCH", "KAPLAN_N", "KAPLAN_D",
    "KAPLAN_C", "cerebras_gpt_table",
    "plot_loss_vs_compute", "plot_isoflop", "plot_mup_vs_sp", "plot_envelope", "plot_curves",
    "sweep_report",
    "cerebras_gpt_downstream", "fit_downstream", "plot_downstream",
    "LrOptimum", "lr_optimum", "lr_sweep", "transfer_table", "lr_drift", "plot_lr_transfer",
]
