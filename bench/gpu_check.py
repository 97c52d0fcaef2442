"""One GPU check, one table: is cgpt's training step what it should be on this GPU?

    python bench/gpu_check.py            # one H100/H200: 111M and 1.3B at seq 2048, <= 10 min
    python bench/gpu_check.py --smoke    # the same code on the CPU at tiny sizes (the suite)

Each measurement runs in its own process, so XLA_FLAGS are read fresh at backend start and
neither framework holds the other's memory (JAX preallocates 90% of the GPU):
- cgpt, per model and per setting of cgpt's XLA GPU flags (`cgpt.config.backend.GPU_XLA_FLAGS`
  on, then CGPT_GPU_XLA_FLAGS=0): the step `cgpt train` runs, fitted to the GPU's memory as
  train fits it (`cgpt.plan.planning.compile_step`: micro-batch and remat), timed as the
  median of the steps after two warm-ups; from its compiled HLO: the cuDNN attention calls,
  the dtypes of the LM head's matmul operands and the f32 all-gathers;
- `plan` of the same runs on emulated CPU devices (what a user runs before a job: its
  micro-batch/remat beside the fit's), and of 111M weight-streamed over 8 emulated devices
  (one GPU has no gathers to check): its f32 weight all-gathers;
- PyTorch: transformers' GPT-2 of the same shape, SDPA attention, bf16 autocast over f32
  weights, fused AdamW, torch.compile (`bench/train_gpu.py`'s `bench_torch`).
MFU counts causal attention once (`cgpt.config.flops.MFU_ATTENTION`, MaxText's convention;
the full-attention figure beside it) against the spec-sheet dense bf16 peak
(`cgpt.train.mfu.PEAKS`). Targets (issue #24): >= 50% MFU at 1.3B, >= 1.2x PyTorch's step.
Every figure is measured in this run; without a GPU the check refuses (never estimates).
Only jax (+ CUDA plugin), flax, optax, orbax, torch and transformers are needed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARK = "GPU_CHECK_RESULT "
TARGET_MFU, TARGET_RATIO = 0.50, 1.2
FULL = {"models": ("111M", "1.3B"), "seq": 2048, "batch": 8, "steps": 10, "budget_s": 600}
SMOKE = {"models": ("tiny-45k",), "seq": 64, "batch": 2, "steps": 1, "budget_s": 600}


# ---- the compiled step's HLO ---------------------------------------------------------------
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*?)\)(.*)$")


def hlo_checks(text: str, vocab: int) -> dict:
    """From a compiled step's HLO text: cuDNN fused-attention calls (forward, backward), the
    operand dtypes of matmuls with a `vocab`-sized dim (the LM head and its two backward
    matmuls: cuBLAS calls, and `dot`s, also those inside Triton/cuDNN GEMM fusions), and
    all-gathers by result dtype."""
    from cgpt.plan.hlo import _SHAPE

    out = {"cudnn_fwd": 0, "cudnn_bwd": 0, "head_matmuls": 0, "head_operand_dtypes": [],
           "all_gathers": 0, "f32_all_gathers": 0}
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
        if op in ("all-gather", "all-gather-start"):
            out["all_gathers"] += 1
            out["f32_all_gathers"] += any(dt == "f32" for dt, _ in shapes[name])
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
def _run_config(model: str, seq: int, batch: int):
    from cgpt.config.data import DataConfig
    from cgpt.config.model import get_config
    from cgpt.config.run import RunConfig, TrainConfig

    cfg = get_config(model)
    cfg = cfg.replace(n_ctx=max(cfg.n_ctx, seq))
    return RunConfig(preset=model, model=cfg, data=DataConfig(seq_len=seq),
                     train=TrainConfig(tokens=1000 * batch * seq, batch_size=batch,
                                       warmup_steps=10))


def child_jax(a) -> dict:
    """The fitted, compiled train step of one model on this process's first device, timed."""
    from cgpt.config import backend
    from cgpt.sharding.allocation import gpus_present

    backend.gpu_allocator(os.environ)  # as `cgpt train`: before JAX starts its GPU client
    added = backend.gpu_xla_flags(os.environ, backend.launch_platform(os.environ, gpus_present()))
    import jax
    import numpy as np

    from cgpt.plan.planning import compile_step
    from cgpt.sharding.mesh import device_memory_bytes
    from cgpt.config.model import remat_value
    from cgpt.train.mfu import Throughput, peak_flops
    from cgpt.train.step import make_step

    dev = jax.devices()[0]
    if not a.smoke and jax.default_backend() != "gpu":
        return {"error": f"no GPU visible to JAX (its backend is {jax.default_backend()!r}); "
                         "run this on a GPU machine, or pass --smoke for the CPU smoke run"}
    stats = (dev.memory_stats() or {}) if dev.platform != "cpu" else {}
    memory = device_memory_bytes(dev)
    st = compile_step(_run_config(a.model, a.seq, a.batch), [dev], memory)
    res, cfg = st.plan, st.cfg
    _, params, opt = st.strategy.compile_step(make_step(cfg, st.optimizer, st.strategy.loss),
                                              st.optimizer, 0, res)
    shape = (res.accum, res.micro_batch * res.replicas, res.seq_len + 1)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, shape)
    batch = st.strategy.shard_batch(tokens, shape)
    state, times = {"p": params, "o": opt}, []
    for i in range(a.steps + 2):  # two warm-ups (first call, autotuning/allocator)
        t0 = time.perf_counter()
        state["p"], state["o"], m = st.compiled(state["p"], state["o"], batch)
        loss = float(m["loss"])  # waits for the step
        if i >= 2:
            times.append(time.perf_counter() - t0)
    step_s = float(np.median(times))
    speed = Throughput.for_model(cfg, res.seq_len, 1)
    n_tok = res.batch_size * res.seq_len
    from cgpt.config.backend import padded_vocab

    return {"device": dev.device_kind, "platform": dev.platform, "jax": jax.__version__,
            "bytes_limit": stats.get("bytes_limit"), "device_memory": memory,
            "peak": peak_flops(cfg.compute_dtype)[0], "peak_source": speed.peak_source,
            "flags_added": len(added), "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "micro_batch": res.micro_batch, "accum": res.accum, "remat": remat_value(cfg.remat),
            "fits": st.choice.fits, "batch": res.batch_size, "seq": res.seq_len,
            "dtype": cfg.compute_dtype, "attention": backend.kernels(cfg).attention,
            "step_s": step_s, "tokens_per_s": n_tok / step_s, "loss": loss,
            "mfu": n_tok / step_s * speed.flops_per_token / speed.peak_total,
            "mfu_full": n_tok / step_s * speed.flops_per_token_full / speed.peak_total,
            "hlo": hlo_checks(st.compiled.as_text(), padded_vocab(cfg))}


