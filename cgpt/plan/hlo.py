"""Reading XLA's compiled HLO text (`compiled.as_text()`): collectives, dot FLOPs, while loops.

Every all-gather / all-reduce / reduce-scatter / collective-permute / all-to-all is sized as
the full buffer one device holds (the gathered result of an all-gather, the unreduced input of
a reduce-scatter, the operand of the others) and, like every `dot`'s 2 x M x N x K, multiplied
by the trip counts (`known_trip_count`) of the while loops enclosing it: the layer scan, the
accumulation scan and the pipeline's tick scan.
"""
from __future__ import annotations

import glob
import math
import os
import re
import tempfile
from collections import defaultdict

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
                "c128": 16}
_SHAPE = re.compile(r"\b(pred|[sufc]\d+|bf16|f8\w*)\[([\d,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_OP = re.compile(r"(?:^|[\s}\])])([a-z][a-z0-9\-]*)\(")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s*\((.*)\)\s*->.*\{\s*$")


def _shapes(text: str) -> list[tuple[str, tuple[int, ...]]]:
    return [(dt, tuple(int(d) for d in dims.split(",") if d)) for dt, dims in _SHAPE.findall(text)]


def _bytes(shape: tuple[str, tuple[int, ...]]) -> int:
    dt, dims = shape
    return _DTYPE_BYTES.get(dt, _DTYPE_BYTES.get(dt[:2], 4)) * math.prod(dims)


def _group_size(line: str) -> int:
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if m:
        sizes = dict((k.strip("' "), int(v)) for k, v in
                     (kv.split("=") for kv in m.group(1).split(",") if "=" in kv))
        return math.prod(sizes.get(a.strip("' "), 1) for a in m.group(2).split(",") if a.strip())
    m = re.search(r"replica_groups=\[([\d,]+)\]<=", line)
    if m:
        return int(m.group(1).split(",")[-1])
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    if m:
        return len([x for x in m.group(1).split(",") if x])
    return 1


def parse_hlo(text: str) -> dict:
    """Per computation: its collectives, dot FLOPs and the computations it calls (with the
    trip count for while bodies), from `compiled.as_text()`."""
    comps: dict[str, dict] = {}
    cur = None
    entry = None
    for raw in text.splitlines():
        h = _HEADER.match(raw)
        if h:
            cur = {"ops": [], "flops": 0, "calls": [], "types": {}}
            comps[h.group(1)] = cur
            if raw.startswith("ENTRY"):
                entry = h.group(1)
            for pname, ptype in re.findall(r"([\w.\-]+):\s*((?:pred|[sufc]\d+|bf16)\[[\d,]*\])",
                                           h.group(2)):
                cur["types"][pname] = _shapes(ptype)[0]
            continue
        m = _INSTR.match(raw) if cur is not None else None
        if not m:
            continue
        name, rest = m.groups()
        op_m = _OP.search(rest)
        if not op_m:
            continue
        op = op_m.group(1)
        result = _shapes(rest[:op_m.start(1)])
        if result:
            cur["types"][name] = result[0]
        base = op.removesuffix("-start")
        if base in COLLECTIVES and not op.endswith("-done"):
            sizes = [_bytes(s) for s in result]
            nbytes = max(sizes) if op.endswith("-start") else sum(sizes)
            if base == "reduce-scatter":
                nbytes *= _group_size(rest)
            cur["ops"].append((base, nbytes))
        elif op == "dot" and result:
            args = re.match(r"\s*%([\w.\-]+)", rest[op_m.end():])
            lhs = cur["types"].get(args.group(1)) if args else None
            cdims = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
            if lhs and cdims:
                k = math.prod(lhs[1][int(i)] for i in cdims.group(1).split(",") if i)
                cur["flops"] += 2 * math.prod(result[0][1]) * k
        if op == "while":
            trip = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', rest)
            body = re.search(r"body=%([\w.\-]+)", rest)
            if body:
                cur["calls"].append((body.group(1), int(trip.group(1)) if trip else 1, True))
        else:
            for callee in re.findall(r"(?:calls|to_apply|true_computation|false_computation)="
                                     r"%([\w.\-]+)", rest):
                cur["calls"].append((callee, 1, False))
            br = re.search(r"branch_computations=\{([^}]*)\}", rest)
            if br:
                for callee in re.findall(r"%([\w.\-]+)", br.group(1)):
                    cur["calls"].append((callee, 1, False))
    return {"computations": comps, "entry": entry}


def hlo_totals(text: str) -> dict:
    """Trip-count-weighted totals per device: collective bytes by kind (and how much of it
    sits inside while loops), collective op counts, and dot FLOPs."""
    parsed = parse_hlo(text)
    comps = parsed["computations"]
    by_kind: dict[str, int] = defaultdict(int)
    in_loop: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    flops = 0

    def walk(name: str, mult: int, looped: bool, depth: int = 0) -> None:
        nonlocal flops
        c = comps.get(name)
        if c is None or depth > 64:
            return
        flops += mult * c["flops"]
        for kind, nbytes in c["ops"]:
            by_kind[kind] += mult * nbytes
            count[kind] += 1
            if looped:
                in_loop[kind] += mult * nbytes
        for callee, trips, is_loop in c["calls"]:
            walk(callee, mult * trips, looped or is_loop, depth + 1)

    if parsed["entry"]:
        walk(parsed["entry"], 1, False)
    return {"collective_bytes": dict(by_kind), "collective_bytes_in_loops": dict(in_loop),
            "collective_ops": dict(count), "dot_flops": flops}


def partitioned_hlo(lowered) -> str:
    """The HLO text of `lowered` (a `jax.jit(...).lower(...)`) right after SPMD partitioning:
    the collectives with the dtypes the program asks for. XLA's CPU compiler later widens
    bf16 collectives to f32 (its float-normalization-bf16 pass, which cannot be turned off:
    its CPU dots need it), so the final CPU HLO would show an accelerator's bf16 gathers as f32."""
    with tempfile.TemporaryDirectory() as d:
        lowered.compile({"xla_dump_to": d, "xla_dump_hlo_pass_re": "spmd-partitioning"})
        files = sorted(glob.glob(os.path.join(d, "*after_spmd-partitioning*.txt")))
        if not files:
            raise RuntimeError(f"XLA wrote no HLO after SPMD partitioning into {d}")
        with open(files[-1]) as f:
            return f.read()


def collective_dtypes(text: str) -> dict[tuple[str, str], int]:
    """{(collective, result dtype): how many} in an HLO text, e.g. ("all-gather", "f32")."""
    count: dict[tuple[str, str], int] = defaultdict(int)
    for raw in text.splitlines():
        m = _INSTR.match(raw)
        op_m = _OP.search(m.group(2)) if m else None
        if not op_m or op_m.group(1).removesuffix("-start") not in COLLECTIVES \
                or op_m.group(1).endswith("-done"):
            continue
        for dt, _ in _shapes(m.group(2)[:op_m.start(1)]):
            count[(op_m.group(1).removesuffix("-start"), dt)] += 1
    return dict(count)
