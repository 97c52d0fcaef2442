"""Every allocated GPU used: the JAX process setup built from SLURM environments, and the
start-up check that refuses a run whose devices differ from the allocation. Pure functions
(no GPU, no scheduler), plus one real `cgpt train` that refuses a CPU fallback."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cgpt.config import backend
from cgpt.sharding.allocation import (AllocationError, allocation_from_env, check_devices,
                                      init_args, layout)
from cgpt.train import fit

REPO = Path(__file__).resolve().parents[2]
EIGHT = "0,1,2,3,4,5,6,7"


def _slurm(nodes: int, tasks_per_node: int, gpus: int, procid: int, **extra) -> dict:
    """The variables `srun` sets in one task of a job of `nodes` x `tasks_per_node` tasks
    with `gpus` GPUs per node (every task of a node sees the node's GPUs)."""
    env = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": str(nodes * tasks_per_node),
           "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_PROCID": str(procid),
           "SLURM_LOCALID": str(procid % tasks_per_node),
           "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})" if nodes > 1
           else str(tasks_per_node),
           "SLURM_GPUS_ON_NODE": str(gpus), "CUDA_VISIBLE_DEVICES": EIGHT[:2 * gpus - 1]}
    return {**env, **extra}


def _devices(env: dict) -> list[int] | None:
    kw = init_args(allocation_from_env(env), env)
    return None if kw is None else kw.get("local_device_ids")


def test_two_nodes_of_eight_gpus_one_process_per_node():
    """cgpt's layout (sweeps/cerebras_gpt.yaml): each process drives its node's 8 GPUs,
    where JAX's own SLURM detection would give it [SLURM_LOCALID] = GPU 0 alone."""
    for rank in (0, 1):
        env = _slurm(2, 1, 8, rank)
        alloc = allocation_from_env(env)
        assert (alloc.nodes, alloc.processes, alloc.process_id, alloc.gpus_per_process) == (
            2, 2, rank, 8)
        assert init_args(alloc, env) == {"local_device_ids": [0, 1, 2, 3, 4, 5, 6, 7]}
        check_devices(alloc, "gpu", 16, 8, 2, nodes=2)  # what JAX then sees: accepted
    # what JAX's default gives (one GPU per process): refused, naming both numbers
    with pytest.raises(AllocationError, match=r"each of 2 process\(es\) 8 GPU\(s\), 16 in all, "
                                              r"but JAX sees 1 in this process and 2 in all"):
        check_devices(allocation_from_env(_slurm(2, 1, 8, 0)), "gpu", 2, 1, 2, nodes=2)


def test_two_nodes_of_eight_gpus_one_process_per_gpu():
    got = [_devices(_slurm(2, 8, 8, r)) for r in range(16)]
    assert got == [[r % 8] for r in range(16)]  # task k of its node: that node's GPU k
    alloc = allocation_from_env(_slurm(2, 8, 8, 11))
    assert (alloc.processes, alloc.tasks_per_node, alloc.local_id, alloc.gpus_per_process) == (
        16, 8, 3, 1)
    check_devices(alloc, "gpu", 16, 1, 16, nodes=2)
    # tasks bound to their own GPU (--gpus-per-task=1): each sees one, and takes it
    assert _devices(_slurm(2, 8, 8, 11, CUDA_VISIBLE_DEVICES="3")) == [0]
    with pytest.raises(AllocationError, match=r"has 16 process\(es\) but JAX joined 2"):
        check_devices(alloc, "gpu", 16, 8, 2, nodes=2)


def test_one_node_of_eight_gpus():
    env = _slurm(1, 1, 8, 0)
    alloc = allocation_from_env(env)
    assert init_args(alloc, env) is None  # one process: no job to join; JAX sees all 8
    check_devices(alloc, "gpu", 8, 8, 1, nodes=1)
    with pytest.raises(AllocationError, match=r"gives each process 8 GPU\(s\) but JAX found none "
                                              r"and fell back to CPU \(1 device\(s\)\).*requirements-gpu"):
        check_devices(alloc, "cpu", 1, 1, 1, nodes=1)
    check_devices(alloc, "cpu", 1, 1, 1, nodes=1, cpu_on_purpose=True)  # JAX_PLATFORMS=cpu
    with pytest.raises(AllocationError, match=r"8 GPU\(s\), 8 in all, but JAX sees 4"):
        check_devices(alloc, "gpu", 4, 4, 1, nodes=1)
    assert layout(alloc, 1, 1, 8, 8) == {"nodes": 1, "processes": 1, "devices_per_process": 8,
                                         "devices_total": 8, "allocation": "slurm"}


@pytest.mark.parametrize("env, message", [
    (_slurm(2, 3, 8, 0), r"8 GPUs per node cannot be split evenly over 3 tasks per node"),
    (_slurm(2, 2, 8, 1, CUDA_VISIBLE_DEVICES="0,1"),
     r"this task sees 2 GPU\(s\) \(CUDA_VISIBLE_DEVICES=0,1\) but should drive 4 of the node's 8"),
])
def test_allocations_that_cannot_be_split_are_refused(env, message):
    with pytest.raises(AllocationError, match=message):
        init_args(allocation_from_env(env), env)


