"""Launching a sweep: pick the runs that are not done, check their identity, run them, report
(through the report the command line hands in).

Killing the sweep (even SIGKILL) loses at most the steps since each live run's last
checkpoint; relaunching the same command continues where it stopped.
"""
from __future__ import annotations

import fcntl
import math
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import yaml
from tqdm.auto import tqdm

from cgpt import rundir
from cgpt.config import backend
from cgpt.config.run import cadence
from cgpt.data.batches import load_data
from cgpt.errors import Stopped
from cgpt.fileio import atomic_write_text, probe_writable, storage_fix
from cgpt.paths import check_destination
from cgpt.sweep.executors import Job, run_submitit
from cgpt.sweep.groups import group_jobs, plan_groups
from cgpt.sweep.spec import Run, Sweep, fmt_count, fmt_time, missing_required, select
from cgpt.sweep.state import (area as sweep_area, config_change, prepare_run_dir, run_files,
                              supersede, write_results)
from cgpt.sweep.worker import GroupTask, run_one_process, run_workers
from cgpt.train import wandb_log
from cgpt.train.notice import BarClock

EXECUTORS = ("local", "slurm", "submitit-local")
ON_CHANGE = ("error", "rerun")


def compile_cache_env(cache: Path | None) -> dict:
    """Environment that points every run's JAX at one persistent compilation cache; programs
    of any size and compile time are kept, so repeated shapes and relaunches skip XLA."""
    if cache is None:
        return {}
    return {"JAX_COMPILATION_CACHE_DIR": str(cache),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
            "JAX_COMPILATION_CACHE_MAX_SIZE": str(backend.COMPILE_CACHE_BYTES)}


def checkpoints_per_limit(run: Run, est_s: float, limit_s: float) -> float:
    """How many checkpoints a run writes within one SLURM time limit (or its whole run):
    every `ckpt_every` steps (default total/10) and every `checkpoint_minutes`."""
    t = run.config.train
    every = [est_s * cadence(t.ckpt_every, run.steps) / run.steps]
    if t.checkpoint_minutes:
        every.append(t.checkpoint_minutes * 60)
    return min(limit_s or est_s, est_s) / min(every)


def print_table(sweep: Sweep, out: Path | None, runs: list[Run], parallel: int = 1,
                file=None) -> None:
    """The --dry-run table: N, D, counted FLOPs, 6ND and the estimated time of every run
    (and, for a spec with slurm resources, the devices and time limit it gets)."""
    file = file or sys.stdout
    e = sweep.estimate
    cluster = e.mfu is not None and e.device_flops is not None
    hdr = (f"{'run_id':34s} {'state':>11s} {'N':>8s} {'D':>8s} {'D/N':>6s} {'batch':>5s} "
           f"{'steps':>7s} {'FLOPs':>9s} {'6ND':>9s} {'est':>7s}" +
           (f" {'devices':>7s} {'limit':>7s} {'jobs':>4s} {'ckpt/limit':>10s}" if cluster else ""))
    print(f"sweep {sweep.name} ({sweep.path}): {len(runs)} runs"
          + (f" (of {len(sweep.runs)}, --only)" if len(runs) != len(sweep.runs) else "")
          + (f"; {sweep.dropped} grid points dropped by filter:" if sweep.dropped else ""),
          file=file)
    print(hdr, file=file)
    total_s = left_s = 0.0
    for r in runs:
        state = rundir.state(out / r.run_id) if out is not None else "new"
        if state not in ("new", "running") and config_change(r, out):
            state = "changed"  # trained with another config: the launch refuses or reruns it
        est = e.seconds(r.steps, r.flops, r.devices)
        total_s += est
        left_s += 0 if state in ("done", "running") else est
        limit = float(r.slurm.get("timeout_min", 0)) * 60
        per_limit = checkpoints_per_limit(r, est, limit)
        print(
            f"{r.run_id:34s} {state:>11s} {fmt_count(r.n_params):>8s} "
            f"{fmt_count(r.tokens):>8s} {r.tokens / r.n_params:6.1f} {r.batch_size:5d} "
            f"{r.steps:7d} {r.flops:9.2e} {r.flops_6nd:9.2e} {fmt_time(est):>7s}" +
            (f" {r.devices:7d} {fmt_time(limit) if limit else '-':>7s} "
             f"{math.ceil(est / limit) if limit else 1:4d} {per_limit:10.0f}" if cluster else ""),
            file=file)
    fl = [r.flops for r in runs]
    rate = (f"MFU {e.mfu:.0%} of {e.device_flops:.3g} FLOP/s per device" if cluster
            else f"{e.flops_per_s:.3g} FLOP/s")
    print(f"total {sum(fl):.3g} FLOPs (counted), {max(fl) / min(fl):.3g}x range; estimated "
          f"{fmt_time(total_s)} serial, {fmt_time(left_s)} still to run"
          + (f", ~{fmt_time(left_s / parallel)} at --parallel {parallel} if cores allow"
             if parallel > 1 else "")
          + f"  [model: {e.startup_s:g}s + steps x {e.step_overhead_s:g}s + FLOPs / ({rate})]",
          file=file)
    miss = missing_required(sweep)
    if miss:
        print(f"note: a launch needs {' '.join(f'--set {k}=...' for k in miss)} "
              f"(required by {sweep.path})", file=file)


