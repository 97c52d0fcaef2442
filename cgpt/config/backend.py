"""Which kernels and dtypes a platform uses, and why: every backend-dependent choice in one place.

The model's execution settings (`ModelConfig.compute_dtype`, `.attention`, `.vocab_multiple`)
default to "auto"; `kernels(cfg)` turns them into concrete choices for the platform the code is
compiled for. `defaults(platform)` gives one platform's choices (`cgpt plan` asks for the GPU's
while it compiles on emulated CPU devices), and `resolve(cfg, ...)` writes the concrete compute
dtype into a config so that a run's `config.yaml` records what it trained with.

- **CPU** (measured on the 2-core development machine): float32 (bf16 matmuls are emulated and
  slower); causal attention in up to 4 query chunks, head-major (`cgpt.model.gpt._chunked`: ~3/8
  fewer FLOPs, XLA's CPU backward ~2x faster than the fused path); the hand-written dense
  backward (~9% per step); no vocabulary padding (nothing to align to).
- **GPU**: bfloat16 matmuls with float32 parameters, LayerNorm, softmax, loss and optimizer;
  attention through `jax.nn.dot_product_attention(implementation="cudnn")`, cuDNN's fused
  flash attention (bf16 only, so an f32 GPU run uses XLA's); autodiff's dense backward; the LM
  head's vocabulary padded to a multiple of 128 for the tensor cores (50257 -> 50304).
- **TPU**: as GPU, with XLA's attention (no cuDNN).

GPU memory, one rule for plan and run: "device memory" (`plan --device-memory 80GB`,
`estimate.device_memory`, `train.device_memory`) is the GPU's physical memory, and the fit
(`cgpt.train.fit`) counts a pool of all but HEADROOM = 10% of it. A GPU run sets JAX's
allocator to exactly that share (`gpu_allocator`: XLA_PYTHON_CLIENT_MEM_FRACTION=0.90, where
JAX's default is 0.75), so the pool the run gets is the plan's; the other 10% is the CUDA
context, cuBLAS/cuDNN workspaces and NCCL buffers, outside the pool. A step may fill the
pool less POOL_MARGIN = 5% of it (fragmentation: `cgpt.sharding.fitrule`), the "usable"
figure the plan prints.
`device_memory(bytes_limit, environ)` turns the allocator's limit back into that device
memory; a user's own smaller fraction lowers it (the fit then sees the smaller pool).

GPU compiler flags (`gpu_xla_flags`, table GPU_XLA_FLAGS): XLA's latency-hiding scheduler and
collective pipelining are off by default; MaxText's and NVIDIA's JAX recipes turn them on for
H100 so the per-layer weight gathers and gradient reductions overlap compute. They go into
XLA_FLAGS before JAX starts its GPU backend (`cgpt.sharding.distributed.initialize`, the bench
scripts), only when the process will run on NVIDIA GPUs; a flag the user set in XLA_FLAGS is
kept as the user set it, and CGPT_GPU_XLA_FLAGS=0 leaves XLA_FLAGS untouched.

CPU host memory (`keep_host_memory`, table CPU_MALLOC_OPTIONS): XLA's CPU runtime allocates a
step's buffers afresh at every execution and frees them after; glibc's malloc serves blocks
over its mmap threshold (32 MiB at most) with fresh mappings, so every page of them faults
on first touch, every step (tiny-116k: 11,700 page faults a step). A CPU training process has
glibc keep freed memory for reuse instead: single-core step -20% (tiny-116k, tiny-45k).
`cgpt train` sets them at its start (`keep_host_memory`); a launcher gives them to a child
through its environment (`host_memory_env`).
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import platform as _host
import re
from dataclasses import dataclass
from pathlib import Path

from cgpt.config.model import ModelConfig

PLATFORMS = ("cpu", "gpu", "rocm", "tpu")
# = 1 - cgpt.train.fit.HEADROOM (tests/multiprocess/test_distributed.py checks)
GPU_MEM_FRACTION = 0.90
JAX_DEFAULT_MEM_FRACTION = 0.75  # JAX's preallocated share when the variable is unset
_ALIASES = {"cuda": "gpu"}


@dataclass(frozen=True)
class Kernels:
    """The concrete execution choices of one model on one platform."""

    platform: str
    compute_dtype: str  # "float32" | "bfloat16"; parameters are always float32
    attention: str  # "chunked" | "xla" | "cudnn"
    vocab_multiple: int  # the LM head's vocabulary is padded to a multiple of this
    custom_dense_backward: bool  # cgpt.model.gpt.dense's hand-written backward (a CPU tuning)
    # the loss's sequence positions per chunk (cgpt.model.gpt.chunked_cross_entropy); 0: the
    # whole [B, T, V] f32 logits at once (CPU: its results as measured before chunking)
    loss_chunk: int = 0
    # the remat rungs `cgpt.train.fit` climbs, most memory first; on CPU "save_dots" is both
    # faster and smaller than keeping everything ("none"), so its ladder starts there
    remat_ladder: tuple[str, ...] = ("save_dots", "full")
    # a stack of at most this many layers is unrolled instead of scanned (`apply_layers`):
    # XLA's CPU while loop writes each layer's saved values into zero-filled stacked buffers
    # (tiny-116k, single core: step -25% unrolled, glibc keeping memory); compile time grows
    # with the layers unrolled, so only the shallow stacks, and only in a one-device step
    unroll_layers: int = 0


_DEFAULTS = {
    "cpu": Kernels("cpu", "float32", "chunked", 1, True, unroll_layers=4),
    "gpu": Kernels("gpu", "bfloat16", "cudnn", 128, False, 512, ("none", "save_attn", "full")),
    "rocm": Kernels("rocm", "bfloat16", "xla", 128, False, 512, ("none", "save_attn", "full")),
    "tpu": Kernels("tpu", "bfloat16", "xla", 128, False, 512, ("none", "save_attn", "full")),
}


def _platform_name(platform: str) -> str:
    p = _ALIASES.get(platform.lower(), platform.lower())
    if p not in _DEFAULTS:
        raise ValueError(f"unknown platform {platform!r}; use one of {', '.join(PLATFORMS)}")
    return p


def platform_of(device) -> str:
    """The platform of a JAX device object: "cpu", "gpu" (CUDA), "rocm" or "tpu", read from
    its attributes (no JAX import). Any other backend (a plugin) gets the CPU's conservative
    choices: f32 and no fused kernels."""
    p = device.platform
    if p == "gpu":
        version = getattr(device.client, "platform_version", "") or ""
        return "rocm" if "rocm" in version.lower() else "gpu"
    p = _ALIASES.get(p, p)
    return p if p in _DEFAULTS else "cpu"


def start_platform(environ=os.environ) -> None:
    """Start JAX's backend (before a command loads anything): JAX_PLATFORMS naming a platform
    this machine lacks is one ValueError saying what to set, not JAX's bare AssertionError."""
    import jax  # loads JAX: only when this runs

    try:
        jax.devices()
    except (RuntimeError, AssertionError) as e:
        platforms = environ.get("JAX_PLATFORMS", "").strip()
        if not platforms:
            raise  # not the user's setting: JAX's own error
        raise ValueError(f"JAX_PLATFORMS={platforms}: JAX cannot start that platform on this "
                         f"machine ({' '.join(str(e).split()) or 'no such device found'}); "
                         "unset JAX_PLATFORMS to let JAX choose, or name one it has "
                         "(e.g. cpu)") from None


