"""Multi-controller runs: one JAX process per host (or per accelerator), N of them in a job.

Every process runs the same training loop on its own devices and the collectives join them.
What differs between processes is decided here, in one place:
  - joining the job (`initialize`): from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
    JAX_PROCESS_ID, or a SLURM allocation of several tasks (`srun`); gloo collectives on CPU;
  - who writes (`is_writer`): process 0 alone writes the run directory's files, while every
    process takes part in collectives and in Orbax checkpoint save/restore;
  - what each process loads (`process_rows`): only the rows of a global batch that its own
    devices hold, assembled with `jax.make_array_from_process_local_data`;
  - work done once (`first`): process 0 prepares shared state (the data cache, the tokenizer),
    the others wait for it and then only read it.
A process that dies is noticed by JAX's coordination service: after `peer_timeout` seconds
without its heartbeat (at once if process 0, the coordinator, dies) the others stop with
"Terminating process because the JAX distributed service detected fatal errors" (SIGABRT).
"""
from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from typing import Callable, NoReturn, TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils

from cgpt.errors import DistributedError
from cgpt.config import backend
from cgpt.config.backend import gpu_allocator, gpu_xla_flags, launch_platform
from cgpt.sharding import allocation, joinwatch

T = TypeVar("T")

PEER_TIMEOUT_S = 100  # JAX's default heartbeat timeout
WAIT_TIMEOUT_S = 7 * 24 * 3600  # for process 0's one-time work; a dead process 0 ends it sooner
BARRIER_TIMEOUT_S = 600  # for barriers that every process reaches within seconds
SHUTDOWN_TIMEOUT_S = 300  # JAX's exit barrier: a live process that is slow to finish gets this
LEAVE_GRACE_S = 2.0  # process 0 outlives the others' exits by this much in `leave`
_peer_timeout = PEER_TIMEOUT_S  # this job's, set by `initialize`


def _env_int(env, name: str, low: int = 1) -> int | None:
    """An integer environment variable, or a ValueError naming it as the user set it."""
    text = env.get(name)
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low:
        raise ValueError(f"{name}={text!r}: must be a whole number >= {low}")
    return value


def check_env(env: os._Environ | dict | None = None) -> None:
    """Refuse, before JAX starts, a job environment that does not add up, naming the variable
    as set: otherwise JAX fails deep inside (an IndexError for JAX_COORDINATOR_ADDRESS='not a
    host', `process_id` for JAX_PROCESS_ID) or waits for processes that never come (SLURM
    variables copied into a shell that `srun` did not start)."""
    env = os.environ if env is None else env
    if env.get("JAX_COORDINATOR_ADDRESS"):
        addr = env["JAX_COORDINATOR_ADDRESS"]
        host, colon, port = addr.strip().rpartition(":")
        if not colon or not host or any(c.isspace() for c in host) or not port.isdigit() \
                or not 0 < int(port) < 65536:
            raise ValueError(f"JAX_COORDINATOR_ADDRESS={addr!r}: expected host:port (process "
                             "0's host name or address and a free port, e.g. node01:12345)")
        n = _env_int(env, "JAX_NUM_PROCESSES") or 1
        pid = _env_int(env, "JAX_PROCESS_ID", low=0)
        if pid is not None and pid >= n:
            raise ValueError(f"JAX_PROCESS_ID={pid} with JAX_NUM_PROCESSES={n}: the processes "
                             f"of a job are numbered 0 .. {n - 1}")
        return
    if env.get("SLURM_JOB_ID") and (_env_int(env, "SLURM_NTASKS") or 1) > 1 \
            and env.get("CGPT_DISTRIBUTED") != "1" and not env.get("SLURM_STEP_NODELIST"):
        raise ValueError(
            f"SLURM_NTASKS={env['SLURM_NTASKS']} (SLURM job {env['SLURM_JOB_ID']}) describes "
            "a job of several processes, but this one was not started by `srun` "
            "(SLURM_STEP_NODELIST is unset), so the others would never join: start every "
            "process with srun, or run one process with `env -u SLURM_NTASKS cgpt ...`")


