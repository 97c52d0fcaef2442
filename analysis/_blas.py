"""Run the small optimisations of this package on one BLAS thread.

L-BFGS-B calls OpenBLAS on tiny matrices at every step. With OpenBLAS's thread pool on a busy
machine that costs milliseconds per step (we measured a 30x slowdown of a bootstrap on a
shared 2-core box), while one thread costs microseconds. This uses OpenBLAS's thread-local
setter in scipy's bundled library, so the rest of the process is unaffected; where that
library or symbol is not found (other platforms or builds) it does nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import os

import scipy

_setters = None


def _find_setters() -> list:
    base = os.path.dirname(scipy.__file__)
    out = []
    for d in (base + ".libs", os.path.join(base, ".dylibs")):
        for path in glob.glob(os.path.join(d, "*openblas*")):
            try:
                f = ctypes.CDLL(path).openblas_set_num_threads_local
            except (OSError, AttributeError):
                continue
            f.argtypes, f.restype = [ctypes.c_int], ctypes.c_int
            out.append(f)
    return out


@contextlib.contextmanager
def one_blas_thread():
    """Limit scipy's OpenBLAS to one thread (for the calling thread) inside the block."""
    global _setters
    if _setters is None:
        _setters = _find_setters()
    previous = [f(1) for f in _setters]
    try:
        yield
    finally:
        for f, p in zip(_setters, previous):
            f(p)
