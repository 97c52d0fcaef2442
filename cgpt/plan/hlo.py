"""Reading XLA's compiled HLO text (`compiled.as_text()`): collectives, matmul FLOPs, kernel
calls, while loops; for CPU and GPU programs alike.

Every all-gather / all-reduce / reduce-scatter / collective-permute / all-to-all is sized as
the full buffer one device holds (the gathered result of an all-gather, the unreduced input of
a reduce-scatter, the operand of the others), summed over the buffers a combined collective
moves, and read from an async `-start`'s (operands, results) tuple on GPU. Like every
matmul's 2 x M x N x K (XLA `dot`s, cuBLAS calls, and cuDNN attention's 4 x B x H x Tq x Tk x D
forward, twice that backward: the math's matmuls, not the kernel's recompute), it is
multiplied by the trip counts (`known_trip_count`) of the while loops enclosing it: the layer
scan, the accumulation scan and the pipeline's tick scan.
"""
from __future__ import annotations

import glob
import math
import os
import re
import tempfile
from collections import defaultdict

import numpy as np

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


def _type_tree(text: str) -> list | tuple[str, tuple[int, ...]]:
    """An HLO result type as a tree: a shape, or a list of subtrees for a tuple, e.g.
    "((bf16[96], f32[8,4]), bf16[768])" -> [[("bf16", (96,)), ("f32", (8, 4))], ("bf16", (768,))].
    Layouts ({1,0}) and comments (/*index=5*/) are skipped."""
    text = re.sub(r"/\*.*?\*/|\{[\d,]*\}", "", text)
    tokens = re.findall(r"\(|\)|(?:pred|[sufc]\d+|bf16|f8\w*)\[[\d,]*\]", text)
    stack: list[list] = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) > 1:
                done = stack.pop()
                stack[-1].append(done)
        else:
            stack[-1].append(_shapes(tok)[0])
    top = stack[0]
    return top[0] if len(top) == 1 else top


def _leaves(tree) -> list[tuple[str, tuple[int, ...]]]:
    return [tree] if isinstance(tree, tuple) else [x for t in tree for x in _leaves(t)]


def _moved(base: str, op: str, result_type: str, line: str) -> list[tuple[str, tuple]]:
    """The buffers a collective moves, as the module docstring sizes them. An async start's
    result is (operands, results[, contexts]) for all-gather, reduce-scatter and
    collective-permute, and the operands themselves for all-reduce."""
    tree = _type_tree(result_type)
    if op.endswith("-start") and base != "all-reduce" and isinstance(tree, list) \
            and len(tree) >= 2:
        return _leaves(tree[1] if base == "all-gather" else tree[0])
    leaves = _leaves(tree)
    if base == "reduce-scatter":  # a synchronous one's result is the scattered shard
        g = _group_size(line)
        return [(dt, (*dims, g)) for dt, dims in leaves]
    return leaves