def job_processes(env: os._Environ | dict | None = None) -> int:
    """How many processes the environment says this job has (readable before JAX starts)."""
    env = os.environ if env is None else env
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return _env_int(env, "JAX_NUM_PROCESSES") or 1
    return _env_int(env, "SLURM_NTASKS") or 1


def devices_per_process(total: int) -> int:
    """Emulated CPU devices each process of the job exposes for a mesh of `total` devices."""
    n = job_processes()
    if total % n:
        raise ValueError(f"--mesh asks for {total} devices, which the job's {n} processes "
                         "cannot split evenly; use a mesh whose size is a multiple of "
                         f"{n}")
    return total // n


def initialize(peer_timeout: int | None = None) -> bool:
    """Join a multi-process job when the environment describes one, with every GPU the
    scheduler gave this process; then check what JAX sees against the allocation. True if
    joined.

    Must run before any JAX computation. JAX_COORDINATOR_ADDRESS (with JAX_NUM_PROCESSES and
    JAX_PROCESS_ID) or a SLURM allocation of more than one task (SLURM_NTASKS > 1, where JAX
    reads the rest) start it; so does CGPT_DISTRIBUTED=1 (Cloud TPU pods). `peer_timeout`
    (seconds, default 100) bounds how long the others wait for a process that stopped.
    GPU memory: the allocator's fraction is set here too (`cgpt.config.backend.gpu_allocator`),
    and on NVIDIA GPUs cgpt's XLA flags (`cgpt.config.backend.gpu_xla_flags`).
    Raises `AllocationError` (one line, both numbers) when the devices differ from the
    allocation (`cgpt.sharding.allocation`).
    """
    timeout = PEER_TIMEOUT_S if peer_timeout is None else peer_timeout
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise ValueError(f"--peer-timeout {peer_timeout!r}: must be a whole number of seconds "
                         ">= 1")
    if _LAYOUT:
        return jax.process_count() > 1
    check_env(os.environ)
    try:
        return _initialize(timeout)
    except (RuntimeError, AssertionError):
        if _backends_up():
            raise  # not the platform: JAX's own error
        # JAX asserts (no message) when JAX_PLATFORMS=cuda finds no GPU, raises for others
        backend.start_platform()
        raise


def _check_port_free(address: str) -> None:
    """Process 0 serves the job on the coordinator's port: one held by another program makes
    JAX crash (a segfault in this version) while the others wait. Probed as JAX binds it."""
    port = int(address.rpartition(":")[2])
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise DistributedError(
                    f"JAX_COORDINATOR_ADDRESS={address}: port {port} on this host is held by "
                    "another program, so process 0 cannot serve the job there; pick a free "
                    "port for every process") from None
            # no IPv6 on this host, say: the other family decides


def _backends_up() -> bool:
    try:
        return bool(jax.devices())
    except (RuntimeError, AssertionError):
        return False


