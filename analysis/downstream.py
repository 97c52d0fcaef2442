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

`fit_downstream_two_step` goes through the loss instead, as Llama 3 (Dubey et al. 2024, §3.2.1)
and the OLMo ladder (Bhagia et al. 2024) do: compute -> loss by the loss law
L = A C^(-b) + c fitted to the rows' (flops, loss), then loss -> accuracy by a sigmoid from
the task's chance accuracy (a random guess among its choices) to `ceiling`:
acc = chance + (ceiling - chance) / (1 + exp(k (L - L_mid))), fitted to the rows'
(loss, accuracy). Two parameters in the second step, so five sizes pin it (where a task's
small models score below chance, as ARC-challenge's and OpenBookQA's `acc` do, the floor is
fitted too: a third parameter, `floor_fitted`); the interval
pairs each bootstrap resample of the loss law with one of the sigmoid (residual bootstrap),
so it carries both steps' uncertainty.
"""
from __future__ import annotations

import pandas as pd

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from .checks import check_count, check_level
from .fit import PowerLawFit, fit_power_law
from .plots import _figure, _grid, _plain_y, _save
from .published import CEREBRAS_GPT, cerebras_gpt_table

TASKS = ("hellaswag", "piqa", "winogrande", "lambada", "arc_easy", "arc_challenge", "openbookqa")
SIZES = ("111M", "256M", "590M", "1.3B", "2.7B", "6.7B", "13B")
# a random guess: 1 / the choices of each task (LAMBADA: a word from the vocabulary, ~0)
CHANCE = {"hellaswag": 0.25, "piqa": 0.5, "winogrande": 0.5, "lambada": 0.0,
          "arc_easy": 0.25, "arc_challenge": 0.25, "openbookqa": 0.25}
CHANCE["average"] = float(np.mean(list(CHANCE.values())))

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
    and Pile test loss (`loss`, of SP or μP; from `cerebras_gpt_table`), the seven tasks and
    `average` (the published column)."""
    if (shots, mup) not in _TABLES:
        raise ValueError(f"shots={shots}, mup={mup}: published tables are 0- and 5-shot, "
                         "SP and μP")
    rows = _TABLES[(shots, mup)]
    df = pd.DataFrame(rows, columns=[*TASKS, "average"])
    pub = cerebras_gpt_table().set_index("model")
    df.insert(0, "model", list(SIZES[:len(rows)]))
    df.insert(1, "flops", pub["flops"].loc[df["model"]].to_numpy())
    df.insert(2, "loss", pub["loss_mup" if mup else "loss"].loc[df["model"]].to_numpy())
    df.insert(3, "mup", mup)
    df.insert(4, "shots", shots)
    return df


def fit_downstream(table: pd.DataFrame, task: str = "average", **kw) -> PowerLawFit:
    """Error rate 1 - accuracy of `task` against training FLOPs: err = A * C^(-b) + c, the
    loss law's form (keyword arguments go to `fit_power_law`; default Huber in log space)."""
    if task not in table.columns:
        raise ValueError(f"task={task!r}: not a column; use one of {[*TASKS, 'average']}")
    return fit_power_law(table["flops"].to_numpy(float), 1.0 - table[task].to_numpy(float), **kw)


@dataclass(frozen=True)
class TwoStepFit:
    """compute -> loss (`loss_law`) -> accuracy (a sigmoid in loss from `chance` to `ceiling`,
    parameters k and l_mid); `boot`: (n, 3) sigmoid resamples (k, l_mid, floor) paired with
    loss_law.boot. floor_fitted: the rows scored below chance, so the floor was fitted."""
    task: str
    loss_law: PowerLawFit
    k: float
    l_mid: float
    chance: float
    ceiling: float
    n: int
    rmse: float                      # of the sigmoid on the rows' accuracies
    boot: np.ndarray = field(repr=False)
    level: float = 0.95
    floor_fitted: bool = False

    def accuracy(self, loss) -> np.ndarray:
        """The sigmoid: accuracy at a loss (nats/token)."""
        return _sigmoid(np.asarray(loss, float), self.k, self.l_mid, self.chance, self.ceiling)

    def predict(self, flops) -> np.ndarray:
        """Accuracy at training FLOPs: the loss law's loss, then the sigmoid's accuracy."""
        return self.accuracy(self.loss_law.predict(np.asarray(flops, float)))

    def predict_interval(self, flops, level: float | None = None):
        """Pointwise percentile band: each loss-law resample through one sigmoid resample."""
        level = self.level if level is None else level
        lx = np.log(np.atleast_1d(np.asarray(flops, float)))
        b = self.loss_law.boot.dropna()
        m = min(len(b), len(self.boot))
        if not m:
            return np.full(lx.shape, np.nan), np.full(lx.shape, np.nan)
        loss = np.exp(np.log(b["A"].to_numpy()[:m, None]) - b["b"].to_numpy()[:m, None] * lx) \
            + b["c"].to_numpy()[:m, None]
        acc = _sigmoid(loss, self.boot[:m, :1], self.boot[:m, 1:2], self.boot[:m, 2:],
                       self.ceiling)
        return (np.percentile(acc, 50 * (1 - level), axis=0),
                np.percentile(acc, 50 * (1 + level), axis=0))

    def summary(self) -> str:
        p = self.loss_law.params
        return (f"{self.task}: loss = {p['A']:.4g} C^-{p['b']:.4f} + {p['c']:.4g}; accuracy = "
                f"{self.chance:.3g} + ({self.ceiling:g} - {self.chance:.3g}) / (1 + exp("
                f"{self.k:.3g} (L - {self.l_mid:.4g}))), {self.n} rows, rmse {self.rmse:.3g}"
                + (" (floor fitted: the rows score below chance)" if self.floor_fitted else ""))


