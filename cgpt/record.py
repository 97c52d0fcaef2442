"""The step record: every field of a logged step (one line of `metrics.jsonl`), declared once
with where it comes from and where it goes.

Both loops read a step's `device` fields from the step's output dict in one transfer
(`cgpt.train.loop.Reader`); `cgpt.train.lifecycle.Lifecycle.record` adds the `host` fields and
writes the fields present, in this order, to metrics.jsonl, the `tensorboard` ones as
`train/<name>` scalars and the `wandb` ones to the W&B run (`cgpt.train.metrics`); the summary
reduces the ones with a `summary` into summary.json (`cgpt.train.summary`), and the `results`
ones are results.csv columns (`cgpt.results_schema`), which the sweep fills from summary.json.

So a new per-step metric of the step is two edits: return it from the step
(`cgpt.train.step.make_step`'s metrics dict; the fused step passes every one through) and add
its `Field` here (`tests/train/test_record.py` makes both edits to a copy of the code and follows
the metric from the step to `analysis`). No imports, so `analysis` and the sweep read it
without JAX.
"""
from __future__ import annotations

from dataclasses import dataclass

SOURCES = ("device", "host")  # the step's output dict; computed on the host where it is logged
# how summary.json reduces a field's logged values
SUMMARIES = {
    "mean": "the mean over the train_loss window (the last steps, each of them logged: "
            "`cgpt.rundir.train_loss_window`)",
    "last": "the last logged step's value (NaN where that step lacks it; left out when no step "
            "logged it)",
    "final": "the launch's own value at its end (the last evaluation, the measured throughput)",
}


@dataclass(frozen=True)
class Field:
    name: str  # the metrics.jsonl key; for a device field, also its key in the step's output
    source: str  # one of SOURCES
    tensorboard: bool = True  # a TensorBoard scalar `train/<name>`
    wandb: bool = True  # logged to the W&B run (train.wandb)
    summary: str | None = None  # one of SUMMARIES, or not in summary.json
    summary_key: str = ""  # its summary.json key ("" = `name`)
    results: bool = False  # its summary key is a results.csv column

    def __post_init__(self):
        if self.source not in SOURCES or self.summary not in (None, *SUMMARIES) or (
                self.results and self.summary is None):
            raise ValueError(f"Field {self.name!r}: source must be one of {SOURCES}, summary one "
                             f"of {list(SUMMARIES)} or None, and a results column needs a summary")

    @property
    def key(self) -> str:
        return self.summary_key or self.name


FIELDS = (
    Field("step", "host", tensorboard=False, wandb=False),  # the x axis of both
    Field("loss", "device", summary="mean", summary_key="train_loss", results=True),
    Field("grad_norm", "device"),
    Field("lr", "host"),  # the schedule's rate at the step (`cgpt.train.optim.lr_at`)
    Field("tokens", "host", tensorboard=False),  # trained so far
    Field("epoch", "host", tensorboard=False),  # passes over the training split so far
    Field("tokens_per_s", "host", summary="final", results=True),  # `cgpt.train.mfu.Throughput`
    Field("mfu", "host", summary="final", results=True),
    Field("val_loss", "host", summary="final", results=True),  # on evaluated steps
    # train.gns: the step's noise scale estimates (`cgpt.train.noise`) and their smoothing
    Field("gns_g2", "device"),
    Field("gns_trace", "device"),
    Field("gns_g2_ema", "host", summary="last"),
    Field("gns_trace_ema", "host", summary="last"),
    Field("gns_b_simple", "host", summary="last"),
)


def names(**flags) -> tuple[str, ...]:
    """The names of the fields whose attributes equal `flags` (e.g. source="device",
    tensorboard=True), in the record's order."""
    return tuple(f.name for f in FIELDS if all(getattr(f, k) == v for k, v in flags.items()))


def summarized(how: str) -> tuple[Field, ...]:
    """The fields summary.json reduces by `how` (one of SUMMARIES)."""
    return tuple(f for f in FIELDS if f.summary == how)


def results_columns() -> tuple[str, ...]:
    """The summary keys that are results.csv columns, in the record's order."""
    return tuple(f.key for f in FIELDS if f.results)
