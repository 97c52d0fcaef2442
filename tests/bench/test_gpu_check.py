"""bench/gpu_check.py: its HLO reader, its order, budget and JSON, its one table, its plan
file, its refusal without a GPU, and its CPU smoke run as the GPU machine runs it: from the
repository root, nothing installed, no PYTHONPATH, without datasets, zstandard, submitit or
tensorboardX."""
import json
import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))
import gpu_check  # noqa: E402

# a GPU-compiled step's HLO, shortened: cuDNN attention, a cuBLAS head matmul in bf16, one whose
# operand is still f32, and a Triton GEMM fusion's dot
GPU_HLO = """
HloModule jit_step
%fused_gemm (p0: bf16[16,768], p1: bf16[768,50304]) -> f32[16,50304] {
  %p0 = bf16[16,768]{1,0} parameter(0)
  %p1 = bf16[768,50304]{1,0} parameter(1)
  ROOT %dot.9 = f32[16,50304]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}
}
ENTRY %main (a: bf16[16,768], w: bf16[768,50304], g: f32[768,50304]) -> f32[] {
  %a = bf16[16,768]{1,0} parameter(0)
  %w = bf16[768,50304]{1,0} parameter(1)
  %g = f32[768,50304]{1,0} parameter(2)
  %fmha = (bf16[8,2048,12,64]{3,2,1,0}, f32[8,12,2048]{2,1,0}, u8[0]{0}) custom-call(%a, %a, %a), custom_call_target="__cudnn$fmhaSoftmax"
  %fmha.bwd = (bf16[8,2048,12,64]{3,2,1,0}, u8[0]{0}) custom-call(%a, %a), custom_call_target="__cudnn$fmhaSoftmaxBackward"
  %gemm = (f32[16,50304]{1,0}, s8[4194304]{0}) custom-call(%a, %w), custom_call_target="__cublas$lt$matmul"
  %gemm.2 = (f32[16,768]{1,0}, s8[4194304]{0}) custom-call(%g, %w), custom_call_target="__cublas$gemm"
  %gemm.3 = (f32[16,768]{1,0}, s8[4194304]{0}) custom-call(%a, %a), custom_call_target="__cublas$gemm"
  ROOT %r = f32[] constant(0)
}
"""


def test_hlo_checks_read_the_compiled_step():
    h = gpu_check.hlo_checks(GPU_HLO, 50304)
    assert (h["cudnn_fwd"], h["cudnn_bwd"]) == (1, 1)
    assert h["head_matmuls"] == 3  # two cuBLAS calls with a 50304 dim and the fused dot
    assert h["head_operand_dtypes"] == ["bf16", "f32"]  # %g is an f32 operand: caught
    clean = GPU_HLO.replace("custom-call(%g, %w)", "custom-call(%a, %w)")
    assert gpu_check.hlo_checks(clean, 50304)["head_operand_dtypes"] == ["bf16"]


# ---- the parent: order, budget, JSON after each result, the table ----------------------------
def _jax(step_s, mfu, peak=60 * 2**30):
    hlo = {"cudnn_fwd": 10, "cudnn_bwd": 10, "head_matmuls": 3, "head_operand_dtypes": ["bf16"]}
    return {"device": "NVIDIA H100 80GB HBM3", "platform": "gpu", "jax": "0.11.2",
            "jaxlib": "0.11.2", "cuda_runtime": 13000, "cuda_driver": 13000, "cudnn": 91000,
            "cublas": 130100, "bytes_limit": 72 * 2**30, "device_memory": 80 * 2**30,
            "peak_in_use": peak, "peak": 989.5e12, "peak_source": "spec sheet: H100 SXM",
            "jax_platforms": "cuda", "flags_added": ["--a=1", "--b=2"], "micro_batch": 8,
            "accum": 1, "remat": "none", "how": "as planned", "fits": True,
            "predicted": 58 * 2**30, "step_s": step_s, "tokens_per_s": 16384 / step_s,
            "loss": 10.9, "flops_per_token": 8e9, "peak_total": 989.5e12, "mfu": mfu,
            "mfu_full": mfu * 1.1, "hlo": hlo}


