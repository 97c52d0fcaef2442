"""One GPU check, one call: cgpt's training step on one GPU, the decisive figures first.

    python3 bench/gpu_check.py --plan-only   # a CPU box, beforehand: bench/gpu_plan.json
    python3 bench/gpu_check.py               # one H100/H200, from the repo root: <= 420 s
    python3 bench/gpu_check.py --smoke       # the same code on the CPU at tiny sizes (the suite)

Run from a plain copy of the repository (nothing installed: the script puts its repository
first on sys.path, for itself and its children), with only jax (+ CUDA plugin), flax, optax,
orbax, torch and transformers installed. The plan half runs on a CPU box beforehand
(`--plan-only`): what `train`'s fit chooses for each model on one 80 GB H100, compiled by the
H100's own compiler without a GPU (JAX's CUDA plugin: `cgpt plan --target h100`), committed
as bench/gpu_plan.json; the GPU run compiles that step only (a check, no search), so its
minutes go to measurement.

Results, in order of value, each in its own process (XLA_FLAGS are read at backend start and
neither framework holds the other's memory), one printed line as each finishes and
`$OUT/gpu_check.json` rewritten after each (when OUT is set), then the table:
  1. 1.3B, cgpt's step with cgpt's XLA GPU flags (`cgpt.config.backend.GPU_XLA_FLAGS`)
  2. 1.3B, PyTorch: transformers' GPT-2 of the same shape, SDPA, bf16 autocast over f32
     weights, fused AdamW, torch.compile (`bench/train_gpu.py`'s `bench_torch`)
  3., 4. the same for 111M
  5. a fused group of 8 same-shape small runs (cpu-19m, 8 seeds: one alone leaves a GPU
     mostly idle) against the same 8 runs one after another: the fused sweep's speed-up
  6. 1.3B without the flags (CGPT_GPU_XLA_FLAGS=0), if time remains.
Each JAX child sets JAX_PLATFORMS=cuda (no silent CPU fallback) and reports the flags it
added. The step is the one `cgpt train` runs (`cgpt.plan.planning.compile_step`), timed as
the median of the steps after two warm-ups; from its compiled HLO the cuDNN attention calls
and the LM head's matmul operand dtypes; beside it the GPU's peak memory in use and the fit's
prediction. MFU counts causal attention once (`cgpt.config.flops.MFU_ATTENTION`) against the
spec-sheet dense bf16 peak (`cgpt.train.mfu.PEAKS`). Targets: >= 50% MFU at 1.3B, >= 1.2x
PyTorch's step, the fused group >= 5x its runs one after another. Every figure is measured in
this run; without a GPU the check refuses (never estimates).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # this checkout's cgpt, also when another one is installed

MARK = "GPU_CHECK_RESULT "
TARGET_MFU, TARGET_RATIO, TARGET_FUSED = 0.50, 1.2, 5.0
H100_MEMORY = 81_559 * 2**20  # what an 80 GB H100 reports (nvidia-smi: 81559 MiB)
PLAN_FILES = {"full": HERE / "gpu_plan.json", "smoke": HERE / "gpu_plan_smoke.json"}
NOT_MEASURED = (
    "not measured on one GPU (no verdict here): bf16 weight all-gathers (a one-device step has "
    "no collectives; tests/model/test_head.py reads them from the partitioned HLO of 8 emulated "
    "devices, before the CPU compiler widens them to f32), the overlap of collectives with "
    "compute that most of the XLA flags schedule (on one GPU only the while-loop "
    "double-buffering flag acts), and node-aware meshes (several nodes)")


@dataclass(frozen=True)
class Size:
    models: tuple[str, ...]  # the first is the decisive one (its flags-off run comes last)
    seq: int
    batch: int
    steps: int
    fused_model: str
    fused_members: int
    fused_batch: int
    fused_seq: int
    budget_s: float


FULL = Size(("1.3B", "111M"), 2048, 8, 10, "cpu-19m", 8, 8, 256, 420.0)
SMOKE = Size(("tiny-17k",), 64, 2, 1, "tiny-17k", 8, 2, 32, 900.0)


# ---- the compiled step's HLO ---------------------------------------------------------------
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*?)\)(.*)$")
_SHAPE = re.compile(r"\b(pred|[sufc]\d+|bf16|f8\w*)\[([\d,]*)\]")


def hlo_checks(text: str, vocab: int) -> dict:
    """From a compiled step's HLO text: cuDNN fused-attention calls (forward, backward) and
    the operand dtypes of matmuls with a `vocab`-sized dim (the LM head and its two backward
    matmuls: cuBLAS calls, and `dot`s, also those inside Triton/cuDNN GEMM fusions)."""
    out = {"cudnn_fwd": 0, "cudnn_bwd": 0, "head_matmuls": 0, "head_operand_dtypes": []}
    shapes: dict[str, list] = {}  # instruction -> [(dtype, dims)] of its result
    gemms = []
    for line in text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        name, result, op, args, rest = m.groups()
        shapes[name] = _SHAPE.findall(result)
        if "__cudnn$fmha" in rest:
            out["cudnn_bwd" if "Backward" in rest else "cudnn_fwd"] += 1
        if op == "dot" or "__cublas" in rest:  # Triton/cuDNN GEMM fusions: the dot inside
            gemms.append((name, re.findall(r"%([\w.\-]+)", args)))
    dtypes = set()
    for name, operands in gemms:
        ops = [sh for o in operands for sh in shapes.get(o, [])[:1]]
        if any(str(vocab) in dims.split(",") for _, dims in shapes[name] + ops):
            out["head_matmuls"] += 1
            dtypes.update(dt for dt, _ in ops)
    out["head_operand_dtypes"] = sorted(dtypes)
    return out


# ---- children: each prints one MARK line of JSON ---------------------------------------------
def _run_config(model: str, seq: int, batch: int, micro_batch: int | None = None,
                remat: str | None = None):
    from cgpt.config.data import DataConfig
    from cgpt.config.model import get_config
    from cgpt.config.run import RunConfig, TrainConfig

    cfg = get_config(model)
    cfg = cfg.replace(n_ctx=max(cfg.n_ctx, seq), remat=remat)
    return RunConfig(preset=model, model=cfg, data=DataConfig(seq_len=seq),
                     train=TrainConfig(tokens=1000 * batch * seq, batch_size=batch,
                                       micro_batch=micro_batch, warmup_steps=10))


def _start_jax(a) -> tuple[object, list[str]]:
    """JAX started as `cgpt train` starts it on a GPU: the platform pinned (cuda; the CPU for
    the smoke run), the allocator's share and cgpt's XLA GPU flags set before the backend
    starts. Returns (the first device, or an error dict; the flags added)."""
    os.environ["JAX_PLATFORMS"] = "cpu" if a.smoke else "cuda"
    from cgpt.config import backend

    backend.gpu_allocator(os.environ)
    added = backend.gpu_xla_flags(os.environ, backend.launch_platform(os.environ, 0))
    import jax

    try:
        return jax.devices()[0], added
    except Exception as e:  # RuntimeError without a GPU; without the CUDA plugin, jax 0.10's
        # backend setup fails an assertion
        why = f"{type(e).__name__}: {e}"[:300]
        return {"error": f"no GPU visible to JAX (JAX_PLATFORMS=cuda: {why}); run this on a "
                         "GPU machine, or pass --smoke for the CPU smoke run"}, added


def _versions(dev) -> dict:
    """jax/jaxlib and, on a GPU, the CUDA runtime, driver, cuDNN and cuBLAS versions JAX's
    CUDA plugin loaded (raw integers as the libraries report them)."""
    import jax
    import jaxlib

    import cgpt

    out = {"device": dev.device_kind, "platform": dev.platform, "jax": jax.__version__,
           "jaxlib": getattr(jaxlib, "__version__", "?"),
           "cgpt": str(Path(cgpt.__file__).resolve().parents[1])}  # the checkout it ran
    try:
        from jax._src.lib import cuda_versions  # the plugin's module, None without one
    except ImportError:
        cuda_versions = None
    for lib in ("cuda_runtime", "cuda_driver", "cudnn", "cublas"):
        fn = getattr(cuda_versions, f"{lib}_get_version", None) if dev.platform != "cpu" \
            else None
        try:
            out[lib] = fn() if fn else None
        except Exception as e:  # a library the plugin could not load: say so, go on
            out[lib] = f"error: {e}"
    return out


def _memory(dev) -> dict:
    stats = (dev.memory_stats() or {}) if dev.platform != "cpu" else {}
    return {"bytes_limit": stats.get("bytes_limit"), "peak_in_use": stats.get("peak_bytes_in_use")}


def child_jax(a) -> dict:
    """The fitted, compiled train step of one model on this process's first device, timed:
    the planned micro-batch and remat when given (one compile), else the fit's search."""
    dev, added = _start_jax(a)
    if isinstance(dev, dict):
        return dev
    import numpy as np

    from cgpt.config import backend
    from cgpt.config.model import remat_value
    from cgpt.plan.planning import compile_step
    from cgpt.sharding.mesh import device_memory_bytes
    from cgpt.train.mfu import Throughput, peak_flops
    from cgpt.train.step import make_step

    memory = device_memory_bytes(dev)
    planned = a.micro_batch is not None
    st = compile_step(_run_config(a.model, a.seq, a.batch, a.micro_batch, a.remat), [dev],
                      memory)
    how = "as planned"
    if planned and not st.choice.fits:  # the plan's step is too big here: the fit searches
        st = compile_step(_run_config(a.model, a.seq, a.batch), [dev], memory)
        how = "searched: the planned step did not fit"
    elif not planned:
        how = "searched (no plan)"
    res, cfg = st.plan, st.cfg
    shape = (res.accum, res.micro_batch * res.replicas, res.seq_len + 1)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, shape)
    batch = st.strategy.shard_batch(tokens, shape)
    params, opt = st.strategy.init_state(st.optimizer)(0)
    times, loss = [], float("nan")
    for i in range(a.steps + 2):  # two warm-ups (first call, autotuning/allocator)
        t0 = time.perf_counter()
        params, opt, m = st.compiled(params, opt, batch)
        loss = float(m["loss"])  # waits for the step
        if i >= 2:
            times.append(time.perf_counter() - t0)
    step_s = float(np.median(times))
    speed = Throughput.for_model(cfg, res.seq_len, 1)
    n_tok = res.batch_size * res.seq_len
    return {**_versions(dev), **_memory(dev), "device_memory": memory,
            "peak": peak_flops(cfg.compute_dtype)[0], "peak_source": speed.peak_source,
            "jax_platforms": os.environ["JAX_PLATFORMS"], "flags_added": added,
            "micro_batch": res.micro_batch, "accum": res.accum, "remat": remat_value(cfg.remat),
            "how": how, "fits": st.choice.fits, "predicted": st.choice.bytes["total"],
            "batch": res.batch_size, "seq": res.seq_len, "dtype": cfg.compute_dtype,
            "attention": backend.kernels(cfg).attention, "step_s": step_s,
            "tokens_per_s": n_tok / step_s, "loss": loss,
            "flops_per_token": speed.flops_per_token, "peak_total": speed.peak_total,
            "mfu": n_tok / step_s * speed.flops_per_token / speed.peak_total,
            "mfu_full": n_tok / step_s * speed.flops_per_token_full / speed.peak_total,
            "hlo": hlo_checks(st.compiled.as_text(), backend.padded_vocab(cfg))}


