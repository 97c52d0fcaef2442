"""LoadError, at the bottom of the package: config readers, `checkpoint`, `hf` and `lm` all
raise it, and `import cgpt` exposes it without importing JAX."""


class LoadError(Exception):
    """A checkpoint could not be loaded; the message names the file, the key and the fix."""
