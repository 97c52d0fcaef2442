"""Published scaling laws, as data, for overlays and sanity checks.

Every law here is callable (law(x) or law(N, D)) and has .predict and .params. Units and
conventions differ between papers, so an overlay says "how does our slope compare", not
"we should match this number": Cerebras-GPT and Chinchilla losses are Pile / MassiveText
nats/token with total parameters, Kaplan's are WebText2 nats/token with non-embedding
parameters.

Sources (numbers transcribed here so nothing is read at run time):
  Cerebras-GPT: Dey et al. 2023, arXiv 2304.03208, Sec. 3.1 Eq. 1 and Tab. 3/8 (paper column).
    Batch sizes: the ModelZoo configs (params_*.yaml, global batch in 2048-token sequences).
  Chinchilla: Hoffmann et al. 2022, arXiv 2203.15556, Eq. 10 (rounded) and the unrounded
    values from its TeX source as used by Epoch (analyzing-chinchilla, `true_params`).
  Epoch replication: Besiroglu et al. 2024, arXiv 2404.10102 (headline estimate).
  Kaplan: Kaplan et al. 2020, arXiv 2001.08361, Eqs. 1.1-1.4.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .chinchilla import ChinchillaLaw
from .fit import PowerLaw

PF_DAY = 1e15 * 24 * 3600           # FLOPs in one petaflop/s-day (Kaplan's compute unit)

# L(f) = (f / 5.984e22)^(-0.0737) + 0.5066; f = algorithmic training FLOPs incl. attention,
# L = Pile test cross-entropy (nats/token), compute-optimal (20 tokens/param) models.
# Fitted on the seven published models, 111M (2.6e18 FLOPs) to 13B (2.3e22).
CEREBRAS_GPT = PowerLaw.from_scale(5.984e22, 0.0737, 0.5066, name="Cerebras-GPT (Dey+ 2023)",
                                   x_range=(2.6e18, 2.3e22))

# Hoffmann eq. 10 as printed, and unrounded (exp of the logs in the TeX source).
CHINCHILLA = ChinchillaLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28,
                           name="Chinchilla (Hoffmann+ 2022, rounded)")
CHINCHILLA_UNROUNDED = ChinchillaLaw(E=float(np.exp(0.5267228)), A=float(np.exp(6.0073404)),
                                     B=float(np.exp(6.0179186)), alpha=0.33917084,
                                     beta=0.2849083, name="Chinchilla (Hoffmann+ 2022, unrounded)")
EPOCH = ChinchillaLaw(E=1.81686, A=482.006, B=2085.434, alpha=0.34781, beta=0.36585,
                      name="Chinchilla replication (Besiroglu+ 2024)")
# Epoch's 95% bootstrap percentile intervals of the replication, for reference.
EPOCH_CI95 = {"E": (1.769, 1.871), "A": (285.2, 743.6), "B": (1042.4, 5810.3),
              "alpha": (0.317, 0.373), "beta": (0.331, 0.415)}

# Kaplan: L(N) = (N_c/N)^0.076 with non-embedding N; L(D) = (D_c/D)^0.095 in tokens;
# L(C_min) = (C_c/C_min)^0.050 with C_c = 3.1e8 PF-days, converted here to FLOPs.
KAPLAN_N = PowerLaw.from_scale(8.8e13, 0.076, name="Kaplan+ 2020 L(N), non-embedding N")
KAPLAN_D = PowerLaw.from_scale(5.4e13, 0.095, name="Kaplan+ 2020 L(D)")
KAPLAN_C = PowerLaw.from_scale(3.1e8 * PF_DAY, 0.050, name="Kaplan+ 2020 L(C_min), FLOPs")
# Kaplan Eq. 1.4: the critical batch B_crit(L) = B* / L^(1/alpha_B), B* ~ 2e8 tokens,
# alpha_B ~ 0.21 (WebText2 loss in nats/token; B_crit in tokens).
KAPLAN_BCRIT = PowerLaw(A=2e8, b=1 / 0.21, name="Kaplan+ 2020 B_crit(L), tokens")


def cerebras_gpt_batches() -> pd.DataFrame:
    """The batch sizes the seven Cerebras-GPT models trained with (sequences of 2048 tokens;
    cerebras_gpt.md's recipe table, the ModelZoo yamls), beside their Pile losses.

    13B switched from 720 to 1080 sequences after 84B tokens: batch_size is the final one,
    batch_size_start the first (equal for the others)."""
    t = cerebras_gpt_table()[["model", "n_params", "flops", "loss"]]
    t["batch_size"] = [120, 264, 264, 528, 528, 1040, 1080]
    t["batch_size_start"] = [120, 264, 264, 528, 528, 1040, 720]
    t["batch_tokens"] = t["batch_size"] * 2048
    return t


def cerebras_gpt_table() -> pd.DataFrame:
    """The seven Cerebras-GPT models: published training FLOPs and Pile test losses.

    flops: paper/HF-card column ("algorithmic" FLOPs, not 6ND: 6ND is 1.48e18 for 111M).
    loss: SP Pile test xent, paper Tab. 3/8 (the column behind Eq. 1).
    loss_mup: muP models (trained up to 2.7B only; NaN otherwise).
    n_params: nominal size from the model name; tokens: 20 tokens/param as trained.
    """
    return pd.DataFrame({
        "model": ["111M", "256M", "590M", "1.3B", "2.7B", "6.7B", "13B"],
        "n_params": [111e6, 256e6, 590e6, 1.3e9, 2.7e9, 6.7e9, 13e9],
        "tokens": [2.22e9, 5.12e9, 1.18e10, 2.63e10, 5.30e10, 1.33e11, 2.57e11],
        "flops": [2.6e18, 1.3e19, 6.1e19, 2.8e20, 1.1e21, 6.3e21, 2.3e22],
        "loss": [2.608, 2.349, 2.181, 1.997, 1.834, 1.704, 1.572],
        "loss_mup": [2.588, 2.359, 2.155, 1.984, 1.846, np.nan, np.nan],
    })
