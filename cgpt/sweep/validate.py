"""A sweep spec checked in one place, before it is expanded: every key, value and name.

`load_sweep` (`cgpt.sweep.spec`) only expands a spec this module passed: a value of the wrong
type (a number where a mapping belongs, a string in `filter`, `estimate.flops_per_s: 0`), an
unknown key or preset, or a seed below 0 would otherwise surface there as a TypeError, a
ZeroDivisionError or a run half-built. Each is one error that names the spec file (or the
`--set` flag), the key and what it should be. A run's own config is checked where every run
config is (`cgpt.config.run.from_dict`, values typed by `cgpt.config.values`); what depends on
a run's resolved size (a budget under one step) is checked as the run is planned.
"""
from __future__ import annotations

import math
from pathlib import Path

from cgpt.config.model import get_config
from cgpt.config.overrides import SECTIONS, check_key

SPEC_KEYS = ("name", "description", "base", "models", "grid", "per_model", "filter", "require",
             "estimate", "slurm", "runs")
GRID_KEYS = ("model", "tokens", "tokens_per_param", "flops", "seed", "overrides", "branches")
RUN_KEYS = ("model", "tokens", "seed")  # an entry of `runs:` (`cgpt sweep --suggest --write`)

# slurm: keys whose values are counts (>= 1) or amounts (> 0), when a spec gives them
SLURM_COUNTS = ("nodes", "gpus_per_node", "tasks_per_node", "cpus_per_task", "array_parallelism",
                "max_num_timeout")
SLURM_AMOUNTS = ("timeout_min", "mem_gb")
ESTIMATE_POSITIVE = ("flops_per_s", "device_flops")  # divided by
ESTIMATE_TIMES = ("startup_s", "step_overhead_s")  # added up: >= 0


def _is_num(v) -> bool:
    """A finite number, or a string that is one (YAML reads `1e9` as a string)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return False
    try:
        return math.isfinite(float(v))
    except ValueError:
        return False


def _scalar(v) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def as_list(value) -> list:
    """A spec value that is one item or a list of them, as a list (None: empty)."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def positive(path: Path, key: str, v) -> float:
    """An entry of a grid axis of numbers (grid.tokens, grid.flops, ...) as a float > 0."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: {key} entry {v!r} is not a number") from None
    if not x > 0 or not math.isfinite(x):
        raise ValueError(f"{path}: {key} entry {v!r} must be a positive number")
    return x


def _fail(where: str, key: str, v, want: str) -> ValueError:
    text = repr(v)
    return ValueError(f"{where}: {key} is {text[:80] + ('...' if len(text) > 80 else '')}; "
                      f"it must be {want}")


def check(spec: dict, path: Path) -> None:
    """Every key of a spec, in one pass: its value of the kind docs/sweeps.md describes, and
    what the expansion reads of it in range: the sweep's name, base keys, presets that exist,
    the grid's budgets, seeds and override keys, per_model entries, `require:` entries."""
    bad = sorted(set(spec) - set(SPEC_KEYS))
    if bad:
        raise ValueError(f"{path}: unknown key(s) {bad}; valid: {', '.join(SPEC_KEYS)}")
    for key in ("name", "description"):
        if key in spec and not (spec[key] is None or isinstance(spec[key], (str, int, float))
                                and not isinstance(spec[key], bool)):
            raise _fail(str(path), key, spec[key], "a string")
    name = str(spec.get("name") or path.stem)
    if name in (".", "..") or any(c in name for c in "/\\\0"):  # it names runs/sweeps/<name>
        raise ValueError(f"{path}: name {name!r} must be one folder name (no '/', not "
                         "'.' or '..'): the sweep's default --out is runs/sweeps/<name>")
    _check_base(spec.get("base") or {}, path)
    grid = _check_grid(spec.get("grid"), path)
    models = _check_models(spec.get("models") or {}, grid, path)
    _check_per_model(spec.get("per_model") or {}, models, path)
    _check_filter(spec.get("filter"), path)
    for k in (str(k) for k in as_list(spec.get("require"))):
        if k.partition(".")[0] not in SECTIONS or "." not in k:
            raise ValueError(f"{path}: require entry {k!r} must be section.key")
    for key in ("estimate", "slurm"):
        if spec.get(key) is not None and not isinstance(spec[key], dict):
            raise _fail(str(path), key, spec[key], "a mapping of key: value (see docs/sweeps.md)")