def current_platform() -> str:
    """The platform JAX compiles for (`platform_of` its first device)."""
    import jax  # loads JAX: only when this runs

    return platform_of(jax.devices()[0])


def defaults(platform: str) -> Kernels:
    """The choices for `platform` ("cpu", "gpu"/"cuda", "rocm", "tpu") when nothing is set."""
    return _DEFAULTS[_platform_name(platform)]


def kernels(cfg: ModelConfig, platform: str | None = None) -> Kernels:
    """`cfg`'s explicit settings over `platform`'s defaults (the current platform if None).

    cuDNN's flash attention takes bf16 only: "auto" attention on an f32 GPU run is XLA's, and
    an explicit `attention="cudnn"` with float32 compute is an error.
    """
    d = defaults(platform or current_platform())
    dtype = d.compute_dtype if cfg.compute_dtype == "auto" else cfg.compute_dtype
    attention = d.attention if cfg.attention == "auto" else cfg.attention
    if attention == "cudnn" and dtype != "bfloat16":
        if cfg.attention == "cudnn":
            raise ValueError(f"model.attention=cudnn needs model.compute_dtype=bfloat16 (cuDNN's "
                             f"flash attention has no float32 kernel), got {dtype}; set "
                             "model.attention=xla or auto")
        attention = "xla"
    multiple = d.vocab_multiple if cfg.vocab_multiple is None else cfg.vocab_multiple
    chunk = d.loss_chunk if getattr(cfg, "loss_chunk", None) is None else cfg.loss_chunk
    return dataclasses.replace(d, compute_dtype=dtype, attention=attention,
                               vocab_multiple=multiple, loss_chunk=chunk)


