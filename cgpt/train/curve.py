"""A finished run's loss curve as a PNG beside its metrics.jsonl (`rundir.CURVE_FILE`), so
that one run has a picture without TensorBoard or code: the logged training loss and the
validation loss at each evaluation, against tokens trained."""
from __future__ import annotations

import math
from pathlib import Path

from cgpt import rundir
from cgpt.fileio import atomic_write


def write(out: Path, summary: dict) -> Path:
    """Draw `out`'s metrics.jsonl into `out`/loss.png (atomically) and return its path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # loads matplotlib: at the end
    from matplotlib.figure import Figure  # loads matplotlib (~1 s): only when a run finishes

    log = rundir.read_metrics(Path(out) / rundir.METRICS_FILE)
    fig = Figure(figsize=(6, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    train = [(r["tokens"], r["loss"]) for r in log if _finite(r.get("loss"))]
    val = [(r["tokens"], r["val_loss"]) for r in log if _finite(r.get("val_loss"))]
    if train:
        ax.plot(*zip(*train), lw=1, color="C0", label="training loss (logged steps)")
    if val:
        ax.plot(*zip(*val), "o-", ms=3, lw=1, color="C1", label="validation loss")
    final = summary.get("val_loss")
    ax.set(xlabel="tokens trained", ylabel="loss (nats/token)", title=(
        f"{summary.get('model')}: {summary.get('n_params', 0):,} params, val_loss "
        + (f"{final:.4f}" if _finite(final) else "not finite")))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = Path(out) / rundir.CURVE_FILE
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    return path


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)
