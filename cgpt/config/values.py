"""One strict reading of config values: every command-line value, `section.key=value` override
and YAML config or sweep spec goes through here, typed by the field it sets.

Why not plain YAML: YAML 1.1 reads `yes`/`on` as true, `#` as a comment and `1e3` as a string,
and a bool is an int in Python, so `train.peak_lr=true` trained at LR 1.0 and `--data '/x/c #2'`
on `/x/c`. Here text is parsed by the type of its field (a path is taken verbatim), a value
YAML already typed must be of the field's type (a bool is not a number, 2.5 is not an int),
and a YAML mapping that gives one key twice is refused with the line of both.
"""
from __future__ import annotations

import dataclasses
import math

import yaml

from cgpt.errors import DuplicateKeyError

MAX_INT = 2**31 - 1  # counts and sizes: array dimensions, int32 step counters, seeds
BIG_INTS = ("train.tokens",)  # a token budget may exceed int32 (steps_for_tokens bounds it)
PATHS = ("data.source", "data.tokenizer", "data.cache_dir")  # verbatim, "null" included
INFINITE_OK = ("train.clip_norm",)  # inf means something here: no clipping
_TRUE, _FALSE = ("true", "yes", "on"), ("false", "no", "off")


def field_types(cls) -> dict[str, tuple[str, ...]]:
    """{field: ('int', 'None')} from a config dataclass's annotations ('int | None')."""
    return {f.name: tuple(t.strip() for t in str(f.type).split("|"))
            for f in dataclasses.fields(cls)}


def _kinds(types: tuple[str, ...]) -> str:
    names = {"int": "a whole number", "float": "a number", "str": "text", "bool": "true/false",
             "None": "null"}
    return " or ".join(names.get(t, t) for t in types)


def _number(text: str) -> int | float | None:
    """A number from text ('6e-4', '64', '2_048'), or None if it does not read as one."""
    s = text.strip()
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return None


def typed(key: str, value, types: tuple[str, ...], given: str | None = None):
    """`value` as the field `key` of `types` wants it, or a ValueError that starts with
    `given` (how the user wrote it, e.g. "override 'train.peak_lr=true'"; default key=value)."""
    given = given or f"{key}={value!r}"
    want = _kinds(types)
    if value is None:
        if "None" in types:
            return None
        raise ValueError(f"{given}: {key} cannot be null; give {want}")
    if isinstance(value, str):
        return _from_text(key, value, types, given, want)
    if isinstance(value, bool):
        if "bool" in types:
            return value
        hint = "quote it" if "str" in types else f"give {want}"
        raise ValueError(f"{given}: is the boolean {str(value).lower()}, not {want} (YAML "
                         f"reads yes/no/on/off/true/false as booleans); {hint}")
    if isinstance(value, (int, float)):
        return _from_number(key, value, types, given, want)
    kind = "a list" if isinstance(value, (list, tuple)) else \
        "a mapping" if isinstance(value, dict) else type(value).__name__
    raise ValueError(f"{given}: {kind}, not {want}")


def _from_text(key: str, text: str, types: tuple[str, ...], given: str, want: str):
    if key in PATHS:
        return text  # a path is the text as typed: '#', 'yes', '1e3' and newlines included
    low = text.strip().lower()
    if "None" in types and low in ("null", "none", "~"):
        return None
    if "bool" in types and low in _TRUE + _FALSE:
        return low in _TRUE
    if "int" in types or "float" in types:
        number = _number(text)
        if number is not None:
            return _from_number(key, number, types, given, want)
        if "str" not in types:
            raise ValueError(f"{given}: is not {want}")
    if "str" in types:
        return text
    raise ValueError(f"{given}: is not {want}")


def _from_number(key: str, v: int | float, types: tuple[str, ...], given: str, want: str):
    if "int" not in types and "float" not in types:
        raise ValueError(f"{given}: read as a number, not {want}; quote it")
    if isinstance(v, float):
        if math.isnan(v) or (math.isinf(v) and key not in INFINITE_OK):
            raise ValueError(f"{given}: must be a finite number")
        if "float" in types:
            return v
        if not v.is_integer():
            raise ValueError(f"{given}: not a whole number; {key} takes {want}")
        v = int(v)
    if "int" not in types:
        return float(v)
    if abs(v) > MAX_INT and key not in BIG_INTS:
        raise ValueError(f"{given}: beyond {MAX_INT:,} (2**31 - 1), the largest count cgpt "
                         "takes; did you mean a smaller value?")
    return v


def typed_section(section: str, cls, values: dict) -> dict:
    """Every `section.key` of a raw config mapping typed by `cls`'s fields; unknown keys are
    an error listing the valid ones."""
    types = field_types(cls)
    bad = sorted(set(map(str, values)) - set(types))
    if bad:
        raise ValueError(f"unknown key(s) {', '.join(f'{section}.{b}' for b in bad)}; "
                         f"valid {section} keys: {', '.join(sorted(types))}")
    return {k: typed(f"{section}.{k}", v, types[k]) for k, v in values.items()}


def scalar(text: str):
    """A command-line value for a key without a declared type (`--set slurm.time=...`): a
    number, true/false or null if it reads as exactly one, else the text verbatim."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    number = _number(text)
    return text if number is None or isinstance(number, float) and not math.isfinite(number) \
        else number


class StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping, naming both lines."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base`: explicit keys may override merged ones
                key = self.construct_object(key_node, deep=True)
                mark = key_node.start_mark
                line = f"line {mark.line + 1}, column {mark.column + 1}"
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: SafeLoader's own error follows
                if first is not None:
                    raise DuplicateKeyError(f"key {key!r} is given twice ({first} and "
                                            f"{line}); keep one")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)
