"""`python -m cgpt sweep SPEC --out DIR`: expand a grid of training runs and launch them.

A sweep spec (YAML, see docs/sweeps.md) is a base run config plus a grid; the product of the
grid's axes is the run list. Each run is its own `python -m cgpt train` process writing its
own run directory `DIR/<run_id>/`, and **the run directories are the source of truth**:

* `summary.json` present         -> done, never rerun;
* `config.yaml` present, no summary -> interrupted, rerun with `--resume`;
* `failed.json` present           -> the last attempt failed (error kept); retried on relaunch.

`DIR/results.csv` is rebuilt from those files at every launch and rewritten atomically after
every finished run, so killing the sweep (even SIGKILL) loses at most the steps since each
live run's last checkpoint, and relaunching the same command continues where it stopped.

Executors: `local` (K subprocesses at a time), `slurm` (a submitit job array) and
`submitit-local` (the same submitit code path on this machine; what the tests exercise).
"""
from __future__ import annotations

import argparse
import copy
import csv
import fcntl
import fnmatch
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from cgpt import flops as flops_mod
from cgpt.config import get_config
from cgpt.fileio import atomic_write, atomic_write_text
from cgpt.runconfig import RunConfig, parse_value, from_dict, load_yaml

# The results contract read by `analysis.load_results` (keep in sync with analysis/results.py).
COLUMNS = (
    "run_id", "model", "seed", "status", "error", "n_params", "n_params_nonembed", "tokens",
    "flops_6nd", "flops", "train_loss", "val_loss", "wall_time_s", "tokens_per_s", "mfu",
    "epochs", "mup", "run_dir",
)
SUMMARY_COLUMNS = ("n_params", "n_params_nonembed", "tokens", "flops_6nd", "flops", "train_loss",
                   "val_loss", "wall_time_s", "tokens_per_s", "mfu", "epochs", "mup")
SPEC_KEYS = ("name", "description", "base", "models", "grid", "per_model", "filter", "require",
             "estimate", "slurm")
GRID_KEYS = ("model", "tokens", "tokens_per_param", "flops", "seed", "overrides", "branches")
SECTIONS = ("model", "data", "train")
EXECUTORS = ("local", "slurm", "submitit-local")
RUN_FILE = "run.yaml"  # the fully resolved config the sweep hands to `cgpt train --config`
LOG_FILE = "train.log"
FAILED_FILE = "failed.json"
LOCK_FILE = ".lock"
# AutoExecutor's cluster-independent parameters; every other `slurm:` key gets a slurm_ prefix.
SUBMITIT_GENERIC = ("timeout_min", "mem_gb", "gpus_per_node", "cpus_per_task", "nodes",
                    "tasks_per_node", "stderr_to_stdout")


# ---- the throughput model behind --dry-run's time estimate --------------------------------
@dataclass(frozen=True)
class Estimate:
    """time = startup_s + steps * (step_overhead_s + counted FLOPs per step / flops_per_s).

    Defaults: a least-squares fit to the demo sweep's runs (tiny family, batch 32 x 128) on
    the 2-core development CPU, shared with other jobs (see docs/sweeps.md); a spec's
    `estimate:` section overrides them (a GPU node is ~10^5 x faster per run).
    """

    flops_per_s: float = 1.9e10
    step_overhead_s: float = 0.035
    startup_s: float = 20.0

    def seconds(self, steps: int, flops: float) -> float:
        return self.startup_s + steps * self.step_overhead_s + flops / self.flops_per_s


# ---- the run list --------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One planned training run of a sweep."""

    run_id: str
    model: str  # preset or spec-defined model name (the `model` column)
    seed: int
    budget: str  # how its token count was chosen, e.g. "20 tok/param" or "C=1e+12"
    config: RunConfig
    n_params: int
    n_params_nonembed: int
    tokens: int  # actually trained: steps x batch x seq_len (the budget rounded down to whole steps)
    batch_size: int
    steps: int
    flops: float  # counted (cgpt.flops.train_flops), at the run's seq_len
    flops_6nd: float
    explicit: frozenset = frozenset()  # section.key names set by the spec or --set
    branch_from: tuple[str, int] | None = None  # (parent run_id, step): a WSD cooldown branch


@dataclass
class Sweep:
    name: str
    path: Path
    runs: list[Run]
    require: list[str] = field(default_factory=list)
    slurm: dict = field(default_factory=dict)
    estimate: Estimate = field(default_factory=Estimate)
    dropped: int = 0  # runs removed by the spec's `filter:`