class SweepLock:
    """DIR/.sweep.lock: one sweep process per output directory (released even on SIGKILL)."""

    def __init__(self, out: Path):
        self.path = out / rundir.SWEEP_LOCK_FILE
        self.f = open(sweep_area(out).resolve(self.path, "truncate and write a pid into"), "a+")
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.f.seek(0)
            other = self.f.read().strip() or "?"
            self.f.close()
            raise ValueError(f"another sweep (pid {other}) is running in {out}; wait for it, "
                             "or stop it, then rerun") from None
        self.f.seek(0)
        self.f.truncate()
        self.f.write(str(os.getpid()))
        self.f.flush()

    def release(self) -> None:
        self.f.close()


def check_out_dir(out: Path) -> None:
    """--out must be a directory this process can write (a clear one-line error otherwise)
    and not one no sweep should fill (`cgpt.paths.check_destination`)."""
    check_destination(str(out), "--out")
    try:
        probe_writable(out)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot use it as the sweep directory "
                         f"({e.strerror or e}); choose another --out") from None
    sweep_area(out).check(rundir.SWEEP_NAMES)


class Remaining:
    """The time a sweep has left: the cost model's seconds of its unfinished runs, over the
    local workers, times the ratio of measured to estimated seconds of the runs finished."""

    def __init__(self, estimate: dict[str, float], workers: int):
        self.estimate, self.workers = dict(estimate), max(1, workers)
        self.todo = set(estimate)
        self.measured = self.expected = 0.0

    def finished(self, run_id: str, seconds: float | None) -> None:
        if run_id in self.todo:
            self.todo.discard(run_id)
            if seconds:
                self.measured += seconds
                self.expected += self.estimate[run_id]

    def seconds(self) -> float:
        scale = self.measured / self.expected if self.expected else 1.0
        return sum(self.estimate[r] for r in self.todo) * scale / self.workers

    def text(self) -> str:
        how = (f"cost model x {self.measured / self.expected:.2f} measured" if self.expected
               else "cost model")
        return f"~{fmt_time(self.seconds())} left ({how})"


def check_identity(sweep: Sweep, runs: list[Run], out: Path, on_change: str) -> None:
    """A run directory trained with another config is never reused silently: an error (the
    launch's and the dry run's), or with on_change 'rerun' moved aside (the launch only)."""
    changed = {r.run_id: config_change(r, out) for r in runs}
    changed = {k: v for k, v in changed.items() if v}
    if not changed:
        return
    if on_change == "rerun":
        by_id = {r.run_id: r for r in runs}
        for rid in changed:
            print(f"config of {rid} changed ({'; '.join(changed[rid])}): moved the old run to "
                  f"{supersede(by_id[rid], out)}; training anew")
        return
    def short(diff: list[str]) -> str:  # one line however many keys or runs changed
        return "; ".join(diff[:3]) + (f" (and {len(diff) - 3} more)" if len(diff) > 3 else "")

    shown = [f"{rid}: {short(diff)}" for rid, diff in list(changed.items())[:3]]
    more = f" | and {len(changed) - 3} more run(s)" if len(changed) > 3 else ""
    raise ValueError(
        f"{len(changed)} run(s) in {out} were trained with a different config than {sweep.path} "
        f"(and --set) now gives: {' | '.join(shown)}{more}; restore the spec, use a new --out, "
        f"or pass --on-change rerun to move them to {out / rundir.SUPERSEDED_DIR}/ and train "
        "them anew")


