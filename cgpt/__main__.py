"""`python -m cgpt ...` (and the `cgpt` console script, `run`): the process entry,
`cgpt.cli.entry`, which installs the stop guard before the commands load."""
from cgpt.cli import entry as run

if __name__ == "__main__":
    run()
