"""A sweep's state: its run directories are the source of truth (`cgpt.rundir.state`: done,
running, failed, interrupted, new), `results.csv` their table.

`results.csv` records only what the files say (done / failed / pending), never "running": a
claim that a run is live would outlive a SIGKILLed sweep. Live state is read from the locks
(`cgpt.rundir.state`, the --dry-run table). Each run directory also records `identity.json`, the
hash of its fully resolved config, so a relaunch after a spec change never reuses it silently.
"""
from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import yaml

from cgpt import paths, rundir
from cgpt.errors import RunDirError
from cgpt.config.model import ModelConfig
from cgpt.fileio import atomic_write, atomic_write_text
from cgpt.config.run import identity, safe_load
from cgpt.results_schema import COLUMNS, FROM_SUMMARY, TEXT, neutralise  # `load_results` reads
from cgpt.sweep.spec import Run, config_hash


def area(out: Path) -> paths.Area:
    """The sweep directory under the path-safety rule (`cgpt.paths`): its run directories and
    its own files are changed only where they resolve inside it."""
    return paths.Area(Path(out), (), "sweep directory")


def result_row(run: Run, out: Path, failures: dict[str, str] | None = None) -> dict:
    """One results.csv row, from the run directory (summary.json / failed.json) and the plan;
    `failures` (run id -> error): this launch's failures, for a run whose failed.json could
    not be written (a full disk), never shown as pending."""
    run_dir = out / run.run_id
    row = {c: "" for c in COLUMNS}
    row.update(run_id=run.run_id, model=run.model, seed=run.seed, run_dir=str(run_dir),
               n_params=run.n_params, n_params_nonembed=run.n_params_nonembed,
               tokens=run.tokens, flops_6nd=run.flops_6nd, flops=run.flops,
               mup=run.config.model.mup, peak_lr=run.peak_lr,
               flops_budget="" if run.flops_budget is None else run.flops_budget)
    summary = rundir.try_json(run_dir / rundir.SUMMARY_FILE)
    if summary is not None:
        row["status"] = "done"
        row.update({k: summary[k] for k in FROM_SUMMARY if k in summary})
        row["model"] = summary.get("model", run.model)
        return row
    failed = rundir.try_json(run_dir / rundir.FAILED_FILE)
    if failed is not None:
        row.update(status="failed", error=failed.get("error", "failed (no message)"))
        return row
    if run.run_id in (failures or {}):
        row.update(status="failed", error=failures[run.run_id])
        return row
    row["status"] = "pending"
    return row


def log_error(log: Path, lines: int = 3) -> str:
    """The failure's message: the `error:` line train prints, else the log's last lines (never
    read through a link that leaves the run directory: `cgpt.paths`)."""
    try:
        text = rundir.area(log.parent).resolve(log, "read").read_text(errors="replace")
    except RunDirError as e:
        return str(e)
    except OSError:
        return f"no log at {log}"
    text = text.splitlines()
    text = [t.rstrip() for t in text if t.strip() and not t.startswith("\r")]
    errs = [t for t in text if t.startswith("cgpt train: error:") or t.startswith("cgpt sweep:")]
    if errs:
        return errs[-1][-600:]
    return " | ".join(text[-lines:])[-600:] or "no output"


def write_results(runs: list[Run], out: Path, failures: dict[str, str] | None = None) -> Path:
    """Rewrite DIR/results.csv atomically: exactly `runs` (this spec's), from their run dirs
    (and this launch's `failures`, `result_row`)."""
    rows = [result_row(r, out, failures) for r in runs]
    path = out / rundir.RESULTS_FILE

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows({k: neutralise(v) if k in TEXT else v for k, v in r.items()}
                        for r in rows)

    atomic_write(path, write)
    return path


# ---- config identity ---------------------------------------------------------------------
def _flat(d: dict) -> dict:
    out = {"preset": d.get("preset")}
    for s in ("model", "data", "train"):
        out.update({f"{s}.{k}": v for k, v in (d.get(s) or {}).items()})
    return out


def config_change(run: Run, out: Path) -> list[str]:
    """The keys in which `run`'s resolved config differs from the one its directory trained
    with (`config.yaml`): ['train.peak_lr: 0.002 -> 0.001', ...]; [] if same or never started."""
    saved = out / run.run_id / rundir.CONFIG_FILE
    if not saved.exists():
        return []
    try:
        old = safe_load(saved.read_text(errors="replace"), str(saved)) or {}
    except (ValueError, OSError):
        old = None
    if not isinstance(old, dict):
        return [f"{saved} is damaged (not a run config)"]
    old = identity(old)
    new = identity(yaml.safe_load(run.config.to_yaml()))
    a, b = _flat(old), _flat(new)
    # Model keys added since the run was written hold their defaults; an "auto" compute dtype
    # is resolved to the saved run's by train (cgpt.config.backend.resolve).
    a = {**{f"model.{f.name}": f.default for f in dataclasses.fields(ModelConfig)
            if f"model.{f.name}" in b}, **a}
    if b.get("model.compute_dtype") == "auto":
        b["model.compute_dtype"] = a["model.compute_dtype"]
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def supersede(run: Run, out: Path) -> Path:
    """Move a run directory whose config changed to DIR/.superseded/<run_id>.<old hash>/."""
    d = out / run.run_id
    try:
        old = safe_load((d / rundir.CONFIG_FILE).read_text(errors="replace"), rundir.CONFIG_FILE)
    except (ValueError, OSError):
        old = None
    old = old if isinstance(old, dict) else {"damaged": (d / rundir.CONFIG_FILE).stat().st_size}
    dest = out / rundir.SUPERSEDED_DIR / f"{run.run_id}.{config_hash(old)}"
    area(out).move(d, dest)
    return dest


def run_files(run: Run) -> dict[str, str]:
    """The files a run directory starts with: the config train reads, its identity record."""
    return {rundir.RUN_FILE: run.config.to_yaml(), rundir.IDENTITY_FILE: json.dumps(
        {"run_id": run.run_id, "config_hash": run.config_hash}, indent=2)}


def prepare_run_dir(run: Run, out: Path) -> Path:
    """Create the run directory with `run_files`; a summary.json that does not parse is moved
    to summary.json.damaged, so that the relaunch (train --resume) writes it again."""
    d = out / run.run_id
    d.mkdir(parents=True, exist_ok=True)
    for name, text in run_files(run).items():
        atomic_write_text(d / name, text)
    summary = d / rundir.SUMMARY_FILE
    if summary.exists() and rundir.try_json(summary) is None:
        rundir.area(d).move(summary, d / "summary.json.damaged")
        print(f"{run.run_id}: {summary} does not parse; moved it to summary.json.damaged and "
              "resuming the run to write it again")
    return d