def _fmt_count(x: float) -> str:
    """3 significant digits with k/M/B/T: 336640 -> '337k', 4820480 -> '4.82M'."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _fmt_flops(c: float) -> str:
    """1e12 -> '1e12', 3e12 -> '3e12', 2.5e13 -> '2.5e13' (run ids: no '+')."""
    mant, exp = f"{c:.2e}".split("e")
    mant = mant.rstrip("0").rstrip(".")
    return f"{mant}e{int(exp)}"


def _fmt_time(s: float) -> str:
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def _safe(text: str) -> str:
    """A run-id fragment: letters, digits and . _ + - only."""
    out = "".join(c if c.isalnum() or c in "._+-" else "-" for c in str(text))
    return out.strip("-") or "x"



def _set_key(raw: dict, key: str, value, where: str) -> None:
    section, dot, name = key.partition(".")
    if not dot or section not in SECTIONS or not name:
        raise ValueError(f"{where}: key {key!r} must be section.key with section one of "
                         f"{', '.join(SECTIONS)} (e.g. train.peak_lr)")
    sec = raw.setdefault(section, {})
    if not isinstance(sec, dict):
        raise ValueError(f"{where}: '{section}' must be a mapping")
    sec[name] = value


def _flat_keys(raw: dict) -> set[str]:
    return {f"{s}.{k}" for s in SECTIONS for k in (raw.get(s) or {})}


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _number(spec_path: Path, key: str, v) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{spec_path}: {key} entry {v!r} is not a number") from None
    if not x > 0 or not math.isfinite(x):
        raise ValueError(f"{spec_path}: {key} entry {v!r} must be a positive number")
    return x


def _overrides_entry(spec_path: Path, i: int, entry) -> tuple[str, dict]:
    """A grid.overrides entry -> (run-id label, {section.key: value})."""
    where = f"{spec_path}: grid.overrides[{i}]"
    if entry is None:
        return "", {}
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a mapping of section.key: value (got {entry!r})")
    entry = dict(entry)
    label = entry.pop("name", None)
    for k in entry:
        if k.partition(".")[0] not in SECTIONS or "." not in k:
            raise ValueError(f"{where}: key {k!r} must be section.key with section one of "
                             f"{', '.join(SECTIONS)}, e.g. train.peak_lr")
    if label is None:
        label = "-".join(f"{k.rpartition('.')[2]}{v}" for k, v in entry.items()) or "base"
    return _safe(label), entry


def read_spec(path: str | Path) -> dict:
    p = Path(path)
    spec = load_yaml(p, "sweep spec (bundled specs live in sweeps/*.yaml)", ", ".join(SPEC_KEYS))
    bad = sorted(set(spec) - set(SPEC_KEYS))
    if bad:
        raise ValueError(f"{p}: unknown key(s) {bad}; valid: {', '.join(SPEC_KEYS)}")
    return spec


def load_sweep(path: str | Path, sets: list[str] | None = None) -> Sweep:
    """Expand a spec file into its run list; `sets` are `section.key=value` launch overrides.

    Layering, later wins: base < spec-defined model < per_model < the grid's seed and token
    budget < the grid's overrides entry < `--set`. Every run is validated here (unknown
    preset or key -> an error naming the spec file and key), before anything is launched.
    """
    from cgpt.train import TrainError, make_plan

    spec_path = Path(path)
    spec = read_spec(spec_path)
    name = str(spec.get("name") or spec_path.stem)
    base = spec.get("base") or {}
    if not isinstance(base, dict):
        raise ValueError(f"{spec_path}: 'base' must be a run config mapping (preset/model/data/train)")
    bad = sorted(set(base) - {"preset", *SECTIONS})
    if bad:
        raise ValueError(f"{spec_path}: unknown base key(s) {bad}; use model, data, train")

    # --set: run-config keys apply to every run; slurm.* / estimate.* go to those sections.
    set_run: dict = {}
    slurm = dict(spec.get("slurm") or {})
    est = dict(spec.get("estimate") or {})
    for item in sets or []:
        key, eq, text = item.partition("=")
        if not eq:
            raise ValueError(f"--set {item!r}: expected section.key=value, e.g. "
                             "data.source=/data/pile or slurm.partition=gpu")
        section, _, k = key.partition(".")
        if section == "slurm" and k:
            slurm[k] = parse_value(text)
        elif section == "estimate" and k:
            est[k] = parse_value(text)
        else:
            _set_key(set_run, key, parse_value(text), f"--set {item!r}")
    try:
        estimate = Estimate(**{k: float(v) for k, v in est.items()})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{spec_path}: estimate: {e}; keys: flops_per_s, step_overhead_s, "
                         "startup_s") from None

    grid = spec.get("grid")
    if not isinstance(grid, dict):
        raise ValueError(f"{spec_path}: 'grid' is required, a mapping with keys "
                         f"{', '.join(GRID_KEYS)}")
    bad = sorted(set(grid) - set(GRID_KEYS))
    if bad:
        raise ValueError(f"{spec_path}: unknown grid key(s) {bad}; valid: {', '.join(GRID_KEYS)}")

    custom = spec.get("models") or {}
    if not isinstance(custom, dict):
        raise ValueError(f"{spec_path}: 'models' maps a new name to {{preset: ..., <model keys>}}")
    models = [str(m) for m in _as_list(grid.get("model"))]
    if not models:
        raise ValueError(f"{spec_path}: grid.model must list at least one preset "
                         "(see `python -m cgpt list`)")
    for m in models:
        if m in custom:
            c = custom[m]
            if not isinstance(c, dict) or "preset" not in c:
                raise ValueError(f"{spec_path}: models.{m} needs a 'preset' to start from")
            try:
                get_config(str(c["preset"]))
            except ValueError as e:
                raise ValueError(f"{spec_path}: models.{m}.preset: {e}") from None
        else:
            try:
                get_config(m)
            except ValueError as e:
                raise ValueError(f"{spec_path}: grid.model: {e} (or define it under 'models:')") \
                    from None

    per_model = spec.get("per_model") or {}
    if not isinstance(per_model, dict):
        raise ValueError(f"{spec_path}: 'per_model' maps a grid.model name to {{section.key: value}}")
    stray = sorted(set(per_model) - set(models))
    if stray:
        raise ValueError(f"{spec_path}: per_model names {stray} that are not in grid.model")

    # The token-budget axis: fixed counts / 'chinchilla', tokens per parameter, FLOP budgets.
    budgets: list[tuple[str, float, str]] = []  # (kind, value, label)
    for t in _as_list(grid.get("tokens")):
        if str(t).strip().lower() == "chinchilla":
            budgets.append(("tpp", float(flops_mod.TOKENS_PER_PARAM), "chinchilla"))
        else:
            budgets.append(("tokens", _number(spec_path, "grid.tokens", t), ""))
    for r in _as_list(grid.get("tokens_per_param")):
        budgets.append(("tpp", _number(spec_path, "grid.tokens_per_param", r), ""))
    for c in _as_list(grid.get("flops")):
        c = _number(spec_path, "grid.flops", c)
        budgets.append(("flops", c, f"c{_fmt_flops(c)}"))
    if not budgets:
        budgets = [("config", 0.0, "")]  # whatever base/--set say (default: chinchilla)

    seeds = _as_list(grid.get("seed")) or [None]
    for s in seeds:
        if s is not None and (not isinstance(s, int) or isinstance(s, bool) or s < 0):
            raise ValueError(f"{spec_path}: grid.seed entries must be ints >= 0 (got {s!r})")
    ovr_list = _as_list(grid.get("overrides")) or [None]
    overrides = [_overrides_entry(spec_path, i, e) for i, e in enumerate(ovr_list)]
    label_overrides = len(overrides) > 1 or any(o and "name" in o for o in ovr_list
                                                if isinstance(o, dict))

    flt = spec.get("filter") or {}
    tpp_range = flt.get("tokens_per_param") if isinstance(flt, dict) else None
    if flt and (not isinstance(flt, dict) or set(flt) != {"tokens_per_param"}
                or not isinstance(tpp_range, list) or len(tpp_range) != 2):
        raise ValueError(f"{spec_path}: filter must be {{tokens_per_param: [min, max]}}")

    runs: list[Run] = []
    dropped = 0
    # budget-major order: cheap budgets first, and an isoFLOP grid reads budget by budget
    for (kind, value, blabel), m, seed, (olabel, ovr) in itertools.product(
            budgets, models, seeds, overrides):
        raw = copy.deepcopy(base)
        if m in custom:
            c = dict(custom[m])
            raw["preset"] = str(c.pop("preset"))
            raw["model"] = {**(raw.get("model") or {}), **c, "name": m}
        else:
            raw["preset"] = m
        where = f"{spec_path}"
        for k, v in (per_model.get(m) or {}).items():
            _set_key(raw, k, v, f"{where}: per_model.{m}")
        if seed is not None:  # a seed is a replicate: new init and new data order
            _set_key(raw, "train.seed", seed, where)
            _set_key(raw, "data.seed", seed, where)
        for k, v in ovr.items():
            _set_key(raw, k, v, f"{where}: grid.overrides")
        for s, sec in set_run.items():
            for k, v in sec.items():
                _set_key(raw, f"{s}.{k}", v, "--set")
        if "data" in raw and "source" in (raw["data"] or {}):
            raw["data"]["source"] = str(raw["data"]["source"])
        explicit = _flat_keys(raw)
        try:
            cfg = from_dict(raw, where)
        except ValueError as e:
            raise ValueError(f"{e} (run model={m}, seed={seed}, overrides={ovr or '{}'})") from None
        n = cfg.model.num_params()
        tokens_fixed = "train.tokens" in ovr or "tokens" in (set_run.get("train") or {})
        if kind != "config" and not tokens_fixed:
            d = (round(value) if kind == "tokens" else round(value * n) if kind == "tpp"
                 else round(value / (6 * n)))
            raw.setdefault("train", {})["tokens"] = max(1, int(d))
            cfg = from_dict(raw, where)
        try:
            plan = make_plan(cfg)
        except TrainError as e:
            raise ValueError(f"{spec_path}: run model={m}: {e}") from None
        d_run = plan.total_steps * plan.tokens_per_step
        if tpp_range and not (tpp_range[0] <= plan.tokens / n <= tpp_range[1]):
            dropped += 1
            continue
        if kind == "flops":
            budget, idpart = f"C={_fmt_flops(value)}", blabel
        else:
            budget = ("20 tok/param" if blabel == "chinchilla" else
                      f"{value:g} tok/param" if kind == "tpp" else "fixed")
            idpart = f"d{_fmt_count(plan.tokens)}"
        seed_val = cfg.train.seed
        rid = f"{_safe(m)}_{idpart}_s{seed_val}" + (f"_{olabel}" if label_overrides and olabel else "")
        runs.append(Run(
            run_id=rid, model=cfg.model.name, seed=seed_val, budget=budget, config=cfg,
            n_params=n, n_params_nonembed=cfg.model.num_params(embedding=False),
            tokens=d_run, batch_size=plan.batch_size, steps=plan.total_steps,
            flops=flops_mod.train_flops(cfg.model, d_run, plan.seq_len),
            flops_6nd=flops_mod.flops_6nd(cfg.model, d_run), explicit=frozenset(explicit)))
    if grid.get("branches"):
        runs = _with_branches(runs, [float(f) for f in _as_list(grid["branches"])], spec_path)
    seen: dict[str, int] = {}
    for r in runs:
        seen[r.run_id] = seen.get(r.run_id, 0) + 1
    dup = sorted(k for k, v in seen.items() if v > 1)
    if dup:
        raise ValueError(f"{spec_path}: the grid gives duplicate run ids {dup}: two grid "
                         "points resolve to the same model, tokens and seed; remove one, or "
                         "give grid.overrides entries distinct 'name's")
    require = [str(k) for k in _as_list(spec.get("require"))]
    for k in require:
        if k.partition(".")[0] not in SECTIONS or "." not in k:
            raise ValueError(f"{spec_path}: require entry {k!r} must be section.key")
    if not runs:
        raise ValueError(f"{spec_path}: the grid is empty after filter: {flt}; widen the filter")
    return Sweep(name=name, path=spec_path, runs=runs, require=require, slurm=slurm,
                 estimate=estimate, dropped=dropped)


def _with_branches(runs: list[Run], fractions: list[float], spec_path: Path) -> list[Run]:
    """`grid.branches`: each run becomes a WSD parent plus one cooldown branch per fraction of
    its budget (cgpt.branch.plan_branches); parents first, so they start before their branches."""
    from dataclasses import replace

    from cgpt.branch import plan_branches
    from cgpt.train import make_plan

    parents, branches = [], []
    for r in runs:
        cfg, planned = plan_branches(r.config, fractions, f"{spec_path}: grid.branches")
        parents.append(replace(r, config=cfg))
        for f, (bcfg, step) in zip(sorted(fractions), planned):
            plan = make_plan(bcfg)
            d = plan.total_steps * plan.tokens_per_step
            branches.append(replace(
                r, run_id=f"{r.run_id}_b{f:g}", budget=f"{f:g} x {r.budget} (branch)",
                config=bcfg, tokens=d, steps=plan.total_steps, branch_from=(r.run_id, step),
                flops=flops_mod.train_flops(bcfg.model, d, plan.seq_len),
                flops_6nd=flops_mod.flops_6nd(bcfg.model, d)))
    return parents + branches


def select(runs: list[Run], only: str | None) -> list[Run]:
    """--only: comma-separated shell globs on run ids; a pattern without * ? [ is a substring."""
    if not only:
        return list(runs)
    pats = [p.strip() for p in only.split(",") if p.strip()]
    pats = [p if any(c in p for c in "*?[") else f"*{p}*" for p in pats]
    return [r for r in runs if any(fnmatch.fnmatchcase(r.run_id, p) for p in pats)]


def missing_required(sweep: Sweep) -> list[str]:
    """Required keys (spec `require:`) that neither the spec nor --set gave a value."""
    return [k for k in sweep.require if any(k not in r.explicit for r in sweep.runs)]


# ---- run-directory state: the source of truth --------------------------------------------
def _held_elsewhere(run_dir: Path) -> bool:
    """True while some process (a train launched by any sweep) holds the run's lock."""
    lock = run_dir / LOCK_FILE
    if not lock.exists():
        return False
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def run_state(run_dir: Path) -> str:
    """'done' | 'running' | 'failed' | 'interrupted' | 'new', read from the run directory."""
    if (run_dir / "summary.json").exists():
        return "done"
    if _held_elsewhere(run_dir):
        return "running"
    if (run_dir / FAILED_FILE).exists():
        return "failed"
    if (run_dir / "config.yaml").exists():
        return "interrupted"
    return "new"


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def result_row(run: Run, out: Path, running: set[str] = frozenset()) -> dict:
    """One results.csv row, from the run directory (summary.json / failed.json) and the plan."""
    run_dir = out / run.run_id
    row = {c: "" for c in COLUMNS}
    row.update(run_id=run.run_id, model=run.model, seed=run.seed, run_dir=str(run_dir),
               n_params=run.n_params, n_params_nonembed=run.n_params_nonembed,
               tokens=run.tokens, flops_6nd=run.flops_6nd, flops=run.flops,
               mup=run.config.model.mup)
    summary = _read_json(run_dir / "summary.json")
    if summary is not None:
        row["status"] = "done"
        row.update({k: summary.get(k, "") for k in SUMMARY_COLUMNS})
        row["model"] = summary.get("model", run.model)
        return row
    if run.run_id in running or _held_elsewhere(run_dir):
        row["status"] = "running"
        return row
    failed = _read_json(run_dir / FAILED_FILE)
    if failed is not None:
        row.update(status="failed", error=failed.get("error", "failed (no message)"))
        return row
    row["status"] = "pending"
    return row


def _extra_rows(runs: list[Run], out: Path) -> list[dict]:
    """Finished run directories in `out` that the (possibly edited) spec no longer lists."""
    known = {r.run_id for r in runs}
    rows = []
    if not out.is_dir():
        return rows
    for d in sorted(out.iterdir()):
        s = _read_json(d / "summary.json") if d.is_dir() and d.name not in known else None
        if s is None:
            continue
        cfg = yaml.safe_load((d / "config.yaml").read_text()) if (d / "config.yaml").exists() else {}
        row = {c: "" for c in COLUMNS}
        row.update({k: s.get(k, "") for k in SUMMARY_COLUMNS})
        row.update(run_id=d.name, model=s.get("model", ""), status="done", run_dir=str(d),
                   seed=((cfg or {}).get("train") or {}).get("seed", ""))
        rows.append(row)
    return rows


def write_results(runs: list[Run], out: Path, running: set[str] = frozenset()) -> Path:
    """Rewrite DIR/results.csv atomically (temp file + os.replace) from the run directories."""
    rows = [result_row(r, out, running) for r in runs] + _extra_rows(runs, out)
    path = out / "results.csv"

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)

    atomic_write(path, write)
    return path


