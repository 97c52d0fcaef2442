"""`python -m cgpt.sweep ...`, the same as `python -m cgpt sweep ...`: the process entry
(`cgpt.cli.entry`, which installs the stop guard before the commands load; the package,
which Python imports first, loads nothing until a name is used)."""
import sys

from cgpt.cli import entry

entry(["sweep", *sys.argv[1:]])