def _torch(step_s):
    return {"step_s": step_s, "tokens_per_s": 16384 / step_s, "loss": 10.9, "torch": "2.11.0",
            "cuda": "13.0", "cudnn": 91000, "peak_in_use": 50 * 2**30, "compiled": True}


FUSED = {"model": "cpu-19m", "members": 8, "batch": 8, "seq": 256, "fused_step_s": 0.02,
         "alone_step_s": 0.015, "sequential_s": 0.12, "speedup": 6.0, "mfu_fused": 0.3,
         "mfu_alone": 0.05, "peak_in_use": 3 * 2**30, "predicted": 2 * 2**30,
         "jax_platforms": "cuda", "flags_added": ["--a=1"]}


def _args(**kw):
    a = SimpleNamespace(models="1.3B,111M", seq=2048, batch=8, steps=10, smoke=False, skip="",
                        fused_model="cpu-19m", fused_batch=8, fused_seq=256,
                        plan_file=Path("/nonexistent/gpu_plan.json"))
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def test_results_in_order_of_value_each_saved_as_it_finishes(tmp_path, monkeypatch, capsys):
    """The children run in order of value within the budget, the planned step is passed on,
    the flags-off run is the last, and $OUT/gpu_check.json holds every result so far."""
    plan = {"for": gpu_check._plan_for(_args()), "jax": "0.10.2", "entries": {
        "1.3B@8x2048": {"micro_batch": 4, "accum": 2, "remat": "save_attn", "predicted": 1},
        "111M@8x2048": {"micro_batch": 8, "accum": 1, "remat": "none", "predicted": 1},
        "cpu-19m@8x256": {"micro_batch": 8, "accum": 1, "remat": "none", "predicted": 1}}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    monkeypatch.setenv("OUT", str(tmp_path))
    calls, canned = [], {"1.3B": [_jax(0.30, 0.52), _jax(0.33, 0.47)], "111M": [_jax(0.05, 0.4)]}

    def spawn(args, env, timeout):
        saved = json.loads((tmp_path / "gpu_check.json").read_text()) if calls else None
        calls.append((args, env, timeout, saved))
        kind, model = args[1], args[3]
        return (canned[model].pop(0) if kind == "jax" else
                _torch(0.40 if model == "1.3B" else 0.07) if kind == "torch" else dict(FUSED))

    monkeypatch.setattr(gpu_check, "_spawn", spawn)
    a = _args(plan_file=tmp_path / "plan.json")
    assert gpu_check.run_all(a, gpu_check.FULL) == 0  # every target met
    kinds = [(c[0][1], c[0][3], c[1]["CGPT_GPU_XLA_FLAGS"]) for c in calls]
    assert kinds == [("jax", "1.3B", "1"), ("torch", "1.3B", "1"), ("jax", "111M", "1"),
                     ("torch", "111M", "1"), ("fused", "cpu-19m", "1"), ("jax", "1.3B", "0")]
    assert all(0 < c[2] <= gpu_check.FULL.budget_s <= 420 for c in calls)
    assert [c[2] for c in calls] == sorted((c[2] for c in calls), reverse=True)
    jax_env, torch_env = calls[0][1], calls[1][1]
    assert "JAX_PLATFORMS" not in jax_env or jax_env["JAX_PLATFORMS"] == os.environ.get(
        "JAX_PLATFORMS")  # the JAX child pins cuda itself
    assert torch_env["JAX_PLATFORMS"] == "cpu"  # JAX must not take the GPU from torch
    assert str(gpu_check.ROOT) in jax_env["PYTHONPATH"].split(os.pathsep)
    first = calls[0][0]
    assert first[first.index("--micro-batch") + 1] == "4"
    assert first[first.index("--remat") + 1] == "save_attn"
    assert "--micro-batch" not in calls[1][0]  # torch runs the whole batch
    order = ["1.3B/cgpt", "1.3B/pytorch", "111M/cgpt", "111M/pytorch", "fused",
             "1.3B/cgpt-flags-off"]
    for i, c in enumerate(calls[1:], 1):  # the JSON after i results holds those i
        assert list(c[3]["results"]) == order[:i] and c[3]["done"] is False
    final = json.loads((tmp_path / "gpu_check.json").read_text())
    assert final["done"] is True and list(final["results"]) == order
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("[")]
    assert len(lines) == 6 and "1.3B/cgpt: 300.0 ms/step" in lines[0]
    assert "1.33x cgpt's step" in lines[1] and "6.00x" in lines[4]
    assert final["table"] in out


