import sys

try:
    from cgpt.cli import main
except KeyboardInterrupt:  # Ctrl-C while Python starts: one line, not a traceback
    print("cgpt: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