# ---- executing one run (in this process's threads, or inside a submitit job) --------------
@dataclass(frozen=True)
class Job:
    """Everything a worker needs to run one training process; picklable for submitit."""

    run_id: str
    run_dir: str
    resume: bool
    branch_from: str = ""  # "PARENT_DIR@STEP" for a cooldown branch (waits for the checkpoint)


# Launcher run as `python -c`: hold the run's lock for the whole training process (the fd is
# inherited across exec), die with the parent (PR_SET_PDEATHSIG, Linux) so a killed sweep
# leaves no orphan writing the run dir, then exec the train entry point.
_LAUNCH = r"""
import ctypes, fcntl, os, signal, sys
lock_path, parent, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
if lock_path:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.exit(f"cgpt sweep: {lock_path} is held: another process is training this run")
    os.set_inheritable(fd, True)
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit("cgpt sweep: the sweep process exited before this run started")
os.execv(sys.executable, [sys.executable, "-m", "cgpt", *argv])
"""

_live: dict[str, subprocess.Popen] = {}  # run_id -> process (local executor)
_live_lock = threading.Lock()
_stopping = threading.Event()


def train_argv(job: Job) -> list[str]:
    """The `python -m cgpt ...` arguments of one run."""
    d = Path(job.run_dir)
    argv = ["train", "--config", str(d / RUN_FILE), "--out", str(d), "--no-progress"]
    if job.branch_from:
        argv += ["--branch-from", job.branch_from]
    return argv + (["--resume"] if job.resume else [])


