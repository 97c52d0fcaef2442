"""`python -m cgpt.plan ...`: the same as `python -m cgpt plan ...`, without the CLI's imports."""
import sys

from cgpt.plan.command import main

sys.exit(main())