def child_plan(a) -> dict:
    """`plan` on emulated CPU devices: each model's micro-batch/remat for the GPU's memory, and
    the f32 all-gathers of 111M (smoke: the model) weight-streamed over 8 devices."""
    import jax

    from cgpt.plan.planning import compile_step, plan_run
    from cgpt.sharding import emulate_cpu_devices

    emulate_cpu_devices(8)
    cpu = jax.devices("cpu")
    out = {}
    for model in a.models.split(","):
        r = plan_run(_run_config(model, a.seq, a.batch), a.device_memory, cpu[:1])
        out[model] = {k: r[k] for k in ("micro_batch", "accum", "remat", "fits")}
    import dataclasses

    from cgpt.config import backend

    ws_model = a.models.split(",")[0]
    run = _run_config(ws_model, a.seq, 8 * a.batch)
    run = dataclasses.replace(run, model=backend.for_platform(run.model, "gpu", "cpu"),
                              train=dataclasses.replace(run.train, mode="weight_streaming"))
    st = compile_step(run, cpu[:8], a.device_memory, platform="gpu")
    out["ws"] = {"model": ws_model, **hlo_checks(st.compiled.as_text(),
                                                 backend.padded_vocab(st.cfg, "gpu"))}
    return out


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
    return {"step_s": step_s, "loss": loss, "torch": version, "compiled": not a.smoke,
            "tokens_per_s": a.batch * a.seq / step_s}


