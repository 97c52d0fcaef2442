"""`cgpt plan` beyond the flags group's wrong types: meshes that do not factor or repeat an
axis, batches that do not divide, sizes past any machine, node layouts that do not add up,
and `--json` that must stay strict. As with MaxText's `ici_*`/`dcn_*` checks: a layout that
cannot be built is one line naming the axis and the numbers, before anything compiles; a valid
but hopeless one is reported as not fitting, not as an error."""
import json

from qa.registry import add

PLAN = ["plan", "--model", "tiny-17k", "--mode", "data_parallel"]


def _strict_json(res):
    try:
        obj = json.loads(res.stdout.strip().splitlines()[-1],
                         parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (ValueError, IndexError) as e:
        return f"--json did not print one strict JSON object: {e}"
    return None if isinstance(obj, dict) else "--json printed no object"


BAD = {  # name -> (argv, what the one line must name)
    "mesh_duplicate_axis": (PLAN + ["--mesh", "data=2,data=2"], "data"),
    "mesh_product_huge": (PLAN + ["--mesh", "data=100000000"], "data"),
    "mesh_negative": (PLAN + ["--mesh", "data=-2"], "mesh"),
    "mesh_empty_axis": (PLAN + ["--mesh", "data=2,,"], "mesh"),
    "mesh_and_devices_disagree": (PLAN + ["--mesh", "data=4", "--devices", "2"], "devices"),
    "batch_not_divisible": (PLAN + ["--mesh", "data=4", "--batch", "6"], "batch"),
    "batch_absurd": (PLAN + ["--batch", str(10 ** 30)], "batch"),
    "micro_batch_above_batch": (PLAN + ["--batch", "8", "--micro-batch", "64"], "micro"),
    "seq_len_past_context": (PLAN + ["--seq-len", "1000000"], "seq"),
    "seq_len_negative": (PLAN + ["--seq-len=-8"], "seq"),
    "device_memory_zero": (PLAN + ["--device-memory", "0"], "device-memory"),
    "device_memory_negative": (PLAN + ["--device-memory=-80GB"], "device-memory"),
    "nodes_zero": (PLAN + ["--nodes", "0", "--gpus-per-node", "8"], "nodes"),
    "nodes_without_gpus_per_node": (PLAN + ["--nodes", "2"], "--gpus-per-node"),
    "gpus_per_node_zero": (PLAN + ["--nodes", "2", "--gpus-per-node", "0"], "gpus-per-node"),
    "host_offload_removed": (PLAN + ["--host-offload"], "host-offload"),
    "mode_bogus": (["plan", "--model", "tiny-17k", "--mode", "tensor_parallel"],
                   "tensor_parallel"),
    "mode_single_with_mesh": (["plan", "--model", "tiny-17k", "--mode", "single", "--mesh",
                               "data=2"], "single"),
    "devices_absurd_no_compile": (PLAN + ["--devices", str(10 ** 12), "--no-compile"],
                                  "devices"),
    "pipeline_more_stages_than_layers": (["plan", "--model", "tiny-17k", "--mode",
                                          "layer_pipelined", "--mesh", "stage=64"], "stage"),
}
for _n, (_argv, _text) in BAD.items():
    add(_n, "error", "plan", lambda ctx, a=_argv, t=_text: {"argv": a, "expect_text": t,
                                                             "timeout": 600})

OK = {  # name -> argv: valid requests (a step that does not fit is a verdict, not an error)
    "device_memory_too_small_is_a_verdict": PLAN + ["--device-memory", "1KB", "--json"],
    "json_13B_no_compile": ["plan", "--model", "13B", "--no-compile", "--json"],
    "json_tiny_compiled": PLAN + ["--devices", "2", "--json"],
    "model_name_case_insensitive": ["plan", "--model", "TINY-17K", "--no-compile", "--json"],
}
for _n, _argv in OK.items():
    add(_n, "ok", "plan", lambda ctx, a=_argv: {"argv": a, "stdout_check": _strict_json,
                                                "timeout": 900})
