"""`python -m cgpt.sweep SPEC ...`, the same as `python -m cgpt sweep SPEC ...`."""
import sys

from cgpt.sweep.command import main

sys.exit(main())