@pytest.mark.parametrize("on_s,runs_off", [(150, True), (200, False)])
def test_the_flags_off_run_only_if_time_remains(monkeypatch, on_s, runs_off):
    """420 s in all: the flags-off run starts only if what is left exceeds the flags-on
    run's time (here 1.3B on, then torch's 100 s)."""
    now = [0.0]
    monkeypatch.setattr(gpu_check.time, "monotonic", lambda: now[0])
    monkeypatch.delenv("OUT", raising=False)
    runs = []

    def spawn(args, env, timeout):
        runs.append((args[1], env["CGPT_GPU_XLA_FLAGS"]))
        now[0] += on_s if args[1] == "jax" else 100
        return _jax(0.3, 0.5) if args[1] == "jax" else _torch(0.4)

    monkeypatch.setattr(gpu_check, "_spawn", spawn)
    gpu_check.run_all(_args(models="1.3B", skip="fused"), gpu_check.FULL)
    assert runs == [("jax", "1"), ("torch", "1")] + [("jax", "0")] * runs_off


def test_a_flag_xla_does_not_know_costs_one_result_not_all(monkeypatch):
    """XLA aborts on an unknown flag: after a flags-on child dies by a signal, the other JAX
    children run without cgpt's flags and say so."""
    monkeypatch.delenv("OUT", raising=False)
    envs = []

    def spawn(args, env, timeout):
        envs.append((args[1], env["CGPT_GPU_XLA_FLAGS"]))
        if len(envs) == 1:
            return {"error": "signal 6 (its stderr is above)"}
        return _jax(0.05, 0.4) if args[1] == "jax" else dict(FUSED)

    monkeypatch.setattr(gpu_check, "_spawn", spawn)
    assert gpu_check.run_all(_args(skip="torch"), gpu_check.FULL) == 1  # 1.3B did not run
    assert envs == [("jax", "1"), ("jax", "0"), ("fused", "0"), ("jax", "0")]


def test_report_is_one_table_with_verdicts():
    a = _args()
    results = {"1.3B/cgpt": _jax(1.00, 0.45), "1.3B/pytorch": _torch(1.10),
               "111M/cgpt": _jax(0.10, 0.40), "111M/pytorch": _torch(0.13),
               "fused": {**FUSED, "speedup": 4.0}, "1.3B/cgpt-flags-off": _jax(1.10, 0.41)}
    results["1.3B/cgpt"]["plan"] = {"micro_batch": 4, "accum": 2, "remat": "save_attn",
                                    "predicted": 63 * 2**30}
    text = gpu_check.report(a, gpu_check.FULL, results, "plan: gpu_plan.json", 321.0)
    lines = {ln.split("  ")[0]: ln for ln in text.splitlines()}
    assert "NVIDIA H100 80GB HBM3" in text and "72.0 GiB of 80.0 GiB" in text
    assert "cuDNN 91000, cuBLAS 130100" in text and "torch 2.11.0 (CUDA 13.0" in text
    assert lines["cuDNN attention calls fwd/bwd"].endswith("ok")
    assert lines["XLA GPU flags added (JAX_PLATFORMS)"].split()[-3:-1] == ["2", "(cuda)"]
    assert "4 x 2, remat save_attn, 63.0 GiB" in lines["plan: the fit on 81,559 MiB (CPU compile)"]
    assert "60.0 GiB / 58.0 GiB" in lines["GPU memory: peak in use / fit's prediction"]
    assert lines["cgpt, flags on: MFU causal (full)"].split()[-1] == "FAIL"  # 45% < 50%
    ratio = lines["pytorch step / cgpt step (flags on)"]
    assert "1.10x" in ratio and "1.30x" in ratio and ratio.endswith("FAIL")  # 1.1 < 1.2
    assert "4.00x (target >= 5x: FAIL)" in text
    assert "f32 all-gathers" not in text and "not measured on one GPU" in text
    assert "SMOKE" not in text and "errors:" not in text


