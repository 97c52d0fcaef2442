"""#23: Ctrl-C, SIGTERM, SIGUSR1/2 at every phase of `python -m cgpt train` end with one line
and exit 128+N (or a checkpointed stop), never a traceback, a lost interrupt or a segfault.

The two mechanisms behind it are tested in small processes without JAX (fast): an interrupt
raised inside a gc callback (Python drops it: "Exception ignored") is delivered again, and a
main thread that cannot act (stuck in C, e.g. an XLA compile) is ended by the watchdog. Real
signals on real `cgpt train` processes at phases found by what the process has done (not by
timing): one fast case here, the sweep over signals x phases is marked slow."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cgpt import rundir
from cgpt.stop import received_line

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}


def _python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


GC_CALLBACK = """
import gc, os, signal, time
from cgpt.stop import GUARD
GUARD.install("train"); GUARD.arm()
fired = []
def cb(phase, info):
    if phase == "start" and not fired:
        fired.append(1)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10000):  # the handler runs here, inside the callback
            pass
gc.callbacks.append(cb)
try:
    gc.collect()
    for _ in range(1000):
        time.sleep(0.01)
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted")
"""


def test_an_interrupt_dropped_inside_a_gc_callback_is_delivered_again():
    """Before: "Exception ignored in: <function _xla_gc_callback>" and the run trained on."""
    p = _python(GC_CALLBACK)
    out, err = p.communicate(timeout=120)
    assert out.strip() == "interrupted", (out, err)
    assert "Exception ignored" not in err and "Traceback" not in err, err


STUCK = """
import signal, sys, time
from cgpt.stop import GUARD
GUARD.install(sys.argv[1]); GUARD.arm()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # as inside XLA
print("ready", flush=True)
time.sleep(120)
print("not stopped", flush=True)
"""


def _asleep(pid: int) -> bool:
    try:
        if "nanosleep" in Path(f"/proc/{pid}/wchan").read_text():
            return True
        return Path(f"/proc/{pid}/syscall").read_text().split()[0] in ("35", "115", "230")
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("sig, line", [
    (signal.SIGTERM, "cgpt train: stopped by SIGTERM before the first training step"),
    (signal.SIGINT, "cgpt train: interrupted before the first training step: nothing of the "
     "run was written; rerun the same command")])
def test_a_main_thread_stuck_in_c_is_ended_by_the_watchdog(sig, line):
    """The main thread never runs the handler (the signal is blocked there, as while it is in
    a long XLA compile): the watchdog thread, woken by the signal, ends it with the line. The
    line says what was written (before: a start-up Ctrl-C said "rerun with --resume", when
    there was nothing to resume)."""
    p = subprocess.Popen([sys.executable, "-c", STUCK, "train"], cwd=REPO, env=ENV, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline().strip() == "ready"
    while not _asleep(p.pid):  # in the C sleep, not between bytecodes that would act
        time.sleep(0.01)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, (out, err)
    assert "not stopped" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), err


# A scheduler's SIGTERM, then its SIGKILL 0.1 s later, while the main thread is in C (an XLA
# step or compile): before, the exit was -9 with no line (the watchdog waited GRACE_S for the
# main thread, the loop's handler runs only between bytecodes).
KILLED = """
import signal, sys, time
from cgpt.stop import GUARD
GUARD.install("train"); GUARD.arm()
if sys.argv[1] == "loop":  # a run's loop took the signals over (cgpt.train.preempt)
    from cgpt.train.preempt import CheckpointTriggers
    CheckpointTriggers().install()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # as inside XLA
print("ready", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("phase, line", [
    ("loop", received_line(signal.SIGTERM)),
    ("start", "cgpt train: stopped by SIGTERM before the first training step")])
def test_sigterm_is_said_when_it_arrives_before_a_sigkill(phase, line):
    p = subprocess.Popen([sys.executable, "-c", KILLED, phase], cwd=REPO, env=ENV, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline().strip() == "ready"
    while not _asleep(p.pid):
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    p.send_signal(signal.SIGKILL)
    _, err = p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL
    assert [x for x in err.splitlines() if x.strip()][0].startswith(line), err


def test_a_training_run_says_sigterm_before_the_sigkill_that_follows(tmp_path, corpus):
    """The real thing: `cgpt train` in its loop (a checkpoint written), SIGTERM, SIGKILL
    0.1 s later (SLURM's KillWait set to nothing): the line is in its stderr; --resume then
    finishes the run."""
    out, err_path = tmp_path / "run", tmp_path / "run.err"
    argv = _train(tmp_path, corpus, out)
    argv[argv.index("--tokens=2560")] = "--tokens=25600"  # 200 steps: the loop is still going
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL,
                                stderr=err_file)
        assert _when(proc, err_path, lambda e: (out / "checkpoints" / "5").exists())
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=120)
    err = err_path.read_text()
    assert proc.returncode in (-signal.SIGKILL, 128 + signal.SIGTERM), err
    assert received_line(signal.SIGTERM) in err.splitlines(), err
    assert "Traceback" not in err


