"""`section.key=value` overrides of a raw run config, shared by `cgpt train` and `cgpt sweep`.

One place for the rules both commands apply: what a key may name (a section of RunConfig and
a field of its dataclass), what a replicate seed sets, and that `data.source` is a string.
"""
from __future__ import annotations

import dataclasses

import yaml

from cgpt.config.model import ModelConfig
from cgpt.config.data import DataConfig
from cgpt.config.run import TrainConfig

SECTIONS = ("model", "data", "train")
_FIELDS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}


def check_key(key: str, where: str) -> tuple[str, str]:
    """`section.key` -> (section, name); an error naming `where` and the valid keys otherwise."""
    section, dot, name = key.partition(".")
    if not dot or section not in SECTIONS or not name:
        raise ValueError(f"{where}: key {key!r} must be section.key with section one of "
                         f"{', '.join(SECTIONS)} (e.g. train.peak_lr)")
    names = {f.name for f in dataclasses.fields(_FIELDS[section])}
    if name not in names:
        raise ValueError(f"{where}: unknown key(s) {key}; valid {section} keys: "
                         f"{', '.join(sorted(names))}")
    return section, name


def set_key(raw: dict, key: str, value, where: str) -> None:
    """raw[section][name] = value, after `check_key`."""
    section, name = check_key(key, where)
    sec = raw.setdefault(section, {})
    if not isinstance(sec, dict):
        raise ValueError(f"{where}: '{section}' must be a mapping")
    sec[name] = value


def parse_value(text: str):
    """YAML scalar parsing, so `true`, `1e-3`, `null` and `[1, 2]` mean what they look like
    (YAML 1.1 itself reads `1e-3` as a string; numbers are read as numbers here)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def split_override(item: str, where: str) -> tuple[str, object]:
    """'train.peak_lr=1e-3' -> ('train.peak_lr', 0.001) (YAML scalar parsing)."""
    key, eq, text = item.partition("=")
    if not eq or "." not in key:
        raise ValueError(f"{where}: expected section.key=value, e.g. train.peak_lr=1e-3 or "
                         "model.remat=true")
    return key, parse_value(text)


def apply_overrides(raw: dict, items: list[str], where: str = "override") -> dict:
    """`section.key=value` strings applied onto a copy of a raw config dict."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for item in items:
        key, value = split_override(item, f"{where} {item!r}")
        set_key(out, key, value, f"{where} {item!r}")
    return out


def seed_overrides(seed: int) -> dict:
    """A replicate seed sets both the init seed and the data-order seed."""
    return {"train.seed": seed, "data.seed": seed}


def coerce_source(raw: dict) -> dict:
    """data.source stays a string even if YAML read it as a number or a bool (in place)."""
    if isinstance(raw.get("data"), dict) and "source" in raw["data"]:
        src = raw["data"]["source"]
        if isinstance(src, (dict, list)):
            raise ValueError(f"data.source is {str(src)[:80]!r}: it must be one path, "
                             "'default', or hf:<name>[:<config>]")
        raw["data"]["source"] = str(src)
    return raw