def test_committed_plan_is_the_full_runs(tmp_path):
    """bench/gpu_plan.json, made by `--plan-only` on a CPU, is for the run the GPU machine
    makes (its models and sizes on an 80 GB H100) and every step in it fits."""
    plan = json.loads((BENCH / "gpu_plan.json").read_text())
    a = _args(plan_file=BENCH / "gpu_plan.json")
    entries, line = gpu_check.read_plan(a)
    assert plan["for"]["device_memory"] == 81_559 * 2**20 and line.startswith("plan: gpu_plan")
    assert set(entries) == {"1.3B@8x2048", "111M@8x2048", "cpu-19m@8x256"}
    assert all(e["fits"] and e["predicted"] <= e["usable_memory"] for e in entries.values())

    other = tmp_path / "other.json"
    other.write_text(json.dumps({**plan, "for": {**plan["for"], "device_memory": 80 * 10**9}}))
    stale, why = gpu_check.read_plan(_args(plan_file=other))
    assert stale == {} and "the fit searches on the GPU" in why


@pytest.mark.slow(reason="test_committed_plan_is_the_full_runs")
def test_plan_row_of_a_one_device_run():
    """`plan` of a one-device run (no mesh): the row gpu_check's plan half reads."""
    import jax

    from cgpt.plan.planning import plan_run

    r = plan_run(gpu_check._run_config("tiny-17k", 32, 2), 10**9, jax.devices("cpu")[:1],
                 platform="gpu")
    assert (r["mode"], r["mesh"], r["axes"], r["num_devices"]) == ("single", {}, {}, 1)
    assert r["fits"] and (r["micro_batch"], r["accum"], r["dtype"]) == (2, 1, "bfloat16")


# ---- as the GPU machine runs it ---------------------------------------------------------------
BLOCKED = ("datasets", "zstandard", "submitit", "tensorboardX")


def _clean_env(tmp_path: Path, **extra) -> dict:
    """No PYTHONPATH, no JAX/XLA settings; the optional packages made unimportable by a
    `usercustomize` in a user site of our own (PYTHONUSERBASE: every process imports it at
    start-up, and it adds no path that could shadow the checkout). A virtualenv has no user
    site: there the same code is a `sitecustomize` in a folder of its own on PYTHONPATH."""
    base = tmp_path / "userbase"
    if site.ENABLE_USER_SITE:
        hook = Path(sysconfig.get_path("purelib", "posix_user", vars={"userbase": str(base)}))
        name, path = "usercustomize.py", {}
    else:
        hook = tmp_path / "blocker"
        name, path = "sitecustomize.py", {"PYTHONPATH": str(hook)}
    hook.mkdir(parents=True, exist_ok=True)
    (hook / name).write_text(  # the path finder no longer finds them
        "import importlib.machinery as m\n"
        "orig = m.PathFinder.find_spec\n"
        "def find_spec(name, path=None, target=None):\n"
        f"    if name.split('.')[0] in {BLOCKED!r}:\n"
        "        return None\n"
        "    return orig(name, path, target)\n"
        "m.PathFinder.find_spec = staticmethod(find_spec)\n")
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    return {**env, **path, "PYTHONUSERBASE": str(base), "PYTHONDONTWRITEBYTECODE": "1",
            **extra}


def _run(tmp_path, *args, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/gpu_check.py", *args], cwd=ROOT,
                          env=_clean_env(tmp_path, **extra), capture_output=True, text=True,
                          timeout=1800)


