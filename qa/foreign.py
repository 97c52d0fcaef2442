"""Tables as other codebases write them, for the `foreign` cases (qa/cases/foreign.py): W&B
history exports, nanoGPT logs, Lightning and HF Trainer logs, papers' CSVs with units in the
header. Each case's `python -c` code imports this module, builds its input the way a user
would (write the other tool's file, read it back with pandas or a regex) and calls the
estimator through `run`, which prints one `cgpt analysis: error: ...` line for a refusal or
the result (and the warnings) as JSON on stdout for the case's check.

The truth is always known: the curves follow a Tissue-form schedule law and the steps to a
target follow S = S_min + E_min / B, so a case can say whether the answer is right.
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

T = 300          # steps of each schedule-law run
PEAK = 1e-3
KINDS = ("const", "cos", "wsd")
FIT = {"form": "tissue", "n_boot": 0}
WORK = Path(tempfile.mkdtemp(prefix="foreign-"))


# ---- schedule-law curves ---------------------------------------------------------------------
def sched(kind: str, total: int = T, warm: int = 20) -> np.ndarray:
    """The LR of every step 1..total of a constant, cosine or WSD schedule with linear warmup."""
    i = np.arange(1, total + 1)
    w = np.minimum(1, i / warm)
    if kind == "const":
        d = np.ones(total)
    elif kind == "cos":
        d = 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * np.clip((i - warm) / (total - warm), 0, 1)))
    else:
        d = np.where(i < 0.8 * total, 1, 1 - (i - 0.8 * total) / (0.2 * total) * 0.9)
    return PEAK * w * d


def loss_of(lr: np.ndarray, seed: int = 0) -> np.ndarray:
    """The training loss logged at each step (a Tissue-form law plus 0.003 nats of noise)."""
    s1 = np.cumsum(np.r_[0, lr[:-1]]) / PEAK            # the updates before step s
    d = np.maximum(0, -np.diff(lr, prepend=lr[0]))       # the LR's fall at each step
    drop = np.cumsum(np.r_[0, d[:-1]]) / PEAK
    rng = np.random.default_rng(seed)
    return 3 + 2 * (s1 + 1) ** -0.4 - 0.15 * drop + rng.normal(0, 0.003, lr.size)


def curves() -> pd.DataFrame:
    """cgpt's own format: run_id, step (1..T), lr, loss."""
    out = []
    for k, kind in enumerate(KINDS):
        lr = sched(kind)
        out.append(pd.DataFrame({"run_id": kind, "step": np.arange(1, T + 1), "lr": lr,
                                 "loss": loss_of(lr, k)}))
    return pd.concat(out, ignore_index=True)


def reference() -> float:
    """The final loss the law fitted to cgpt-format curves predicts for a cosine run of 2T."""
    import analysis as A
    return A.fit_schedule_law(curves(), **FIT).final_loss(sched("cos", 2 * T))[0]


def predicted(fit, unit: float = 1.0) -> float:
    """The fit's final loss for a cosine run of 2T (its LRs in `unit`s, as the fit's were)."""
    return fit.final_loss(sched("cos", 2 * T) / unit)[0]


def wandb_export(step_col: str = "_step", base: int = 0, every: int = 1,
                 val_rows: bool = False, lr_every_step: bool = False) -> Path:
    """A CSV of W&B histories, one run after another with a `Name` column (W&B's run name):
    `_step` (W&B's own counter, from `base`) or a custom x-axis, `train/loss` every `every`
    steps, `train/lr`, `_runtime`, `_timestamp`. val_rows: an evaluation logged in its own
    call every 50 steps (HF Trainer's pattern: a row with the same step, NaN loss and lr).
    lr_every_step: the LR logged every step and the loss every `every` (Lightning's
    LearningRateMonitor), so the other rows' loss is NaN."""
    rows = []
    for kind, g in curves().groupby("run_id", sort=False):
        for s, lr, loss in zip(g["step"], g["lr"], g["loss"]):
            logged = s % every == 0 or every == 1
            if not logged and not lr_every_step:
                continue
            rows.append({"Name": kind, step_col: s - 1 + base, "train/loss":
                         loss if logged else np.nan, "train/lr": lr, "val/loss": np.nan,
                         "_runtime": s * 0.1, "_timestamp": 1.7e9 + s})
            if val_rows and s % 50 == 0:
                rows.append({"Name": kind, step_col: s - 1 + base, "train/loss": np.nan,
                             "train/lr": np.nan, "val/loss": loss - 0.01, "_runtime": s * 0.1,
                             "_timestamp": 1.7e9 + s})
    p = WORK / "wandb_export.csv"
    pd.DataFrame(rows).to_csv(p, index=False)
    return p


