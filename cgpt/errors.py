"""The errors a user sees as one line, at the bottom of the package: config readers, `resolve`,
`train`, `checkpoint`, `hf` and `lm` raise them, and `import cgpt` exposes them without JAX."""


class LoadError(Exception):
    """A checkpoint could not be loaded; the message names the file, the key and the fix."""


class TrainError(RuntimeError):
    """A run cannot start or continue as configured; the message says why and what to do."""
