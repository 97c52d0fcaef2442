"""Training several jobs in one process: fused groups, and a local sweep's runs one after another.

`main([--report])` (the sweep starts it with `python -c`, `executors._LAUNCH`) reads a JSON
list of `Job`s on stdin and trains them in this one process, in order: a lone run as `cgpt
train` would (`cgpt.train.loop.train`), a fused group with
`cgpt.train.fused_loop.train_fused`. One interpreter start, one import of
JAX and the model, compiled steps reused across same-shape jobs (and JAX's persistent
compilation cache across processes, as before). Every run directory is locked while its job
trains, and ends up as a `cgpt train` process would leave it: `train.log` (the job's output,
a fused group's in its first member's log), summary.json or failed.json.

The sweep uses it two ways (`cgpt.sweep.executors`): `execute_group` runs one fused group as
one process (SLURM: one job per group), and `run_one_process` runs a local sweep's jobs in
one worker, restarting a worker for the rest if one dies (a crashed job is failed, as a
crashed `cgpt train` is). `--parallel K` starts K such workers (`run_workers`), each pinned
to its share of the devices and given its share of the jobs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cgpt import rundir, stop
from cgpt.config import backend
from cgpt.config.run import from_dict, load_yaml
from cgpt.errors import RunDirError
from cgpt.sharding.axes import mesh_size
from cgpt.sharding.allocation import gpus_present
from cgpt.sweep.executors import _LAUNCH, Job, LiveRuns, RunTask, _wait_for_parent, \
    await_requeue, device_share, execute_run, outcome, prepare_job, slurm_tag, train_argv

RESULT = "CGPT-RESULT "  # prefix of a result line on the worker's report channel


def job_to_dict(job: Job) -> dict:
    return dataclasses.asdict(job)


def job_from_dict(d: dict) -> Job:
    return Job(**{**d, "pin": tuple(d.get("pin") or ()),
                  "members": tuple(job_from_dict(m) for m in d.get("members") or ())})


def _header(job: Job, first: Job, n: int, where: str = "") -> str:
    fused = (f" (fused with {n - 1} other run(s) into one program; its output is in "
             f"{Path(first.run_dir) / rundir.LOG_FILE})" if n > 1 and job is not first else
             f" ({n} runs fused into one program)" if n > 1 else "")
    return (f"==== cgpt sweep {time.strftime('%Y-%m-%d %H:%M:%S')}: python -m cgpt "
            f"{' '.join(train_argv(job))}{where}{fused}\n")


# ---- parent side --------------------------------------------------------------------------
def _spawn(jobs: list[Job], stdout, report: bool, extra_env: dict | None = None,
           cpus: list[int] | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **jobs[0].env, **(extra_env or {}))

    if backend.launch_platform(env, gpus_present()) == "cpu":  # as `cgpt train` keeps it
        env.update(backend.host_memory_env(env))  # glibc keeps the steps' freed memory
    argv = ["cgpt.sweep.worker"] + (["--report"] if report else [])
    # a local sweep's worker (`report`) is in a session of its own: a terminal's Ctrl-C reaches
    # the sweep alone, which stops its workers (`LiveRuns`), each once
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCH, "", str(os.getpid()),
                             ",".join(map(str, cpus or [])), *argv],
                            stdin=subprocess.PIPE, stdout=stdout, stderr=None if report
                            else subprocess.STDOUT, env=env, start_new_session=report)
    proc.stdin.write(json.dumps([job_to_dict(j) for j in jobs]).encode())
    proc.stdin.close()
    return proc


def execute_group(job: Job, live: LiveRuns | None = None) -> dict:
    """A fused group as one worker process with its output in the first member's train.log,
    registered in `live` (the launch's: its stop reaches the process); {'run_id', 'status',
    'members': [one result per run]} (never raises on failure)."""
    members, live = list(job.members), live or LiveRuns()
    for m in members:
        prepare_job(m)
    if job.branch_from and not _wait_for_parent(job, live.stopping):
        return {"run_id": job.run_id, "status": "failed", "members": [
            {"run_id": m.run_id, "status": "failed", "returncode": None,
             "error": f"parent {job.branch_from} did not produce its checkpoint"}
            for m in members]}
    log = Path(job.run_dir) / rundir.LOG_FILE
    t0 = time.monotonic()
    extra, cpus = device_share(*job.pin) if job.pin else ({}, [])
    where = (f" [cpus {','.join(map(str, cpus))}]" if cpus else "") + "".join(
        f" [{k}={v}]" for k, v in extra.items()) + slurm_tag()
    for m in members[1:]:
        with rundir.area(m.run_dir).append(Path(m.run_dir) / rundir.LOG_FILE) as f:
            f.write(_header(m, members[0], len(members), where))
    with rundir.area(job.run_dir).append(log) as f:
        f.write(_header(members[0], members[0], len(members), where))
        f.flush()
        if live.stopping.is_set():
            rc = None
        else:
            rc = live.wait(job.run_id, _spawn([job], f, report=False, extra_env=extra,
                                              cpus=cpus))
    await_requeue(rc)
    results = [outcome(m, rc, t0, log, live.stopping.is_set()) if rc is not None else
               {"run_id": m.run_id, "status": "interrupted", "error": "", "returncode": None}
               for m in members]
    worst = next((r["status"] for r in results if r["status"] != "done"), "done")
    return {"run_id": job.run_id, "status": worst, "members": results}


def execute_job(job: Job, live: LiveRuns | None = None) -> dict:
    """One job as its own process: a fused group (`execute_group`) or one run (`execute_run`)."""
    return execute_group(job, live) if job.members else execute_run(job, live)


class GroupTask(RunTask):
    """The SLURM callable for jobs that may be fused groups (checkpoint/requeue: RunTask's)."""

    def run(self, job: Job, live: LiveRuns) -> dict:
        return execute_job(job, live)


def run_one_process(jobs: list[Job], finished, pin: tuple = (),
                    live: LiveRuns | None = None) -> None:
    """Every job in one worker process, one after another; `finished(result)` per job as it
    ends. A worker that dies fails the job it was training; a new one takes the rest.
    pin: (slot, slots) of `run_workers`, whose `live` this worker joins: the worker runs on
    that share of the devices."""
    extra, cpus = device_share(*pin) if pin else ({}, [])
    key = f"<worker {pin[0]}>" if pin else "<worker>"
    pending = list(jobs)
    with live or LiveRuns() as live:
        while pending and not live.stopping.is_set():
            proc = _spawn(pending, subprocess.PIPE, report=True, extra_env=extra, cpus=cpus)
            with live.running(key, proc):
                for line in proc.stdout:
                    text = line.decode(errors="replace")
                    if text.startswith(RESULT):
                        res = json.loads(text[len(RESULT):])
                        pending = [j for j in pending if j.run_id != res["run_id"]]
                        finished(res)
                rc = proc.wait()
            if pending and not live.stopping.is_set() and rc not in (130, -signal.SIGINT):
                job = pending.pop(0)  # the one it was training when it died
                res = [outcome(m, rc or 1, time.monotonic(), Path(job.run_dir) / rundir.LOG_FILE)
                       for m in list(job.members) or [job]]
                finished(res[0] if not job.members else
                         {"run_id": job.run_id, "status": "failed", "members": res})
            elif pending:
                raise KeyboardInterrupt  # the worker was interrupted: so is the sweep


def split_slots(jobs: list[Job], seconds: dict[str, float], slots: int) -> list[list[Job]]:
    """The jobs dealt to `slots` workers, longest first, each to the least loaded (LPT: the
    long pole starts at once and the sweep ends soon after it); in each worker every parent
    trains before any branch, so no worker waits on a parent queued behind a branch."""
    shares: list[list[Job]] = [[] for _ in range(slots)]
    load = [0.0] * slots
    for job in sorted(jobs, key=lambda j: -seconds.get(j.run_id, 0.0)):
        k = load.index(min(load))
        shares[k].append(job)
        load[k] += seconds.get(job.run_id, 0.0)
    return [sorted(s, key=lambda j: bool(j.branch_from)) for s in shares]


def run_workers(jobs: list[Job], parallel: int, finished, seconds: dict[str, float]) -> None:
    """`--parallel K` locally: K worker processes (`run_one_process`), each pinned to its
    share of the devices (`device_share`: its own cores, or GPUs) and training its share of
    the jobs (`split_slots` by `seconds`, the estimate per job) one after another. On a CPU
    small models train faster one per core than one at a time on every core, and each worker
    keeps what `run_one_process` gives: one start-up, the next job compiled ahead."""
    device_share(0, parallel)  # fail now if K workers cannot each get a GPU
    shares = [(k, s) for k, s in enumerate(split_slots(jobs, seconds, parallel)) if s]
    lock = threading.Lock()

    def report(res: dict) -> None:  # from K threads: results.csv and the bar, one at a time
        with lock:
            finished(res)

    # the pool waits for its threads, so the workers are stopped (`live`) before it ends
    with ThreadPoolExecutor(max_workers=len(shares) or 1) as pool, LiveRuns() as live:
        futures = [pool.submit(run_one_process, share, report, (k, parallel), live)
                   for k, share in shares]
        for f in futures:
            f.result()


# ---- worker side --------------------------------------------------------------------------
def _train_edge(job: Job) -> int:
    """Train `job` here with `cgpt train`'s exit status and one-line messages: the per-run
    edge (`cgpt.stop.edge`), where one job's crash fails that job and the others go on."""
    return stop.edge("train", lambda: _train_here(job) or 0, job=True)


def _config(job: Job):
    path = Path(job.run_dir) / rundir.RUN_FILE
    return from_dict(load_yaml(str(path)), str(path))


def _train_here(job: Job) -> None:
    members = list(job.members) or [job]
    resume = job.resume or any((Path(m.run_dir) / rundir.CONFIG_FILE).exists() for m in members)
    if len(members) > 1:
        from cgpt.train.fused_loop import train_fused  # loads JAX: only when this runs

        train_fused([_config(m) for m in members], [m.run_dir for m in members], resume=resume,
                    progress=False)
        return
    from cgpt.train.loop import train  # loads JAX: only when this runs

    run, branch_from = _config(job), None
    if job.branch_from:
        # loads JAX: only when this runs
        from cgpt.train.branch import branch_run, parse_spec, precheck

        branch_from = parse_spec(job.branch_from)
        run = branch_run(branch_from[0], run)
        precheck(branch_from, run)
    train(run, Path(job.run_dir), resume=resume, progress=False, branch_from=branch_from)


@contextlib.contextmanager
def _output_to(log: Path):
    """fds 1 and 2 (ours, JAX's and XLA's) appended to `log` for the job."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = rundir.area(log.parent).open_fd(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                         "append to")
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def run_job(job: Job, redirect: bool, note: str = "") -> list[dict]:
    """Train one job here: lock its run directories, train, release; one result per run.
    `note`: a line for the job's train.log after its header (its compile-ahead)."""
    members = list(job.members) or [job]
    log, t0, locks = Path(job.run_dir) / rundir.LOG_FILE, time.monotonic(), []
    try:
        for m in members:
            try:  # a run directory the path rule refuses (`cgpt.paths`): this job fails
                if redirect:
                    prepare_job(m)
                fd = rundir.area(m.run_dir).open_fd(Path(m.run_dir) / rundir.LOCK_FILE,
                                                    os.O_RDWR | os.O_CREAT, "lock")
            except RunDirError as e:
                return [{"run_id": x.run_id, "status": "failed", "returncode": None,
                         "error": str(e)} for x in members]
            locks.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return [{"run_id": x.run_id, "status": "failed", "returncode": None,
                         "error": f"{Path(m.run_dir) / rundir.LOCK_FILE} is held: another process "
                         "is training this run"} for x in members]
        if redirect:
            for m in members:
                with rundir.area(m.run_dir).append(Path(m.run_dir) / rundir.LOG_FILE) as f:
                    cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))))
                    f.write(_header(m, members[0], len(members),
                                    f" [in the sweep's worker process, pid {os.getpid()}]"
                                    f" [cpus {cpus}]")
                            + note)
            if job.branch_from and not _wait_for_parent(job):
                return [{"run_id": job.run_id, "status": "failed", "returncode": None,
                         "error": f"parent {job.branch_from} did not produce its checkpoint"}]
            with _output_to(log):
                rc = _train_edge(job)
        else:
            rc = _train_edge(job)
        return [outcome(m, rc, t0, log) for m in members]
    finally:
        for fd in locks:
            os.close(fd)