def _error_from_log(log: Path, lines: int = 3) -> str:
    """The failure's message: the `error:` line train prints, else the log's last lines."""
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return f"no log at {log}"
    text = [t.rstrip() for t in text if t.strip() and not t.startswith("\r")]
    errs = [t for t in text if t.startswith("cgpt train: error:") or t.startswith("cgpt sweep:")]
    if errs:
        return errs[-1][-600:]
    return " | ".join(text[-lines:])[-600:] or "no output"


def execute_run(job: Job) -> dict:
    """Run one training process with its output in `train.log`; never raises on failure.

    Returns {'run_id', 'status': done|failed|interrupted, 'error', 'returncode'}. In a
    multi-task SLURM job every task runs this; rank 0 owns the lock, log and status files,
    and all ranks inherit the SLURM environment that `jax.distributed.initialize` reads.
    """
    d = Path(job.run_dir)
    rank = int(os.environ.get("SLURM_PROCID", "0") or 0)
    ntasks = int(os.environ.get("SLURM_NTASKS", "1") or 1)
    # a requeued single-task job finds the config its first attempt wrote: resume it
    resume = job.resume or (ntasks == 1 and (d / "config.yaml").exists())
    job = Job(job.run_id, job.run_dir, resume, job.branch_from)
    if job.branch_from and not _wait_for_parent(job):
        return {"run_id": job.run_id, "status": "failed", "returncode": None,
                "error": f"parent {job.branch_from} did not produce its checkpoint"}
    log = d / (LOG_FILE if rank == 0 else f"train.rank{rank}.log")
    if rank == 0:
        (d / FAILED_FILE).unlink(missing_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-c", _LAUNCH, str(d / LOCK_FILE) if rank == 0 else "",
           str(os.getpid()), *train_argv(job)]
    t0 = time.time()
    with open(log, "a") as f:
        f.write(f"==== cgpt sweep {time.strftime('%Y-%m-%d %H:%M:%S')}: python -m cgpt "
                f"{' '.join(train_argv(job))}\n")
        f.flush()
        if _stopping.is_set():
            return {"run_id": job.run_id, "status": "interrupted", "error": "", "returncode": None}
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL)
        with _live_lock:
            _live[job.run_id] = proc
        try:
            rc = proc.wait()
        finally:
            with _live_lock:
                _live.pop(job.run_id, None)
    result = {"run_id": job.run_id, "returncode": rc, "error": "",
              "seconds": round(time.time() - t0, 1)}
    if rc == 0 and (d / "summary.json").exists():
        return {**result, "status": "done"}
    if _stopping.is_set() or rc in (130, -signal.SIGINT):
        return {**result, "status": "interrupted"}
    err = _error_from_log(log)
    if rc < 0:
        err = f"killed by signal {signal.Signals(-rc).name}; {err}"
    elif rc == 0:
        err = f"exited 0 without writing summary.json; {err}"
    if rank == 0:
        atomic_write_text(d / FAILED_FILE,
                          json.dumps({**result, "error": err, "log": str(log)}, indent=2))
    return {**result, "status": "failed", "error": err}


