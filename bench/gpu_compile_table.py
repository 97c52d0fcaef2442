"""The published presets as the H100's own compiler sees them, without a GPU: per row, the
bytes per device the compiled step needs (`cgpt plan --target h100`) beside the analytic
model's (`--no-compile`) and their ratio, the micro-batch and remat chosen, the kernels and
the collective bytes by kind and dtype. Needs JAX's CUDA plugin (requirements-gpu.txt).

    python bench/gpu_compile_table.py [--rows issue|presets|all] [--out bench/gpu_compile.json]

Prints a Markdown table (docs/gpu_compile.md holds the latest) and writes every plan's JSON.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ISSUE_ROWS = [  # (label, plan arguments): the rows the CPU plan got wrong by 1.6-5x
    ("111M data_parallel 8", "--model 111M --mode data_parallel --devices 8 --batch 64 "
                             "--micro-batch 8 --remat none"),
    ("111M weight_streaming 8", "--model 111M --mode weight_streaming --devices 8 --batch 64 "
                                "--micro-batch 8 --remat none"),
    ("111M layer_pipelined stage=2,data=4", "--model 111M --mode layer_pipelined --mesh "
                                            "stage=2,data=4 --batch 64 --micro-batch 8 "
                                            "--remat none"),
    ("1.3B data_parallel 8", "--model 1.3B --mode data_parallel --devices 8 --batch 88 "
                             "--micro-batch 11 --remat none"),
    ("1.3B weight_streaming 8", "--model 1.3B --mode weight_streaming --devices 8 --batch 88 "
                                "--micro-batch 11 --remat none"),
    ("1.3B one device, save_attn", "--model 1.3B --devices 1 --batch 8 --micro-batch 8 "
                                   "--remat save_attn"),
]
PRESET_ROWS = [(f"{m} weight_streaming 8, published batch, fit's choice",
                f"--model {m} --mode weight_streaming --devices 8")
               for m in ("111M", "256M", "590M", "1.3B", "2.7B", "6.7B")]


def _plan(args: str, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "cgpt", "plan", "--json", "--seq-len", "2048", *args.split(),
           *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _gb(b: float) -> str:
    return f"{b / 1e9:.3g} GB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", choices=("issue", "presets", "all"), default="all")
    ap.add_argument("--out", type=Path, default=Path("bench/gpu_compile.json"))
    a = ap.parse_args()
    rows = {"issue": ISSUE_ROWS, "presets": PRESET_ROWS, "all": ISSUE_ROWS + PRESET_ROWS}[a.rows]
    out = []
    print("| configuration | H100 compile | analytic | analytic / compile | step (micro x accum, "
          "remat) | compiles | cuDNN fwd/bwd calls | reductions by dtype |")
    print("|---|---|---|---|---|---|---|---|")
    for label, args in rows:
        t0 = time.monotonic()
        gpu = _plan(args, ["--target", "h100"])
        seconds = time.monotonic() - t0
        if "error" in gpu:
            print(f"| {label} | error: {gpu['error']} | | | | | | |", flush=True)
            out.append({"label": label, "args": args, "h100": gpu})
            continue
        mesh = ",".join(f"{k}={v}" for k, v in gpu["mesh"].items())
        # the analytic figure of the very step compiled: its mode, mesh, micro-batch and remat
        ana = _plan(f"--model {label.split()[0]} --mode {gpu['mode']} --batch {gpu['batch']} "
                    f"--micro-batch {gpu['micro_batch']} --remat {gpu['remat']} "
                    + (f"--mesh {mesh}" if mesh else f"--devices {gpu['num_devices']}"),
                    ["--no-compile", "--device-memory", str(gpu["device_memory"])])
        c = gpu["per_device_bytes"]["total"]
        an = ana.get("per_device_bytes", {}).get("total")
        calls = gpu["kernel_calls"]
        red = ", ".join(f"{k} {_gb(v)}" for k, v in sorted(gpu["collective_bytes_by_dtype"].items())
                        if v >= 1e6)
        print(f"| {label} | {_gb(c)} | {_gb(an) if an else ana.get('error')} | "
              f"{f'{an / c:.2f}' if an else ''} | {gpu['micro_batch']} x {gpu['accum']}, "
              f"{gpu['remat']} | {len(gpu['fit']['tried'])} ({seconds:.0f} s) | "
              f"{calls.get('__cudnn$fmhaSoftmax', 0)}/{calls.get('__cudnn$fmhaSoftmaxBackward', 0)}"
              f" | {red} |", flush=True)
        out.append({"label": label, "args": args, "h100": gpu, "analytic": ana,
                    "seconds": round(seconds, 1)})
        a.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
