"""Where a run goes, as arithmetic: `--mesh` parsing, how an empty mesh is factored, which axes
split the batch. JAX-free, so `cgpt.train.resolve` decides a run's mode and mesh before JAX
starts (with `cgpt.sharding.auto.placement`) (and `plan` can place 256 devices anywhere);
`cgpt.sharding.mesh` builds the real mesh from these axes.
"""
from __future__ import annotations

import math

HOST_OFFLOAD_REMOVED = (
    "train.host_offload (plan --host-offload) was removed: cgpt does not stream weights from "
    "pinned host memory (the pinned-host arrays were computed on directly, and CPU has no "
    "such memory to test a real stream on); set train.host_offload=false. weight_streaming "
    "already keeps 1/N of the weights and optimizer state on each of N devices")

# mesh axes each mode accepts; the first is where an empty --mesh puts every device
MESH_AXES: dict[str, tuple[str, ...]] = {"data_parallel": ("data",),
                                         "weight_streaming": ("data", "fsdp"),
                                         "layer_pipelined": ("stage", "data"),
                                         "auto": ("stage", "data", "fsdp")}
SHARDED_MODES = ("data_parallel", "weight_streaming", "layer_pipelined", "auto")


def check_stages(n_layer: int, stages: int) -> None:
    """layer_pipelined splits the layers into equal contiguous stages: `stages` must divide
    n_layer (so no stage is empty and none holds more layers than another)."""
    if n_layer % stages:
        divisors = [s for s in range(1, n_layer + 1) if n_layer % s == 0]
        raise ValueError(f"--mesh stage={stages} does not divide n_layer={n_layer}; "
                         f"layer_pipelined needs equal stages, use a stage size in {divisors}")


def mesh_size(spec: str) -> int:
    """Devices a `--mesh` spec asks for (the product of its sizes), checking only its syntax."""
    n = 1
    for item in spec.split(","):
        _, eq, size = item.partition("=")
        if not eq or not size.strip().isdigit() or int(size) < 1:
            raise ValueError(f"--mesh {spec!r}: expected axis=size pairs separated by commas, "
                             "e.g. --mesh data=16 or --mesh stage=4,data=2")
        n *= int(size)
    return n


def parse_mesh(spec: str, mode: str, num_devices: int, num_processes: int = 1) -> dict[str, int]:
    """`"data=2,stage=4"` -> {"data": 2, "stage": 4}; empty -> every device on the main axis
    (weight_streaming's empty mesh is factored by `weight_streaming_axes` instead)."""
    allowed = MESH_AXES[mode]
    spec = (spec or "").strip()
    if not spec:
        return {allowed[0]: num_devices}
    axes: dict[str, int] = {}
    for item in spec.split(","):
        name, eq, size = item.strip().partition("=")
        name = name.strip()
        if not eq or not size.strip().isdigit():
            raise ValueError(f"--mesh {spec!r}: expected axis=size pairs separated by commas, "
                             f"e.g. --mesh {','.join(f'{a}=2' for a in allowed)}")
        if name not in allowed:
            raise ValueError(f"--mesh {spec!r}: axis {name!r} is not used by --mode {mode}; "
                             f"its axes are {', '.join(allowed)}")
        if name in axes:
            raise ValueError(f"--mesh {spec!r}: axis {name!r} is given twice")
        if int(size) < 1:
            raise ValueError(f"--mesh {spec!r}: axis {name} must have size >= 1")
        axes[name] = int(size)
    if axes.get("stage", 1) > 1 and axes.get("fsdp", 1) > 1:
        raise ValueError(f"--mesh {spec!r}: stage and fsdp belong to different modes "
                         "(layer_pipelined, weight_streaming); give one of them")
    n = math.prod(axes.values())
    if n > num_devices:
        raise ValueError(f"--mesh {spec!r} needs {n} devices but only {num_devices} are "
                         f"available; shrink the mesh so the sizes multiply to <= {num_devices}")
    if n < num_devices and num_processes > 1:
        raise ValueError(f"--mesh {spec!r} uses {n} of {num_devices} devices; on several hosts "
                         "the sizes must multiply to the global device count")
    return axes


