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
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from cgpt.config import flops as flops_mod
from cgpt.config.recipe import MAX_STEPS
from cgpt.config.units import fmt_count
from cgpt.config.overrides import SECTIONS, coerce_source, seed_overrides, set_key, split_override
from cgpt.config.run import RunConfig, from_dict, identity, load_yaml, parse_bytes
from cgpt.errors import TrainError
from cgpt.train.resolve import batch_of, resolve
from cgpt.sweep.validate import SPEC_KEYS, as_list, check, check_estimate, check_runs, \
    check_slurm, split_slurm


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


def _overrides_entry(entry) -> tuple[str, dict]:
    """A grid.overrides entry -> (run-id label, {section.key: value})."""
    if entry is None:
        return "", {}
    entry = dict(entry)
    label = entry.pop("name", None)
    if label is None:
        label = "-".join(f"{k.rpartition('.')[2]}{v}" for k, v in entry.items()) or "base"
    return _safe(label), entry


def read_spec(path: str | Path) -> dict:
    """The spec file as a mapping (`load_sweep` checks it: `cgpt.sweep.validate.check`)."""
    return load_yaml(Path(path), "sweep spec (bundled specs live in sweeps/*.yaml)",
                     ", ".join(SPEC_KEYS))


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


def _settings(spec: dict, spec_path: Path, sets: list[str] | None):
    """(--set's run-config keys, the sweep's slurm resources, --set's own, the Estimate):
    `slurm:` and `estimate:` with --set's slurm.* and estimate.* over them."""
    slurm, est, slurm_set = dict(spec.get("slurm") or {}), dict(spec.get("estimate") or {}), {}
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
    return set_run, slurm, slurm_set, estimate


def _budgets(grid: dict) -> list[tuple[str, float, str]]:
    """The token-budget axis, (kind, value, label) each: fixed counts and 'chinchilla', tokens
    per parameter, FLOP budgets; none: the token count base and --set give."""
    budgets = [("tpp", float(flops_mod.TOKENS_PER_PARAM), "chinchilla")
               if str(t).strip().lower() == "chinchilla" else ("tokens", float(t), "")
               for t in as_list(grid.get("tokens"))]
    budgets += [("tpp", float(r), "") for r in as_list(grid.get("tokens_per_param"))]
    budgets += [("flops", float(c), f"c{fmt_flops(float(c))}") for c in as_list(grid.get("flops"))]
    return budgets or [("config", 0.0, "")]  # whatever base/--set say (default: chinchilla)


@dataclass(frozen=True)
class _Grid:
    """A checked spec's grid (`validate.check`) and what each of its points is planned
    with: one point is a budget, a model, a seed and an overrides entry."""

    path: Path
    spec: dict
    set_run: dict  # --set's run-config keys, {section: {key: value}}
    slurm_set: dict  # --set's slurm.* resources

    def points(self) -> Iterator[tuple]:
        """Budget-major: cheap budgets first, and an isoFLOP grid reads budget by budget."""
        grid = self.spec["grid"]
        return itertools.product(_budgets(grid), [str(m) for m in as_list(grid.get("model"))],
                                 as_list(grid.get("seed")) or [None],
                                 [_overrides_entry(e) for e in self.override_entries])

    @property
    def override_entries(self) -> list:
        return as_list(self.spec["grid"].get("overrides")) or [None]

    def raw(self, m: str, seed: int | None, ovr: dict) -> dict:
        """Point (m, seed, ovr)'s run config as a raw dict, layered (later wins): base <
        spec-defined model < per_model < seed < the overrides entry < --set."""
        raw, custom = copy.deepcopy(self.spec.get("base") or {}), self.spec.get("models") or {}
        if m in custom:
            c = dict(custom[m])
            raw["preset"] = str(c.pop("preset"))
            raw["model"] = {**(raw.get("model") or {}), **c, "name": m}
        else:
            raw["preset"] = m
        where = str(self.path)
        for k, v in split_slurm((self.spec.get("per_model") or {}).get(m))[0].items():
            set_key(raw, k, v, f"{where}: per_model.{m}")
        for k, v in (seed_overrides(seed) if seed is not None else {}).items():
            set_key(raw, k, v, where)  # a seed is a replicate: new init and new data order
        for k, v in ovr.items():
            set_key(raw, k, v, f"{where}: grid.overrides")
        for s, sec in self.set_run.items():
            for k, v in sec.items():
                set_key(raw, f"{s}.{k}", v, "--set")
        return coerce_source(raw)

    def run(self, budget: tuple[str, float, str], m: str, seed: int | None,
            override: tuple[str, dict]) -> Run | None:
        """The point's Run, or None when the spec's `filter:` drops it."""
        (kind, value, _), ovr = budget, override[1]
        raw = self.raw(m, seed, ovr)
        explicit = _flat_keys(raw)
        try:
            cfg = from_dict(raw, str(self.path))
        except ValueError as e:
            raise ValueError(f"{e} (run model={m}, seed={seed}, overrides={ovr or '{}'})") from None
        n = cfg.model.num_params()
        tokens_fixed = "train.tokens" in ovr or "tokens" in (self.set_run.get("train") or {})
        derived = kind != "config" and not tokens_fixed  # the grid's budget sets train.tokens
        if derived:
            d = (round(value) if kind == "tokens" else round(value * n) if kind == "tpp"
                 else round(value / (6 * n)))
            raw.setdefault("train", {})["tokens"] = max(1, int(d))
            cfg = from_dict(raw, str(self.path))
        try:
            plan = resolve(cfg)
        except TrainError as e:
            raise ValueError(f"{self.path}: run model={m}: {e}") from None
        except ValueError as e:
            if not derived:  # train.tokens as the user set it: the error names it
                raise ValueError(f"{self.path}: run model={m}: {e}") from None
            raise _budget_error(self.path, budget, m, n, raw, e) from None
        flt = self.spec.get("filter")
        if flt and not (float(flt["tokens_per_param"][0]) <= plan.tokens / n
                        <= float(flt["tokens_per_param"][1])):
            return None
        return self.planned(cfg, plan, (budget, m, override[0]), explicit)

    def planned(self, cfg: RunConfig, plan, point: tuple, explicit: set[str]) -> Run:
        """The Run of a resolved point; its id names the model, the budget, the seed and (for
        a grid of several) the overrides entry."""
        (kind, value, blabel), m, olabel = point
        if kind == "flops":
            budget, idpart = f"C={fmt_flops(value)}", blabel
        else:
            budget = ("20 tok/param" if blabel == "chinchilla" else
                      f"{value:g} tok/param" if kind == "tpp" else "fixed")
            idpart = f"d{fmt_count(plan.tokens)}"
        entries = self.override_entries
        several = len(entries) > 1 or any(isinstance(o, dict) and "name" in o for o in entries)
        label = f"_{olabel}" if several and olabel else ""
        d_run = plan.total_steps * plan.tokens_per_step
        model_slurm = split_slurm((self.spec.get("per_model") or {}).get(m))[1]
        return Run(
            run_id=f"{_safe(m)}_{idpart}_s{cfg.train.seed}{label}", model=cfg.model.name,
            seed=cfg.train.seed, budget=budget, config=cfg, n_params=cfg.model.num_params(),
            n_params_nonembed=cfg.model.num_params(embedding=False),
            tokens=d_run, batch_size=plan.batch_size, steps=plan.total_steps,
            flops=flops_mod.train_flops(cfg.model, d_run, plan.seq_len),
            flops_6nd=flops_mod.flops_6nd(cfg.model, d_run), explicit=frozenset(explicit),
            flops_budget=value if kind == "flops" else None, peak_lr=plan.recipe.peak_lr,
            slurm={**(self.spec.get("slurm") or {}), **model_slurm, **self.slurm_set})


