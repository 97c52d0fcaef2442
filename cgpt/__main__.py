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

code = main()
if sys.argv[1:2] == ["train"]:  # checkpointed and ending: a scheduler's repeated signal must
    preempt.ignore_late()       # not turn this exit into a death by that signal
sys.exit(code)