def _wait_for_parent(job: Job, poll_s: float = 2.0) -> bool:
    """A branch starts once its parent's checkpoint exists; False if the parent failed."""
    parent, _, step = job.branch_from.rpartition("@")
    p = Path(parent)
    while not _stopping.is_set():
        if (p / "checkpoints" / step).is_dir() and not any(
                (p / "checkpoints").glob(f"{step}.orbax-checkpoint-tmp*")):
            return True
        if (p / FAILED_FILE).exists() or ((p / "summary.json").exists()
                                          and not (p / "checkpoints" / step).is_dir()):
            return False
        time.sleep(poll_s)
    return False


def _stop_local(grace_s: float = 20.0) -> None:
    """SIGINT the live runs (train saves nothing extra, but exits cleanly), then SIGKILL."""
    _stopping.set()
    with _live_lock:
        procs = list(_live.values())
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.time() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()


# ---- the sweep ---------------------------------------------------------------------------
def print_table(sweep: Sweep, out: Path | None, runs: list[Run], parallel: int = 1,
                file=None) -> None:
    """The --dry-run table: N, D, counted FLOPs, 6ND and the estimated time of every run."""
    file = file or sys.stdout
    hdr = (f"{'run_id':34s} {'state':>11s} {'N':>8s} {'D':>8s} {'D/N':>6s} {'batch':>5s} "
           f"{'steps':>7s} {'FLOPs':>9s} {'6ND':>9s} {'est':>7s}")
    print(f"sweep {sweep.name} ({sweep.path}): {len(runs)} runs"
          + (f" (of {len(sweep.runs)}, --only)" if len(runs) != len(sweep.runs) else "")
          + (f"; {sweep.dropped} grid points dropped by filter:" if sweep.dropped else ""),
          file=file)
    print(hdr, file=file)
    total_s = left_s = 0.0
    for r in runs:
        state = run_state(out / r.run_id) if out is not None else "new"
        est = sweep.estimate.seconds(r.steps, r.flops)
        total_s += est
        left_s += 0 if state in ("done", "running") else est
        print(f"{r.run_id:34s} {state:>11s} {_fmt_count(r.n_params):>8s} "
              f"{_fmt_count(r.tokens):>8s} {r.tokens / r.n_params:6.1f} {r.batch_size:5d} "
              f"{r.steps:7d} {r.flops:9.2e} {r.flops_6nd:9.2e} {_fmt_time(est):>7s}", file=file)
    fl = [r.flops for r in runs]
    e = sweep.estimate
    print(f"total {sum(fl):.3g} FLOPs (counted), {max(fl) / min(fl):.3g}x range; estimated "
          f"{_fmt_time(total_s)} serial, {_fmt_time(left_s)} still to run"
          + (f", ~{_fmt_time(left_s / parallel)} at --parallel {parallel} if cores allow"
             if parallel > 1 else "")
          + f"  [model: {e.startup_s:g}s + steps x {e.step_overhead_s:g}s + FLOPs / "
          f"{e.flops_per_s:.3g} FLOP/s]", file=file)
    miss = missing_required(sweep)
    if miss:
        print(f"note: a launch needs {' '.join(f'--set {k}=...' for k in miss)} "
              f"(required by {sweep.path})", file=file)