def child_fused(a) -> dict:
    """`fused_members` runs of one small shape (seeds 0..M-1) as the fused sweep trains them
    (`cgpt.train.fused.make_fused_step`, all members in one vmapped program on a GPU) against
    the same runs one after another (`make_step`, one compiled step reused): `steps` steps
    each, dispatched back to back and waited for at the end, as a training loop runs them."""
    dev, added = _start_jax(a)
    if isinstance(dev, dict):
        return dev
    import jax
    import jax.numpy as jnp
    import numpy as np

    from cgpt.train import fused, optim
    from cgpt.train.mfu import Throughput
    from cgpt.train.resolve import resolve
    from cgpt.train.step import make_step

    res = resolve(_run_config(a.model, a.seq, a.batch, remat=a.remat), [dev])
    cfg, recipe, k = res.cfg, res.recipe, a.members
    per_pass = fused.members_per_pass()  # 0 on a GPU: one vmapped pass; 1 on a CPU: a loop
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (k, 1, a.batch, a.seq + 1)), jnp.int32)
    members = [fused.init_member(cfg, recipe, i) for i in range(k)]
    f = {"p": fused.stack([m[0] for m in members]), "o": fused.stack([m[1] for m in members])}
    hyper, active = fused.stack_hyper([recipe] * k), jnp.ones((k,), bool)
    step_f = fused.make_fused_step(cfg, recipe, per_pass=per_pass).lower(
        f["p"], f["o"], tokens, hyper, active).compile()  # one compile: run and measured
    solo = jax.jit(make_step(cfg, optim.make_optimizer(recipe, cfg)), donate_argnums=(0, 1))
    runs = [{"p": p, "o": o} for p, o in (fused.init_member(cfg, recipe, i) for i in range(k))]

    def fused_steps(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            f["p"], f["o"], m = step_f(f["p"], f["o"], tokens, hyper, active)
        jax.block_until_ready(m["loss"])
        return time.perf_counter() - t0

    def solo_steps(r: dict, batch, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            r["p"], r["o"], m = solo(r["p"], r["o"], batch)
        jax.block_until_ready(m["loss"])
        return time.perf_counter() - t0

    fused_steps(2)  # autotuning, allocator
    solo_steps(runs[0], tokens[0], 2)
    t_fused = fused_steps(a.steps) / a.steps
    t_alone = sum(solo_steps(runs[i], tokens[i], a.steps) for i in range(k)) / a.steps
    speed = Throughput.for_model(cfg, a.seq, 1)
    n_tok = k * a.batch * a.seq
    mfu = lambda s: n_tok / s * speed.flops_per_token / speed.peak_total  # noqa: E731
    from cgpt.train.fit import step_bytes

    return {**_versions(dev), **_memory(dev), "jax_platforms": os.environ["JAX_PLATFORMS"],
            "flags_added": added, "model": a.model, "members": k, "per_pass": per_pass,
            "batch": a.batch, "seq": a.seq, "dtype": cfg.compute_dtype,
            "fused_step_s": t_fused, "alone_step_s": t_alone / k, "sequential_s": t_alone,
            "speedup": t_alone / t_fused, "mfu_fused": mfu(t_fused), "mfu_alone": mfu(t_alone),
            "predicted": step_bytes(step_f)["total"]}


def child_torch(a) -> dict:
    sys.path.insert(0, str(HERE))
    import numpy as np
    import torch

    from train_gpu import bench_torch

    device = "cpu" if a.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        return {"error": "PyTorch sees no GPU (a CPU-only torch build?)"}
    cfg = _run_config(a.model, a.seq, a.batch).model
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (a.batch, a.seq + 1))
    dtype = "float32" if a.smoke else "bfloat16"
    step_s, loss, version = bench_torch(cfg, tokens, a.steps, device, dtype, not a.smoke)
    cuda = device == "cuda"
    return {"step_s": step_s, "loss": loss, "torch": version, "compiled": not a.smoke,
            "tokens_per_s": a.batch * a.seq / step_s, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
            "peak_in_use": torch.cuda.max_memory_allocated() if cuda else None}


def child_plan(a) -> dict:
    """What `train`'s fit chooses for each model (and the fused group's member) on one
    device of `device_memory` bytes: compiled by the H100's own compiler without a GPU where
    JAX's CUDA plugin is installed (`cgpt plan --target h100`: cuDNN attention, cgpt's GPU
    flags), else on one CPU device with the GPU's dtype, vocabulary padding and loss chunking
    (XLA's attention for cuDNN's: it overstates the GPU's memory)."""
    from cgpt.config import backend
    from cgpt.plan import target

    name = target.default_target()
    if name != "cpu":
        backend.gpu_xla_flags(os.environ, "gpu")  # before JAX starts, as on the GPU
    import jax

    from cgpt.plan.planning import plan_run, target_devices

    devs = target_devices(name, 1)
    out = {}
    for model, seq, batch in [*[(m, a.seq, a.batch) for m in a.models.split(",")],
                              (a.fused_model, a.fused_seq, a.fused_batch)]:
        r = plan_run(_run_config(model, seq, batch), a.device_memory, devs, platform="gpu")
        out[f"{model}@{batch}x{seq}"] = {
            "micro_batch": r["micro_batch"], "accum": r["accum"], "remat": r["remat"],
            "fits": r["fits"], "predicted": r["per_device_bytes"]["total"],
            "usable_memory": r["usable_memory"], "attention_compiled": r["attention"],
            "compiled_for": r["compiled_for"], "tried": r["fit"]["tried"],
            "compile_s": r["compile_s"]}
    return {"jax": jax.__version__, "entries": out}


# ---- the parent: never imports JAX, torch or cgpt -------------------------------------------
def _spawn(args: list[str], env: dict, timeout: float) -> dict:
    """Run one child; its result, or an error with the end of what it printed to stderr
    (which is also passed on to ours)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        sys.stderr.write(err or "")
        return {"error": f"timed out after {timeout:.0f} s", "stderr": (err or "")[-1500:]}
    sys.stderr.write(p.stderr)
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    why = f"signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
    return {"error": f"{why} (its stderr is above)", "stderr": p.stderr[-1500:]}


def _plan_for(a) -> dict:
    """What the plan file must have been made for: these sizes on an 80 GB H100."""
    return {"models": a.models.split(","), "seq": a.seq, "batch": a.batch,
            "fused": [a.fused_model, a.fused_batch, a.fused_seq], "device_memory": H100_MEMORY}


def _write_json(path: Path, data: dict) -> None:
    """Whole or not at all: a reader (or a killed run) never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: the code path only")
    ap.add_argument("--plan-only", action="store_true",
                    help="on a CPU: write the fit's choices for an 80 GB H100 to --plan-file")
    ap.add_argument("--plan-file", type=Path, help="default bench/gpu_plan.json "
                    "(--smoke: bench/gpu_plan_smoke.json)")
    ap.add_argument("--models", help="comma-separated presets (default 1.3B,111M)")
    ap.add_argument("--steps", type=int, help="timed steps per measurement (default 10)")
    ap.add_argument("--skip", default="", help="comma-separated parts not to run: torch, "
                    "fused, off (the flags-off run)")
    ap.add_argument("--child", choices=("jax", "plan", "torch", "fused"), help=argparse.SUPPRESS)
    for hidden in ("--model", "--remat"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    for hidden in ("--seq", "--batch", "--micro-batch", "--members", "--device-memory"):
        ap.add_argument(hidden, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    d = SMOKE if a.smoke else FULL
    a.models = a.models or ",".join(d.models)
    a.steps = a.steps or d.steps
    a.seq, a.batch = a.seq or d.seq, a.batch or d.batch
    a.fused_model, a.fused_batch, a.fused_seq = d.fused_model, d.fused_batch, d.fused_seq
    a.plan_file = a.plan_file or PLAN_FILES["smoke" if a.smoke else "full"]
    if a.child:
        result = {"jax": child_jax, "plan": child_plan, "torch": child_torch,
                  "fused": child_fused}[a.child](a)
        print(MARK + json.dumps(result), flush=True)
        return 0
    if a.plan_only:
        return plan_only(a)
    return run_all(a, d)


def plan_only(a) -> int:
    """The plan half, on a CPU: one child process (JAX on the CPU; the H100's compiler when
    the CUDA plugin is installed, with cgpt's GPU flags, else the CPU's without them)."""
    from cgpt.plan.target import plugin_available  # JAX-free

    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if not plugin_available():
        env["CGPT_GPU_XLA_FLAGS"] = "0"
    t0 = time.monotonic()
    r = _spawn(["--child", "plan", "--models", a.models, "--seq", str(a.seq), "--batch",
                str(a.batch), "--device-memory", str(H100_MEMORY),
                *(["--smoke"] if a.smoke else [])], env, 24 * 3600)
    if "error" in r:
        print(f"bench/gpu_check.py: --plan-only failed: {r['error']}", file=sys.stderr)
        return 1
    smoke = " --smoke" if a.smoke else ""
    _write_json(a.plan_file, {"command": f"python3 bench/gpu_check.py --plan-only{smoke}",
                              "for": _plan_for(a), **r})
    for key, e in r["entries"].items():
        print(f"{key}: micro-batch {e['micro_batch']} x {e['accum']}, remat {e['remat']}, "
              f"{e['predicted'] / 2**30:.2f} GiB of {e['usable_memory'] / 2**30:.2f} GiB usable"
              f"{'' if e['fits'] else ' (does NOT fit)'}")
    print(f"wrote {a.plan_file} in {time.monotonic() - t0:.0f} s")
    return 0


def read_plan(a) -> tuple[dict, str]:
    """(entries, a line saying where the steps come from). A missing or stale plan file, or
    a run it has no entry for, is not an error: the GPU's fit then searches (more compiles,
    the same steps)."""
    try:
        plan = json.loads(a.plan_file.read_text())
    except FileNotFoundError:
        return {}, f"plan: {a.plan_file} not found: the fit searches on the GPU"
    except (OSError, ValueError) as e:
        return {}, f"plan: {a.plan_file} unreadable ({e}): the fit searches on the GPU"
    made = (plan.get("for") or {}).get("device_memory")
    if made != H100_MEMORY:  # each entry names its model and sizes: a run finds its own
        return {}, (f"plan: {a.plan_file} was made for {made} bytes, not {H100_MEMORY}: the "
                    "fit searches on the GPU")
    return plan["entries"], (f"plan: {a.plan_file.name} (the fit on {H100_MEMORY >> 20:,} MiB, "
                             f"compiled on a CPU, jax {plan.get('jax')})")


def _jobs(a, d: Size, skip: set[str]) -> list[tuple[str, str, list[str]]]:
    """(key, kind, child args) in order of value."""
    jobs = []
    for m in a.models.split(","):
        jobs.append((f"{m}/cgpt", "jax", ["--model", m]))
        if "torch" not in skip:
            jobs.append((f"{m}/pytorch", "torch", ["--model", m]))
    if "fused" not in skip:
        jobs.append(("fused", "fused", ["--model", d.fused_model, "--members",
                                         str(d.fused_members)]))
    if "off" not in skip and not a.smoke:  # on a CPU cgpt's GPU flags never apply
        m = a.models.split(",")[0]
        jobs.append((f"{m}/cgpt-flags-off", "jax", ["--model", m]))
    return jobs


def run_all(a, d: Size) -> int:
    t0 = time.monotonic()
    skip = {x.strip() for x in a.skip.split(",") if x.strip()}
    if skip - {"torch", "fused", "off"}:
        print(f"bench/gpu_check.py: error: --skip {a.skip}: use torch, fused and/or off",
              file=sys.stderr)
        return 2
    left = lambda: d.budget_s - (time.monotonic() - t0)  # noqa: E731
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None
    entries, plan_line = read_plan(a)
    print(plan_line, flush=True)
    results: dict[str, dict] = {}
    state = {"smoke": a.smoke, "plan": plan_line, "budget_s": d.budget_s, "results": results}
    flags = "1"  # "0" once a JAX child with cgpt's flags died by a signal (XLA aborts on a
    # flag it does not know): the rest then runs without them, and says so

    def save(done: bool = False) -> None:
        if out is not None:
            _write_json(out, {**state, "wall_s": round(time.monotonic() - t0, 1), "done": done})

    for key, kind, args in _jobs(a, d, skip):
        model = args[1]
        if kind == "fused":
            sizes = ["--seq", str(d.fused_seq), "--batch", str(d.fused_batch)]
            plan = entries.get(f"{model}@{d.fused_batch}x{d.fused_seq}")
        else:
            sizes = ["--seq", str(a.seq), "--batch", str(a.batch)]
            plan = entries.get(f"{model}@{a.batch}x{a.seq}")
        if plan and kind != "torch":
            args = [*args, "--remat", plan["remat"]]
            if kind == "jax":
                args += ["--micro-batch", str(plan["micro_batch"])]
        env = dict(base, CGPT_GPU_XLA_FLAGS="0" if key.endswith("flags-off") else flags,
                   # torch's child: JAX must not take the GPU's memory (it only reads configs)
                   **({"JAX_PLATFORMS": "cpu"} if kind == "torch" else {}))
        first_on = results.get(f"{a.models.split(',')[0]}/cgpt", {})
        if key.endswith("flags-off") and "wall_s" in first_on and left() < first_on["wall_s"]:
            results[key] = {"error": f"not run: {left():.0f} s of the budget left, the "
                                     f"flags-on run took {first_on['wall_s']:.0f} s"}
        elif left() < 5:
            results[key] = {"error": f"not run: the {d.budget_s:.0f} s budget is spent"}
        else:
            t = time.monotonic()
            results[key] = _spawn(["--child", kind, *args, *sizes, "--steps", str(a.steps),
                                   *(["--smoke"] if a.smoke else [])], env, left())
            results[key]["wall_s"] = round(time.monotonic() - t, 1)
            if plan:
                results[key]["plan"] = plan
        r = results[key]
        if kind != "torch" and env["CGPT_GPU_XLA_FLAGS"] == "1" and \
                r.get("error", "").startswith("signal"):
            r["error"] += ("; XLA aborts on a flag it does not know: if its stderr names one of "
                           "cgpt's GPU_XLA_FLAGS, drop it there; the next JAX children run "
                           "without the flags (CGPT_GPU_XLA_FLAGS=0)")
            flags = "0"
        elif kind != "torch" and "error" not in r and env["CGPT_GPU_XLA_FLAGS"] == "0" and \
                not key.endswith("flags-off"):
            r["flags_note"] = "run without the flags: a flags-on child aborted"
        print(f"[{time.monotonic() - t0:5.0f} s] {key}: {line(key, r, results)}", flush=True)
        save()
        if "no GPU visible to JAX" in r.get("error", ""):
            print(f"bench/gpu_check.py: {r['error']}", file=sys.stderr)
            return 2
    print(report(a, d, results, plan_line, time.monotonic() - t0))
    state["table"] = report(a, d, results, plan_line, time.monotonic() - t0)
    save(done=True)
    return 0 if a.smoke or all(v is not False for v in verdicts(a, results).values()) else 1


# ---- what the parent prints -----------------------------------------------------------------
def _gib(b) -> str:
    return f"{b / 2**30:.1f} GiB" if isinstance(b, (int, float)) and b else "-"


def _pct(x) -> str:
    return f"{x:.1%}" if isinstance(x, float) else "-"


def _flags(r: dict) -> str:
    note = f" ({r['flags_note']})" if "flags_note" in r else ""
    return f"JAX_PLATFORMS={r['jax_platforms']}, {len(r['flags_added'])} XLA flags added{note}"


def line(key: str, r: dict, results: dict) -> str:
    """One result as one line, printed as it finishes."""
    if "error" in r:
        return f"error: {r['error']}"
    if "/pytorch" in key:
        j = results.get(key.replace("/pytorch", "/cgpt"), {})
        ratio = f", {r['step_s'] / j['step_s']:.2f}x cgpt's step" if "step_s" in j else ""
        return (f"torch {r['torch']}: {r['step_s'] * 1e3:.1f} ms/step, "
                f"{r['tokens_per_s']:,.0f} tokens/s{ratio}, peak {_gib(r['peak_in_use'])}")
    if key == "fused":
        return (f"{r['members']} x {r['model']} fused {r['fused_step_s'] * 1e3:.1f} ms/step, "
                f"one after another {r['sequential_s'] * 1e3:.1f} ms: {r['speedup']:.2f}x "
                f"(MFU {_pct(r['mfu_fused'])} vs {_pct(r['mfu_alone'])}); {_flags(r)}")
    return (f"{r['step_s'] * 1e3:.1f} ms/step, {r['tokens_per_s']:,.0f} tokens/s, MFU "
            f"{_pct(r['mfu'])} ({_pct(r['mfu_full'])} full); {r['micro_batch']} x {r['accum']}, "
            f"remat {r['remat']} ({r['how']}); peak {_gib(r['peak_in_use'])}, fit "
            f"{_gib(r['predicted'])}; {_flags(r)}")


def verdicts(a, results: dict) -> dict[str, bool | None]:
    """Each target: met, missed, or None (not measured / the smoke run)."""
    if a.smoke:
        return {}
    first = a.models.split(",")[0]
    out: dict[str, bool | None] = {}
    for m in a.models.split(","):
        j, t = results.get(f"{m}/cgpt", {}), results.get(f"{m}/pytorch", {})
        out[f"{m} cgpt ran"] = "error" not in j
        out[f"{m} ratio"] = t["step_s"] / j["step_s"] >= TARGET_RATIO \
            if "step_s" in t and "step_s" in j else None
    j = results.get(f"{first}/cgpt", {})
    out["mfu"] = j["mfu"] >= TARGET_MFU if "mfu" in j and first.upper() == "1.3B" else None
    f = results.get("fused", {})
    out["fused"] = f["speedup"] >= TARGET_FUSED if "speedup" in f else None
    return out


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("ok" if ok else "FAIL")


def report(a, d: Size, results: dict, plan_line: str, wall_s: float) -> str:
    """The one table: a column per model, a row per figure, the target and the verdict; then
    the fused group, what one GPU cannot measure, and the errors."""
    models = a.models.split(",")
    first = next((r for k, r in results.items() if "/cgpt" in k and "error" not in r), {})
    pt = next((r for k, r in results.items() if "/pytorch" in k and "error" not in r), {})
    head = [f"gpu_check: {first.get('device', '?')} ({first.get('platform', '?')}), jax "
            f"{first.get('jax', '?')} (jaxlib {first.get('jaxlib', '?')}), CUDA runtime "
            f"{first.get('cuda_runtime')}, driver {first.get('cuda_driver')}, cuDNN "
            f"{first.get('cudnn')}, cuBLAS {first.get('cublas')}; torch {pt.get('torch', '?')} "
            f"(CUDA {pt.get('cuda')}, cuDNN {pt.get('cudnn')})",
            f"allocator limit {_gib(first.get('bytes_limit'))} of "
            f"{_gib(first.get('device_memory'))}; peak {first.get('peak', 0) / 1e12:.4g} "
            f"TFLOP/s ({first.get('peak_source', '?')}); seq {a.seq}, batch {a.batch}, "
            f"{a.steps} timed steps; {wall_s:.0f} s of a {d.budget_s:.0f} s budget", plan_line]
    if a.smoke:
        head.append("SMOKE RUN on the CPU: these are CPU numbers, not GPU figures")
    v = verdicts(a, results)
    rows = [("figure", *models, "target", "verdict")]

    def row(label, cell, target="", verdict=None, key="cgpt"):
        cells = []
        for m in models:
            r = results.get(f"{m}/{key}", {})
            try:
                cells.append(cell(r, m) if "error" not in r else f"error: {r['error']}")
            except (KeyError, TypeError, ZeroDivisionError):
                cells.append("-")
        rows.append((label, *cells, target, _verdict(verdict)))

    j = lambda m: results.get(f"{m}/cgpt", {})  # noqa: E731
    row("XLA GPU flags added (JAX_PLATFORMS)",
        lambda r, m: f"{len(r['flags_added'])} ({r['jax_platforms']})")
    row("cuDNN attention calls fwd/bwd",
        lambda r, m: f"{r['hlo']['cudnn_fwd']}/{r['hlo']['cudnn_bwd']}", ">0/>0",
        None if a.smoke or not first else all(
            j(m).get("hlo", {}).get("cudnn_fwd", 0) > 0 and j(m)["hlo"]["cudnn_bwd"] > 0
            for m in models if "hlo" in j(m)))
    row("LM head matmul operands",
        lambda r, m: f"{','.join(r['hlo']['head_operand_dtypes'])} "
                     f"({r['hlo']['head_matmuls']} matmuls)", "bf16 only",
        None if a.smoke or not first else all(
            set(j(m)["hlo"]["head_operand_dtypes"]) <= {"bf16"} and j(m)["hlo"]["head_matmuls"]
            for m in models if "hlo" in j(m)))
    row(f"plan: the fit on {H100_MEMORY >> 20:,} MiB (CPU compile)",
        lambda r, m: f"{r['plan']['micro_batch']} x {r['plan']['accum']}, remat "
                     f"{r['plan']['remat']}, {_gib(r['plan']['predicted'])}")
    row("step run here (micro x accum, remat)",
        lambda r, m: f"{r['micro_batch']} x {r['accum']}, remat {r['remat']} ({r['how']})")
    row("GPU memory: peak in use / fit's prediction",
        lambda r, m: f"{_gib(r['peak_in_use'])} / {_gib(r['predicted'])}")
    row("cgpt, flags on: ms/step", lambda r, m: f"{r['step_s'] * 1e3:.1f}")
    row("cgpt, flags on: tokens/s", lambda r, m: f"{r['tokens_per_s']:,.0f}")
    row("cgpt, flags on: MFU causal (full)",
        lambda r, m: f"{_pct(r['mfu'])} ({_pct(r['mfu_full'])})",
        f">={TARGET_MFU:.0%} at 1.3B", v.get("mfu"))
    row("cgpt, flags off: ms/step (MFU)",
        lambda r, m: f"{r['step_s'] * 1e3:.1f} ({_pct(r['mfu'])})", key="cgpt-flags-off")
    row(f"pytorch{' compiled' if not a.smoke else ''}: ms/step",
        lambda r, m: f"{r['step_s'] * 1e3:.1f}", key="pytorch")
    row("pytorch: MFU causal, peak memory in use",
        lambda r, m: f"{_pct(r['tokens_per_s'] * j(m)['flops_per_token'] / j(m)['peak_total'])}"
                     f", {_gib(r['peak_in_use'])}", key="pytorch")
    ratio = [v.get(f"{m} ratio") for m in models]
    row("pytorch step / cgpt step (flags on)",
        lambda r, m: f"{r['step_s'] / j(m)['step_s']:.2f}x", f">={TARGET_RATIO}x",
        None if all(x is None for x in ratio) else all(x is not False for x in ratio),
        key="pytorch")
    row("loss cgpt / pytorch (same random tokens)",
        lambda r, m: f"{j(m)['loss']:.3f} / {r['loss']:.3f}", key="pytorch")
    f = results.get("fused", {})
    fused = (f"error: {f['error']}" if "error" in f else
             f"{f['members']} x {f['model']} (seeds), batch {f['batch']} x seq {f['seq']} each: "
             f"fused {f['fused_step_s'] * 1e3:.1f} ms/step, one after another "
             f"{f['members']} x {f['alone_step_s'] * 1e3:.1f} = {f['sequential_s'] * 1e3:.1f} ms:"
             f" {f['speedup']:.2f}x (target >= {TARGET_FUSED:.0f}x: {_verdict(v.get('fused'))})"
             f"; MFU {_pct(f['mfu_fused'])} fused, {_pct(f['mfu_alone'])} alone; peak "
             f"{_gib(f['peak_in_use'])} in use, fit {_gib(f['predicted'])}"
             if f else "not run (--skip fused)")
    errors = [f"  {k}: {r['error']}" for k, r in results.items()
              if "error" in r and not r["error"].startswith("not run")]
    return "\n".join([*head, table(rows), f"fused group: {fused}", NOT_MEASURED,
                      *(["errors:", *errors] if errors else [])])


if __name__ == "__main__":
    sys.exit(main())