class _Ahead:
    """While job i starts and trains, job i+1's programs compile in a background thread
    (`cgpt.train.warm`), into the persistent compilation cache the sweep sets: the next job
    then loads them instead of compiling; a fused group's step is kept in this process
    (`fused_loop.compile_group`). Not for a branch (it compiles for itself), and only with a
    cache (`--compile-cache none`: nothing is compiled ahead)."""

    def __init__(self, jobs: list[Job]):
        self.jobs, self.runner = jobs, None
        if len(jobs) > 1:
            from cgpt.train import warm  # loads JAX: only when this runs

            if warm.cache_enabled():
                self.runner, self.warm = warm.Ahead(), warm

    def _wanted(self, job: Job) -> bool:
        return not job.branch_from

    def next(self, i: int) -> str:
        """Join job i's compile-ahead (a line for its log, or ""), start job i+1's."""
        if self.runner is None:
            return ""
        name, done, err = self.runner.wait()
        note = ("" if name != self.jobs[i].run_id else
                f"compiled ahead while the previous job ran ({self.runner.seconds:.1f} s): "
                f"{', '.join(done)}\n" if done else
                f"compile-ahead failed ({err}); compiling at start-up\n" if err else "")
        nxt = self.jobs[i + 1] if i + 1 < len(self.jobs) else None
        if nxt is not None and self._wanted(nxt):
            if nxt.members:
                from cgpt.train.fused_loop import compile_group  # loads JAX: only when this runs

                self.runner.start(nxt.run_id,
                                  lambda: compile_group([_config(m) for m in nxt.members]))
            else:
                self.runner.start(nxt.run_id, lambda: self.warm.compile_run(_config(nxt)))
        return note


