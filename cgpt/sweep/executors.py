"""Executing runs: one `python -m cgpt train` process per run, locally or in SLURM jobs.

`execute_run` runs one training process with its output in the run's `train.log`; the local
executor calls it from K worker threads (each run pinned to its share of the devices), the
SLURM executors submit it as a submitit job array. The submitted callable (`RunTask`) follows
submitit's checkpoint/requeue protocol: on the scheduler's signal before a time limit it asks
the training process to checkpoint (train does so on SIGTERM/SIGUSR1/SIGUSR2 and exits), and
the requeued job resumes from that checkpoint.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

from cgpt import rundir
from cgpt.errors import Stopped
from cgpt.fileio import atomic_write_text, storage_fix
from cgpt.sweep.state import log_error

# AutoExecutor's cluster-independent parameters; every other `slurm:` key gets a slurm_ prefix.
SUBMITIT_GENERIC = ("timeout_min", "mem_gb", "gpus_per_node", "cpus_per_task", "nodes",
                    "tasks_per_node", "stderr_to_stdout")
# Exit statuses of a train that checkpointed and stopped on a signal (cgpt.train.preempt).
SIGNAL_EXITS = {128 + s for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)}
SUBMITIT_SIGNAL_DELAY_S = 90  # submitit's slurm_signal_delay_s when a spec sets none
GRACE_ENV = "CGPT_SAVE_GRACE_S"  # the grace, passed to train
REQUEUE_MARGIN_S = 30  # of the signal's lead, kept for submitit's requeue (scontrol) itself


def requeue_grace(slurm: dict) -> float:
    """Seconds `RunTask.checkpoint` waits for the checkpoint on the time-limit signal: the
    spec's `slurm.signal_delay_s` (submitit's 90 when unset) less the requeue margin (30 s,
    or a third of a shorter lead). One number for both, so they cannot disagree; train warns
    when its measured save time exceeds it (cgpt.train.checkpoint)."""
    lead = float(slurm.get("signal_delay_s", SUBMITIT_SIGNAL_DELAY_S))
    if lead <= 0:
        raise ValueError(f"slurm.signal_delay_s={lead:g}: must be > 0 seconds (the time "
                         "between SLURM's signal and the time limit, for the checkpoint)")
    return lead - min(REQUEUE_MARGIN_S, lead / 3)


@dataclass(frozen=True)
class Job:
    """Everything a worker needs to run one training process; picklable for submitit."""

    run_id: str
    run_dir: str
    resume: bool
    env: dict = field(default_factory=dict, hash=False)  # extra environment (compile cache)
    pin: tuple = ()  # (slot, slots): local runs get their own share of the devices
    branch_from: str = ""  # "PARENT_DIR@STEP" for a cooldown branch (waits for the checkpoint)
    files: dict = field(default_factory=dict, hash=False)  # name -> text the run dir starts with
    members: tuple = ()  # a fused group's Jobs, this one's first (cgpt.sweep.groups)


# Launcher run as `python -c`: ignore SIGUSR1/2 until train handles them (an early time-limit
# signal must not kill it: `cgpt.stop`), hold the run's lock for the whole training process
# (the fd is inherited across exec), pin to its CPU share, die with the parent
# (PR_SET_PDEATHSIG, Linux) so a killed sweep leaves no orphan writing the run dir, then exec
# the entry point: `cgpt` as `python -m cgpt` (its entry installs the signal guard before it
# imports the commands), the sweep's worker by installing the quiet guard (`StopGuard.install`:
# the sweep says a stop's line), importing it and calling its `main`. `python -m` ran the
# worker as a second copy, `__main__`, of a module its package had already imported
# (`cgpt.sweep` -> launch -> worker): runpy's RuntimeWarning in every worker's output.
_LAUNCH = r"""
from cgpt.stop import ignore_checkpoint_requests
ignore_checkpoint_requests()
import ctypes, fcntl, os, signal, sys
lock_path, parent, cpus, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
if lock_path:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.exit(f"cgpt sweep: {lock_path} is held: another process is training this run")
    os.set_inheritable(fd, True)