def _check_base(base, path: Path) -> None:
    if not isinstance(base, dict):
        raise ValueError(f"{path}: 'base' must be a run config mapping (preset/model/data/train)")
    if "preset" in base and not isinstance(base["preset"], str):
        raise _fail(str(path), "base.preset", base["preset"], "a preset name (see `cgpt list`)")
    bad = sorted(set(base) - {"preset", *SECTIONS})
    if bad:
        raise ValueError(f"{path}: unknown base key(s) {bad}; use model, data, train")
    for s in SECTIONS:
        if base.get(s) is not None and not isinstance(base[s], dict):
            raise _fail(str(path), f"base.{s}", base[s], "a mapping of key: value")
        for k, v in (base.get(s) or {}).items():
            if isinstance(v, dict):
                raise _fail(str(path), f"base.{s}.{k}", v, "a single value")
            check_key(f"{s}.{k}", f"{path}: base")


def _check_grid(grid, path: Path) -> dict:
    """The grid's axes: single values or lists of them; budgets > 0, seeds >= 0, overrides
    entries mappings of section.key (and a `name`) to single values."""
    if not isinstance(grid, dict):
        raise ValueError(f"{path}: 'grid' is required, a mapping with keys "
                         f"{', '.join(GRID_KEYS)}")
    bad = sorted(set(grid) - set(GRID_KEYS))
    if bad:
        raise ValueError(f"{path}: unknown grid key(s) {bad}; valid: {', '.join(GRID_KEYS)}")
    for key in ("model", "tokens", "tokens_per_param", "flops", "seed", "branches"):
        for v in as_list(grid.get(key)):
            if not (isinstance(v, (str, int, float)) and not isinstance(v, bool)):
                raise _fail(str(path), f"grid.{key}", grid[key], "a value or a list of values")
    for key in ("tokens", "tokens_per_param", "flops"):
        for v in as_list(grid.get(key)):
            if key != "tokens" or str(v).strip().lower() != "chinchilla":
                positive(path, f"grid.{key}", v)
    for v in as_list(grid.get("branches")):  # fractions of a budget, read with float()
        if not _is_num(v):
            raise _fail(str(path), "grid.branches", grid["branches"], "fractions of each run's "
                        "budget in (0, 1), e.g. [0.5, 0.8]")
    for s in as_list(grid.get("seed")):
        if not isinstance(s, int) or s < 0:
            raise ValueError(f"{path}: grid.seed entries must be ints >= 0 (got {s!r})")
    for i, entry in enumerate(as_list(grid.get("overrides"))):
        where = f"grid.overrides[{i}]"
        if entry is not None and not isinstance(entry, dict):
            raise ValueError(f"{path}: {where} must be a mapping of section.key: value (got "
                             f"{entry!r})")
        for k, v in (entry or {}).items():
            if k == "name" and not isinstance(v, (str, int, float)):
                raise _fail(str(path), f"{where}.name", v, "a string")
            if not _scalar(v):
                raise _fail(str(path), f"{where}.{k}", v, "a single value")
            if k != "name":
                check_key(k, f"{path}: {where}")
    return grid


def _check_models(custom, grid: dict, path: Path) -> list[str]:
    """grid.model's names: each a preset, or a `models:` entry whose preset exists."""
    if not isinstance(custom, dict):
        raise ValueError(f"{path}: 'models' maps a new name to {{preset: ..., <model keys>}}")
    for m, c in custom.items():
        if not isinstance(c, dict) or not isinstance(c.get("preset"), str):
            raise _fail(str(path), f"models.{m}", c, "a mapping with a 'preset' name and model "
                        "keys")
    models = [str(m) for m in as_list(grid.get("model"))]
    if not models:
        raise ValueError(f"{path}: grid.model must list at least one preset "
                         "(see `python -m cgpt list`)")
    for m in models:
        try:
            get_config(str(custom[m]["preset"]) if m in custom else m)
        except ValueError as e:
            raise ValueError(f"{path}: models.{m}.preset: {e}" if m in custom else
                             f"{path}: grid.model: {e} (or define it under 'models:')") from None
    return models