class _SweepLock:
    """DIR/.sweep.lock: one sweep process per output directory (released even on SIGKILL)."""

    def __init__(self, out: Path):
        self.path = out / ".sweep.lock"
        self.f = open(self.path, "a+")
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.f.seek(0)
            other = self.f.read().strip() or "?"
            self.f.close()
            raise ValueError(f"another sweep (pid {other}) is running in {out}; wait for it, "
                             "or stop it, then rerun") from None
        self.f.seek(0)
        self.f.truncate()
        self.f.write(str(os.getpid()))
        self.f.flush()

    def release(self) -> None:
        self.f.close()


def _report(out: Path, n_done: int) -> None:
    """Scaling-law report from the `analysis` package, when it is there and can fit."""
    try:
        from analysis import sweep_report
    except ImportError as e:
        print(f"(no scaling-law report: the analysis package is not importable: {e})")
        return
    if n_done < 3:
        print(f"(no scaling-law report: {n_done} finished run(s); a fit needs at least 3)")
        return
    try:
        print(sweep_report(out, out_png=out / "scaling.png"))
    except ValueError as e:
        print(f"(no scaling-law report: {e})")
    except Exception as e:  # a fit that fails must not hide that the runs are safe
        print(f"(scaling-law report failed: {type(e).__name__}: {e}; results are in "
              f"{out / 'results.csv'})")