if cpus:
    os.sched_setaffinity(0, [int(c) for c in cpus.split(",")])
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit("cgpt sweep: the sweep process exited before this run started")
if argv[0] == "cgpt":  # argv: module, then its args
    os.execv(sys.executable, [sys.executable, "-m", *argv])
os.execv(sys.executable, [sys.executable, "-c", "from cgpt.stop import GUARD; "
                          "GUARD.install('train', quiet=True); from " + argv[0]
                          + " import main; GUARD.finish(main())", *argv[1:]])
"""


class LiveRuns:
    """The training processes one launch is running, so that a stop reaches them: each
    executor call (`run_one_process`, `run_workers`, `run_submitit`) and each SLURM job
    (`RunTask`) has its own, nothing is kept in the module.

    The one place a sweep answers a stop: the launch's main thread gets Ctrl-C or a
    scheduler's signal from the process's guard (`KeyboardInterrupt`, `Stopped`:
    `cgpt.stop`), and leaving this context on it sends every live run Ctrl-C, waits for them
    (`grace_s`), SIGKILLs the rest and runs the `on_stop` callbacks; the stop goes on up to
    `cgpt.sweep.launcher`, which records the results and says the line."""

    def __init__(self, grace_s: float = 20.0) -> None:
        self.procs: dict[str, subprocess.Popen] = {}  # run_id or worker -> its process
        self.lock = threading.Lock()
        self.stopping = threading.Event()  # set: start nothing more
        self.grace_s = grace_s
        self._on_stop: list = []

    def __enter__(self) -> "LiveRuns":
        return self

    def __exit__(self, kind, e, tb) -> None:
        if kind is not None and issubclass(kind, (KeyboardInterrupt, Stopped)):
            self.stop()

    def on_stop(self, fn) -> None:
        """`fn()` when the runs are stopped (submitit's local jobs cancelled, say)."""
        self._on_stop.append(fn)

    def get(self, key: str) -> subprocess.Popen | None:
        with self.lock:
            return self.procs.get(key)

    @contextlib.contextmanager
    def running(self, key: str, proc: subprocess.Popen) -> Iterator[None]:
        """`proc` registered while the block runs, so that a stop reaches it; a stop that
        ends the block (the main thread's Ctrl-C) leaves it registered, for `stop`."""
        with self.lock:
            self.procs[key] = proc
        yield
        with self.lock:
            self.procs.pop(key, None)

    def wait(self, key: str, proc: subprocess.Popen) -> int:
        """Wait for a training process, registered meanwhile."""
        with self.running(key, proc):
            return proc.wait()

    def stop(self, grace_s: float | None = None) -> None:
        """SIGINT the live runs (train saves nothing extra, but exits cleanly), then SIGKILL
        those still running after the grace. Once: a worker thread and the main thread may
        both leave on the same stop."""
        with self.lock:
            if self.stopping.is_set():
                return
            self.stopping.set()
            procs = list(self.procs.values())
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        deadline = time.monotonic() + (self.grace_s if grace_s is None else grace_s)
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        for fn in self._on_stop:
            fn()


# ---- devices -----------------------------------------------------------------------------
def visible_gpus() -> list[str]:
    """GPU ids this process may use, without initializing JAX (which would claim them all)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def device_share(slot: int, slots: int, gpus: list[str] | None = None,
                 cpus: list[int] | None = None) -> tuple[dict, list[int]]:
    """Slot `slot` of `slots` parallel runs -> (env, cpu list): its own GPUs when there are
    GPUs (CUDA_VISIBLE_DEVICES), else its own share of the cores (sched_setaffinity)."""
    gpus = visible_gpus() if gpus is None else gpus
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else cpus
    if gpus:
        if slots > len(gpus):
            raise ValueError(f"--parallel {slots} exceeds the {len(gpus)} visible GPU(s): each "
                             f"run needs its own; use --parallel {len(gpus)} or fewer")
        k = len(gpus) // slots
        return {"CUDA_VISIBLE_DEVICES": ",".join(gpus[slot * k:(slot + 1) * k])}, []
    k = max(1, len(cpus) // slots)
    start = (slot * k) % len(cpus)
    return {}, cpus[start:start + k]


# ---- one run -------------------------------------------------------------------------------
def train_argv(job: Job) -> list[str]:
    """The `python -m cgpt ...` arguments of one run."""
    d = Path(job.run_dir)
    argv = ["train", "--config", str(d / rundir.RUN_FILE), "--out", str(d), "--no-progress"]
    if job.branch_from:
        argv += ["--branch-from", job.branch_from]
    return argv + (["--resume"] if job.resume else [])


def _wait_for_parent(job: Job, stopping: threading.Event | None = None,
                     poll_s: float = 2.0) -> bool:
    """A branch starts once its parent's checkpoint exists; False if the parent failed or the
    launch is `stopping`."""
    parent, _, step = job.branch_from.rpartition("@")
    p = Path(parent)
    while stopping is None or not stopping.is_set():
        if (p / rundir.CKPT_DIR / step).is_dir() and not any(
                (p / rundir.CKPT_DIR).glob(f"{step}.orbax-checkpoint-tmp*")):
            return True
        if (p / rundir.FAILED_FILE).exists() or ((p / rundir.SUMMARY_FILE).exists()
                                          and not (p / rundir.CKPT_DIR / step).is_dir()):
            return False
        time.sleep(poll_s)
    return False


def proc_rank() -> int:
    """This task's rank in a multi-task SLURM job (0 otherwise)."""
    return int(os.environ.get("SLURM_PROCID", "0") or 0)


def slurm_job_id() -> str:
    """This job's id as squeue and scontrol name it: ARRAYID_TASK for an array task."""
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID", "")


def slurm_tag() -> str:
    """' [SLURM job ID, restart N]' for a train.log header inside a SLURM job, else ''."""
    if "SLURM_JOB_ID" not in os.environ:
        return ""
    return f" [SLURM job {slurm_job_id()}, restart {os.environ.get('SLURM_RESTART_COUNT', '0')}]"


def execute_run(job: Job, live: LiveRuns | None = None) -> dict:
    """Run one training process with its output in `train.log`, registered in `live` (the
    launch's, so that its stop reaches the process); never raises on failure.

    Returns {'run_id', 'status': done|failed|interrupted, 'error', 'returncode'}. In a
    multi-task SLURM job every task runs this; rank 0 owns the lock, log and status files,
    and all ranks inherit the SLURM environment that `jax.distributed.initialize` reads.
    """
    d, rank, live = Path(job.run_dir), proc_rank(), live or LiveRuns()
    prepare_job(job)
    # A requeued or relaunched run finds the config its first attempt wrote: resume it (every
    # rank alike; the sweep checked that the config is the same before launching).
    job = replace(job, resume=job.resume or (d / rundir.CONFIG_FILE).exists())
    if job.branch_from and not _wait_for_parent(job, live.stopping):
        return {"run_id": job.run_id, "status": "failed", "returncode": None,
                "error": f"parent {job.branch_from} did not produce its checkpoint"}
    log = d / rundir.log_name(rank)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **job.env)
    cpus: list[int] = []
    if job.pin:
        extra, cpus = device_share(*job.pin)
        env.update(extra)
    lock = rundir.area(d).resolve(d / rundir.LOCK_FILE, "lock and write a pid into")
    cmd = [sys.executable, "-c", _LAUNCH, str(lock) if rank == 0 else "",
           str(os.getpid()), ",".join(map(str, cpus)), "cgpt", *train_argv(job)]
    t0 = time.monotonic()
    with rundir.area(d).append(log) as f:
        where = (f" [cpus {','.join(map(str, cpus))}]" if cpus else "") + (
            f" [CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}]"
            if job.pin and "CUDA_VISIBLE_DEVICES" in env else "") + (
            slurm_tag())
        f.write(f"==== cgpt sweep {time.strftime('%Y-%m-%d %H:%M:%S')}: python -m cgpt "
                f"{' '.join(train_argv(job))}{where}\n")
        f.flush()
        if live.stopping.is_set():
            return {"run_id": job.run_id, "status": "interrupted", "error": "", "returncode": None}
        rc = live.wait(job.run_id, subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                                    env=env, stdin=subprocess.DEVNULL))
    await_requeue(rc)
    return outcome(job, rc, t0, log, live.stopping.is_set())