def prepare_ahead(runs: list[Run]) -> None:
    """Prepare the runs' data here, on every core this process has, while pinned workers
    (`--parallel K`) start: each would otherwise prepare it on its own share of the cores while
    the others wait. Returns once this process holds the first data's preparer lock, so the
    workers wait for it rather than prepare; they compile ahead meanwhile. A failure here is
    left to the runs: each fails with its own error when it loads the data."""
    held = threading.Event()
    configs = list(dict.fromkeys(r.config.data for r in runs))

    def work() -> None:
        try:
            for cfg in configs:
                try:
                    load_data(cfg, on_lock=held.set)
                except Exception:  # noqa: BLE001 - the run that loads it reports it
                    pass
        finally:
            held.set()

    threading.Thread(target=work, name="cgpt-prepare-data", daemon=True).start()
    held.wait()


def _selected(sweep: Sweep, executor: str, on_change: str, parallel: int | None,
              only: str | None) -> list[Run]:
    """The runs --only selects, once the launch's flags and the spec's `require:` hold."""
    if executor not in EXECUTORS:
        raise ValueError(f"--executor {executor!r}; use one of {', '.join(EXECUTORS)}")
    if on_change not in ON_CHANGE:
        raise ValueError(f"--on-change {on_change!r}; use one of {', '.join(ON_CHANGE)}")
    if parallel is not None and parallel < 1:
        raise ValueError(f"--parallel {parallel}: must be >= 1")
    miss = missing_required(sweep)
    if miss:
        raise ValueError(f"{sweep.path} requires {', '.join(miss)} to be set at launch: add "
                         f"{' '.join(f'--set {k}=...' for k in miss)}")
    runs = select(sweep.runs, only)
    if not runs:
        raise ValueError(f"--only {only!r} matches none of the {len(sweep.runs)} run ids of "
                         f"{sweep.path} (see --dry-run)")
    for project in sorted({r.config.train.wandb for r in runs} - {None}):
        wandb_log.require(project)  # W&B asked for but not installed: one error, not per run
    return runs


def _begin(sweep: Sweep, runs: list[Run], out: Path, on_change: str,
           compile_cache: Path | None | str) -> Path | None:
    """Under the sweep's lock: the identity check, sweep.yaml and results.csv written; returns
    the compilation cache."""
    states = {r.run_id: rundir.state(out / r.run_id) for r in runs}
    check_identity(sweep, [r for r in runs if states[r.run_id] != "running"], out, on_change)
    cache = backend.compile_cache_dir() if compile_cache == "default" else compile_cache
    atomic_write_text(out / rundir.SWEEP_SPEC_FILE, yaml.safe_dump(
        {"spec": str(sweep.path), "name": sweep.name, "argv": sys.argv[1:],
         "compile_cache": str(cache) if cache else None,
         "runs": [r.run_id for r in sweep.runs]}, sort_keys=False))
    write_results(sweep.runs, out)
    return Path(cache) if cache else None


def _todo(sweep: Sweep, runs: list[Run], out: Path, executor: str,
          parallel: int | None) -> tuple[list[Run], int]:
    """The runs to train (not done, not running elsewhere), in the order they start, and the
    count already done; printed as the launch's first line."""
    states = {r.run_id: rundir.state(out / r.run_id) for r in runs}
    todo = [r for r in runs if states[r.run_id] not in ("done", "running")]
    elsewhere = [r.run_id for r in runs if states[r.run_id] == "running"]
    n_done = sum(s == "done" for s in states.values())
    print(f"sweep {sweep.name}: {len(runs)} runs in {out}: {n_done} done, "
          f"{sum(states[r.run_id] == 'interrupted' for r in todo)} to resume, "
          f"{sum(states[r.run_id] == 'failed' for r in todo)} to retry, "
          f"{sum(states[r.run_id] == 'new' for r in todo)} new"
          + (f"; {len(elsewhere)} running in another process, skipped: {elsewhere}"
             if elsewhere else "") + f" [executor {executor}"
          + (f", parallel {parallel or 1}]" if executor == "local" else "]"))
    if (parallel or 1) > 1 and executor == "local":
        # longest first: K workers finish sooner when the long pole starts at once
        todo.sort(key=lambda r: (r.branch_from is not None,  # parents before branches
                                 -sweep.estimate.seconds(r.steps, r.flops)))
    return todo, n_done


