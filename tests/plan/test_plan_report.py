"""`cgpt plan`'s report names the one step `cgpt train` would run and labels every other step
it costed an alternative; it says how --devices was read (nodes x devices per node) and that
the cost model's communication time is the exposed part of the traffic."""
from cgpt.cli import main
from cgpt.plan.costs import format_cost


def _plan(capsys, *argv) -> str:
    assert main(["plan", "--model", "111M", "--platform", "gpu", "--no-compile", *argv]) == 0
    return capsys.readouterr().out


def test_devices_beyond_one_node_say_how_they_were_read(capsys):
    one = _plan(capsys, "--devices", "16")
    assert "16 devices = 1 node(s) x 16, read as one node" in one and "--nodes N" in one
    two = _plan(capsys, "--nodes", "2", "--gpus-per-node", "8")
    assert "16 devices = 2 node(s) x 8" in two and "read as one node" not in two
    assert "read as one node" not in _plan(capsys, "--devices", "8")
    assert "\nstep          train runs: micro-batch" in one


def test_the_step_train_runs_and_the_alternatives_are_labelled():
    def step(mode, total):
        return {"mode": mode, "mesh": {"data": 8}, "total_s": total, "compute_s": 0.002,
                "remat_s": 0.0, "bubble_s": 0.0, "bubble_fraction": None, "comm_s": 0.0003,
                "micro_batch": 8, "accum": 1, "remat": False, "fits": True}

    chosen = step("weight_streaming", 0.003)
    lines = format_cost({"hardware": "H100 SXM", "peak_flops": 989e12,
                         "nvlink_bytes_per_s": 450e9, "network_bytes_per_s": 50e9,
                         "chosen": chosen, "cheapest": None,
                         "candidates": [chosen, step("data_parallel", 0.005)]})
    assert [x.split()[0] for x in lines[1:]] == ["train", "alternative"]
    assert lines[1].startswith("  train runs  weight_streaming") and "exposed comm" in lines[1]
    assert "data_parallel" in lines[2] and "(auto ranked it 2)" in lines[2]