def await_requeue(rc: int | None) -> None:
    """Checkpointed on SLURM's signal: no result (the job's end, to submitit) until requeued."""
    if rc in SIGNAL_EXITS and "SLURM_JOB_ID" in os.environ:
        time.sleep(float(os.environ.get("CGPT_REQUEUE_WAIT_S", "600")))


def outcome(job: Job, rc: int | None, t0: float, log: Path, stopped: bool = False) -> dict:
    """One run's result once its process (or in-process job) ended with `rc`, from its
    directory (`stopped`: the launch stopped it: interrupted); a failure writes failed.json
    (unless the job wrote its own: a fused member's).
    `t0`: time.monotonic() at the job's start (every duration and deadline of the sweep is
    monotonic: a wall clock stepped by NTP or a resumed VM would make it negative or a day)."""
    d = Path(job.run_dir)
    res = {"run_id": job.run_id, "returncode": rc, "error": "",
           "seconds": round(time.monotonic() - t0, 1)}
    if (d / rundir.SUMMARY_FILE).exists():
        return {**res, "status": "done"}
    if stopped or rc in (130, -signal.SIGINT) or rc in SIGNAL_EXITS:
        return {**res, "status": "interrupted"}
    try:
        own = json.loads((d / rundir.FAILED_FILE).read_text()).get("error")
    except (OSError, ValueError, AttributeError):
        own = None
    err = own or log_error(log)
    if rc is not None and rc < 0:
        err = f"killed by signal {signal.Signals(-rc).name}; {err}"
    elif rc == 0 and not own:
        err = f"exited 0 without writing {rundir.SUMMARY_FILE}; {err}"
    if proc_rank() == 0:
        try:
            atomic_write_text(d / rundir.FAILED_FILE, json.dumps(
                {**res, "status": "failed", "error": err, "log": str(log)}, indent=2))
        except OSError as e:  # a full disk: the sweep still reports the run failed (results.csv)
            err = (f"{err}; could not record the failure in {d / rundir.FAILED_FILE} "
                   f"({e.strerror or e}): {storage_fix(e)} and rerun the sweep")
    return {**res, "status": "failed", "error": err}


