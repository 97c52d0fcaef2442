"""A bound on joining a multi-process job: one line naming the job, the processes that never
came and the fix, instead of JAX's join timeout, which aborts with a C++ stack trace."""
from __future__ import annotations

import contextlib
import os
import sys
import threading

INIT_MIN_S = 60  # the shortest wait for every process of the job to join


@contextlib.contextmanager
def bound(alloc, kw: dict, seconds: float):
    """Within it, a timer ends this process with one line when the job is not joined in
    `seconds`: JAX's own join timeout ends in a C++ abort with no word of which job waited for
    whom (SLURM variables of a job step copied into a shell that srun did not start, say)."""
    def fire() -> None:
        job = os.environ.get("SLURM_JOB_ID")
        what = (f"SLURM job {job}" if job and alloc.source != "jax_env" else
                f"the job at {kw.get('coordinator_address')}")
        others = ", ".join(str(i) for i in range(alloc.processes) if i != alloc.process_id)
        fix = ("start every process with srun (a shell that srun did not start has no other "
               "processes), or run one process with `env -u SLURM_NTASKS -u SLURM_STEP_NODELIST "
               "cgpt ...`" if what.startswith("SLURM") else
               "start every process (JAX_PROCESS_ID 0 .. JAX_NUM_PROCESSES-1) with the same "
               "JAX_COORDINATOR_ADDRESS, or raise --peer-timeout")
        cmd = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else ""
        print(f"cgpt{' ' + cmd if cmd else ''}: error: {what}: process {alloc.process_id} "
              f"waited {seconds:.0f} s and not all of its {alloc.processes} processes joined "
              f"(the others are {others}); {fix}", file=sys.stderr, flush=True)
        os._exit(2)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
