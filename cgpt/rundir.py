"""A run directory's contract: the names cgpt keeps in it, what each must be (a file or a
directory), the state a directory is in, and the readers of its files. JAX-free: `train`, the
sweep, `cgpt.load` and the CLI all read a run through it, and no other module spells a name.

A run directory (one training run) holds:

* `config.yaml`: the run's resolved config (`RunConfig.to_dict()`), written when the launch
  commits: from then on the directory holds a resumable run;
* `tokenizer.json`, `metrics.jsonl` (one strict-JSON object per logged step), `events/`
  (TensorBoard), `checkpoints/<step>/` (Orbax), `config_changes.json` (train.* values a resume
  changed), `branch.json` (a cooldown branch's parent);
* `summary.json` once finished, and `loss.png` (its loss curve: training loss and validation
  loss against tokens), or `failed.json` when its last attempt failed;
* with `train.wandb`: `wandb.json` (the W&B run id, so a resume continues the same W&B run)
  and `wandb/` (W&B's own files: the offline runs `wandb sync` uploads);
* `.lock`, an `flock` held while one process trains in it; the kernel drops it when its holder
  dies (a SIGKILL included), so a stale lock file never blocks the next launch. A launcher
  that took the lock itself (the sweep) and exec'd `train` with the descriptor still open is
  recognised, so the two never refuse each other;
* from a sweep: `run.yaml` (the config it hands to `train --config`), `identity.json` (the
  hash of that config) and `train.log`.

Its state (`state`): done (a summary.json that parses), running (the lock is held),
failed (failed.json), interrupted (config.yaml, no summary: `--resume` continues it), or new.

A sweep directory holds one run directory per run, `DIR/<run_id>/`, beside `results.csv` (one
row per run, its columns `cgpt.results_schema`'s), `curves.png` (the finished runs' training
curves on one figure), `sweep.yaml` (the spec it ran), `.sweep.lock`
and `.superseded/` (run directories whose config changed). `analysis` reads both kinds of
directory through this module, which imports neither JAX nor more of cgpt than its errors
and path rule (`cgpt.errors`, `cgpt.paths`).
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import socket
from pathlib import Path

import numpy as np
import yaml

from cgpt import paths
from cgpt.errors import LoadError, RunDirError

CONFIG_FILE = "config.yaml"
IDENTITY_FILE = "identity.json"
RUN_FILE = "run.yaml"
LOG_FILE = "train.log"
TOKENIZER_FILE = "tokenizer.json"
METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "loss.png"  # the finished run's loss curve, drawn from metrics.jsonl
CHANGES_FILE = "config_changes.json"
BRANCH_FILE = "branch.json"
SUMMARY_FILE = "summary.json"
FAILED_FILE = "failed.json"
LOCK_FILE = ".lock"
CKPT_DIR = "checkpoints"
EVENTS_DIR = "events"
DISCARDED_DIR = "discarded_checkpoints"  # rewound past (`--from-step`, a fused resume)
CORRUPT_DIR = "corrupt_checkpoints"  # set aside: they would not restore
WANDB_FILE = "wandb.json"  # {"id": the W&B run's id} (`cgpt.train.wandb_log`)
WANDB_DIR = "wandb"  # where W&B writes its files when given the run directory
# a sweep directory's own names, beside its run directories
RESULTS_FILE = "results.csv"
SWEEP_SPEC_FILE = "sweep.yaml"  # the spec the sweep ran
SWEEP_LOCK_FILE = ".sweep.lock"
SWEEP_CURVES_FILE = "curves.png"  # every finished run's training curve on one figure
SUPERSEDED_DIR = ".superseded"  # run directories whose config changed (--on-change rerun)
SWEEP_NAMES = (RESULTS_FILE, SWEEP_SPEC_FILE, SWEEP_LOCK_FILE, SUPERSEDED_DIR, SWEEP_CURVES_FILE)
# what each name cgpt writes in a run directory must be
KINDS = {**dict.fromkeys((CONFIG_FILE, IDENTITY_FILE, RUN_FILE, LOG_FILE, TOKENIZER_FILE,
                          METRICS_FILE, CURVE_FILE, CHANGES_FILE, BRANCH_FILE, SUMMARY_FILE,
                          FAILED_FILE, LOCK_FILE, WANDB_FILE), "file"),
         **dict.fromkeys((CKPT_DIR, EVENTS_DIR, DISCARDED_DIR, CORRUPT_DIR, WANDB_DIR), "dir")}
STATES = ("done", "running", "failed", "interrupted", "new")
STORAGE = (CKPT_DIR,)  # the one entry users may put on another disk (a symlink)


def area(run_dir: str | os.PathLike) -> paths.Area:
    """The run directory under the path-safety rule (`cgpt.paths`)."""
    return paths.Area(Path(run_dir), STORAGE, "run directory")


def log_name(rank: int) -> str:
    """The sweep's log of a run's process `rank` (rank 0: `LOG_FILE`)."""
    return LOG_FILE if rank == 0 else LOG_FILE.replace(".log", f".rank{rank}.log")


# ---- the lock -----------------------------------------------------------------------------
def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _inherited(path: Path) -> int | None:
    """An open descriptor of this process on `path` (a lock a launcher passed down), or None."""
    fd_dir = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    try:
        fds = [int(x) for x in os.listdir(fd_dir)]
    except OSError:
        return None
    for fd in fds:
        if fd > 2 and _same_file(fd, path):
            return fd
    return None


class RunLock:
    """An exclusive lock on a run directory, held while one process trains in it."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_FILE
        self.fd: int | None = None
        self.adopted = False

    def acquire(self) -> "RunLock":
        while True:
            fd = area(self.path.parent).open_fd(self.path, os.O_RDWR | os.O_CREAT,
                                                "truncate and write a pid into")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                fd = _inherited(self.path)
                if fd is not None:
                    try:  # succeeds only if the lock is ours already (same open file)
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        self.fd, self.adopted = fd, True
                        self._write_holder()
                        return self
                    except BlockingIOError:
                        pass
                raise RunDirError(
                    f"{self.path.parent} is in use by another training process (pid {holder}, "
                    f"holding {self.path}); wait for it to finish or stop it, or choose "
                    "another --out") from None
            if _same_file(fd, self.path):  # not a file a previous holder just removed
                self.fd = fd
                self._write_holder()
                return self
            os.close(fd)

    def _write_holder(self) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}@{socket.gethostname()}\n".encode(), 0)

    def release(self, remove: bool = False) -> None:
        """Drop the lock; `remove` also deletes the lock file (a launch that left nothing)."""
        if self.fd is None:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        if not self.adopted:  # an inherited descriptor belongs to the launcher
            os.close(self.fd)
        self.fd = None