def prepare_job(job: Job) -> None:
    """The files a job starts with (its directory may be gone), its last failure forgotten;
    first a RunDirError if an entry cgpt writes is of the wrong kind or resolves outside the
    run directory (a symlinked train.log or .lock: `cgpt.paths`)."""
    d = Path(job.run_dir)
    rundir.check_kinds(d)
    for name, text in job.files.items():
        if not (d / name).exists():
            atomic_write_text(d / name, text)
    if proc_rank() == 0:
        rundir.area(d).remove(d / rundir.FAILED_FILE)



def _child_exited(pid: int) -> bool:
    """True once `pid` (our child) has exited; does not reap it (its waiter does)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class RunTask:
    """The callable submitted to SLURM: `execute_run`, checkpointable the submitit way.

    On the time-limit signal submitit calls `checkpoint` (rank 0) before requeueing the job:
    it tells the training process to checkpoint and waits until it has exited, then hands
    submitit the same call to run again; the requeued job resumes from that checkpoint. (A
    run that finished just before the signal returns None: no requeue.)
    """

    def __call__(self, job: Job) -> dict:
        self.live = LiveRuns()  # this job's process, for `checkpoint` (the same object)
        return self.run(job, self.live)

    def run(self, job: Job, live: LiveRuns) -> dict:
        return execute_run(job, live)

    def checkpoint(self, job: Job, grace_s: float | None = None):
        """Ask train to checkpoint and stop, wait up to the job's grace (`requeue_grace`),
        and hand submitit the resuming call."""
        import submitit  # loads submitit: only when this runs

        if (Path(job.run_dir) / rundir.SUMMARY_FILE).exists():
            return None  # finished just before the signal: nothing to requeue

        live = getattr(self, "live", None)
        proc = live.get(job.run_id) if live is not None else None
        if proc is not None:  # ask again each second: train ignores it until its loop starts
            grace = grace_s or float(job.env.get(GRACE_ENV) or requeue_grace({}))
            d = Path(job.run_dir)
            with rundir.area(d).append(d / rundir.log_name(proc_rank())) as f:
                f.write(f"==== cgpt sweep {time.strftime('%Y-%m-%d %H:%M:%S')}: the scheduler's "
                        f"signal: checkpoint, waiting up to {grace:.0f} s, then requeue\n")
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and not _child_exited(proc.pid):
                try:
                    proc.send_signal(signal.SIGUSR1)
                except ProcessLookupError:
                    break
                time.sleep(1.0)
        # a fresh task: this one's live process is this job's (and a lock does not pickle)
        return submitit.helpers.DelayedSubmission(type(self)(), replace(job, resume=True))


# ---- executors -----------------------------------------------------------------------------
def slurm_params(slurm: dict, parallel: int | None, n_jobs: int, name: str) -> dict:
    """A spec's `slurm:` settings -> submitit AutoExecutor parameters."""
    params = {}
    for k, v in slurm.items():
        if k in ("array_parallelism", "max_num_timeout"):
            continue
        params[k if k in SUBMITIT_GENERIC else f"slurm_{k}"] = v
    # one process per node driving all of its GPUs (cgpt.sharding.allocation)
    params.setdefault("tasks_per_node", 1)
    params["slurm_array_parallelism"] = int(parallel or slurm.get("array_parallelism") or n_jobs)
    params.setdefault("timeout_min", 60 * 24)
    params["name"] = f"cgpt-{name}"
    return params