def _by_dtype(shapes: list[tuple[str, tuple]]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for shape in shapes:
        out[shape[0]] += _bytes(shape)
    return out


CUBLAS = ("__cublas$lt$matmul", "__cublas$gemm")  # XLA's GPU matmul calls
CUDNN_ATTENTION_FWD, CUDNN_ATTENTION_BWD = "__cudnn$fmha", "Backward"  # target prefix, suffix


def _kernel_flops(target: str, line: str, result: list, cur: dict) -> int:
    """The matmul FLOPs of a cuBLAS or cuDNN-attention custom call (0 for other kernels)."""
    if target in CUBLAS:
        dims = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', line)
        lhs = re.search(r"custom-call\(%([\w.\-]+)", line)
        shape = cur["types"].get(lhs.group(1)) if lhs else None
        if not (dims and shape and result):
            return 0
        k = math.prod(shape[1][int(i.strip('" '))] for i in dims.group(1).split(",") if i)
        return 2 * math.prod(result[0][1]) * k
    if target.startswith(CUDNN_ATTENTION_FWD):
        # q, k, v in the operand layout constraints, each [batch, seq, heads, head_dim]
        qkv = _shapes(line.partition("operand_layout_constraints=")[2])[:2]
        if len(qkv) < 2 or len(qkv[0][1]) != 4:
            return 0
        fwd = 4 * math.prod(qkv[0][1]) * qkv[1][1][1]
        return 2 * fwd if target.endswith(CUDNN_ATTENTION_BWD) else fwd
    return 0


def _iota(dims: str, reshape: str, perm: str | None) -> np.ndarray:
    """XLA's iota tile assignment: arange over `reshape`, transposed by `perm`, as `dims`."""
    shape = [int(x) for x in reshape.split(",") if x]
    a = np.arange(math.prod(shape)).reshape(shape)
    if perm:
        a = a.transpose([int(x) for x in perm.split(",")])
    return a.reshape([int(x) for x in dims.split(",") if x])


def replica_groups(line: str) -> list[list[int]] | None:
    """The device groups of one collective (logical ids of the program's device assignment),
    from any of XLA's forms: {{0,1},{2,3}}, [2,4]<=[8], [4,2]<=[2,4]T(1,0), mesh[...] over
    named axes (with device_ids=(...)), or a collective-permute's source_target_pairs."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)\]"
                  r"(?:T\(([\d,]+)\))?\))?\s*\{([^}]*)\}", line)
    if m:
        axes = [(k.strip("' "), int(v)) for k, v in (kv.split("=") for kv in m.group(1).split(","))]
        sizes = [n for _, n in axes]
        ids = (_iota(",".join(map(str, sizes)), m.group(2), m.group(3)) if m.group(2)
               else np.arange(math.prod(sizes)).reshape(sizes))
        chosen = [i for i, (k, _) in enumerate(axes) if f"'{k}'" in m.group(4)]
        rest = [i for i in range(len(axes)) if i not in chosen]
        return ids.transpose(rest + chosen).reshape(-1, math.prod(sizes[i] for i in chosen)
                                                     ).tolist()
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if m:
        return _iota(m.group(1), m.group(2), m.group(3)).reshape(
            int(m.group(1).split(",")[0]), -1).tolist()
    m = re.search(r"(?:replica_groups|source_target_pairs)=\{(\{[\d,{} ]*\})\}", line)
    if m:
        return [[int(x) for x in g.split(",") if x]
                for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
    return None


def parse_hlo(text: str) -> dict:
    """Per computation: its collectives, dot FLOPs and the computations it calls (with the
    trip count for while bodies), from `compiled.as_text()`."""
    comps: dict[str, dict] = {}
    cur = None
    entry = None
    for raw in text.splitlines():
        h = _HEADER.match(raw)
        if h:
            cur = {"ops": [], "flops": 0, "calls": [], "types": {}, "kernels": []}
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
            groups = replica_groups(rest)
            for dt, nbytes in _by_dtype(_moved(base, op, rest[:op_m.start(1)], rest)).items():
                cur["ops"].append((base, dt, nbytes, groups))
        elif op == "custom-call":
            target = re.search(r'custom_call_target="([^"]+)"', rest)
            if target:
                cur["kernels"].append((target.group(1),
                                       _kernel_flops(target.group(1), rest, result, cur)))
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


def hlo_totals(text: str, hosts: list[int] | None = None) -> dict:
    """Trip-count-weighted totals per device: collective bytes by kind (and how much of it
    sits inside while loops), by kind and dtype, collective op counts, matmul FLOPs (XLA dots
    and cuBLAS/cuDNN calls) and how many times each custom-call kernel runs per step.
    `hosts`: the host of each logical device of the program (its device assignment's order):
    then also the bytes of the collectives whose groups span more than one host, by kind."""
    parsed = parse_hlo(text)
    comps = parsed["computations"]
    by_kind: dict[str, int] = defaultdict(int)
    by_dtype: dict[str, int] = defaultdict(int)
    in_loop: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    kernels: dict[str, int] = defaultdict(int)
    across: dict[str, int] = defaultdict(int)
    flops = 0

    def walk(name: str, mult: int, looped: bool, depth: int = 0) -> None:
        nonlocal flops
        c = comps.get(name)
        if c is None or depth > 64:
            return
        flops += mult * c["flops"]
        for kind, dtype, nbytes, groups in c["ops"]:
            by_kind[kind] += mult * nbytes
            if hosts is not None and groups and any(
                    len({hosts[i] for i in g if i < len(hosts)}) > 1 for g in groups):
                across[kind] += mult * nbytes
            by_dtype[f"{kind} {dtype}"] += mult * nbytes
            count[kind] += 1
            if looped:
                in_loop[kind] += mult * nbytes
        for target, kflops in c["kernels"]:
            kernels[target] += mult
            flops += mult * kflops
        for callee, trips, is_loop in c["calls"]:
            walk(callee, mult * trips, looped or is_loop, depth + 1)

    if parsed["entry"]:
        walk(parsed["entry"], 1, False)
    return {"collective_bytes": dict(by_kind), "collective_bytes_in_loops": dict(in_loop),
            "collective_bytes_by_dtype": dict(by_dtype), "collective_ops": dict(count),
            "dot_flops": flops, "kernel_calls": dict(kernels),
            "collective_bytes_across_hosts": dict(across) if hosts is not None else None}


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