def _sigmoid(loss, k, l_mid, chance, ceiling):
    with np.errstate(over="ignore"):
        return chance + (ceiling - chance) / (1.0 + np.exp(k * (loss - l_mid)))


def _fit_sigmoid(loss, acc, chance, ceiling, x0=None, floor: bool = False) -> np.ndarray:
    """(k, l_mid, floor) by least squares on accuracy, from a few starts; the floor is
    `chance` unless `floor` (then fitted in [0, chance])."""
    starts = [x0] if x0 is not None else [(k, m, min(chance, acc.min()))
                                          for k in (2.0, 8.0)
                                          for m in np.quantile(loss, [0.0, 0.5, 1.0])]
    n = 3 if floor else 2
    lo, hi = [1e-3, 0.0, 0.0][:n], [100.0, 20.0, max(chance, 1e-9)][:n]

    def resid(t):
        return _sigmoid(loss, t[0], t[1], t[2] if floor else chance, ceiling) - acc

    best = None
    for s in starts:
        r = least_squares(resid, np.clip(s[:n], lo, hi), bounds=(lo, hi))
        if best is None or r.cost < best.cost:
            best = r
    return np.r_[best.x[:2], best.x[2] if floor else chance]


def fit_downstream_two_step(table: pd.DataFrame, task: str = "average", *,
                            ceiling: float = 1.0, chance: float | None = None,
                            n_boot: int = 1000, seed: int = 0,
                            level: float = 0.95) -> TwoStepFit:
    """Accuracy of `task` against training FLOPs through the loss (module docstring), fitted
    on the rows given (columns flops, loss and `task`, as `cerebras_gpt_downstream` returns):
    the loss law by `fit_power_law` (least squares, offset), the sigmoid by least squares
    with the task's chance accuracy as its floor (CHANCE; `chance=` for other tasks) and
    `ceiling` as its top. Intervals: the loss law's bootstrap, each resample paired with a
    residual-bootstrap resample of the sigmoid (residuals scaled by sqrt(n / (n - 2)))."""
    level, n_boot = check_level(level), check_count(n_boot)
    if task not in table.columns:
        raise ValueError(f"task={task!r}: not a column; use one of {[*TASKS, 'average']}")
    for col, why in (("flops", "the training FLOPs of each row"),
                     ("loss", "each row's loss (nats/token), the first step's target")):
        if col not in table.columns:
            raise ValueError(f"table: no column {col!r} ({why}); fit_downstream_two_step goes "
                             "compute -> loss -> accuracy and needs both (cerebras_gpt_"
                             "downstream has them)")
    if chance is None:
        if task not in CHANCE:
            raise ValueError(f"chance=None for task {task!r}: pass chance=, the accuracy of a "
                             "random guess (1 / the number of choices)")
        chance = CHANCE[task]
    if not 0 <= chance < ceiling <= 1:
        raise ValueError(f"chance={chance}, ceiling={ceiling}: need 0 <= chance < ceiling <= 1")
    flops = table["flops"].to_numpy(float)
    loss = table["loss"].to_numpy(float)
    acc = table[task].to_numpy(float)
    if not (np.isfinite(acc) & (acc >= 0) & (acc <= 1)).all():
        raise ValueError(f"table: column {task!r} has a value that is not an accuracy in "
                         "[0, 1] (a percentage? divide by 100) or is missing; fix or drop "
                         "those rows")
    if not (np.isfinite(loss) & (loss > 0)).all():
        raise ValueError("table: column 'loss' has a value that is not a positive loss "
                         "(nats/token); fix or drop those rows")
    if len(table) < 4:
        raise ValueError(f"table: {len(table)} rows; the loss law has 3 parameters and the "
                         "sigmoid 2: pass at least 4 sizes")
    law = fit_power_law(flops, loss, n_boot=n_boot, seed=seed, level=level)
    below = bool((acc < chance).any())     # small models under chance: fit the floor
    best = _fit_sigmoid(loss, acc, chance, ceiling, floor=below)
    fitted = _sigmoid(loss, *best, ceiling)
    res = acc - fitted
    n = len(acc)
    res = (res - res.mean()) * np.sqrt(n / max(n - 2 - below, 1))
    rng = np.random.default_rng(seed + 1)
    boot = np.array([_fit_sigmoid(loss, fitted + rng.choice(res, n), chance, ceiling, best,
                                  floor=below)
                     for _ in range(len(law.boot.dropna()))]).reshape(-1, 3)
    return TwoStepFit(task=task, loss_law=law, k=float(best[0]), l_mid=float(best[1]),
                      chance=float(best[2]), ceiling=float(ceiling), n=n,
                      rmse=float(np.sqrt(np.mean((acc - fitted) ** 2))), boot=boot,
                      level=level, floor_fitted=below)


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
