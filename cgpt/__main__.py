import sys

if sys.argv[1:2] == ["train"]:  # a scheduler's signal from the first moment: kept, not fatal
    from cgpt.preempt import defer_early
    defer_early()
try:
    from cgpt.cli import main
except KeyboardInterrupt:  # Ctrl-C while Python starts: one line, not a traceback
    print("cgpt: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
