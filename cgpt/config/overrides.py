"""`section.key=value` overrides of a raw run config, shared by `cgpt train` and `cgpt sweep`.

One place for the rules both commands apply: what a key may name (a section of RunConfig and
a field of its dataclass), how its text is read (by the field's type, `cgpt.config.values`),
what a replicate seed sets, and that `data.source` is a string.
"""
from __future__ import annotations

import dataclasses

from cgpt.config.model import ModelConfig
from cgpt.config.data import DataConfig
from cgpt.config.run import TrainConfig
from cgpt.config.values import field_types, scalar, typed

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


def split_override(item: str, where: str) -> tuple[str, object]:
    """'train.peak_lr=1e-3' -> ('train.peak_lr', 0.001): the text after the first '=' read by
    the type of the field it sets (`cgpt.config.values.typed`; a path verbatim). Keys of other
    sections (`--set slurm.time=...`) get `values.scalar`, checked where they are used."""
    key, eq, text = item.partition("=")
    if not eq or "." not in key:
        raise ValueError(f"{where}: expected section.key=value, e.g. train.peak_lr=1e-3 or "
                         "model.remat=true")
    section, _, name = key.partition(".")
    if section not in SECTIONS:
        return key, scalar(text)
    section, name = check_key(key, where)
    return key, typed(key, text, field_types(_FIELDS[section])[name], given=where)


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
    """data.source must be text: a path YAML read as a bool (`yes`) or a number (`1e3` as
    2.0e3) is refused with the advice to quote it, never turned into 'True' or '2000.0'."""
    if isinstance(raw.get("data"), dict) and "source" in raw["data"]:
        typed("data.source", raw["data"]["source"], ("str",))
    return raw