def with_runs(spec_path: Path, spec: dict, sets: list[str] | None) -> Sweep:
    """The grid's runs plus the spec's `runs:` entries, each expanded as a one-run grid of the
    same spec (base, models and per_model apply to it as to any grid run)."""
    entries = check_runs(spec, spec_path)
    sweep = load_sweep(spec_path, sets, _spec={**spec, "runs": None})
    per_model = spec.get("per_model") or {}
    for i, e in enumerate(entries):
        grid = {"model": [e["model"]], "tokens": [e["tokens"]]}
        if "seed" in e:
            grid["seed"] = [e["seed"]]
        sub = {**spec, "runs": None, "filter": None, "grid": grid,
               "per_model": {k: v for k, v in per_model.items() if k == e["model"]}}
        try:
            sweep.runs += load_sweep(spec_path, sets, _spec=sub).runs
        except ValueError as err:
            raise ValueError(f"{spec_path}: runs[{i}]: {err}") from None
    _check_unique(sweep.runs, f"{spec_path}: runs: duplicate run ids {{}}: an entry repeats a "
                  "grid run or another entry; remove it or give it another seed")
    return sweep


def _check_unique(runs: list[Run], message: str) -> None:
    """Two runs of one id would share a run directory: `message` with the ids, an error."""
    ids = [r.run_id for r in runs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(message.format(dup))


def load_sweep(path: str | Path, sets: list[str] | None = None, _spec: dict | None = None) -> Sweep:
    """Expand a spec file into its run list; `sets` are `section.key=value` launch overrides.

    Layering, later wins: base < spec-defined model < per_model < the grid's seed and token
    budget < the grid's overrides entry < `--set`. `slurm:` resources layer the same way
    (spec < per_model < --set slurm.*). The spec is checked first (`cgpt.sweep.validate`).
    """
    spec_path = Path(path)
    spec = read_spec(spec_path) if _spec is None else _spec
    if spec.get("runs"):  # explicit extra runs {model, tokens, seed} (`--suggest K --write`)
        return with_runs(spec_path, spec, sets)
    check(spec, spec_path)
    set_run, slurm, slurm_set, estimate = _settings(spec, spec_path, sets)
    grid = _Grid(spec_path, spec, set_run, slurm_set)
    planned = [grid.run(*point) for point in grid.points()]
    runs = [r for r in planned if r is not None]
    dropped = len(planned) - len(runs)  # by the spec's `filter:`
    if spec["grid"].get("branches"):
        runs = _with_branches(runs, [float(f) for f in as_list(spec["grid"]["branches"])],
                              spec_path)
    _check_unique(runs, f"{spec_path}: the grid gives duplicate run ids {{}}: two grid points "
                  "resolve to the same model, tokens and seed; remove one, or give "
                  "grid.overrides entries distinct 'name's")
    if not runs:
        raise ValueError(f"{spec_path}: the grid is empty after filter: {spec.get('filter')}; "
                         "widen the filter")
    return Sweep(name=str(spec.get("name") or spec_path.stem), path=spec_path, runs=runs,
                 require=[str(k) for k in as_list(spec.get("require"))], slurm=slurm,
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
