import sys

from cgpt.train import preempt

if sys.argv[1:2] == ["train"]:  # a scheduler's signal from the first moment: one line
    preempt.defer_early()
try:
    from cgpt.cli import main
except KeyboardInterrupt:  # Ctrl-C while Python starts: one line, not a traceback
    print("cgpt: interrupted", file=sys.stderr)
    sys.exit(130)
except preempt.Preempted as e:
    print(f"cgpt train: {e}", file=sys.stderr)
    sys.exit(e.exit_code)

sys.exit(main())