# ---- the parent: never imports JAX or torch -----------------------------------------------------
def _spawn(args: list[str], env: dict, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True,
                           timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    why = f"signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
    return {"error": f"{why} (its error is printed above)"}


def _pct(x) -> str:
    return f"{x:.1%}" if isinstance(x, float) else "-"


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: the code path only")
    ap.add_argument("--models", help="comma-separated presets (default 111M,1.3B)")
    ap.add_argument("--batch", type=int, help="sequences per step (default 8)")
    ap.add_argument("--steps", type=int, help="timed steps per measurement (default 10)")
    ap.add_argument("--skip", default="", help="comma-separated parts not to run: torch, plan, "
                    "off (the flags-off runs); the suite's quick smoke run skips all three")
    ap.add_argument("--child", choices=("jax", "plan", "torch"), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--device-memory", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    d = SMOKE if a.smoke else FULL
    a.models = a.models or ",".join(d["models"])
    a.batch, a.steps, a.seq = a.batch or d["batch"], a.steps or d["steps"], a.seq or d["seq"]
    if a.child:
        result = {"jax": child_jax, "plan": child_plan, "torch": child_torch}[a.child](a)
        print(MARK + json.dumps(result), flush=True)
        return 0
    return run_all(a, d["budget_s"])


def run_all(a, budget_s: float) -> int:
    t0 = time.monotonic()
    skip = {x.strip() for x in a.skip.split(",") if x.strip()}
    if skip - {"torch", "plan", "off"}:
        print(f"bench/gpu_check.py: error: --skip {a.skip}: use torch, plan and/or off",
              file=sys.stderr)
        return 2
    left = lambda: budget_s - (time.monotonic() - t0)  # noqa: E731
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if a.smoke:
        base["JAX_PLATFORMS"] = "cpu"
    common = ["--seq", str(a.seq), "--batch", str(a.batch), "--steps", str(a.steps)]
    common += ["--smoke"] if a.smoke else []
    jax_rows, plan_proc, ok = {}, None, True
    for model in a.models.split(","):
        for flags in ("on", "off"):
            if flags in skip:
                jax_rows[model, flags] = {"error": "skipped (--skip off)"}
                continue
            env = dict(base, CGPT_GPU_XLA_FLAGS="1" if flags == "on" else "0")
            r = _spawn(["--child", "jax", "--model", model, *common], env, left())
            if flags == "on" and r.get("error", "").startswith("signal"):
                r["error"] += ("; XLA aborts on a flag it does not know: if it names one of "
                               "cgpt's GPU_XLA_FLAGS, drop it there (CGPT_GPU_XLA_FLAGS=0 "
                               "turns them all off)")
            jax_rows[model, flags] = r
            if "error" in r and "no GPU" in r["error"]:
                print(f"bench/gpu_check.py: {r['error']}", file=sys.stderr)
                return 2
            # plan runs on the CPU meanwhile, for this GPU's memory
            if plan_proc is None and "device_memory" in r and "plan" not in skip:
                penv = dict(base, JAX_PLATFORMS="cpu", CGPT_GPU_XLA_FLAGS="0",
                            XLA_FLAGS="--xla_force_host_platform_device_count=8")
                plan_proc = subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), "--child", "plan",
                     "--models", a.models, "--device-memory", str(r["device_memory"]), *common],
                    env=penv, stdout=subprocess.PIPE, text=True)
    torch_rows = {m: _spawn(["--child", "torch", "--model", m, *common],
                            dict(base, JAX_PLATFORMS="cpu"), left())
                  if "torch" not in skip else {"error": "skipped (--skip torch)"}
                  for m in a.models.split(",")}
    plan = {"error": "skipped (--skip plan)" if "plan" in skip else "not run (no cgpt step ran)"}
    if plan_proc is not None:
        try:
            out, _ = plan_proc.communicate(timeout=max(1.0, left()))
            lines = [ln for ln in out.splitlines() if ln.startswith(MARK)]
            plan = json.loads(lines[-1][len(MARK):]) if lines else {"error": "plan failed"}
        except subprocess.TimeoutExpired:
            plan_proc.kill()
            plan = {"error": "plan timed out"}
    print(report(a, jax_rows, torch_rows, plan, time.monotonic() - t0))
    for model in a.models.split(","):
        j, t = jax_rows[model, "on"], torch_rows[model]
        ok &= "error" not in j and ("error" not in t or "torch" in skip)
        if not a.smoke and "error" not in j and "error" not in t:
            ok &= t["step_s"] / j["step_s"] >= TARGET_RATIO
            ok &= model.upper() != "1.3B" or j["mfu"] >= TARGET_MFU
    return 0 if ok or a.smoke else 1


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("ok" if ok else "FAIL")


