import sys

from cgpt.cli import main

sys.exit(main())