def weight_streaming_axes(num_devices: int, batch: int, micro_batch: int | None = None,
                          nodes: int = 1) -> tuple[dict[str, int], str]:
    """(axes, why) for weight streaming on `num_devices` with an empty `--mesh`: `data` =
    the most devices the global batch splits over (the largest divisor of the device count
    that divides `batch`, and `batch / micro_batch` when a micro-batch is set), `fsdp` = the
    rest. The weights are sharded over both, i.e. over every device.

    On `nodes` > 1 nodes `data` is the axis that crosses nodes (`cgpt.sharding.nodes`) and
    the weights are sharded only inside a node, over `fsdp` (a kernel sharded across nodes
    would be gathered over the slow network every layer). When the batch splits over every
    device this is HSDP: `data` = the nodes, `fsdp` = a node's devices, the batch over both
    and each device holding 1/G of the state (G devices per node). When it splits over
    nodes x k devices only (k < G), `data` = nodes x k and `fsdp` = G / k: each fsdp group
    shares a batch shard. When the batch does not split over the nodes at all, the
    single-node factoring is used and the reason says that `fsdp` crosses nodes."""
    step = batch // micro_batch if micro_batch and batch % micro_batch == 0 else batch
    crossing = ""
    if nodes > 1 and num_devices % nodes == 0:
        per_node = num_devices // nodes
        # the most devices k of a node with nodes x k splitting the step (0: none), as a gcd:
        # a scan of every count up to --gpus-per-node 2**40 never ended
        inside = math.gcd(per_node, step // nodes) if step % nodes == 0 else 0
        if inside == per_node and per_node > 1:  # HSDP
            return {"data": nodes, "fsdp": per_node}, (
                f"HSDP: the global batch of {batch} splits over all {num_devices} devices, "
                f"over data={nodes} (one per node: data crosses nodes) x fsdp={per_node} (a "
                f"node's devices); weights and optimizer state sharded over fsdp={per_node} "
                f"inside each node, replicated over the {nodes} nodes")
        if inside:
            data = nodes * inside
            fsdp = num_devices // data
            why = (f"the global batch of {batch} splits over data={data} (a multiple of the "
                   f"{nodes} nodes: data crosses nodes)" + (
                       f", fsdp={fsdp} inside each node of {per_node} shares a batch shard; "
                       f"weights sharded over fsdp={fsdp}, replicated over data"
                       if fsdp > 1 else "; weights replicated (one device per node)"))
            return ({"data": data, "fsdp": fsdp} if fsdp > 1 else {"data": data}), why
        crossing = (f"; fsdp CROSSES NODES: the batch of {batch} does not split over the "
                    f"{nodes} nodes (data would have to be a multiple of {nodes}); a batch "
                    f"that is a multiple of {nodes} keeps fsdp inside a node")
    data = math.gcd(num_devices, step)  # the most devices the step splits over
    fsdp = num_devices // data
    if fsdp == 1:
        return {"data": data}, (f"the global batch of {batch} splits over all {num_devices} "
                                f"devices: data={data}, weights sharded over the same devices")
    return {"data": data, "fsdp": fsdp}, (
        f"the global batch of {batch}{f' (micro-batch {micro_batch})' if micro_batch else ''}"
        f" splits over at most {data} of the {num_devices} devices (the largest divisor of "
        f"{num_devices} that divides it): data={data} batch shards x fsdp={fsdp}; weights "
        + (f"sharded over fsdp={fsdp} (data crosses nodes, so not over it)" if crossing else
           f"sharded over all {num_devices}") + ", each fsdp group shares a batch shard" + crossing)


def batch_axes(axes: dict[str, int], batch: int, micro_batch: int | None) -> tuple[str, ...]:
    """weight_streaming's batch axes: `data`, plus `fsdp` when the global batch splits over
    data x fsdp (with `micro_batch` sequences per shard when it is set)."""
    n = axes.get("data", 1) * axes.get("fsdp", 1) * (micro_batch or 1)
    return ("data", "fsdp") if batch % n == 0 else ("data",)


def replica_axes(mode: str, axes: dict[str, int], batch: int,
                 micro_batch: int | None = None) -> tuple[str, ...]:
    """The mesh axes a mode splits every batch's rows over (those of size > 1): their sizes
    multiply to the number of distinct batch shards, the data replicas."""
    names = batch_axes(axes, batch, micro_batch) if mode == "weight_streaming" else ("data",)
    return tuple(a for a in names if axes.get(a, 1) > 1)


def member_groups(members: int, run_devices: int, devices: int, spread: bool) -> int:
    """How many groups of a run's devices a fused program's members are split over (a
    divisor of `members`, `cgpt.sharding.members`): 1 unless `spread`, else the most that fit
    `devices` side by side."""
    if not spread:
        return 1
    return max(d for d in range(1, members + 1)
               if members % d == 0 and d * max(1, run_devices) <= max(1, devices))