def test_nodes_and_gpu_variables_are_compared():
    alloc = allocation_from_env(_slurm(2, 1, 8, 0))
    with pytest.raises(AllocationError, match=r"spans 2 node\(s\) but the 2 processes run on 1 "
                                              r"host"):
        check_devices(alloc, "gpu", 16, 8, 2, nodes=1)
    # SLURM_GPUS_PER_NODE with a type, when SLURM_GPUS_ON_NODE is absent
    env = {k: v for k, v in _slurm(2, 1, 8, 0).items() if k != "SLURM_GPUS_ON_NODE"}
    assert allocation_from_env({**env, "SLURM_GPUS_PER_NODE": "h100:8"}).gpus_per_node == 8
    # a SLURM job without GPUs (the CPU test cluster): process counts only
    cpu = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
    check_devices(allocation_from_env(cpu), "cpu", 8, 4, 2, nodes=2)
    # no scheduler: CUDA_VISIBLE_DEVICES, else the node's /dev/nvidiaN, states the GPUs
    assert allocation_from_env({"CUDA_VISIBLE_DEVICES": "2,3"}).gpus_per_process == 2
    assert allocation_from_env({}, gpus_present=4).gpus_per_process == 4
    assert allocation_from_env({}).gpus_per_process is None
    assert allocation_from_env({"CUDA_VISIBLE_DEVICES": ""}).gpus_per_process == 0
    check_devices(allocation_from_env({}), "cpu", 8, 8, 1)


def test_jax_variables_need_a_process_id():
    env = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
    assert init_args(allocation_from_env(env), env) == {
        "coordinator_address": "h:1", "num_processes": 2, "process_id": 1}
    del env["JAX_PROCESS_ID"]
    with pytest.raises(ValueError, match="JAX_PROCESS_ID"):
        init_args(allocation_from_env(env), env)


def test_gpu_memory_means_the_same_bytes_in_plan_and_run():
    """`plan --device-memory 80GB` is the GPU's memory; the run's allocator pool is exactly the
    fit's pool, of which a step may use all but POOL_MARGIN, and `device_memory_bytes()` reads
    the 80 GB back."""
    assert backend.GPU_MEM_FRACTION == pytest.approx(1 - fit.HEADROOM)
    env: dict = {}
    assert backend.gpu_allocator(env) == 0.9 and env == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.90"}
    hbm = 80 * 10**9
    limit = int(hbm * 0.9)  # what memory_stats()["bytes_limit"] reports under that fraction
    assert abs(backend.device_memory(limit, env) - hbm) <= 1
    assert abs(fit.pool_memory(backend.device_memory(limit, env)) - limit) <= 1
    assert fit.usable_memory(hbm) == int(limit * (1 - fit.POOL_MARGIN))
    # a user's own fraction wins; a smaller pool is what the fit then gets
    mine = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.75"}
    assert backend.gpu_allocator(mine) == 0.75 and mine["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.75"
    small = int(hbm * 0.75)
    assert abs(fit.pool_memory(backend.device_memory(small, mine)) - small) <= 1
    assert backend.device_memory(int(hbm * 0.95), {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".95"}) == hbm
    with pytest.raises(ValueError, match=r"XLA_PYTHON_CLIENT_MEM_FRACTION='1.5'"):
        backend.mem_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"})


def test_train_refuses_a_cpu_fallback_before_training(tmp_path):
    """A 1-node SLURM allocation of 8 GPUs where JAX finds only the CPU: one error line,
    nothing written."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "JAX_", "XLA_", "CUDA_"))}
    env.update(_slurm(1, 1, 8, 0), JAX_PLATFORMS="", PYTHONPATH=str(REPO))
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "cgpt", "train", "--model", "tiny-17k",
                           "--data", str(tmp_path), "--out", str(out), "--no-progress"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "cgpt train: error: the SLURM allocation (SLURM_JOB_NUM_NODES=1, SLURM_NTASKS=1, "
        "SLURM_TASKS_PER_NODE=1, SLURM_GPUS_ON_NODE=8) gives each process 8 GPU(s) but JAX "
        "found none and fell back to CPU (1 device(s)): install JAX's CUDA wheels (`pip "
        "install -r requirements-gpu.txt`, README: GPU clusters), or set JAX_PLATFORMS=cpu to "
        "train on the CPU on purpose"], proc.stderr
    assert not out.exists()


def test_signal_lead_and_grace_agree_with_the_spec():
    """The executor waits the spec's signal lead less the requeue margin, one process per node."""
    from cgpt.sweep import executors as ex
    from cgpt.sweep.spec import load_sweep

    assert ex.requeue_grace({}) == 60  # submitit's 90 s lead: the grace cgpt had before
    cluster = load_sweep(REPO / "sweeps" / "cerebras_gpt.yaml").runs[0].slurm
    assert ex.requeue_grace(cluster) == cluster["signal_delay_s"] - 30 == 270
    assert ex.requeue_grace({"signal_delay_s": 15}) == 10
    with pytest.raises(ValueError, match="slurm.signal_delay_s=0"):
        ex.requeue_grace({"signal_delay_s": 0})
    params = ex.slurm_params(cluster, None, 7, "cerebras_gpt")
    assert (params["tasks_per_node"], params["gpus_per_node"]) == (1, 8)
