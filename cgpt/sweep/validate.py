"""The shape of every sweep-spec value, checked before the spec is expanded.

`load_sweep` reads values as it needs them; a value of the wrong type (a number where a
mapping belongs, a string in `filter`, `estimate.flops_per_s: 0`) would surface there as a
TypeError or a ZeroDivisionError. Checked here first, each is one error that names the spec
file, the key and what it should be.
"""
from __future__ import annotations

import math
from pathlib import Path

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


def _list(v) -> list:
    return list(v) if isinstance(v, list) else [v]


def _fail(where: str, key: str, v, want: str) -> ValueError:
    text = repr(v)
    return ValueError(f"{where}: {key} is {text[:80] + ('...' if len(text) > 80 else '')}; "
                      f"it must be {want}")


def check_spec(spec: dict, path: Path) -> None:
    """Every top-level key of a spec has a value of the kind docs/sweeps.md describes."""
    w = str(path)
    for key in ("name", "description"):
        if key in spec and not (spec[key] is None or isinstance(spec[key], (str, int, float))
                                and not isinstance(spec[key], bool)):
            raise _fail(w, key, spec[key], "a string")
    base = spec.get("base")
    if isinstance(base, dict):
        if "preset" in base and not isinstance(base["preset"], str):
            raise _fail(w, "base.preset", base["preset"], "a preset name (see `cgpt list`)")
        for s in ("model", "data", "train"):
            if base.get(s) is not None and not isinstance(base[s], dict):
                raise _fail(w, f"base.{s}", base[s], "a mapping of key: value")
            for k, v in (base.get(s) or {}).items():
                if isinstance(v, dict):
                    raise _fail(w, f"base.{s}.{k}", v, "a single value")
    models = spec.get("models")
    if isinstance(models, dict):
        for m, c in models.items():
            if not isinstance(c, dict) or not isinstance(c.get("preset"), str):
                raise _fail(w, f"models.{m}", c, "a mapping with a 'preset' name and model keys")
    grid = spec.get("grid")
    if isinstance(grid, dict):
        for key in ("model", "tokens", "tokens_per_param", "flops", "seed", "branches"):
            for v in _list(grid[key]) if grid.get(key) is not None else []:
                if not (isinstance(v, (str, int, float)) and not isinstance(v, bool)):
                    raise _fail(w, f"grid.{key}", grid[key], "a value or a list of values")
        for i, e in enumerate(_list(grid.get("overrides"))):
            if isinstance(e, dict):
                if "name" in e and not isinstance(e["name"], (str, int, float)):
                    raise _fail(w, f"grid.overrides[{i}].name", e["name"], "a string")
                for k, v in e.items():
                    if not _scalar(v):
                        raise _fail(w, f"grid.overrides[{i}].{k}", v, "a single value")
    per_model = spec.get("per_model")
    if isinstance(per_model, dict):
        for m, e in per_model.items():
            if e is not None and not isinstance(e, dict):
                raise _fail(w, f"per_model.{m}", e, "a mapping of section.key: value")
    flt = spec.get("filter")
    if flt and (not isinstance(flt, dict) or set(flt) != {"tokens_per_param"}
                or not isinstance(flt["tokens_per_param"], list)
                or len(flt["tokens_per_param"]) != 2):
        raise ValueError(f"{w}: filter must be {{tokens_per_param: [min, max]}}")
    if flt:
        r = flt["tokens_per_param"]
        if not (all(_is_num(x) and float(x) >= 0 for x in r)
                                and float(r[0]) <= float(r[1])):
            raise _fail(w, "filter.tokens_per_param", r, "[min, max]: two numbers, "
                        "0 <= min <= max")
    for key in ("estimate", "slurm"):
        if spec.get(key) is not None and not isinstance(spec[key], dict):
            raise _fail(w, key, spec[key], "a mapping of key: value (see docs/sweeps.md)")


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