def as_curves(df: pd.DataFrame, step_col: str = "_step") -> pd.DataFrame:
    """What a user does to a W&B export: rename the columns to the law's."""
    return df.rename(columns={"Name": "run_id", step_col: "step", "train/loss": "loss",
                              "train/lr": "lr", "val/loss": "val_loss"})


# ---- nanoGPT ---------------------------------------------------------------------------------
def nanogpt_log(kind: str, interval: int = 10, resumed_at: int | None = None,
                diverge_at: int | None = None) -> str:
    """nanoGPT's train.py output: `iter N: loss X, time Yms, mfu Z%` every `interval` iters
    (iter 0 is the first update), `step N: train loss X, val loss Y` every 100. A resume
    (init_from='resume') repeats the iters from `resumed_at`; a diverged run logs `loss nan`."""
    lr = sched(kind)
    loss = loss_of(lr, KINDS.index(kind))
    out = []
    iters = list(range(T))
    if resumed_at is not None:
        iters = iters[:resumed_at + 50] + iters[resumed_at:]
    for it in iters:
        if it % 100 == 0:
            out.append(f"step {it}: train loss {loss[it]:.4f}, val loss {loss[it] + .01:.4f}")
        if it % interval == 0:
            v = float("nan") if diverge_at is not None and it >= diverge_at else loss[it]
            mfu = -100 if it < 5 else 12.5
            out.append(f"iter {it}: loss {v:.4f}, time {31.4:.2f}ms, mfu {mfu:.2f}%")
    return "\n".join(out)


ITER = re.compile(r"^iter (\d+): loss ([\w.+-]+), time")


def parse_nanogpt(text: str, run_id: str, plus_one: bool = True) -> pd.DataFrame:
    """The regex a user writes for nanoGPT's log: (run_id, step, loss); step = iter + 1 (iter 0
    is the first update) unless plus_one is False."""
    rows = [(run_id, int(m[1]) + plus_one, float(m[2]))
            for m in map(ITER.match, text.splitlines()) if m]
    return pd.DataFrame(rows, columns=["run_id", "step", "loss"])


def nanogpt_schedules(extra: int = 0) -> dict:
    """nanoGPT's get_lr(it) for it in range(max_iters): entry i is iter i's LR (step i + 1)."""
    return {k: np.r_[sched(k), np.full(extra, sched(k)[-1])] for k in KINDS}


# ---- critical batch --------------------------------------------------------------------------
BATCHES = np.array([32, 64, 128, 256, 512, 1024], float)
S_MIN, E_MIN = 1000.0, 64000.0   # B_crit = 64 sequences


def steps_at(b) -> np.ndarray:
    return S_MIN + E_MIN / np.asarray(b, float)


def steps_csv(rows: list[dict], header: str | None = None) -> pd.DataFrame:
    """`rows` written as a CSV by hand and read back with pandas.read_csv, as a user would."""
    p = WORK / "steps.csv"
    df = pd.DataFrame(rows)
    if header:
        df = df.rename(columns=dict(zip(df.columns, header.split(","))))
    df.to_csv(p, index=False)
    return pd.read_csv(p)


# ---- published tables ------------------------------------------------------------------------
def paper(**cols) -> pd.DataFrame:
    """A Chinchilla-like table, with `cols` replaced or added, written and read back as CSV."""
    n = np.array([125e6, 350e6, 760e6, 1.3e9])
    t = {"N": n, "D": 20 * n, "loss": [3.2, 2.9, 2.7, 2.55]}
    t.update(cols)
    p = WORK / "paper.csv"
    pd.DataFrame(t).to_csv(p, index=False)
    return pd.read_csv(p)


LADDER = np.array([1e17, 3e17, 1e18, 3e18, 1e19, 3e19])


def ladder_losses(k: float = 1.0, seed: int = 1) -> np.ndarray:
    """A recipe's final losses: 20 (k C)^-0.05 + 1.5 with 0.005 of noise (k = 2: B is A with
    twice the compute, m = 2 at every compute)."""
    rng = np.random.default_rng(seed)
    return 20 * (k * LADDER) ** -0.05 + 1.5 + rng.normal(0, 0.005, LADDER.size)


# ---- the call ----------------------------------------------------------------------------
def _plain(v):
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, pd.DataFrame):
        return v.to_dict("list")
    return v


def run(call, **extra) -> None:
    """Call `call()`. A refusal (ValueError, TypeError, OSError) is one `cgpt analysis: error:`
    line on stderr and exit 2; any other exception is left to print its traceback. Else
    {"value": ..., "warnings": [...], **extra} on stdout, for the case's check."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = call()
        except (ValueError, TypeError, OSError) as e:
            print(f"cgpt analysis: error: {e}".splitlines()[0], file=sys.stderr)
            sys.exit(2)
    print(json.dumps({"value": _plain(value), "warnings": [str(w.message) for w in caught],
                      **{k: _plain(v) for k, v in extra.items()}}, default=str))