def _groups(jobs: list[Job], resources: dict[str, dict]) -> list[tuple[dict, list[Job]]]:
    """Jobs grouped by their SLURM resources: one job array per distinct set."""
    out: dict[str, tuple[dict, list[Job]]] = {}
    for j in jobs:
        res = resources.get(j.run_id, {})
        out.setdefault(json.dumps(res, sort_keys=True, default=str), (res, []))[1].append(j)
    return list(out.values())


def run_submitit(jobs: list[Job], resources: dict[str, dict], name: str, folder: Path,
                 parallel: int | None, executor: str, finished, poll_s: float,
                 where: str = "spec", task: RunTask | None = None) -> None:
    """Submit `jobs` as SLURM job arrays (or submitit's local executor) and wait for them;
    `task`: the submitted callable (`cgpt.sweep.worker.GroupTask` also runs fused groups)."""
    import submitit  # loads submitit: only when this runs

    if not jobs:
        return
    cluster = "slurm" if executor == "slurm" else "local"
    subs, by_id = [], {}
    for res, group in _groups(jobs, resources):
        ex = submitit.AutoExecutor(folder=folder, cluster=cluster,
                                   slurm_max_num_timeout=int(res.get("max_num_timeout", 30)))
        try:
            ex.update_parameters(**slurm_params(res, parallel, len(group), name))
        except (NameError, AssertionError, ValueError) as e:
            raise ValueError(f"{where}: bad slurm: setting ({e}); see docs/sweeps.md") from None
        task = task or RunTask()
        grace = {GRACE_ENV: f"{requeue_grace(res):g}"}  # train compares its save time with it
        group = [replace(j, env={**j.env, **grace}) for j in group]
        with ex.batch():
            group_subs = [ex.submit(task, j) for j in group]
        subs += group_subs
        by_id.update({s.job_id: j for s, j in zip(group_subs, group)})
        print(f"submitted {len(group_subs)} {cluster} jobs "
              f"({group_subs[0].job_id.split('_')[0]}...) {res or ''}, logs in {folder}")
    with LiveRuns() as live:  # a stop cancels the local executor's jobs; SLURM's keep running
        if cluster == "local":
            live.on_stop(lambda: [s.cancel(check=False) for s in subs])
        for s in submitit.helpers.as_completed(subs, poll_frequency=poll_s):
            j = by_id[s.job_id]
            try:
                res = s.result()
                if isinstance(res, list):  # multi-task job: rank 0's result
                    res = res[0]
            except Exception as e:  # the job itself died (time limit, node failure, ...)
                res = {"run_id": j.run_id, "status": "failed",
                       "error": f"submitit job {s.job_id}: {str(e).strip().splitlines()[-1:]}"}
                if rundir.state(j.run_dir) == "done":
                    res["status"] = "done"
                else:
                    atomic_write_text(Path(j.run_dir) / rundir.FAILED_FILE,
                                      json.dumps(res, indent=2))
            finished(res)