# ---- strict JSON ------------------------------------------------------------------------
def json_line(rec: dict, default=None) -> str:
    """`rec` as one strict-JSON line: non-finite numbers become null and are listed under
    `nonfinite` (Python's json would write a bare NaN, which no JSON parser accepts).
    `default` as in `json.dumps` (e.g. `str` for values JSON has no type for)."""
    bad = [k for k, v in rec.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        rec = {**{k: (None if k in bad else v) for k, v in rec.items()}, "nonfinite": bad}
    return json.dumps(rec, allow_nan=False, default=default)


# ---- what a directory holds -------------------------------------------------------------
def recognise(out: str | os.PathLike) -> list[str]:
    """What makes `out` hold a run, beyond an empty folder: its config.yaml, a sweep's
    identity.json, a non-empty checkpoints/, a non-empty metrics.jsonl or a summary.json."""
    out = Path(out)
    found = []
    for name in (CONFIG_FILE, IDENTITY_FILE, SUMMARY_FILE):
        if (out / name).exists():
            found.append(name)
    c = out / CKPT_DIR
    if c.exists() and not (c.is_dir() and not any(c.iterdir())):
        found.append(CKPT_DIR + "/")
    m = out / METRICS_FILE
    if m.exists() and not (m.is_file() and m.stat().st_size == 0):
        found.append(METRICS_FILE)
    return found


def check_kinds(out: Path) -> None:
    """Every name cgpt keeps in a run directory is of the kind it writes (a file where a file
    goes, a directory where one goes) and none resolves outside it but `STORAGE`
    (`cgpt.paths`); otherwise one error naming the path and the fix."""
    for name, kind in KINDS.items():
        p = Path(out) / name
        if p.exists() or p.is_symlink():
            is_dir = p.is_dir()
            if not p.exists():  # a dangling symlink
                raise RunDirError(f"{p} is a broken symbolic link; remove it (cgpt keeps a "
                                  f"{'directory' if kind == 'dir' else 'file'} there)")
            if is_dir != (kind == "dir"):
                raise RunDirError(
                    f"{p} is a {'directory' if is_dir else 'file'}, but cgpt keeps a "
                    f"{'directory' if kind == 'dir' else 'file'} there; move it away (or choose "
                    "another --out)")
    area(out).check(KINDS)


def is_run(path: str | os.PathLike) -> bool:
    """A cgpt run (not a Hugging Face directory, which has a config.json): by `recognise`."""
    path = Path(path)
    return not (path / "config.json").exists() and bool(recognise(path))


def held_elsewhere(run_dir: str | os.PathLike) -> bool:
    """True while some process (a `train`, launched by any sweep or by hand) holds the lock."""
    lock = Path(run_dir) / LOCK_FILE
    if not lock.exists():
        return False
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def state(run_dir: str | os.PathLike) -> str:
    """One of `STATES`, read from the directory. A summary.json that does not parse (a crash
    mid-copy, a full disk) is not 'done'."""
    run_dir = Path(run_dir)
    if try_json(run_dir / SUMMARY_FILE) is not None:
        return "done"
    if held_elsewhere(run_dir):
        return "running"
    if (run_dir / FAILED_FILE).exists():
        return "failed"
    if (run_dir / CONFIG_FILE).exists():
        return "interrupted"
    return "new"


# ---- the log and the other JSON files --------------------------------------------------
def _bad_constant(c: str):
    raise ValueError(f"{c} is not JSON (cgpt writes null for non-finite numbers)")


def read_metrics(path: str | os.PathLike, upto_step: int | None = None,
                 raw: bool = False) -> list:
    """The records of metrics.jsonl (with step <= `upto_step`), checked line by line.

    Only a torn last line (no newline: a kill mid-write) is dropped; any other line that is not
    a JSON object with an increasing integer `step` is an error naming the file and line, never
    a silent cut. `raw`: (line text, record) pairs. A missing file reads as no records."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        text = path.read_bytes().decode()
    except IsADirectoryError:
        raise RunDirError(f"{path} is a directory, but cgpt keeps the run's log there; move it "
                          "away") from None
    except UnicodeDecodeError as e:
        raise RunDirError(f"{path}: not UTF-8 text (byte {e.start}); restore the file, or cut "
                          "it back to its last good line") from None
    lines = text.split("\n")
    torn = lines.pop()  # "" when the file ends with a newline
    out, last = [], 0
    for i, line in enumerate(lines, 1):
        where = f"{path}, line {i}"
        try:
            rec = json.loads(line, parse_constant=_bad_constant)
        except ValueError as e:
            raise RunDirError(f"{where}: not a JSON object ({e}); fix or delete that line "
                              "(every line is one logged step), then rerun") from None
        if not isinstance(rec, dict):
            raise RunDirError(f"{where}: expected a JSON object, got {type(rec).__name__}; "
                              "fix or delete that line, then rerun")
        step = rec.get("step")
        if type(step) is not int or step <= last:
            raise RunDirError(f"{where}: 'step' must be an integer above the previous line's "
                              f"{last}, got {step!r}; fix or delete that line, then rerun")
        last = step
        if upto_step is None or step <= upto_step:
            out.append((line, rec) if raw else rec)
    del torn  # a kill mid-write: the step is redone on --resume
    return out


def train_loss_window(total_steps: int) -> int:
    """The summary's train_loss averages the last this-many steps (each of them logged)."""
    return max(1, min(50, total_steps // 20))


def window_mean(path: str | os.PathLike, total_steps: int, field: str, key: str) -> float:
    """The summary's `key` (a "mean" field of `cgpt.record`: train_loss): the mean logged
    `field` of the last `train_loss_window` steps."""
    first = total_steps - train_loss_window(total_steps) + 1
    got = {r["step"]: r.get(field) for r in read_metrics(path) if r["step"] >= first}
    missing = [s for s in range(first, total_steps + 1) if not isinstance(got.get(s), (int, float))]
    if missing:
        raise RunDirError(f"{path}: no logged {field} for step(s) {step_ranges(missing)}, which "
                          f"the summary's {key} (the mean of steps {first}-{total_steps}) needs")
    return float(np.mean([got[s] for s in range(first, total_steps + 1)]))


def step_ranges(steps: list[int]) -> str:
    """'3, 4, 5' (at most five steps shown, then how many in all)."""
    shown = ", ".join(map(str, steps[:5]))
    return shown + (f", ... ({len(steps)} in all)" if len(steps) > 5 else "")


def read_json(path: str | os.PathLike, kind: type, fix: str):
    """A JSON file of the run directory, which must hold a `kind` (dict or list); anything else
    is a RunDirError ending in `fix` (what to do about it)."""
    path = Path(path)
    try:
        got = json.loads(path.read_bytes().decode(), parse_constant=_bad_constant)
    except IsADirectoryError:
        raise RunDirError(f"{path} is a directory; move it away") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise RunDirError(f"{path}: not valid JSON ({e}); {fix}") from None
    if not isinstance(got, kind):
        raise RunDirError(f"{path}: expected a JSON {'object' if kind is dict else 'list'}, "
                          f"got {type(got).__name__}; {fix}")
    return got


def read_changes(path: str | os.PathLike) -> list[dict]:
    """config_changes.json: a list of {"step": int, "train.<key>": [old, new], ...}."""
    path = Path(path)
    if not path.exists():
        return []
    fix = "restore it, or delete it (it only records train.* values changed on a resume)"
    log = read_json(path, list, fix)
    for i, c in enumerate(log):
        if not (isinstance(c, dict) and type(c.get("step")) is int):
            raise RunDirError(f"{path}: entry {i} is not an object with an integer 'step'; {fix}")
    return log



def read_config(run_dir: str | os.PathLike) -> dict:
    """The run's `config.yaml` as a dict (`RunConfig.to_dict()`), checked to be a mapping with a
    model section; a LoadError naming the file otherwise."""
    f = Path(run_dir) / CONFIG_FILE
    if not f.exists():
        found = recognise(run_dir)
        raise LoadError(f"{f} is missing" + (f" (the directory holds a run: {', '.join(found)})"
                                             if found else "")
                        + f"; restore the run's {CONFIG_FILE}, or pass a run directory")
    try:
        cfg = yaml.safe_load(f.read_bytes().decode())
    except IsADirectoryError:
        raise LoadError(f"{f} is a directory; the run's config must be a YAML file") from None
    except UnicodeDecodeError as e:
        raise LoadError(f"{f}: not a text file (byte {e.start} is not UTF-8); restore the "
                        f"run's {CONFIG_FILE}") from None
    except (OSError, yaml.YAMLError) as e:
        raise LoadError(f"{f}: unreadable run config ({e})") from e
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        raise LoadError(f"{f}: expected a mapping with a 'model' section")
    return cfg


def try_json(path: str | os.PathLike) -> dict | None:
    """The JSON object in `path`, or None when it is missing, unreadable or not an object: a
    file a crash may have cut (the sweep reads a summary.json this way; never trusted)."""
    try:
        return read_json(path, dict, "")
    except (OSError, RunDirError, RecursionError):
        return None


def read_summary(out: str | os.PathLike) -> dict:
    """A finished run's summary (a damaged one is an error that says how to rewrite it)."""
    return read_json(Path(out) / SUMMARY_FILE, dict, "delete it and rerun with --resume to "
                     "write it again from the last checkpoint and the log")
