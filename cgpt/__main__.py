"""`python -m cgpt ...` (and the `cgpt` console script): the process's signal guard from its
first statement (`preempt.install_process`; `python -m cgpt` installs it while the package
imports), the CLI, then an end that no late signal or interpreter finalization turns into a
traceback or a crash (`preempt.finish`)."""
import signal
import sys

from cgpt.errors import Preempted, Stopped
from cgpt.train import preempt


def run() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    preempt.install_process(command)
    if command == "train":  # before JAX starts a thread: the steps' buffers stay mapped
        _keep_host_memory()
    try:
        preempt.arm()
        from cgpt.cli import main

        code = main()
    except KeyboardInterrupt:  # Ctrl-C while the modules load, before main's own handler
        print(preempt.stop_line(signal.SIGINT, command), file=sys.stderr)
        code = 130
    except (Stopped, Preempted) as e:
        print(f"cgpt {command}: {e}", file=sys.stderr)
        code = e.exit_code
    preempt.finish(code, command)


def _keep_host_memory() -> None:
    """glibc keeps a CPU training process's freed memory (`cgpt.config.backend`). Here, at the
    process's start, not in `cgpt.cli.main`: a library or test calling main keeps its own."""
    import os

    from cgpt.config import backend
    from cgpt.sharding.allocation import gpus_present

    if backend.launch_platform(os.environ, gpus_present()) == "cpu":
        backend.keep_host_memory()


if __name__ == "__main__":
    run()
