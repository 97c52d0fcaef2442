"""`python -m cgpt ...` (and the `cgpt` console script): the process's signal guard from its
first statement (`cgpt.stop.GUARD`; `python -m cgpt` installs it while the package imports),
the CLI, which is the process's one edge for a stop or an error (`cgpt.cli.main`), then an
end that no late signal or interpreter finalization turns into a traceback or a crash
(`StopGuard.finish`)."""
import os
import sys

from cgpt.cli import main
from cgpt.config import backend
from cgpt.sharding.allocation import gpus_present
from cgpt.stop import GUARD


def run() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    GUARD.install(command)
    if command == "train":  # before JAX starts a thread: the steps' buffers stay mapped
        _keep_host_memory()
    GUARD.finish(main())


def _keep_host_memory() -> None:
    """glibc keeps a CPU training process's freed memory (`cgpt.config.backend`). Here, at the
    process's start, not in `cgpt.cli.main`: a library or test calling main keeps its own."""
    if backend.launch_platform(os.environ, gpus_present()) == "cpu":
        backend.keep_host_memory()


if __name__ == "__main__":
    run()