def _slurm_params(sweep: Sweep, parallel: int | None, n_jobs: int) -> dict:
    params = {}
    for k, v in sweep.slurm.items():
        if k == "array_parallelism":
            continue
        params[k if k in SUBMITIT_GENERIC else f"slurm_{k}"] = v
    params["slurm_array_parallelism"] = int(parallel or sweep.slurm.get("array_parallelism")
                                            or n_jobs)
    params.setdefault("timeout_min", 60 * 24)
    params["name"] = f"cgpt-{sweep.name}"
    return params


def launch(sweep: Sweep, out: Path, parallel: int | None = None, executor: str = "local",
           only: str | None = None, poll_s: float = 10.0, report: bool = True) -> int:
    """Run every selected run that is not done; returns 0 if all are done, else 1 (130: ^C)."""
    from tqdm.auto import tqdm

    if executor not in EXECUTORS:
        raise ValueError(f"--executor {executor!r}; use one of {', '.join(EXECUTORS)}")
    if parallel is not None and parallel < 1:
        raise ValueError(f"--parallel {parallel}: must be >= 1")
    miss = missing_required(sweep)
    if miss:
        raise ValueError(f"{sweep.path} requires {', '.join(miss)} to be set at launch: add "
                         f"{' '.join(f'--set {k}=...' for k in miss)}")
    runs = select(sweep.runs, only)
    if not runs:
        raise ValueError(f"--only {only!r} matches none of the {len(sweep.runs)} run ids of "
                         f"{sweep.path} (see --dry-run)")
    out.mkdir(parents=True, exist_ok=True)
    lock = _SweepLock(out)
    _stopping.clear()
    try:
        (out / "sweep.yaml").write_text(yaml.safe_dump(
            {"spec": str(sweep.path), "name": sweep.name, "argv": sys.argv[1:],
             "runs": [r.run_id for r in sweep.runs]}, sort_keys=False))
        running: set[str] = set()
        write_results(sweep.runs, out, running)
        states = {r.run_id: run_state(out / r.run_id) for r in runs}
        todo = [r for r in runs if states[r.run_id] not in ("done", "running")]
        elsewhere = [r.run_id for r in runs if states[r.run_id] == "running"]
        n_done = sum(s == "done" for s in states.values())
        print(f"sweep {sweep.name}: {len(runs)} runs in {out}: {n_done} done, "
              f"{sum(states[r.run_id] == 'interrupted' for r in todo)} to resume, "
              f"{sum(states[r.run_id] == 'failed' for r in todo)} to retry, "
              f"{sum(states[r.run_id] == 'new' for r in todo)} new"
              + (f"; {len(elsewhere)} running in another process, skipped: {elsewhere}"
                 if elsewhere else "") + f" [executor {executor}"
              + (f", parallel {parallel or 1}]" if executor == "local" else "]"))
        if (parallel or 1) > 1 and executor == "local":
            # longest first: K workers finish sooner when the long pole starts at once
            todo.sort(key=lambda r: (r.branch_from is not None,  # parents before branches
                                     -sweep.estimate.seconds(r.steps, r.flops)))
        jobs = []
        for r in todo:
            d = out / r.run_id
            d.mkdir(parents=True, exist_ok=True)
            (d / RUN_FILE).write_text(r.config.to_yaml())
            jobs.append(Job(r.run_id, str(d), resume=(d / "config.yaml").exists(),
                            branch_from=f"{out / r.branch_from[0]}@{r.branch_from[1]}"
                            if r.branch_from else ""))

        failures: dict[str, str] = {}
        bar = tqdm(total=len(runs), initial=n_done, unit="run", desc=f"sweep {sweep.name}",
                   dynamic_ncols=True)

        def finished(res: dict) -> None:
            running.discard(res["run_id"])
            if res["status"] == "failed":
                failures[res["run_id"]] = res["error"]
                bar.write(f"FAILED {res['run_id']}: {res['error']}  "
                          f"(log: {out / res['run_id'] / LOG_FILE})")
            elif res["status"] == "done":
                s = _read_json(out / res["run_id"] / "summary.json") or {}
                bar.write(f"done   {res['run_id']}: val_loss {s.get('val_loss', float('nan')):.4f}"
                          f"  {res.get('seconds', 0):.0f}s")
                bar.update(1)
            write_results(sweep.runs, out, running)
            bar.set_postfix(failed=len(failures), running=len(running), refresh=True)

        try:
            if executor == "local":
                _run_local(jobs, parallel or 1, running, finished, lambda: write_results(
                    sweep.runs, out, running))
            else:
                _run_submitit(jobs, sweep, out, parallel, executor, running, finished, poll_s)
        except KeyboardInterrupt:
            bar.close()
            write_results(sweep.runs, out, set())
            left = sum(run_state(out / r.run_id) != "done" for r in runs)
            print(f"\ncgpt sweep: interrupted; finished runs are kept and {left} left; rerun "
                  "the same command to resume"
                  + (" (SLURM jobs already submitted keep running)" if executor == "slurm"
                     else ""), file=sys.stderr)
            return 130
        bar.close()
        write_results(sweep.runs, out, set())
        states = {r.run_id: run_state(out / r.run_id) for r in runs}
        n_done = sum(s == "done" for s in states.values())
        failed = [k for k, s in states.items() if s == "failed"]
        print(f"sweep {sweep.name}: {n_done}/{len(runs)} done, {len(failed)} failed"
              + (f" ({', '.join(failed)}; errors in {out / 'results.csv'}, logs in "
                 f"<run>/{LOG_FILE})" if failed else "") + f"; results: {out / 'results.csv'}")
        if report:
            all_done = sum(run_state(out / r.run_id) == "done" for r in sweep.runs)
            _report(out, all_done)
        return 0 if n_done == len(runs) else 1
    finally:
        lock.release()


