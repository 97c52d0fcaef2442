"""The GPU a plan compiles for, without one present.

JAX's CUDA plugin compiles for a GPU it does not have: `get_topology_desc(platform="cuda",
target_config=<a GpuTargetConfigProto in text form>, topology="1xHOSTSxGPUS")` gives
compile-only devices whose `memory_analysis()` and HLO are the GPU compiler's own (cuDNN
attention, cuBLAS calls, async collectives). The descriptions are the files in `targets/`,
one per GPU, each with the device's real memory. The CPU path (emulated CPU devices, XLA
attention in place of cuDNN's) stays as the fallback: it overstates a GPU's memory.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

TARGET_DIR = Path(__file__).with_name("targets")
GPU_TARGETS = ("h100", "h200", "a100")  # a description file each: targets/NAME.txtpb
TARGETS = (*GPU_TARGETS, "cpu")
CUDA_PLUGIN = "jax_plugins.xla_cuda13"  # what `jax[cuda13]` installs
INSTALL = ('pip install -r requirements-gpu.txt (jax[cuda13], ~4.4 GB; a virtualenv of its '
           'own keeps the CPU install as it is)')
CPU_CAVEAT = ("compiled for emulated CPU devices with XLA attention: it overstates a GPU's "
              "memory (1.6-5x on the published presets); install the CUDA plugin to compile "
              f"for the GPU itself: {INSTALL}")


def plugin_available() -> bool:
    """Whether JAX's CUDA plugin is importable (it compiles for a GPU without one)."""
    try:
        return importlib.util.find_spec(CUDA_PLUGIN) is not None
    except ModuleNotFoundError:  # no jax_plugins namespace at all
        return False


def default_target() -> str:
    """What `cgpt plan` compiles for when --target is not given: the H100 with the plugin,
    else the CPU fallback."""
    return "h100" if plugin_available() else "cpu"


def check(name: str, flag: str = "--target") -> str:
    """`name` if it is a known target and its compiler is here; else one line naming the fix."""
    if name not in TARGETS:
        raise ValueError(f"{flag} {name!r}: no target description; use one of "
                         f"{', '.join(TARGETS)} (GPU descriptions: {TARGET_DIR}/NAME.txtpb)")
    if name != "cpu" and not plugin_available():
        raise ValueError(f"{flag} {name}: JAX's CUDA plugin ({CUDA_PLUGIN}) is not installed, "
                         f"so nothing here compiles for a GPU; {INSTALL}, or give {flag} cpu")
    return name


def description(name: str) -> str:
    """The target description of GPU `name` (a GpuTargetConfigProto in text form)."""
    return (TARGET_DIR / f"{check(name)}.txtpb").read_text()


def memory_bytes(name: str) -> int:
    """The device memory GPU `name`'s description gives (its device_memory_size)."""
    m = re.search(r"device_memory_size:\s*(\d+)", (TARGET_DIR / f"{name}.txtpb").read_text())
    if not m:
        raise ValueError(f"{TARGET_DIR / name}.txtpb has no device_memory_size; restore it from "
                         "git")
    return int(m.group(1))


def devices(name: str, n: int, nodes: int = 1) -> list:
    """`n` compile-only devices of GPU `name` on `nodes` hosts (n / nodes each, one JAX
    process a host, as a multi-node job has), in global order."""
    if nodes < 1 or n % nodes:
        raise ValueError(f"{n} devices do not split over {nodes} node(s) evenly: give a device "
                         "count that is a multiple of --nodes")
    from jax.experimental import topologies  # loads JAX: only when this runs

    topo = topologies.get_topology_desc(platform="cuda", target_config=description(name),
                                        topology=f"1x{nodes}x{n // nodes}")
    return sorted(topo.devices, key=lambda d: d.id)
