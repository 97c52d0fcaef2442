"""A sweep spec (YAML, see docs/sweeps.md) expanded into its run list, validated up front.

A spec is a base run config plus a grid; the product of the grid's axes is the run list.
Every run is resolved to a full `RunConfig` here, so a bad preset, key or value is an error
naming the spec file (or the `--set` flag) and the key before anything is launched.
"""
from __future__ import annotations

import copy
import fnmatch
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from cgpt.config import flops as flops_mod
from cgpt.config.model import get_config
from cgpt.config.recipe import MAX_STEPS
from cgpt.config.overrides import SECTIONS, check_key, coerce_source, seed_overrides, set_key, \
    split_override
from cgpt.config.run import RunConfig, from_dict, identity, load_yaml, parse_bytes
from cgpt.errors import TrainError
from cgpt.sweep.suggest import with_runs
from cgpt.train.resolve import batch_of, resolve
from cgpt.sweep.validate import check_estimate, check_slurm, check_spec

SPEC_KEYS = ("name", "description", "base", "models", "grid", "per_model", "filter", "require",
             "estimate", "slurm", "runs")
GRID_KEYS = ("model", "tokens", "tokens_per_param", "flops", "seed", "overrides", "branches")


# ---- the throughput model behind --dry-run's time estimate --------------------------------
@dataclass(frozen=True)
class Estimate:
    """time = startup_s + steps * (step_overhead_s + counted FLOPs per step / FLOP/s).

    FLOP/s is `flops_per_s`, or, when `mfu` and `device_flops` are given, mfu x device_flops x
    the run's devices (slurm nodes x gpus_per_node): a cluster spec states its MFU. Defaults: a
    least-squares fit to the demo sweep's runs on the 2-core development CPU (docs/sweeps.md).
    """

    flops_per_s: float = 1.9e10
    step_overhead_s: float = 0.035
    startup_s: float = 20.0
    mfu: float | None = None
    device_flops: float | None = None  # peak FLOP/s of one device, e.g. 989e12 (H100 bf16)
    device_memory: int | None = None  # bytes per device ("80GB" in a spec): the dry run's fit

    def rate(self, devices: int = 1) -> float:
        if self.mfu is not None and self.device_flops is not None:
            return self.mfu * self.device_flops * max(1, devices)
        return self.flops_per_s

    def seconds(self, steps: int, flops: float, devices: int = 1) -> float:
        return self.startup_s + steps * self.step_overhead_s + flops / self.rate(devices)


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
    tokens: int  # trained: steps x batch x seq_len (the budget rounded down to whole steps)
    batch_size: int
    steps: int
    flops: float  # counted (cgpt.config.flops.train_flops), at the run's seq_len
    flops_6nd: float
    explicit: frozenset = frozenset()  # section.key names set by the spec or --set
    flops_budget: float | None = None  # the nominal C of an isoFLOP grid point
    peak_lr: float = math.nan  # resolved (the preset's published value unless set)
    slurm: dict = field(default_factory=dict, hash=False, compare=False)  # this run's resources
    branch_from: tuple[str, int] | None = None  # (parent run_id, step): a WSD cooldown branch

    @property
    def devices(self) -> int:
        return int(self.slurm.get("nodes", 1)) * int(self.slurm.get("gpus_per_node", 1) or 1)

    @property
    def config_hash(self) -> str:
        return config_hash(self.config.to_dict())


