"""Cerebras-GPT's downstream (zero- and five-shot) accuracy as data, and its trend in compute.

The paper evaluates every size with EleutherAI's lm-evaluation-harness on seven tasks
(HellaSwag, PIQA, WinoGrande, LAMBADA, ARC-easy, ARC-challenge, OpenBookQA); these tables
are the Cerebras ModelZoo README's (commit b353ab5; the SP rows equal the HF model cards,
the μP rows the paper's Table 3). `cgpt eval RUN --tasks ...` produces the same numbers for
cgpt's own runs (metric `acc`, LAMBADA `acc` on lambada_openai).

`fit_downstream` fits the error rate 1 - accuracy as a power law in training compute with a
floor, err = A * C^(-b) + c (the form of the loss law, `analysis.fit_power_law`), so the
accuracy trend is drawn and extrapolated like the loss: `plot_downstream` puts the two
side by side.
"""
from __future__ import annotations

import pandas as pd

from .fit import PowerLawFit, fit_power_law
from .plots import _figure, _grid, _plain_y, _save
from .published import CEREBRAS_GPT, cerebras_gpt_table

TASKS = ("hellaswag", "piqa", "winogrande", "lambada", "arc_easy", "arc_challenge", "openbookqa")
SIZES = ("111M", "256M", "590M", "1.3B", "2.7B", "6.7B", "13B")

# (shots, μP) -> one row per size: the seven task accuracies then the published average.
_TABLES = {
    (0, False): [
        (.268, .594, .488, .194, .380, .166, .118, .315),
        (.274, .613, .511, .293, .410, .170, .158, .347),
        (.291, .627, .498, .366, .464, .190, .158, .370),
        (.325, .664, .521, .462, .508, .224, .166, .410),
        (.386, .701, .559, .567, .571, .246, .206, .462),
        (.447, .739, .602, .636, .643, .282, .238, .512),
        (.513, .766, .646, .696, .714, .367, .286, .570),
    ],
    (0, True): [
        (.268, .598, .519, .204, .390, .176, .124, .325),
        (.274, .617, .505, .287, .427, .194, .156, .351),
        (.295, .644, .517, .362, .470, .194, .172, .379),
        (.334, .682, .512, .471, .515, .223, .196, .419),
        (.388, .697, .557, .558, .569, .241, .218, .461),
    ],
    (5, False): [
        (.267, .588, .475, .158, .356, .166, .136, .306),
        (.278, .606, .522, .225, .422, .183, .164, .343),
        (.291, .634, .479, .281, .475, .206, .152, .360),
        (.326, .668, .536, .395, .529, .241, .174, .410),
        (.382, .697, .543, .487, .590, .267, .224, .456),
        (.444, .736, .590, .591, .667, .314, .270, .516),
        (.514, .768, .674, .655, .743, .398, .318, .581),
    ],
    (5, True): [
        (.268, .581, .520, .146, .368, .175, .124, .312),
        (.278, .619, .534, .220, .415, .193, .154, .345),
        (.298, .652, .515, .301, .479, .206, .174, .375),
        (.329, .672, .513, .396, .531, .235, .212, .413),
        (.382, .704, .560, .510, .595, .267, .210, .461),
    ],
}


def cerebras_gpt_downstream(shots: int = 0, mup: bool = False) -> pd.DataFrame:
    """Published accuracies: one row per model (μP: 111M-2.7B only) with its training FLOPs
    (from `cerebras_gpt_table`), the seven tasks and `average` (the published column)."""
    if (shots, mup) not in _TABLES:
        raise ValueError(f"shots={shots}, mup={mup}: published tables are 0- and 5-shot, "
                         "SP and μP")
    rows = _TABLES[(shots, mup)]
    df = pd.DataFrame(rows, columns=[*TASKS, "average"])
    flops = cerebras_gpt_table().set_index("model")["flops"]
    df.insert(0, "model", list(SIZES[:len(rows)]))
    df.insert(1, "flops", flops.loc[df["model"]].to_numpy())
    df.insert(2, "mup", mup)
    df.insert(3, "shots", shots)
    return df


def fit_downstream(table: pd.DataFrame, task: str = "average", **kw) -> PowerLawFit:
    """Error rate 1 - accuracy of `task` against training FLOPs: err = A * C^(-b) + c, the
    loss law's form (keyword arguments go to `fit_power_law`; default Huber in log space)."""
    if task not in table.columns:
        raise ValueError(f"task={task!r}: not a column; use one of {[*TASKS, 'average']}")
    return fit_power_law(table["flops"].to_numpy(float), 1.0 - table[task].to_numpy(float), **kw)


def plot_downstream(shots: int = 0, fit: PowerLawFit | None = None, *, path=None):
    """Left: the published Pile loss against compute with the Cerebras-GPT law. Right: the
    average downstream accuracy against compute with the fitted trend and its bootstrap
    band; μP models as open markers on both."""
    sp, mp = cerebras_gpt_downstream(shots, False), cerebras_gpt_downstream(shots, True)
    fit = fit_downstream(sp) if fit is None else fit
    pub = cerebras_gpt_table()
    fig, (ax, ax2) = _figure(2)
    xx = _grid(pub["flops"], 0.5, 2.0)
    ax.scatter(pub["flops"], pub["loss"], s=18, color="k", zorder=3, label="SP (Pile test)")
    ax.scatter(pub["flops"], pub["loss_mup"], s=40, facecolors="none", edgecolors="C3",
               zorder=3, label="μP")
    ax.plot(xx, CEREBRAS_GPT.predict(xx), "--", color="C1", label=CEREBRAS_GPT.name)
    ax.set(xscale="log", yscale="log", xlabel="training FLOPs", ylabel="loss (nats/token)",
           title="Loss law")
    _plain_y(ax)
    ax.legend(fontsize=8)
    p = fit.params
    ax2.scatter(sp["flops"], sp["average"], s=18, color="k", zorder=3, label="SP")
    ax2.scatter(mp["flops"], mp["average"], s=40, facecolors="none", edgecolors="C3",
                zorder=3, label="μP")
    ax2.plot(xx, 1.0 - fit.predict(xx), color="C0",
             label=f"fit: 1 - acc = {p['A']:.3g}·C^-{p['b']:.3f} + {p['c']:.3f}")
    if len(fit.boot.dropna()):
        lo, hi = fit.predict_interval(xx)
        ax2.fill_between(xx, 1.0 - hi, 1.0 - lo, color="C0", alpha=0.2,
                         label=f"{int(100 * fit.level)}% bootstrap band")
    ax2.set(xscale="log", xlabel="training FLOPs", ylabel=f"average accuracy, {shots}-shot",
            title="Downstream (7 tasks, lm-eval-harness)")
    ax2.legend(fontsize=8)
    return _save(fig, path)
