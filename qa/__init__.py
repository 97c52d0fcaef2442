"""Fault campaigns: cgpt's commands run as subprocesses against hostile input (not tests).

`python -m qa.campaign --help`; how to add a case: docs/faults.md."""
