"""The command line's sweep commands: `cgpt sweep SPEC` (`sweep`) and what reads a sweep's
results through `analysis`: the report after the runs (`report`), `--suggest` (`suggest`) and
`cgpt sweep compare` (`compare`).

With `cgpt.cli` this is the command-line face, the one part of cgpt that imports `analysis`:
`analysis` depends on cgpt's JAX-free contract (`cgpt.rundir`, `cgpt.record`,
`cgpt.results_schema`) and the library (`cgpt.sweep` and below) never imports `analysis`
(tests/structure/test_imports.py keeps it so).
"""