def test_the_clean_environment_blocks_only_the_optional_packages(tmp_path):
    code = ("import sys\n"
            f"for n in {BLOCKED!r}:\n"
            "    try:\n"
            "        __import__(n)\n"
            "        sys.exit(n + ' imported')\n"
            "    except ModuleNotFoundError:\n"
            "        pass\n"
            "import numpy\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=BENCH, env=_clean_env(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout


def test_refuses_without_a_gpu(tmp_path):
    r = _run(tmp_path, "--models", "tiny-17k", "--skip", "torch,fused,off")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "no GPU visible to JAX" in r.stderr and "--smoke" in r.stderr
    assert "ms/step" not in r.stdout  # nothing measured, nothing estimated


@pytest.mark.slow(reason=(
    "the smoke run end to end (~60 s); its parts run by default (results saved in order, the "
    "report, the HLO checks, the committed plan)"))
def test_cpu_smoke_as_the_gpu_machine_runs_it(tmp_path):
    """`python3 bench/gpu_check.py --smoke` from the repository root in a clean environment:
    every part runs (with the committed smoke plan), one line per result in order of value,
    the JSON under $OUT, and this checkout's cgpt in every child."""
    out = tmp_path / "out"
    out.mkdir()
    r = _run(tmp_path, "--smoke", OUT=str(out))
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    assert "SMOKE RUN on the CPU: these are CPU numbers, not GPU figures" in r.stdout
    lines = [ln.split("] ")[1].split(":")[0] for ln in r.stdout.splitlines()
             if ln.startswith("[")]
    assert lines == ["tiny-17k/cgpt", "tiny-17k/pytorch", "fused"]  # no flags to turn off
    assert "errors:" not in r.stdout and "error:" not in r.stdout, r.stdout
    data = json.loads((out / "gpu_check.json").read_text())
    assert data["done"] and data["smoke"] and data["table"] in r.stdout
    res = data["results"]
    assert res["tiny-17k/cgpt"]["cgpt"] == str(ROOT) == res["fused"]["cgpt"]
    assert res["tiny-17k/cgpt"]["how"] == "as planned"  # bench/gpu_plan_smoke.json is current
    assert res["tiny-17k/cgpt"]["jax_platforms"] == "cpu"
    assert res["tiny-17k/cgpt"]["flags_added"] == []  # a CPU run: cgpt's GPU flags do not apply
    assert res["fused"]["members"] == 8 and res["fused"]["sequential_s"] > 0
    rows = {ln.split("  ")[0]: ln for ln in r.stdout.splitlines()}
    assert rows["LM head matmul operands"].split()[4:6] == ["f32", "(3"]  # CPU: f32 matmuls
    assert rows["cuDNN attention calls fwd/bwd"].split()[4] == "0/0"  # CPU: chunked attention


@pytest.mark.slow  # the plan half at the smoke sizes: a JAX process and two fit searches
def test_plan_only_writes_the_committed_smoke_plan(tmp_path):
    r = _run(tmp_path, "--smoke", "--plan-only", "--plan-file", str(tmp_path / "plan.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    made = json.loads((tmp_path / "plan.json").read_text())
    committed = json.loads((BENCH / "gpu_plan_smoke.json").read_text())
    assert made["for"] == committed["for"] and made["command"] == committed["command"]
    keys = ("micro_batch", "accum", "remat", "fits")
    assert {k: [e[x] for x in keys] for k, e in made["entries"].items()} == \
        {k: [e[x] for x in keys] for k, e in committed["entries"].items()}


def test_metrics_log_without_tensorboardx(tmp_path, monkeypatch, capsys):
    """A GPU image without tensorboardX still trains: metrics.jsonl only, and one line says so."""
    from cgpt.train.metrics import MetricsLog
    from cgpt.rundir import read_metrics

    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # `import tensorboardX` fails
    log = MetricsLog(tmp_path, 0)
    log.write({"step": 1, "loss": 2.5, "mfu": 0.4})
    log.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "loss": 2.5, "mfu": 0.4}]
    assert not (tmp_path / "events").exists()
    assert "tensorboardX is not installed" in capsys.readouterr().err
