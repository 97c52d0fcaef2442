"""Byte sizes in and out: `parse_bytes` reads '80GB' / '16GiB' (flags, config keys) and
`fmt_bytes` writes every size cgpt prints (plan, fit, auto mode, the sweep's dry run)."""
from __future__ import annotations

import math
import re

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
MAX_BYTES = 2**63 - 1  # the most a size may be: an int64 count of bytes (1e400 is inf)
_PREFIXES = (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def parse_bytes(text: str | int | float, what: str = "--device-memory") -> int:
    """'80GB' -> 80e9, '16GiB' -> 16 * 2**30, '1024' -> 1024; errors name `what`."""
    m = re.fullmatch(r"\s*([\d.]+(?:E[+-]?\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"{what} {text!r}: expected a size such as 80GB, 40GiB or 512MB")
    try:
        value = float(m.group(1)) * _UNITS[m.group(2)]
    except ValueError:  # '1.2.3'
        raise ValueError(f"{what} {text!r}: expected a size such as 80GB, 40GiB or 512MB") \
            from None
    if value < 1:
        raise ValueError(f"{what} {text!r} must be positive")
    if not math.isfinite(value) or value > MAX_BYTES:  # int(inf) raised OverflowError
        raise ValueError(f"{what} {text!r}: beyond any device ({MAX_BYTES:,} bytes at most); "
                         "give the memory of one device, such as 80GB")
    return int(value)


def fmt_bytes(n: float) -> str:
    """Decimal units (as GPUs are sold and `parse_bytes` reads), 3 significant digits:
    72e9 -> '72 GB', 19_123_456_789 -> '19.1 GB', 870_000 -> '870 kB', 512 -> '512 B'."""
    for unit, scale in _PREFIXES:
        if abs(n) >= scale * 0.9995:  # what rounds to 1000 of a unit is 1 of the next
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_count(x: float) -> str:
    """3 significant digits with k/M/B/T: 336640 -> '337k', 4820480 -> '4.82M'."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"