def resolve(cfg: ModelConfig, platform: str | None = None,
            saved: ModelConfig | None = None) -> ModelConfig:
    """`cfg` with an "auto" compute dtype made concrete, as a run records it in config.yaml.

    Resuming (`saved` = the run's saved model config), "auto" keeps the dtype the run trained
    with, so a run started before "auto" existed (float32) or on another platform continues
    as it began; an explicit dtype is kept as given (and compared with the saved one).
    """
    if cfg.compute_dtype != "auto":
        return cfg
    if saved is not None and saved.compute_dtype != "auto":
        return cfg.replace(compute_dtype=saved.compute_dtype)
    return cfg.replace(compute_dtype=kernels(cfg, platform).compute_dtype)


def padded_vocab(cfg: ModelConfig, platform: str | None = None) -> int:
    """The LM head's vocabulary after padding (the parameters keep `cfg.vocab_size` rows)."""
    m = kernels(cfg, platform).vocab_multiple
    return -(-cfg.vocab_size // m) * m


def for_platform(cfg: ModelConfig, platform: str, compile_on: str | None = None) -> ModelConfig:
    """`cfg` with every "auto" execution setting made concrete for `platform`: what `cgpt
    plan` compiles when it plans for GPUs on emulated CPU devices.

    `compile_on`: the platform that will actually lower the step. cuDNN attention cannot lower
    on a CPU, so there it becomes XLA's (same math; XLA keeps the [T, T] scores that flash
    attention never stores, so a memory estimate errs on the safe side).
    """
    k = kernels(cfg, platform)
    attention = k.attention
    if attention == "cudnn" and compile_on is not None and _platform_name(compile_on) != "gpu":
        attention = "xla"
    return cfg.replace(compute_dtype=k.compute_dtype, attention=attention,
                       vocab_multiple=k.vocab_multiple, loss_chunk=k.loss_chunk)


def gpu_allocator(environ) -> float:
    """Set the GPU allocator's share of memory (XLA_PYTHON_CLIENT_MEM_FRACTION) unless the user
    set it, and return the share in effect. Must run before JAX creates its GPU client."""
    if not (environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION") or "").strip():
        environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{GPU_MEM_FRACTION:.2f}"
    return mem_fraction(environ)


def mem_fraction(environ) -> float:
    """The allocator's share of GPU memory in effect (JAX's 0.75 when unset)."""
    raw = (environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION") or "").strip()
    try:
        f = float(raw) if raw else JAX_DEFAULT_MEM_FRACTION
    except ValueError:
        f = -1.0
    if not 0 < f <= 1:
        raise ValueError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={raw!r}: must be a fraction in (0, 1]; "
                         f"unset it to use cgpt's {GPU_MEM_FRACTION}")
    return f


def device_memory(bytes_limit: int, environ) -> int:
    """The device memory (in the sense of `plan --device-memory`) a GPU whose allocator limit
    is `bytes_limit` gives a run: limit / max(fraction, 0.90). With cgpt's 0.90 (or more) that
    is the GPU's physical memory; with a smaller fraction the fit's usable 90% of it is the
    pool itself."""
    return int(bytes_limit / max(mem_fraction(environ), GPU_MEM_FRACTION))


# XLA's GPU flags cgpt sets, each with its reason. Sources: NVIDIA JAX-Toolbox
# rosetta/docs/GPU_performance.md ("Tips for High-Performance LLMs with JAX and XLA") and
# MaxText's H100 (A3) recipes (configs/gpu/a3/*/1vm.sh, thresholds from there). XLA aborts
# the process on a flag it does not know, so each is checked against the installed XLA
# (tests/model/test_backend.py starts a process with all of them); dropped from this list:
# --xla_gpu_enable_async_all_gather/_reduce_scatter/_all_reduce, --xla_gpu_graph_level,
# --xla_gpu_enable_triton_softmax_fusion, --xla_gpu_enable_pipelined_collectives (unknown to
# XLA in jaxlib 0.10.2: async collectives are XLA's default now).
# XLA options of a run's fresh-state init on CPU devices (`init_compile_options`): it runs once,
# so its compile is all its cost (the second-largest per shape after the step's). Backend
# optimization level 1 instead of XLA's default, measured on the 2-core CPU (tiny-45k, CPU
# seconds of the compile, options interleaved in one process, 4 rounds): 1.7-2.5 -> 1.2-1.3 s,
# its values bit-identical (an elementwise program: RNG bits, their transforms to normals;
# `tests/train/test_warm.py` checks). Not for the step or the evaluation: they compile ~20% faster
# too, but the step's update differs in the last bit at some shapes (tiny-17k at batch 4 x 33:
# 6e-8), and results must not depend on the compile. Level 0 changes the init too.
CPU_INIT_COMPILE_OPTIONS: dict[str, int] = {"xla_backend_optimization_level": 1}


def init_compile_options(platform: str) -> dict | None:
    """`compiler_options` of the fresh-state init for `platform`'s devices: the CPU's
    (CPU_INIT_COMPILE_OPTIONS), None (XLA's defaults) elsewhere."""
    return dict(CPU_INIT_COMPILE_OPTIONS) if _platform_name(platform) == "cpu" else None


def cache_home(environ=os.environ) -> Path:
    """Where cgpt caches what it can rebuild (prepared data, compiled programs): $CGPT_CACHE,
    else ~/.cache/cgpt. One that is, or lies under, a file is a ValueError naming the variable
    (it ended in "<file>/locks: Not a directory" after the step had compiled)."""
    given = environ.get("CGPT_CACHE")
    home = Path(given or Path.home() / ".cache" / "cgpt").expanduser()
    fix = ("point CGPT_CACHE at a directory (made if missing), or unset it to use "
           "~/.cache/cgpt" if given else "move that file away, or set CGPT_CACHE to a directory")
    return cache_folder(home, f"CGPT_CACHE={given}" if given else
                        "the cache ~/.cache/cgpt (CGPT_CACHE is unset)", fix)


def cache_folder(path: Path, named: str, fix: str) -> Path:
    """`path`, a cache directory to be made if missing, unless it or a folder above it is a
    file: then a ValueError naming it as the user set it (`named`) with `fix`."""
    for p in (path, *path.parents):
        if p.exists():
            if p.is_dir():
                return path
            what = "is a file" if p == path else f"lies under {p}, a file"
            raise ValueError(f"{named}: {path} {what}, not a directory; {fix}")
    return path


# JAX's persistent compilation cache, one per user (`compile_cache_dir`): a sweep's workers,
# and every later sweep into any --out, load the programs compiled before instead of running
# XLA again (measured with bench/first_result.py: the rerun of README command 1). JAX keys an
# entry by the program, the backend and device kinds, the compile options and the jax/jaxlib
# version, so a hit is the same executable; the directory is kept to COMPILE_CACHE_BYTES, least
# recently used entries evicted first.
COMPILE_CACHE_BYTES = 2 << 30


def compile_cache_dir(environ=os.environ) -> Path:
    """The default directory of JAX's persistent compilation cache: `cache_home()`/jax."""
    return cache_home(environ) / "jax"


GPU_XLA_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("xla_gpu_enable_latency_hiding_scheduler", "true",
     "schedule collectives asynchronously around compute: the weight-streaming gathers and "
     "the gradient reductions overlap the matmuls instead of waiting for them"),
    ("xla_gpu_enable_highest_priority_async_stream", "true",
     "collectives on the highest-priority stream, so compute kernels do not delay them"),
    ("xla_gpu_enable_pipelined_all_gather", "true",
     "FSDP/weight streaming: the next layer's weight all-gather is issued one scan "
     "iteration early"),
    ("xla_gpu_enable_pipelined_reduce_scatter", "true",
     "FSDP/weight streaming: a layer's gradient reduce-scatter completes during the next "
     "layer's backward"),
    ("xla_gpu_enable_pipelined_all_reduce", "true",
     "data parallel: gradient all-reduces inside the layer scan move out of its critical path"),
    ("xla_gpu_enable_while_loop_double_buffering", "true",
     "the layer scan unrolled by two so a pipelined collective has an iteration to hide in"),
    ("xla_gpu_enable_all_gather_combine_by_dim", "false",
     "combine gathers along different dims too: fewer, larger all-gathers"),
    ("xla_gpu_enable_reduce_scatter_combine_by_dim", "false",
     "combine reduce-scatters along different dims too: fewer, larger collectives"),
    ("xla_gpu_all_gather_combine_threshold_bytes", "134217728",
     "combine small all-gathers up to 128 MiB (MaxText's A3 value): NCCL latency amortized"),
    ("xla_gpu_reduce_scatter_combine_threshold_bytes", "134217728",
     "combine small reduce-scatters up to 128 MiB (MaxText's A3 value)"),
    ("xla_gpu_all_reduce_combine_threshold_bytes", "1073741824",
     "combine the data-parallel gradient all-reduces up to 1 GiB (MaxText's A3 value)"),
)
_FLAG_NAME = re.compile(r"--?([A-Za-z0-9_]+)")


def forced_cpu_devices(environ=os.environ) -> int:
    """The CPU devices XLA_FLAGS' --xla_force_host_platform_device_count asks for (the tests'
    conftest and a local sweep's workers set it), else 0."""
    m = re.search(r"--xla_force_host_platform_device_count=(\d+)", environ.get("XLA_FLAGS", ""))
    return int(m.group(1)) if m else 0


ADDED_FLAGS_VAR = "CGPT_ADDED_XLA_FLAGS"  # the names of the flags cgpt added to XLA_FLAGS
# Per execution mode, the GPU flags above that the H100 compile (`cgpt plan --target h100`)
# shows doing harm there, turned off for that mode's compile alone (`compile_options`):
# (flag, what the compile showed).
GPU_FLAGS_OFF_BY_MODE: dict[str, tuple[tuple[str, str], ...]] = {
    "layer_pipelined": (
        ("xla_gpu_enable_pipelined_all_gather",
         "it peels the pipeline's tick scan so every forward tick runs twice: 111M on "
         "stage=2,data=4 ran 180 cuDNN forward calls for 90 backward and took 18.8 GB, "
         "against 90 and 7.7 GB without it"),),
}


def compile_options(mode: str, platform: str, environ=os.environ) -> dict[str, bool]:
    """XLA options for one compile of a `mode` step on `platform`: the GPU flags that mode
    turns off (GPU_FLAGS_OFF_BY_MODE), unless the user set that flag in XLA_FLAGS or
    CGPT_GPU_XLA_FLAGS=0 asked for XLA's defaults."""
    if _platform_name(platform) != "gpu" or (environ.get("CGPT_GPU_XLA_FLAGS") or "1").strip(
            ).lower() in ("0", "false", "off", "no"):
        return {}
    ours = set((environ.get(ADDED_FLAGS_VAR) or "").split(","))
    mine = _user_flag_names(environ.get("XLA_FLAGS") or "") - ours
    return {name: False for name, _ in GPU_FLAGS_OFF_BY_MODE.get(mode, ()) if name not in mine}


def _user_flag_names(xla_flags: str) -> set[str]:
    return {m.group(1) for tok in xla_flags.split() if (m := _FLAG_NAME.match(tok))}


def compose_xla_flags(user: str, platform: str) -> str:
    """XLA_FLAGS for a process on `platform`: the user's flags, then cgpt's GPU flags the
    user did not set (any value the user gave a flag wins); other platforms: `user` as is."""
    if _platform_name(platform) != "gpu":
        return user
    mine = _user_flag_names(user)
    extra = [f"--{name}={value}" for name, value, _ in GPU_XLA_FLAGS if name not in mine]
    return " ".join(t for t in (user.strip(), *extra) if t)


def launch_platform(environ, gpus: int) -> str:
    """The platform a process started with `environ` will use, read before JAX starts: the
    first of JAX_PLATFORMS when set ("cuda" -> "gpu"), else "gpu" when the node exposes
    NVIDIA devices (`gpus`: `cgpt.sharding.allocation.gpus_present()`), else "cpu"."""
    first = (environ.get("JAX_PLATFORMS") or "").split(",")[0].strip().lower()
    if first:
        return _ALIASES.get(first, first)
    return "gpu" if gpus else "cpu"


def gpu_xla_flags(environ, platform: str) -> list[str]:
    """Add cgpt's GPU flags to environ["XLA_FLAGS"] when `platform` (`launch_platform`) is
    NVIDIA's; returns the flags added. Must run before JAX starts its GPU backend (XLA reads
    XLA_FLAGS once). CGPT_GPU_XLA_FLAGS=0 adds none (a flag-off comparison, or an XLA that
    dropped one of them)."""
    if (environ.get("CGPT_GPU_XLA_FLAGS") or "1").strip().lower() in ("0", "false", "off", "no"):
        return []
    if _ALIASES.get(platform, platform) != "gpu":
        return []
    user = environ.get("XLA_FLAGS") or ""
    composed = compose_xla_flags(user, "gpu")
    if composed != user:
        environ["XLA_FLAGS"] = composed
    added = composed[len(user.strip()):].split()
    if added:  # told apart from the user's own flags (`compile_options`), in child processes too
        environ[ADDED_FLAGS_VAR] = ",".join(sorted(_user_flag_names(" ".join(added))))
    return added


# glibc mallopt options of a CPU training process (`keep_host_memory`): (mallopt parameter,
# value, the environment variable a user sets it with, why).
CPU_MALLOC_OPTIONS: tuple[tuple[int, int, str, str], ...] = (
    (-4, 0, "MALLOC_MMAP_MAX_",  # M_MMAP_MAX
     "no block from its own mapping: XLA's per-step buffers come from the heap, whose pages "
     "stay mapped, instead of fresh mappings that fault on every page, every step"),
    (-1, 2 ** 31 - 1, "MALLOC_TRIM_THRESHOLD_",  # M_TRIM_THRESHOLD
     "never hand the freed top of the heap back to the kernel between steps"),
    (-8, 1, "MALLOC_ARENA_MAX",  # M_ARENA_MAX
     "XLA's threads allocate from that one heap too: a thread's own arena unmaps each of its "
     "sub-heaps as soon as it is free, whatever the trim threshold"),
)


def _malloc_off(environ) -> bool:
    """CGPT_CPU_MALLOC=0 (or false/off/no): glibc's own defaults, nothing set."""
    return (environ.get("CGPT_CPU_MALLOC") or "1").strip().lower() in ("0", "false", "off", "no")


def host_memory_env(environ=os.environ) -> dict[str, str]:
    """CPU_MALLOC_OPTIONS as the environment of a CPU training child process (a sweep's
    worker): glibc reads them at the child's start, before any thread. The options the user
    set are left out (theirs pass through); none with CGPT_CPU_MALLOC=0."""
    if _malloc_off(environ):
        return {}
    return {name: str(value) for _, value, name, _ in CPU_MALLOC_OPTIONS if name not in environ}


def keep_host_memory(environ=os.environ) -> list[str]:
    """Set CPU_MALLOC_OPTIONS in this process's glibc malloc; returns the variables set.

    For a process that trains on the CPU (call before its first step): its memory then stays
    at its peak instead of being returned between steps. Nothing on a libc other than glibc,
    none with CGPT_CPU_MALLOC=0, and an option whose variable the user set is left to it."""
    if _malloc_off(environ):
        return []
    if _host.system() != "Linux" or _host.libc_ver()[0] != "glibc":
        return []
    mallopt = ctypes.CDLL(None).mallopt
    return [name for param, value, name, _ in CPU_MALLOC_OPTIONS
            if name not in environ and mallopt(param, value) == 1]