def _jobs(sweep: Sweep, todo: list[Run], out: Path, cache: Path | None, fuse: bool) -> list[Job]:
    """One job per run, or per fused group of same-shape runs (`cgpt.sweep.groups`), each
    with its prepared run directory."""
    env = {**compile_cache_env(cache.resolve() if cache else None),
           **wandb_log.group_env(sweep.name)}  # W&B groups the runs by the sweep's name
    by_id = {r.run_id: Job(r.run_id, str(prepare_run_dir(r, out).resolve()),
                resume=(out / r.run_id / rundir.CONFIG_FILE).exists(), env=env,
                files=run_files(r),
                branch_from=f"{(out / r.branch_from[0]).resolve()}@{r.branch_from[1]}"
                if r.branch_from else "") for r in todo}
    groups = plan_groups(todo, fuse)
    if any(len(g) > 1 for g in groups):
        print(f"fused: {sum(len(g) for g in groups if len(g) > 1)} runs in "
              f"{sum(len(g) > 1 for g in groups)} group(s) of one shape, each one program "
              "(--no-fuse: one program per run)")
    return group_jobs(groups, by_id)


class Progress:
    """The sweep's bar, its time left and its failures; `finished` takes each job's result
    (a fused group's per member) and rewrites results.csv."""

    def __init__(self, sweep: Sweep, out: Path, counts: tuple[int, int], left: Remaining,
                 show: bool):
        self.sweep, self.out, self.left, self.failures = sweep, out, left, {}
        total, n_done = counts
        self.bar = tqdm(total=total, initial=n_done, unit="run", desc=f"sweep {sweep.name}",
                        dynamic_ncols=True, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} runs "
                        "[{elapsed}{postfix}]", disable=not show)
        self.bar.set_postfix_str(left.text())
        # the bar redraws only when a run ends: between, its clock ticks on its own, so the
        # terminal shows the sweep at work (a demo's first runs take ~40 s)
        self._clock = BarClock(self.bar)

    def record(self) -> None:
        """results.csv; a full disk must not stop the sweep."""
        try:
            write_results(self.sweep.runs, self.out, self.failures)
        except OSError as e:
            self.bar.write(f"cgpt sweep: could not write {self.out / rundir.RESULTS_FILE} "
                           f"({e.strerror or e}); {storage_fix(e)}")

    def finished(self, res: dict) -> None:
        if "members" in res:  # a fused group: one result per run
            for m in res["members"]:
                self.finished(m)
            return
        if res["status"] != "interrupted":  # an interrupted run is still to do, unmeasured
            self.left.finished(res["run_id"], res.get("seconds")
                               if res["status"] == "done" else None)
        if res["status"] == "failed":
            self.failures[res["run_id"]] = res["error"]
            self.bar.write(f"FAILED {res['run_id']}: {res['error']}  "
                           f"(log: {self.out / res['run_id'] / rundir.LOG_FILE})")
        elif res["status"] == "done":
            s = rundir.try_json(self.out / res["run_id"] / rundir.SUMMARY_FILE) or {}
            self.bar.write(f"done   {res['run_id']}: val_loss "
                           f"{s.get('val_loss', float('nan')):.4f}  {res.get('seconds', 0):.0f}s")
            self.bar.update(1)
        self.record()
        self.bar.set_postfix_str(self.left.text() + (f", {len(self.failures)} failed"
                                                     if self.failures else ""), refresh=True)

    def close(self) -> None:
        self._clock.stop()
        self.bar.close()
        self.record()


