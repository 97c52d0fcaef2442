"""Ways to damage one file or directory of a copy, and the spec of a resume after the damage."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

from qa.context import Ctx, complete, untouched

Damage = Callable[[Path], object]


def write(name: str, data: str | bytes) -> Damage:
    """`name` (relative to the directory) replaced by `data`."""
    def damage(d: Path):
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data) if isinstance(data, bytes) else p.write_text(data)
    return damage


def unlink(name: str) -> Damage:
    return lambda d: (d / name).unlink()


def to_dir(name: str) -> Damage:
    """`name` becomes a directory (holding one file)."""
    def damage(d: Path):
        p = d / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
        p.mkdir()
        (p / "x").write_text("x")
    return damage


def to_file(name: str) -> Damage:
    """`name` becomes a file."""
    def damage(d: Path):
        p = d / name
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        p.write_text("not a directory\n")
    return damage


def zero_checkpoint_data(d: Path, step: str = "") -> None:
    """Overwrite the array data of checkpoint `step` (every checkpoint when empty) with zeros."""
    for f in (d / "checkpoints" / step).rglob("ocdbt.process_0/d/*"):
        f.write_bytes(b"\0" * f.stat().st_size)


def resume(ctx: Ctx, damage: Damage, *extra: str, fresh: bool = False,
           expect_complete: bool = False) -> dict:
    """A copy of the base run killed after checkpoint 15, damaged, then `train --resume` (or a
    fresh launch). Refused: nothing may change; finished anyway: a complete, strict result."""
    d = ctx.run_copy()
    damage(d)
    if expect_complete:
        check = complete(d)
    else:
        same = untouched(d)
        check = lambda: complete(d)() if (d / "summary.json").is_file() else same()  # noqa: E731
    return {"argv": ctx.train(d, *(() if fresh else ("--resume",)), *extra), "check": check}


def generate(src, *extra: str) -> list[str]:
    """`cgpt generate` of four tokens from `src`."""
    return ["generate", str(src), "def ", "--max-new-tokens", "4", *extra]
