"""`cgpt plan` and `cgpt sweep --dry-run` asked for what no machine has: meshes past any
cluster or of odd shape, batches and contexts of 1e9+, node counts in the millions, memory of
a byte or an exabyte, models of a trillion parameters, grids of thousands of runs. A plan must
answer (fits / does not fit, with its numbers) or refuse with one line naming the flag, in
seconds, and never allocate what it describes (the `plan` group tries malformed meshes and
values of the wrong sign; these are the well-formed absurd ones)."""
import json

import yaml

from qa.registry import add

PLAN = ["plan", "--model", "tiny-17k", "--no-compile", "--json"]


def _plan_json(res):
    """One strict JSON object on stdout's last line, with finite numbers."""
    try:
        json.loads(res.stdout.strip().splitlines()[-1],
                   parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (ValueError, IndexError) as e:
        return f"--json did not print one strict JSON object: {e}"
    return None


CASES = {  # name -> (argv, expect, what a refusal must name)
    "devices_one_million": (PLAN + ["--devices", "1000000"], "either", "devices"),
    "nodes_one_million": (PLAN + ["--nodes", "1000000", "--gpus-per-node", "8"], "either",
                          "nodes"),
    "gpus_per_node_1e6": (PLAN + ["--nodes", "2", "--gpus-per-node", "1000000"], "either",
                          "gpus-per-node"),
    "mesh_stage_1e6_13B": (["plan", "--model", "13B", "--mode", "layer_pipelined", "--mesh",
                            "stage=1000000", "--no-compile", "--json"], "error", "stage"),
    "mesh_prime_devices": (PLAN + ["--mesh", "data=7", "--batch", "14"], "ok", None),
    "mesh_prime_batch_mismatch": (PLAN + ["--mesh", "data=7", "--batch", "8"], "error",
                                  "batch"),
    "mesh_three_axes_product_1e9": (PLAN + ["--mesh", "data=1000,fsdp=1000,stage=1000"],
                                    "error", "mesh"),
    "batch_1e9": (PLAN + ["--batch", "1000000000"], "either", "batch"),
    "batch_2_pow_63": (PLAN + ["--batch", str(2 ** 63)], "error", "batch"),
    "seq_len_1e9_13B": (["plan", "--model", "13B", "--seq-len", "1000000000", "--no-compile",
                         "--json"], "error", "seq"),
    "micro_batches_1e9": (PLAN + ["--batch", "8", "--micro-batches", "1000000000"], "error",
                          "micro"),
    # --mode auto: no mode fits a byte, and that, with each mode's need, is the answer
    "device_memory_one_byte": (PLAN + ["--device-memory", "1"], "either", "1 B per device"),
    "device_memory_exabyte": (PLAN + ["--device-memory", "1EB"], "either", "device-memory"),
    "device_memory_1e400": (PLAN + ["--device-memory", "1e400"], "error", "device-memory"),
    "device_memory_nan": (PLAN + ["--device-memory", "nan"], "error", "device-memory"),
    "device_memory_spaces": (PLAN + ["--device-memory", " 80 GB "], "either", "device-memory"),
    "device_memory_gib": (PLAN + ["--device-memory", "80GiB"], "ok", None),
    "device_memory_lowercase_unit": (PLAN + ["--device-memory", "80gb"], "either",
                                     "device-memory"),
    "devices_2_pow_40_13B": (["plan", "--model", "13B", "--devices", str(2 ** 40),
                              "--no-compile", "--json"], "either", "devices"),
    "nodes_times_gpus_overflow": (PLAN + ["--nodes", str(2 ** 40), "--gpus-per-node",
                                          str(2 ** 40)], "error", "nodes"),
    # a valid (wasteful) plan: data=1, fsdp=64, every device on the one sequence; its numbers
    # are the answer (strict JSON, checked)
    "batch_1_on_64_devices": (PLAN + ["--devices", "64", "--batch", "1"], "either", "batch"),
    "seq_len_1_tiny": (PLAN + ["--seq-len", "1"], "either", "seq"),
}
for _n, (_argv, _expect, _text) in CASES.items():
    add(_n, _expect, "planabsurd", lambda ctx, a=_argv, t=_text: {
        "argv": a, "timeout": 300, "stdout_check": _plan_json_if_ok,
        **({"expect_text": t} if t else {})})


def _plan_json_if_ok(res):
    return _plan_json(res) if res.returncode == 0 else None


BASE = {"name": "absurd", "base": {"preset": "tiny-17k",
                                   "data": {"vocab_size": 512, "seq_len": 16},
                                   "train": {"batch_size": 4, "tokens": 640}},
        "grid": {"model": ["tiny-17k"], "seed": [0]}}


def _spec(grid=None, train=None, **top):
    s = json.loads(json.dumps(BASE))
    s["grid"].update(grid or {})
    s["base"]["train"].update(train or {})
    s.update(top)
    return s


DRY = {  # name -> (spec, expect, what a refusal must name)
    "grid_5000_runs": (_spec({"seed": list(range(5000))}), "either", "runs"),
    "grid_tokens_1e18": (_spec({"tokens": [1e18]}), "either", "tokens"),
    "grid_flops_1e40": (_spec({"flops": [1e40]}), "either", "flops"),
    "grid_tokens_per_param_1e9": (_spec({"tokens_per_param": [1e9]}), "either", "tokens"),
    "grid_model_13B_to_1e15_tokens": (_spec({"model": ["13B"], "tokens": [1e15]}), "either",
                                      "tokens"),
    "base_batch_1e9": (_spec(train={"batch_size": 1000000000}), "error", "batch_size"),
    "grid_tokens_below_one_batch": (_spec({"tokens": [3]}), "error", "tokens"),
    "estimate_flops_per_s_1e-30": (_spec(estimate={"flops_per_s": 1e-30}), "either",
                                   "flops_per_s"),
    "estimate_flops_per_s_1e300": (_spec(estimate={"flops_per_s": 1e300}), "ok", None),
    "slurm_nodes_1e6": (_spec(slurm={"nodes": 1000000, "gpus_per_node": 8}), "either",
                        "nodes"),
}


def _dry(spec, text):
    def make(ctx):
        p = ctx.fresh("spec.yaml")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(spec))
        return {"argv": ["sweep", str(p), "--out", str(ctx.fresh("sw")), "--dry-run",
                         "--no-fit"], "timeout": 300, **({"expect_text": text} if text else {})}
    return make


for _n, (_s, _expect, _text) in DRY.items():
    add(f"dry_run_{_n}", _expect, "planabsurd", _dry(_s, _text))