def config_hash(cfg: dict) -> str:
    """sha256 of `identity(cfg)` (`cgpt.config.run`: the rule `--resume` checks too) as
    canonical JSON: equal hashes, equal runs."""
    text = json.dumps(identity(cfg), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Sweep:
    name: str
    path: Path
    runs: list[Run]
    require: list[str] = field(default_factory=list)
    slurm: dict = field(default_factory=dict)
    estimate: Estimate = field(default_factory=Estimate)
    dropped: int = 0  # runs removed by the spec's `filter:`


def fmt_count(x: float) -> str:
    """3 significant digits with k/M/B/T: 336640 -> '337k', 4820480 -> '4.82M'."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def fmt_flops(c: float) -> str:
    """1e12 -> '1e12', 3e12 -> '3e12', 2.5e13 -> '2.5e13' (run ids: no '+')."""
    mant, exp = f"{c:.2e}".split("e")
    mant = mant.rstrip("0").rstrip(".")
    return f"{mant}e{int(exp)}"


def fmt_time(s: float) -> str:
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.1f}m"
    if s < 3 * 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def _safe(text: str) -> str:
    """A run-id fragment: letters, digits and . _ + - only."""
    out = "".join(c if c.isalnum() or c in "._+-" else "-" for c in str(text))
    return out.strip("-") or "x"


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


def _three_digits(x: float, rounding) -> float:
    """`x` to three significant digits, rounded by `rounding` (math.ceil or math.floor)."""
    unit = 10 ** (math.floor(math.log10(x)) - 2)
    return rounding(x / unit) * unit


def _budget_error(spec_path: Path, budget: tuple[str, float, str], model: str, n: int,
                  raw: dict, e: ValueError) -> ValueError:
    """A grid budget no run of `model` can train (below one step, or beyond an int32 step
    count), named by its grid key and value with the least or largest this model takes: the
    resolver's error names train.tokens, which the grid set, not the user."""
    kind, value, label = budget
    key = ("grid.tokens" if kind == "tokens" or label == "chinchilla" else
           "grid.tokens_per_param" if kind == "tpp" else "grid.flops")
    scale = {"tokens": 1, "tpp": n, "flops": 1 / (6 * n)}[kind]  # tokens per unit (C = 6 N D)
    what = f"{key} entry {label if label == 'chinchilla' else f'{value:g}'}"
    run = from_dict(raw, str(spec_path))
    step = batch_of(run) * run.data.seq_len
    if value * scale < step:
        least = _three_digits(step / scale, math.ceil)  # rounded up: one step trains
        return ValueError(f"{spec_path}: {what} gives model {model} ({n:,} parameters) "
                          f"{value * scale:.3g} tokens, less than one step of {step:,} "
                          f"(train.batch_size x data.seq_len); give {key} at least "
                          f"{least:.3g} for this model, or lower train.batch_size")
    most = MAX_STEPS * step
    top = _three_digits(most / scale, math.floor)  # rounded down: the bound itself trains
    return ValueError(f"{spec_path}: {what} gives model {model} ({n:,} parameters) "
                      f"{value * scale:.3g} tokens, beyond the {most:.3g} of a run's "
                      f"{MAX_STEPS:,} steps at most; give {key} at most {top:.3g} for this "
                      "model")


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
        check_key(k, where)
    if label is None:
        label = "-".join(f"{k.rpartition('.')[2]}{v}" for k, v in entry.items()) or "base"
    return _safe(label), entry


def read_spec(path: str | Path) -> dict:
    p = Path(path)
    spec = load_yaml(p, "sweep spec (bundled specs live in sweeps/*.yaml)", ", ".join(SPEC_KEYS))
    bad = sorted(set(spec) - set(SPEC_KEYS))
    if bad:
        raise ValueError(f"{p}: unknown key(s) {bad}; valid: {', '.join(SPEC_KEYS)}")
    check_spec(spec, p)
    return spec


def _split_sets(sets: list[str], slurm: dict, est: dict) -> dict:
    """--set items: run-config keys (checked here, blamed on the flag) or slurm.* / estimate.*."""
    set_run: dict = {}
    for item in sets:
        where = f"--set {item!r}"
        key, value = split_override(item, where)
        section, _, k = key.partition(".")
        if section == "slurm" and k:
            slurm[k] = value
        elif section == "estimate" and k:
            est[k] = value
        else:
            set_key(set_run, key, value, where)
    return set_run


def _model_slurm(spec_path: Path, entries: dict, m: str) -> tuple[dict, dict]:
    """per_model.<m>: split run-config keys from `slurm.*` resources."""
    run_keys, slurm = {}, {}
    for k, v in (entries or {}).items():
        section, _, name = str(k).partition(".")
        if section == "slurm" and name:
            slurm[name] = v
        else:
            check_key(k, f"{spec_path}: per_model.{m}")
            run_keys[k] = v
    check_slurm(slurm, f"{spec_path}: per_model.{m}")
    return run_keys, slurm


def load_sweep(path: str | Path, sets: list[str] | None = None, _spec: dict | None = None) -> Sweep:
    """Expand a spec file into its run list; `sets` are `section.key=value` launch overrides.

    Layering, later wins: base < spec-defined model < per_model < the grid's seed and token
    budget < the grid's overrides entry < `--set`. `slurm:` resources layer the same way
    (spec < per_model < --set slurm.*).
    """

    spec_path = Path(path)
    spec = read_spec(spec_path) if _spec is None else _spec
    if spec.get("runs"):  # explicit extra runs {model, tokens, seed} (`--suggest K --write`)
        return with_runs(spec_path, spec, sets, load_sweep)
    name = str(spec.get("name") or spec_path.stem)
    if name in (".", "..") or any(c in name for c in "/\\\0"):  # it names runs/sweeps/<name>
        raise ValueError(f"{spec_path}: name {name!r} must be one folder name (no '/', not "
                         "'.' or '..'): the sweep's default --out is runs/sweeps/<name>")
    base = spec.get("base") or {}
    if not isinstance(base, dict):
        raise ValueError(
            f"{spec_path}: 'base' must be a run config mapping (preset/model/data/train)")
    bad = sorted(set(base) - {"preset", *SECTIONS})
    if bad:
        raise ValueError(f"{spec_path}: unknown base key(s) {bad}; use model, data, train")
    for s in SECTIONS:
        for k in (base.get(s) or {}):
            check_key(f"{s}.{k}", f"{spec_path}: base")

    slurm = dict(spec.get("slurm") or {})
    est = dict(spec.get("estimate") or {})
    slurm_set: dict = {}
    set_run = _split_sets(list(sets or []), slurm_set, est)
    slurm.update(slurm_set)
    check_slurm(slurm, f"{spec_path} (or --set)")
    check_estimate(est, f"{spec_path} (or --set)")
    try:
        memory = est.pop("device_memory", None)
        estimate = Estimate(**{k: float(v) for k, v in est.items()}, device_memory=None if
                            memory is None else parse_bytes(memory, "estimate.device_memory"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{spec_path}: estimate: {e}; keys: flops_per_s, step_overhead_s, "
                         "startup_s, mfu, device_flops, device_memory") from None

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
        raise ValueError(
            f"{spec_path}: 'per_model' maps a grid.model name to {{section.key: value}}")
    stray = sorted(set(per_model) - set(models))
    if stray:
        raise ValueError(f"{spec_path}: per_model names {stray} that are not in grid.model")
    per_model = {m: _model_slurm(spec_path, v, m) for m, v in per_model.items()}

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
        budgets.append(("flops", c, f"c{fmt_flops(c)}"))
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

    flt = spec.get("filter") or {}  # its shape: validate.check_spec
    tpp_range = [float(x) for x in flt["tokens_per_param"]] if flt else None

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
        model_keys, model_slurm = per_model.get(m, ({}, {}))
        for k, v in model_keys.items():
            set_key(raw, k, v, f"{where}: per_model.{m}")
        if seed is not None:  # a seed is a replicate: new init and new data order
            for k, v in seed_overrides(seed).items():
                set_key(raw, k, v, where)
        for k, v in ovr.items():
            set_key(raw, k, v, f"{where}: grid.overrides")
        for s, sec in set_run.items():
            for k, v in sec.items():
                set_key(raw, f"{s}.{k}", v, "--set")
        coerce_source(raw)
        explicit = _flat_keys(raw)
        try:
            cfg = from_dict(raw, where)
        except ValueError as e:
            raise ValueError(f"{e} (run model={m}, seed={seed}, overrides={ovr or '{}'})") from None
        n = cfg.model.num_params()
        tokens_fixed = "train.tokens" in ovr or "tokens" in (set_run.get("train") or {})
        derived = kind != "config" and not tokens_fixed  # the grid's budget sets train.tokens
        if derived:
            d = (round(value) if kind == "tokens" else round(value * n) if kind == "tpp"
                 else round(value / (6 * n)))
            raw.setdefault("train", {})["tokens"] = max(1, int(d))
            cfg = from_dict(raw, where)
        try:
            plan = resolve(cfg)
        except TrainError as e:
            raise ValueError(f"{spec_path}: run model={m}: {e}") from None
        except ValueError as e:
            if not derived:  # train.tokens as the user set it: the error names it
                raise ValueError(f"{spec_path}: run model={m}: {e}") from None
            raise _budget_error(spec_path, (kind, value, blabel), m, n, raw, e) from None
        d_run = plan.total_steps * plan.tokens_per_step
        if tpp_range and not (tpp_range[0] <= plan.tokens / n <= tpp_range[1]):
            dropped += 1
            continue
        if kind == "flops":
            budget, idpart = f"C={fmt_flops(value)}", blabel
        else:
            budget = ("20 tok/param" if blabel == "chinchilla" else
                      f"{value:g} tok/param" if kind == "tpp" else "fixed")
            idpart = f"d{fmt_count(plan.tokens)}"
        seed_val = cfg.train.seed
        label = f"_{olabel}" if label_overrides and olabel else ""
        rid = f"{_safe(m)}_{idpart}_s{seed_val}{label}"
        runs.append(Run(
            run_id=rid, model=cfg.model.name, seed=seed_val, budget=budget, config=cfg,
            n_params=n, n_params_nonembed=cfg.model.num_params(embedding=False),
            tokens=d_run, batch_size=plan.batch_size, steps=plan.total_steps,
            flops=flops_mod.train_flops(cfg.model, d_run, plan.seq_len),
            flops_6nd=flops_mod.flops_6nd(cfg.model, d_run), explicit=frozenset(explicit),
            flops_budget=value if kind == "flops" else None, peak_lr=plan.recipe.peak_lr,
            slurm={**(spec.get("slurm") or {}), **model_slurm, **slurm_set}))
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
    its budget (cgpt.train.branch.plan_branches); parents first, so they start before their
    branches."""
    from cgpt.train.branch import plan_branches  # loads JAX: only when this runs
    parents, branches = [], []
    for r in runs:
        cfg, planned = plan_branches(r.config, fractions, f"{spec_path}: grid.branches")
        parents.append(replace(r, config=cfg))
        for f, (bcfg, step) in zip(sorted(fractions), planned):
            plan = resolve(bcfg)
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


__all__ = ["Estimate", "Run", "Sweep", "load_sweep", "read_spec", "select", "missing_required",
           "config_hash", "identity"]
