"""bench/gpu_check.py: its HLO reader, its one table, its refusal without a GPU, and its CPU smoke
run on a machine without datasets, zstandard, submitit or tensorboardX."""
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPT = BENCH / "gpu_check.py"
sys.path.insert(0, str(BENCH))
import gpu_check  # noqa: E402

# a GPU-compiled step's HLO, shortened: cuDNN attention, a cuBLAS head matmul in bf16, one whose
# operand is still f32, a Triton GEMM fusion's dot, and two all-gathers (one f32)
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
  %ag = f32[768,50304]{1,0} all-gather-start(%g), dimensions={0}
  %ag.2 = bf16[768,50304]{1,0} all-gather(%w), dimensions={0}
  ROOT %r = f32[] constant(0)
}
"""


def test_hlo_checks_read_the_compiled_step():
    h = gpu_check.hlo_checks(GPU_HLO, 50304)
    assert (h["cudnn_fwd"], h["cudnn_bwd"]) == (1, 1)
    assert h["head_matmuls"] == 3  # two cuBLAS calls with a 50304 dim and the fused dot
    assert h["head_operand_dtypes"] == ["bf16", "f32"]  # %g is an f32 operand: caught
    assert (h["all_gathers"], h["f32_all_gathers"]) == (2, 1)
    clean = GPU_HLO.replace("custom-call(%g, %w)", "custom-call(%a, %w)")
    assert gpu_check.hlo_checks(clean, 50304)["head_operand_dtypes"] == ["bf16"]


def _jax(step_s, mfu, fits=True):
    hlo = {"cudnn_fwd": 10, "cudnn_bwd": 10, "head_matmuls": 3, "head_operand_dtypes": ["bf16"],
           "all_gathers": 0, "f32_all_gathers": 0}
    return {"device": "NVIDIA H100 80GB HBM3", "platform": "gpu", "jax": "0.11.0",
            "bytes_limit": 72 * 2**30, "device_memory": 80 * 2**30, "peak": 989.5e12,
            "peak_source": "spec sheet: H100 SXM", "micro_batch": 8, "accum": 1, "remat": False,
            "fits": fits, "step_s": step_s, "tokens_per_s": 16384 / step_s, "loss": 10.9,
            "mfu": mfu, "mfu_full": mfu * 1.1, "hlo": hlo}


def test_report_is_one_table_with_verdicts():
    a = SimpleNamespace(models="111M,1.3B", seq=2048, batch=8, steps=10, smoke=False)
    jax_rows = {("111M", "on"): _jax(0.10, 0.40), ("111M", "off"): _jax(0.12, 0.33),
                ("1.3B", "on"): _jax(1.00, 0.45), ("1.3B", "off"): _jax(1.10, 0.41)}
    torch_rows = {"111M": {"step_s": 0.13, "tokens_per_s": 1, "loss": 10.9, "torch": "2.11"},
                  "1.3B": {"step_s": 1.10, "tokens_per_s": 1, "loss": 10.9, "torch": "2.11"}}
    plan = {"111M": {"micro_batch": 8, "accum": 1, "remat": False, "fits": True},
            "1.3B": {"micro_batch": 4, "accum": 2, "remat": True, "fits": True},
            "ws": {"model": "111M", "f32_all_gathers": 39, "all_gathers": 40}}
    text = gpu_check.report(a, jax_rows, torch_rows, plan, 321.0)
    lines = {ln.split("  ")[0]: ln for ln in text.splitlines()}
    assert "NVIDIA H100 80GB HBM3" in text and "72.0 GiB of 80.0 GiB" in text
    assert lines["cuDNN attention calls fwd/bwd"].endswith("ok")
    assert lines["f32 all-gathers (plan: 111M weight_streaming, 8 CPU)"].endswith("FAIL")
    assert "4x2, remat full" in lines["plan's choice (emulated CPU, XLA attention)"]
    assert lines["cgpt, XLA GPU flags on: MFU causal (full)"].split()[-1] == "FAIL"  # 45% < 50%
    ratio = lines["pytorch step / cgpt step (flags on)"]
    assert "1.30x" in ratio and "1.10x" in ratio and ratio.endswith("FAIL")  # 1.1 < 1.2
    assert "SMOKE" not in text and "errors:" not in text


BLOCKED = ("datasets", "zstandard", "submitit", "tensorboardX")


def _run(tmp_path, *args, block=True, env=None):
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(  # every process of the run imports this first:
        # the path finder no longer finds them, as if not installed (find_spec gives None)
        "import importlib.machinery as m\n"
        "orig = m.PathFinder.find_spec\n"
        "def find_spec(name, path=None, target=None):\n"
        f"    if name.split('.')[0] in {BLOCKED!r}:\n"
        "        return None\n"
        "    return orig(name, path, target)\n"
        "m.PathFinder.find_spec = staticmethod(find_spec)\n")
    root = str(Path(__file__).resolve().parents[1])
    e = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {}),
         "PYTHONPATH": os.pathsep.join([str(site)] * block + [root])}
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=e, capture_output=True,
                          text=True, timeout=1200)


def test_the_blocker_blocks(tmp_path):
    r = _run(tmp_path, "--child", "nothing")  # argparse fails after sitecustomize ran
    assert r.returncode == 2
    probe = subprocess.run([sys.executable, "-c", "import tensorboardX"], capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, text=True)
    assert probe.returncode != 0 and "No module named 'tensorboardX'" in probe.stderr


def test_refuses_without_a_gpu(tmp_path):
    r = _run(tmp_path, "--models", "tiny-17k", "--skip", "torch,plan,off")
    assert r.returncode == 2 and "no GPU visible to JAX" in r.stderr and "--smoke" in r.stderr
    assert "ms/step" not in r.stdout  # nothing measured, nothing estimated


def test_cpu_smoke_of_the_cgpt_side_without_optional_packages(tmp_path):
    """One cgpt measurement (on the CPU the GPU flags do not apply: the flags-off run and the
    other parts are the slow test's); ~60 s on the 2-core machine at load 22."""
    r = _run(tmp_path, "--smoke", "--models", "tiny-17k", "--skip", "torch,plan,off")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "SMOKE RUN on the CPU: these are CPU numbers, not GPU figures" in r.stdout
    rows = {ln.split("  ")[0]: ln for ln in r.stdout.splitlines()}
    assert rows["LM head matmul operands"].split()[4:6] == ["f32", "(3"]  # CPU: f32 matmuls
    assert rows["cuDNN attention calls fwd/bwd"].split()[4] == "0/0"  # CPU: chunked attention
    assert "2x1, remat save_dots" in rows["fit's choice on this device (micro x accum)"]
    assert float(rows["cgpt, XLA GPU flags on: ms/step"].split()[-2]) > 0


@pytest.mark.slow  # every part: the PyTorch side and plan's compiles too (minutes under load)
def test_cpu_smoke_of_every_part_without_optional_packages(tmp_path):
    r = _run(tmp_path, "--smoke")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "pytorch step / cgpt step (flags on)" in out and "errors:" not in out, out
    assert "f32 all-gathers (plan: tiny-45k weight_streaming, 8 CPU)" in out


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