def _check_per_model(per_model, models: list[str], path: Path) -> None:
    if not isinstance(per_model, dict):
        raise ValueError(f"{path}: 'per_model' maps a grid.model name to {{section.key: value}}")
    for m, e in per_model.items():
        if e is not None and not isinstance(e, dict):
            raise _fail(str(path), f"per_model.{m}", e, "a mapping of section.key: value")
    stray = sorted(set(per_model) - set(models))
    if stray:
        raise ValueError(f"{path}: per_model names {stray} that are not in grid.model")
    for m, entries in per_model.items():
        run_keys, slurm = split_slurm(entries)
        for k in run_keys:
            check_key(k, f"{path}: per_model.{m}")
        check_slurm(slurm, f"{path}: per_model.{m}")


def _check_filter(flt, path: Path) -> None:
    if not flt:
        return
    if (not isinstance(flt, dict) or set(flt) != {"tokens_per_param"}
            or not isinstance(flt["tokens_per_param"], list) or len(flt["tokens_per_param"]) != 2):
        raise ValueError(f"{path}: filter must be {{tokens_per_param: [min, max]}}")
    r = flt["tokens_per_param"]
    if not (all(_is_num(x) and float(x) >= 0 for x in r) and float(r[0]) <= float(r[1])):
        raise _fail(str(path), "filter.tokens_per_param", r, "[min, max]: two numbers, "
                    "0 <= min <= max")


def check_estimate(est: dict, where: str) -> None:
    """estimate.*: rates and times a --dry-run divides by or adds up (from the spec or --set)."""
    for k, v in est.items():
        if k == "device_memory":
            continue
        if k in ESTIMATE_POSITIVE and not (_is_num(v) and float(v) > 0):
            raise _fail(where, f"estimate.{k}", v, "a positive number")
        if k in ESTIMATE_TIMES and not (_is_num(v) and float(v) >= 0):
            raise _fail(where, f"estimate.{k}", v, "a number of seconds >= 0")
        if k == "mfu" and not (_is_num(v) and 0 < float(v) <= 1):
            raise _fail(where, f"estimate.{k}", v, "a fraction in (0, 1], e.g. 0.4")


def check_slurm(slurm: dict, where: str) -> None:
    """slurm.*: single values; counts and amounts positive (from the spec, per_model or --set)."""
    for k, v in slurm.items():
        if not _scalar(v):
            raise _fail(where, f"slurm.{k}", v, "a single value")
        if k in SLURM_COUNTS and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise _fail(where, f"slurm.{k}", v, "a whole number >= 1")
        if k in SLURM_AMOUNTS and not (_is_num(v) and float(v) > 0):
            raise _fail(where, f"slurm.{k}", v, "a positive number")


def split_slurm(entries: dict | None) -> tuple[dict, dict]:
    """A per_model entry: its run-config keys, and its `slurm.*` resources by their name."""
    run_keys, slurm = {}, {}
    for k, v in (entries or {}).items():
        section, _, name = str(k).partition(".")
        if section == "slurm" and name:
            slurm[name] = v
        else:
            run_keys[k] = v
    return run_keys, slurm


def check_runs(spec: dict, path: Path) -> list[dict]:
    """The spec's `runs:` entries, each {model, tokens} and optionally seed."""
    entries = spec["runs"]
    if not isinstance(entries, list):
        raise ValueError(f"{path}: 'runs' must be a list of {{model, tokens, seed}}")
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not {"model", "tokens"} <= set(e) or set(e) - set(RUN_KEYS):
            raise ValueError(f"{path}: runs[{i}] must be a mapping with model, tokens and "
                             f"optionally seed (got {e!r})")
    return entries