def _run_local(jobs: list[Job], parallel: int, running: set[str], finished, refresh) -> None:
    pending = list(jobs)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futs = {}
        try:
            while pending or futs:
                while pending and len(futs) < parallel:
                    j = pending.pop(0)
                    running.add(j.run_id)
                    futs[pool.submit(execute_run, j)] = j
                refresh()
                done, _ = wait(list(futs), return_when=FIRST_COMPLETED)
                for f in done:
                    futs.pop(f)
                    finished(f.result())
        except KeyboardInterrupt:
            _stop_local()
            for f in futs:
                f.cancel()
            raise


def _run_submitit(jobs: list[Job], sweep: Sweep, out: Path, parallel: int, executor: str,
                  running: set[str], finished, poll_s: float) -> None:
    import submitit

    if not jobs:
        return
    cluster = "slurm" if executor == "slurm" else "local"
    ex = submitit.AutoExecutor(folder=out / ".submitit", cluster=cluster)
    params = _slurm_params(sweep, parallel, len(jobs))
    try:
        ex.update_parameters(**params)
    except (NameError, AssertionError) as e:
        raise ValueError(f"{sweep.path}: bad slurm: setting ({e}); see docs/sweeps.md") from None
    with ex.batch():
        subs = [ex.submit(execute_run, j) for j in jobs]
    by_id = {s.job_id: j for s, j in zip(subs, jobs)}
    running.update(j.run_id for j in jobs)
    print(f"submitted {len(subs)} {cluster} jobs ({subs[0].job_id.split('_')[0]}...), "
          f"logs in {out / '.submitit'}")
    try:
        for s in submitit.helpers.as_completed(subs, poll_frequency=poll_s):
            j = by_id[s.job_id]
            try:
                res = s.result()
                if isinstance(res, list):  # multi-task job: rank 0's result
                    res = res[0]
            except Exception as e:  # the job itself died (time limit, node failure, ...)
                res = {"run_id": j.run_id, "status": "failed",
                       "error": f"submitit job {s.job_id}: {str(e).strip().splitlines()[-1:]}"}
                if run_state(Path(j.run_dir)) == "done":
                    res["status"] = "done"
                else:
                    p = Path(j.run_dir) / FAILED_FILE
                    p.write_text(json.dumps(res, indent=2))
            finished(res)
    except KeyboardInterrupt:
        if cluster == "local":
            for s in subs:
                s.cancel(check=False)
        raise


# ---- command line ------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="sweep spec YAML (see sweeps/*.yaml and docs/sweeps.md)")
    p.add_argument("--out", help="sweep directory (default: runs/sweeps/<spec name>)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the runs with N, D, FLOPs and estimated time, then exit")
    p.add_argument("--parallel", type=int,
                   help="runs at a time: local default 1; slurm default slurm.array_parallelism "
                   "or all")
    p.add_argument("--executor", default="local", choices=EXECUTORS,
                   help="local subprocesses, a SLURM job array via submitit, or submitit's "
                   "local executor (the SLURM code path on this machine)")
    p.add_argument("--only", metavar="PATTERN",
                   help="run only ids matching these comma-separated globs (or substrings)")
    p.add_argument("--set", dest="sets", nargs="+", action="extend", default=[],
                   metavar="section.key=value",
                   help="override every run (data.source=..., train.batch_size=16) or the "
                   "slurm:/estimate: sections (slurm.partition=gpu)")


def register(subparsers) -> argparse.ArgumentParser:
    """Add `sweep` to cgpt's subcommands (cli.py: `sweep.register(sub)`)."""
    p = subparsers.add_parser(
        "sweep", help="launch a grid of training runs from a spec (resumable)",
        description="Expand a sweep spec into runs and train each as its own process. "
        "Relaunching the same command skips finished runs and resumes interrupted ones.")
    add_arguments(p)
    p.set_defaults(func=cmd_sweep)
    return p


def cmd_sweep(args: argparse.Namespace) -> int:
    sweep = load_sweep(args.spec, args.sets)
    out = Path(args.out or f"runs/sweeps/{sweep.name}")
    if args.dry_run:
        print_table(sweep, out if out.exists() else None, select(sweep.runs, args.only),
                    args.parallel or 1)
        return 0
    return launch(sweep, out, parallel=args.parallel, executor=args.executor, only=args.only)


def main(argv: list[str] | None = None) -> int:
    """`python -m cgpt.sweep ...`, the same as `python -m cgpt sweep ...`."""
    from cgpt.cli import main as cli_main

    return cli_main(["sweep", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    from cgpt.sweep import main as _main  # the module's own name, so submitit pickles cgpt.sweep.*

    sys.exit(_main())