def report(a, jax_rows: dict, torch_rows: dict, plan: dict, wall_s: float) -> str:
    """The one table: a column per model, a row per check or figure, and the verdicts."""
    from cgpt.config.model import remat_value

    models = a.models.split(",")
    first = next((r for r in jax_rows.values() if "error" not in r), {})
    gib = lambda b: f"{b / 2**30:.1f} GiB" if b else "-"  # noqa: E731
    head = [f"gpu_check: {first.get('device', '?')} ({first.get('platform', '?')}), allocator "
            f"limit {gib(first.get('bytes_limit'))} of {gib(first.get('device_memory'))}, "
            f"jax {first.get('jax', '?')}; peak {first.get('peak', 0) / 1e12:.3g} TFLOP/s "
            f"({first.get('peak_source', '?')}); seq {a.seq}, batch {a.batch}, "
            f"{a.steps} timed steps; {wall_s:.0f} s in all"]
    if a.smoke:
        head.append("SMOKE RUN on the CPU: these are CPU numbers, not GPU figures")
    rows = [("check / figure", *models, "target", "verdict")]

    def row(label, cell, target="", verdict=None):
        cells, oks = [], []
        for m in models:
            try:
                text, ok = cell(m)
            except (KeyError, TypeError, ZeroDivisionError):
                err = (jax_rows.get((m, "on")) or {}).get("error") or "-"
                text, ok = (f"error: {err}" if err != "-" else "-"), None
            cells.append(text)
            oks.append(ok)
        known = [o for o in oks if o is not None]
        v = verdict if verdict is not None else (all(known) if known else None)
        rows.append((label, *cells, target, "-" if a.smoke and verdict is None else _verdict(v)))

    on = lambda m: jax_rows[m, "on"]  # noqa: E731
    off = lambda m: jax_rows[m, "off"]  # noqa: E731
    hlo = lambda m: on(m)["hlo"]  # noqa: E731
    row("cuDNN attention calls fwd/bwd",
        lambda m: (f"{hlo(m)['cudnn_fwd']}/{hlo(m)['cudnn_bwd']}",
                   hlo(m)["cudnn_fwd"] > 0 and hlo(m)["cudnn_bwd"] > 0), ">0/>0")
    row("LM head matmul operands",
        lambda m: (f"{','.join(hlo(m)['head_operand_dtypes'])} ({hlo(m)['head_matmuls']} "
                   "matmuls)", hlo(m)["head_matmuls"] > 0
                   and set(hlo(m)["head_operand_dtypes"]) <= {"bf16"}), "bf16 only")
    row("f32 all-gathers (this step)",
        lambda m: (f"{hlo(m)['f32_all_gathers']} of {hlo(m)['all_gathers']}",
                   hlo(m)["f32_all_gathers"] == 0), "0")
    ws = plan.get("ws") or {}
    rows.append((f"f32 all-gathers (plan: {ws.get('model', '?')} weight_streaming, 8 CPU)",
                 *[f"{ws['f32_all_gathers']} of {ws['all_gathers']}" if ws else
                   plan.get("error", "-")] + [""] * (len(models) - 1), "0",
                 _verdict(ws["f32_all_gathers"] == 0 if ws else None)))

    def choice(r):
        return f"{r['micro_batch']}x{r['accum']}, remat {remat_value(r['remat'])}"

    row("fit's choice on this device (micro x accum)", lambda m: (choice(on(m)), on(m)["fits"]))
    row("plan's choice (emulated CPU, XLA attention)",
        lambda m: (choice(plan[m]) + ("" if plan[m]["fits"] else ", no fit"), None),
        "", verdict=None)
    for label, src in (("cgpt, XLA GPU flags on", on), ("cgpt, XLA GPU flags off", off)):
        row(f"{label}: ms/step", lambda m, s=src: (f"{s(m)['step_s'] * 1e3:.1f}", None))
        row(f"{label}: tokens/s", lambda m, s=src: (f"{s(m)['tokens_per_s']:,.0f}", None))
        row(f"{label}: MFU causal (full)",
            lambda m, s=src: (f"{_pct(s(m)['mfu'])} ({_pct(s(m)['mfu_full'])})",
                              None if a.smoke or m.upper() != "1.3B" or s is off
                              else s(m)["mfu"] >= TARGET_MFU),
            f">={TARGET_MFU:.0%} at 1.3B" if src is on else "")
    tv = next((t.get("torch") for t in torch_rows.values() if "torch" in t), "?")
    row(f"pytorch {tv}{' compiled' if not a.smoke else ''}: ms/step",
        lambda m: (f"{torch_rows[m]['step_s'] * 1e3:.1f}", None))
    row("pytorch: tokens/s", lambda m: (f"{torch_rows[m]['tokens_per_s']:,.0f}", None))
    row("pytorch step / cgpt step (flags on)",
        lambda m: (f"{torch_rows[m]['step_s'] / on(m)['step_s']:.2f}x",
                   None if a.smoke else torch_rows[m]["step_s"] / on(m)["step_s"] >= TARGET_RATIO),
        f">={TARGET_RATIO}x")
    row("loss cgpt / pytorch (same random tokens)",
        lambda m: (f"{on(m)['loss']:.3f} / {torch_rows[m]['loss']:.3f}", None))
    errors = [f"  {k}: {r['error']}" for k, r in [*jax_rows.items(), *torch_rows.items()]
              if "error" in r and not r["error"].startswith("skipped")]
    return "\n".join([*head, table(rows), *(["errors:", *errors] if errors else [])])


if __name__ == "__main__":
    sys.exit(main())
