"""Signals to `cgpt train`: after fixed delays, and at phases found by what the process did
(JAX loading, placement printed, config written, a checkpoint being saved, ...). The signalled
command must finish or stop with one line; the same command with `--resume` then completes.

Retired (carried by tests/faults/test_faults_signals.py, test_faults_rundir.py): SIGINT while jaxlib
loads; SIGINT, SIGTERM, SIGUSR1 at placement, config written, first and last checkpoint,
summary written (the slow phase sweep)."""
import signal
from pathlib import Path

from qa.context import complete
from qa.registry import add


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def _saving(d: Path) -> bool:
    c = d / "checkpoints"
    return c.is_dir() and any("tmp" in p.name for p in c.glob("*"))


PHASES = {  # name -> (pid, stderr so far, run dir) -> ready
    "jax_loading": lambda pid, err, d: "/jaxlib/" in _maps(pid),
    "placement": lambda pid, err, d: "tiny-17k:" in err,
    "first_checkpoint": lambda pid, err, d: (d / "checkpoints" / "5").exists(),
    "checkpoint_saving": lambda pid, err, d: _saving(d),
}


def _add(name, signals, resume=False, group=False, extra=()):
    def make(ctx):
        d = ctx.run_copy() if resume else ctx.fresh("out")
        argv = ctx.train(d, *(("--resume",) if resume else ()), *extra)
        return {"argv": argv, "signals": signals(), "group": group,
                "then": ctx.train(d, "--resume", *extra), "check": complete(d)}
    add(name, "either", "signals", make)


for _sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
    for _delay in (0.3, 1.5, 4.0):
        _add(f"{_sig.name}_at_{_delay}s_fresh", lambda s=_sig, t=_delay: [(s, t)])
    _add(f"{_sig.name}_at_3s_resume", lambda s=_sig: [(s, 3.0)], resume=True)

for _sig, _ph in [(signal.SIGTERM, "jax_loading"), (signal.SIGUSR1, "jax_loading"),
                  (signal.SIGINT, "checkpoint_saving"), (signal.SIGTERM, "checkpoint_saving"),
                  (signal.SIGUSR1, "checkpoint_saving"), (signal.SIGUSR2, "placement"),
                  (signal.SIGUSR2, "first_checkpoint")]:
    _add(f"{_sig.name}_when_{_ph}", lambda s=_sig, ph=_ph: [(s, PHASES[ph])])
_add("SIGUSR1_repeated_every_second_at_placement",
     lambda: [(signal.SIGUSR1, PHASES["placement"])] + [(signal.SIGUSR1, 1.0)] * 4)
_add("SIGUSR1_repeated_every_second_in_loop",
     lambda: [(signal.SIGUSR1, PHASES["first_checkpoint"])] + [(signal.SIGUSR1, 1.0)] * 4)
_add("SIGINT_twice_in_loop",
     lambda: [(signal.SIGINT, PHASES["first_checkpoint"]), (signal.SIGINT, 0.2)])
_add("SIGTERM_then_SIGINT_at_placement",
     lambda: [(signal.SIGTERM, PHASES["placement"]), (signal.SIGINT, 0.1)])
_add("SIGINT_resume_at_placement", lambda: [(signal.SIGINT, PHASES["placement"])], resume=True)


def _group_while_preparing(ctx):
    d, cache = ctx.fresh("out"), ctx.fresh("cache")
    argv = ctx.train(d, f"data.cache_dir={cache}")
    return {"argv": argv, "group": True, "signals": [(signal.SIGINT, PHASES["placement"])],
            "then": argv + ["--resume"], "check": complete(d)}


add("SIGINT_to_group_while_preparing_data", "either", "signals", _group_while_preparing)