REPEATED = """
import os, signal, sys, time
from cgpt.errors import Stopped
from cgpt.stop import GUARD
GUARD.install("train"); GUARD.arm()
try:
    print("ready", flush=True)
    time.sleep(120)
except Stopped as e:
    for _ in range(3):  # the executor re-sends SIGUSR1 every second: the cleanup goes on
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
    GUARD.say(f"cgpt train: {e}")  # as the edge (cgpt.stop.status) says it: once
    GUARD.finish(e.exit_code)
"""


def test_a_repeated_scheduler_signal_does_not_break_the_cleanup():
    p = _python(REPEATED)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGUSR1)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGUSR1, err
    assert len(err.strip().splitlines()) == 1 and "stopped by SIGUSR1" in err, err


def _train(tmp_path: Path, corpus: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "cgpt", "train", "--model", "tiny-17k", "--data", str(corpus),
            "--out", str(out), "--no-progress", "--tokens=2560", "train.batch_size=8",
            "data.vocab_size=512", "data.seq_len=16", "data.val_sequences=16",
            f"data.cache_dir={tmp_path / 'cache'}", "train.ckpt_every=5"]


def _when(proc, err_path: Path, ready, timeout: float = 600) -> bool:
    """Wait until `ready(stderr so far)` (or the process ended): phases by what it did."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if ready(err_path.read_text(errors="replace")):
            return True
        time.sleep(0.02)
    return False


def _signal_train(tmp_path, corpus, sig, ready, name="run"):
    out, err_path = tmp_path / name, tmp_path / f"{name}.err"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(_train(tmp_path, corpus, out), cwd=tmp_path, env=ENV,
                                stdout=subprocess.PIPE, stderr=err_file, text=True)
        sent = _when(proc, err_path, ready)
        if sent:
            proc.send_signal(sig)
        stdout, _ = proc.communicate(timeout=600)
    return proc.returncode, err_path.read_text(errors="replace"), out, sent


def _one_line_or_done(rc, err, out, sig):
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("tiny-17k:")
             and not x.startswith("tokenizing") and x != received_line(sig)]  # said at arrival
    assert "Traceback" not in err and "Exception ignored" not in err and rc >= 0, err
    if rc == 0:  # the signal came after the work was done: the run is complete
        assert (out / "summary.json").is_file(), err
        return
    assert rc == 128 + sig, err
    assert len(lines) == 1 and lines[0].startswith("cgpt train: ") and (
        "interrupted" in lines[0] or "stopped by" in lines[0]), err


def test_ctrl_c_while_jax_loads_is_one_line_and_leaves_nothing(tmp_path, corpus):
    """The fast representative: SIGINT once JAX's libraries are being loaded (before: a
    traceback from inside the import, or an interrupt dropped and the run trained on)."""
    out, err_path = tmp_path / "run", tmp_path / "run.err"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(_train(tmp_path, corpus, out), cwd=tmp_path, env=ENV,
                                stdout=subprocess.PIPE, stderr=err_file, text=True)
        end = time.monotonic() + 300
        while time.monotonic() < end and proc.poll() is None:
            try:
                if "/jaxlib/" in Path(f"/proc/{proc.pid}/maps").read_text():
                    break
            except OSError:
                break
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=300)
    err = err_path.read_text()
    _one_line_or_done(proc.returncode, err, out, signal.SIGINT)
    assert proc.returncode == 130, err  # JAX loads long before the run could finish
    assert rundir.recognise(out) == []  # nothing that a relaunch would take for a run


PHASES = {  # name -> when to signal, from what the process printed or wrote
    "placement": lambda tmp: lambda err: "tiny-17k:" in err,
    "config-written": lambda tmp: lambda err: (tmp / "run" / "config.yaml").exists(),
    "first-checkpoint": lambda tmp: lambda err: (tmp / "run" / "checkpoints" / "5").exists(),
    "last-checkpoint": lambda tmp: lambda err: (tmp / "run" / "checkpoints" / "20").exists(),
    "summary-written": lambda tmp: lambda err: (tmp / "run" / "summary.json").exists(),
}


# Ctrl-C at every phase, and a scheduler's signal at every phase: SIGTERM and SIGUSR1 (and
# SIGUSR2) are one class to cgpt (`cgpt.stop.SIGNALS`: one handler before the loop, one in it),
# so they take turns over the phases, each before the loop and in it (10 launches, not 15).
SCHEDULER = dict(zip(PHASES, [signal.SIGTERM, signal.SIGUSR1] * 3))


@pytest.mark.slow
@pytest.mark.parametrize("sig, phase", [(signal.SIGINT, p) for p in PHASES]
                         + [(s, p) for p, s in SCHEDULER.items()])
def test_every_signal_at_every_phase(tmp_path, corpus, sig, phase):
    rc, err, out, sent = _signal_train(tmp_path, corpus, sig, PHASES[phase](tmp_path))
    _one_line_or_done(rc, err, out, sig)
    if rc:  # stopped: the same command with --resume finishes the run
        again = subprocess.run(_train(tmp_path, corpus, out) + ["--resume"], cwd=tmp_path,
                               env=ENV, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stderr
    assert (out / "summary.json").is_file()