def _initialize(timeout: int) -> bool:
    gpu_allocator(os.environ)  # before JAX creates its GPU client
    gpu_xla_flags(os.environ, launch_platform(os.environ, allocation.gpus_present()))
    alloc = allocation.allocation_from_env(os.environ, allocation.gpus_present())
    kw = allocation.init_args(alloc, os.environ)
    global _peer_timeout
    _peer_timeout = timeout
    joined = jax.distributed.is_initialized()
    if kw is not None and not joined:
        # Cross-process collectives on the CPU backend (accelerator backends ignore this).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if kw.get("process_id") == 0 and kw.get("coordinator_address"):
            _check_port_free(kw["coordinator_address"])
        wait = max(timeout, joinwatch.INIT_MIN_S)  # the watchdog speaks before JAX aborts
        try:
            with joinwatch.bound(alloc, kw, wait):
                # the exit barrier waits only for live processes: a slow one must not get SIGABRT
                jax.distributed.initialize(
                    heartbeat_timeout_seconds=timeout, initialization_timeout=wait + 30,
                    shutdown_timeout_seconds=max(timeout, SHUTDOWN_TIMEOUT_S), **kw)
        except (RuntimeError, ValueError) as e:  # port taken, coordinator unreachable, ...
            where = kw.get("coordinator_address") or "the SLURM job's coordinator"
            raise DistributedError(
                f"could not join the job at {where} within {wait} s "
                f"({' '.join(str(e).split())[:300]}); check that process 0 runs and that its "
                "port is free (another program may hold it), or raise --peer-timeout") from None
        joined = True
    hosts = _gather_hosts()
    nodes = len(set(hosts))
    allocation.check_devices(alloc, jax.default_backend(), jax.device_count(),
                             jax.local_device_count(), jax.process_count(), nodes,
                             cpu_on_purpose=os.environ.get("JAX_PLATFORMS", "").strip() == "cpu")
    _LAYOUT.update(allocation.layout(alloc, nodes, jax.process_count(),
                                     jax.local_device_count(), jax.device_count()), hosts=hosts)
    return joined


_LAYOUT: dict = {}  # this job's layout once initialize() checked it, with each process's host


def job_layout() -> dict:
    """Nodes, processes and devices per process of this job, for summary.json's placement."""
    if not _LAYOUT:
        initialize()
    return dict(_LAYOUT)


HOST_ENV = "CGPT_HOST"  # the host a process reports, when set: tests make two processes of
# one machine two hosts with it, and a container whose hostname is not its node's can name it


def host_name(environ=None) -> str:
    """The host this process runs on: $CGPT_HOST when set, else the machine's hostname."""
    env = os.environ if environ is None else environ
    return (env.get(HOST_ENV) or "").strip() or socket.gethostname()


def _exchange(key: str, value: str, timeout_s: float, index: int, count: int) -> list[str]:
    """Every process's `value`, by process index, through the coordination service's key-value
    store: each process publishes its own under `key`, all meet at a barrier, each reads the
    directory once (three calls per process, however many there are)."""
    client = _client()
    client.key_value_set(f"{key}/{index}", value)
    client.wait_at_barrier(key, int(timeout_s * 1000))
    got = {int(k.rsplit("/", 1)[-1]): v for k, v in client.key_value_dir_get(f"{key}/")}
    return [got[i] for i in range(count)]


def _gather_hosts() -> list[str]:
    """Every process's `host_name()`, by process index: read at start-up, so the mesh groups
    processes by where they run, not by how they are numbered."""
    if jax.process_count() == 1:
        return [host_name()]
    return _exchange("cgpt/host", host_name(), BARRIER_TIMEOUT_S, jax.process_index(),
                     jax.process_count())


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def disagreement(records: list[dict]) -> str | None:
    """What the processes' `records` (by process index) disagree on, as one line naming the
    keys and the first differing values; None when all equal process 0's."""
    flat = [_flat(r) for r in records]
    diff = sorted({k for f in flat[1:] for k in set(f) | set(flat[0])
                   if f.get(k) != flat[0].get(k)})
    if not diff:
        return None
    shown = []
    for k in diff[:4]:
        i = next(i for i, f in enumerate(flat) if f.get(k) != flat[0].get(k))
        shown.append(f"{k}: process 0 has {flat[0].get(k)!r}, process {i} has {flat[i].get(k)!r}")
    return f"{', '.join(diff)} differ ({'; '.join(shown)})"


