"""The campaign's cases: one `Case` per hostile input, registered by the modules of `qa/cases/`.

A case module registers its cases when it is imported, with `@case(expect, group)` on a
function `make(ctx) -> dict` or with `add(name, expect, group, make)` in a loop; `all_cases()`
imports every module of the package, so a new file there is picked up with no other edit.
What the returned dict may hold is documented in `qa/campaign.py` (`run_case`).
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

EXPECTS = ("ok", "error", "either")


@dataclass(frozen=True)
class Case:
    name: str
    expect: str  # "ok": must succeed; "error": must be refused with one line; "either"
    make: Callable  # (Ctx) -> dict: how to run it and what to check afterwards
    group: str

    @property
    def id(self) -> str:
        return f"{self.group}:{self.name}"


_CASES: dict[str, Case] = {}


def add(name: str, expect: str, group: str, make: Callable) -> Case:
    """Register one case; a name used twice in a group is an error (one fact, one case)."""
    if expect not in EXPECTS:
        raise ValueError(f"case {group}:{name}: expect must be one of {EXPECTS}, got {expect!r}")
    c = Case(name, expect, make, group)
    if c.id in _CASES:
        raise ValueError(f"case {c.id} is registered twice")
    _CASES[c.id] = c
    return c


def case(expect: str, group: str) -> Callable:
    """Decorator: the function's name is the case's name."""
    def deco(f: Callable) -> Callable:
        add(f.__name__, expect, group, f)
        return f
    return deco


def all_cases() -> list[Case]:
    """Every registered case, after importing each module of `qa.cases` (in name order)."""
    import qa.cases as pkg
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        importlib.import_module(f"qa.cases.{info.name}")
    return list(_CASES.values())