def _execute(sweep: Sweep, todo: list[Run], jobs: list[Job], out: Path, how: tuple,
             finished: Callable[[dict], None]) -> None:
    """Run the jobs: one local process, K pinned local workers, or submitit (SLURM)."""
    executor, parallel, poll_s = how
    if executor == "local" and (parallel or 1) == 1:
        run_one_process(jobs, finished)  # one process: no start-up per run
    elif executor == "local":
        prepare_ahead(todo)
        secs = {r.run_id: sweep.estimate.seconds(r.steps, r.flops) for r in todo}
        run_workers(jobs, parallel, finished, {
            j.run_id: sum(secs[m.run_id] for m in j.members or (j,)) for j in jobs})
    else:
        resources = {r.run_id: r.slurm for r in todo}  # a group: its first run's
        run_submitit(jobs, resources, sweep.name, out / ".submitit", parallel, executor,
                     finished, poll_s, where=str(sweep.path), task=GroupTask())


def _interrupted(runs: list[Run], out: Path, executor: str) -> int:
    left = sum(rundir.state(out / r.run_id) != "done" for r in runs)
    print(f"\ncgpt sweep: interrupted; finished runs are kept and {left} left; rerun "
          "the same command to resume"
          + (" (SLURM jobs already submitted keep running)" if executor == "slurm" else ""),
          file=sys.stderr)
    return 130


def _conclude(sweep: Sweep, runs: list[Run], out: Path, failures: dict[str, str],
              report: Callable[[Path, int], None] | None) -> int:
    """The sweep's last line, then the report; 0 if every selected run is done, else 1."""
    states = {r.run_id: rundir.state(out / r.run_id) for r in runs}
    n_done = sum(s == "done" for s in states.values())
    failed = [k for k, s in states.items() if s == "failed" or (s != "done" and k in failures)]
    print(f"sweep {sweep.name}: {n_done}/{len(runs)} done, {len(failed)} failed"
          + (f" ({', '.join(failed)}; errors in {out / rundir.RESULTS_FILE}, logs in "
             f"<run>/{rundir.LOG_FILE})" if failed else "")
          + f"; results: {out / rundir.RESULTS_FILE}")
    if report is not None:
        report(out, sum(rundir.state(out / r.run_id) == "done" for r in sweep.runs))
    return 0 if n_done == len(runs) else 1


def launch(sweep: Sweep, out: Path, parallel: int | None = None, executor: str = "local",
           only: str | None = None, poll_s: float = 10.0,
           report: Callable[[Path, int], None] | None = None,
           on_change: str = "error", compile_cache: Path | None | str = "default",
           fuse: bool = True, progress: bool = True) -> int:
    """Run every selected run that is not done; returns 0 if all are done, else 1 (130: ^C).
    `progress` False: no bar (the lines of each finished run are printed still).

    fuse: same-shape runs train as one fused program per group (`cgpt.sweep.groups`); a
    local sequential sweep trains all its jobs in one worker process (`cgpt.sweep.worker`).

    compile_cache: a directory for JAX's persistent compilation cache shared by the runs
    ("default": the user's, `cgpt.config.backend.compile_cache_dir()`, so a later sweep
    reuses these programs too), or None for none.

    report: called with `out` and the sweep's finished runs once the runs end (not on ^C):
    the command line's scaling-law report (`cgpt.commands.report`), which this library does
    not import, for `analysis` depends on cgpt and not the reverse.
    """
    runs = _selected(sweep, executor, on_change, parallel, only)
    check_out_dir(out)
    lock = SweepLock(out)
    try:
        cache = _begin(sweep, runs, out, on_change, compile_cache)
        todo, n_done = _todo(sweep, runs, out, executor, parallel)
        jobs = _jobs(sweep, todo, out, cache, fuse)
        # the time left from the cost model (the dry run's estimate), not from the mean time
        # of the runs so far (the largest go first); scaled by the finished runs' measured
        # time over their estimate
        left = Remaining({r.run_id: sweep.estimate.seconds(r.steps, r.flops) for r in todo},
                         (parallel or 1) if executor == "local" else 1)
        bar = Progress(sweep, out, (len(runs), n_done), left, progress)
        try:
            _execute(sweep, todo, jobs, out, (executor, parallel, poll_s), bar.finished)
        except (KeyboardInterrupt, Stopped) as e:
            bar.close()
            if isinstance(e, Stopped):  # a scheduler's signal: its one line is the edge's
                raise
            return _interrupted(runs, out, executor)
        bar.close()
        return _conclude(sweep, runs, out, bar.failures, report)
    finally:
        lock.release()


__all__ = ["launch", "print_table", "check_out_dir", "compile_cache_env", "EXECUTORS"]