def _emulate_devices(jobs: list[Job]) -> None:
    """One process trains every job, and JAX fixes its CPU devices when it starts (the first
    compile-ahead): expose those the largest `train.mesh` asks for, as `cgpt train` does for
    its one run. A config that does not read is left to its job, which fails with its error."""
    from cgpt.sharding.distributed import devices_per_process  # loads JAX: only when this runs
    from cgpt.sharding import emulate_cpu_devices  # loads JAX: only when this runs

    sizes = [1]
    for job in jobs:
        for m in job.members or (job,):
            try:
                sizes.append(mesh_size(_config(m).train.mesh or "data=1"))
            except (OSError, ValueError):
                continue
    emulate_cpu_devices(devices_per_process(max(sizes)))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    report = "--report" in argv
    jobs = [job_from_dict(d) for d in json.load(sys.stdin)]
    channel = os.dup(1) if report else None
    if report:  # our own output goes to the sweep's stderr between jobs, not the channel
        os.dup2(2, 1)
    _emulate_devices(jobs)
    ahead = _Ahead(jobs)
    for i, job in enumerate(jobs):
        note = ahead.next(i)  # job i's compile-ahead joined; job i+1's started
        results = run_job(job, redirect=report, note=note)
        if channel is not None:
            res = results[0] if not job.members else {
                "run_id": job.run_id, "members": results,
                "status": next((r["status"] for r in results if r["status"] != "done"), "done")}
            try:
                os.write(channel, (RESULT + json.dumps(res) + "\n").encode())
            except BrokenPipeError:  # the sweep was killed: the run's files say what was done
                os._exit(128 + 13)   # the shell's code for SIGPIPE, no traceback
        if any(r["status"] == "interrupted" for r in results):
            return 130
    return max((0 if r.get("status") == "done" else 1 for r in results), default=0) \
        if not report and jobs else 0


if __name__ == "__main__":
    sys.exit(main())