def agree(name: str, record: dict) -> None:
    """Every process publishes `record` (its resolved config and flags) at start-up: if they
    differ, all stop here with one DistributedError naming the keys (else they hang or abort
    in a collective later). No-op in a single-process run."""
    if (where := joined()) is None:
        return
    got = _exchange(f"cgpt/agree/{name}", json.dumps(record, sort_keys=True, default=str),
                    max(3 * _peer_timeout, 60), *where)
    why = disagreement([json.loads(v) for v in got])
    if why is not None:
        raise DistributedError(f"the processes of this job disagree on their {name}: {why}; "
                               "give every process the same command, config and environment")


def process_hosts() -> tuple[str, ...]:
    """The host of each process of this job (index = `jax.process_index()`), joining the
    job first if it has not been joined (`initialize`)."""
    return tuple(job_layout()["hosts"])


def joined() -> tuple[int, int] | None:
    """(process index, process count) of the multi-process job this process joined, else None.
    Reads the coordination state only: never starts a JAX backend."""
    if "jax" not in sys.modules:
        return None
    state = jax._src.distributed.global_state
    if state.client is None or not state.num_processes or state.num_processes < 2:
        return None
    return int(state.process_id), int(state.num_processes)


def leave(code: int) -> NoReturn:
    """End this process of a failed multi-process job with exit status `code`, skipping
    JAX's exit barrier (whose timeout, when another process is slow to fail too, ends every
    process with SIGABRT and a C++ stack instead of the error already printed).

    Each process records that it is leaving; the others wait for process 0 (the coordination
    service lives in it, and their clients abort once it is gone), and process 0 waits until
    every other process has acknowledged, each wait bounded by a few peer timeouts: a process
    that never comes (stuck elsewhere) is then stopped by the heartbeat check as before.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    where = joined()
    if where is not None:
        index, count = where
        client, wait_ms = _client(), max(3 * _peer_timeout, 60) * 1000
        try:
            client.key_value_set(f"cgpt/leave/{index}", str(code))
            if index == 0:
                for j in range(1, count):
                    client.blocking_key_value_get(f"cgpt/left/{j}", wait_ms)
                # a process between its acknowledgement and its exit would see the service
                # (ours) vanish and abort with a C++ stack: give it that moment (seen under load)
                time.sleep(LEAVE_GRACE_S)
            else:
                client.blocking_key_value_get("cgpt/leave/0", wait_ms)
                client.key_value_set(f"cgpt/left/{index}", str(code))
        except Exception:  # noqa: BLE001 - the service is gone or a peer never came: leave anyway
            pass
    os._exit(code)


def is_writer() -> bool:
    """Process 0 writes the run directory (config, metrics, events, summary, progress)."""
    return jax.process_index() == 0


def _client():
    # The coordination service's key-value store and barriers (what Orbax uses as well).
    return jax._src.distributed.global_state.client


def barrier(name: str, timeout_s: int = BARRIER_TIMEOUT_S) -> None:
    """Every process waits here until all have arrived (no-op with one process)."""
    if jax.process_count() > 1:
        _client().wait_at_barrier(f"cgpt/{name}", timeout_s * 1000)


def first(name: str, fn: Callable[[], T], timeout_s: int = WAIT_TIMEOUT_S) -> T:
    """fn() on process 0 first, then on the others: shared work (preparing the data cache,
    training the tokenizer) happens once and the rest read its result. If process 0 fails,
    the others raise DistributedError with its message instead of repeating the work."""
    if jax.process_count() == 1:
        return fn()
    key = f"cgpt/first/{name}"
    if is_writer():
        try:
            out = fn()
        except BaseException as e:
            _client().key_value_set(key, f"{type(e).__name__}: {e}")
            raise
        _client().key_value_set(key, "ok")
        return out
    status = _client().blocking_key_value_get(key, timeout_s * 1000)
    if status != "ok":
        raise DistributedError(f"process 0 failed during {name}, so process "
                               f"{jax.process_index()} stops too: {status}")
    return fn()


def process_rows(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> np.ndarray:
    """Which rows of a global batch this process loads, in the order it passes them on.

    `shape` is the batch as the step sees it, [accum, rows, T+1] or [rows, T+1], and
    `sharding` splits its rows axis (-2). Returns positions in the global batch's row order
    (step order: accumulation slice a holds rows a*rows .. a*rows+rows-1): the rows held by
    this process's devices, in the layout `jax.make_array_from_process_local_data` expects
    (its devices' slices sorted by start). Every row when one process holds the whole axis.
    """
    axis = len(shape) - 2
    starts = sorted({(idx[axis].start or 0, idx[axis].stop or shape[axis])
                     for idx in sharding.addressable_devices_indices_map(shape).values()})
    local = np.concatenate([np.arange(a, b) for a, b in starts])
    if axis == 0:
        return local
    return (np.arange(shape[0])[:, None] * shape[1] + local[None, :]).ravel()


class NullWriter:
    """Stands in for the metrics file and the TensorBoard writer on processes other than 0."""

    def write(self, *args, **kwargs) -> None:
        pass

    flush = close = add_scalar = write


def smallest_mib(nbytes: int) -> int:
    """The smallest of every process's `nbytes` (e.g. device memory), so that all of them
    compile the same step. Gathered in MiB: without jax_enable_x64 the gather is int32, which
    byte counts would overflow."""
    if jax.process_count() == 1:
        return nbytes

    mib = multihost_utils.process_allgather(np.int32(min(nbytes >> 20, 2**31 - 1)))
    return int(np.min(mib)) << 20


class StepAgreement:
    """Processes agree on the step at which to act (checkpoint, stop) through the coordination
    service's key-value store: no device collective, one small RPC per step.

    `poll(step, due, signum)` runs once per step in every process with its own trigger state.
    A process with a trigger publishes the step it is at; the others see that and publish theirs
    at their next poll; once all have published, each acts at max(published) + MARGIN. The
    margin makes that step reachable by all before any passes it: a process reads step k-1's
    scalars (the result of a collective over every process) before it polls step k, so when it
    polls step k every process has queued step k-1 and therefore made any publication from
    step k-2 or earlier visible; the last publication, at step p, is seen by all by step p + 2.
    Rounds are numbered, so a later trigger starts a fresh agreement.
    """

    MARGIN = 2
    _instances = 0  # every process creates them in the same order: a fresh key space each

    def __init__(self, client=None, index: int | None = None, count: int | None = None,
                 key: str | None = None):
        self.client = client if client is not None else _client()
        self.index = jax.process_index() if index is None else index
        self.count = jax.process_count() if count is None else count
        StepAgreement._instances += 1
        self.prefix = key or f"cgpt/agree/{StepAgreement._instances}"
        self.round, self.mine, self.at = 0, None, None

    def poll(self, step: int, due: bool, signum: int) -> tuple[bool, int] | None:
        """The agreed (due, signum), any process's due and the largest signal, at the agreed
        step; None at every other step."""
        if self.at is None:
            keys = f"{self.prefix}/{self.round}/"
            got = dict(self.client.key_value_dir_get(keys))
            if self.mine is None and (got or due or signum):
                self.mine = step
                self.client.key_value_set(f"{keys}{self.index}", f"{step} {int(due)} {signum}")
                got[f"{keys}{self.index}"] = f"{step} {int(due)} {signum}"
            if len(got) < self.count:
                return None
            vals = [tuple(map(int, v.split())) for v in got.values()]
            self.at = (max(v[0] for v in vals) + self.MARGIN, any(v[1] for v in vals),
                       max(v[2] for v in vals))
        at, agreed_due, agreed_signum = self.at
        if step < at:
            return None
        if step > at:
            raise DistributedError(f"process {self.index} learned the agreed checkpoint step "
                                   f"{at} only at step {step}: the processes are not in step")
        self.round, self.mine, self.at = self.round + 1, None, None
        return agreed_due, agreed_signum
