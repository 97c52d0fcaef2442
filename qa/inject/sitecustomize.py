"""Fault injection for the campaign's commands (qa/cases/flaky.py, clock.py): imported by Python
at start-up when this folder leads PYTHONPATH, it does nothing unless $CGPT_QA_FAULT holds a
JSON fault. The calls it wraps are the ones a network filesystem or a wrong clock break:

  {"kind": "error", "call": "replace"|"rename"|"fsync"|"open_w"|"open_r"|"mkdir"|"unlink"|"rmtree"
   |"tokenizer_file", "match": "metrics.jsonl", "errno": "EIO", "after": 0, "times": 1,
   "state": FILE}
      the call on a path containing `match` fails with OSError(errno, path) `times` times,
      after `after` matching calls pass (counted across every process of the case in `state`);
      `tokenizer_file` is the read the tokenizers library does in Rust (Tokenizer.from_file, no
      Python open): it fails as that library reports an I/O error, a plain Exception
  {"kind": "slow", "call": ..., "match": ..., "seconds": 0.2}   every matching call sleeps first
  {"kind": "clock", "jump": -3600.0, "after_s": 8.0}
      time.time() (the wall clock, not monotonic) jumps by `jump` seconds `after_s` seconds
      after the process started (an NTP step, a suspended VM)
"""
import builtins
import errno as _errno
import fcntl
import io
import json
import os
import time

_FAULT = os.environ.get("CGPT_QA_FAULT")


def _fire(f: dict) -> bool:
    """Whether this matching call fails: a shared counter of matching calls in f['state']."""
    with open(f["state"], "a+") as s:
        fcntl.flock(s, fcntl.LOCK_EX)
        s.seek(0)
        n = int(s.read() or 0)
        s.seek(0)
        s.truncate()
        s.write(str(n + 1))
    return f.get("after", 0) <= n < f.get("after", 0) + f.get("times", 1)


def _wrap_tokenizer_file(f: dict, code: int) -> None:
    """tokenizers.Tokenizer (a Rust type: no subclass, no attribute set) replaced by a stand-in
    whose from_file fails; everything else (construction, isinstance, the other constructors)
    is the real type's."""
    import tokenizers
    real = tokenizers.Tokenizer

    class Meta(type):
        def __instancecheck__(cls, x):
            return isinstance(x, real)

        def __getattr__(cls, name):
            return getattr(real, name)

    class Tokenizer(metaclass=Meta):
        def __new__(cls, *a, **k):
            return real(*a, **k)

        @staticmethod
        def from_file(path, *a, **k):
            if f["match"] in str(path) and _fire(f):
                raise Exception(f"{os.strerror(code)} (os error {code})")  # as the library does
            return real.from_file(path, *a, **k)
    tokenizers.Tokenizer = Tokenizer


def _install(f: dict) -> None:
    if f["kind"] == "clock":
        real, t0 = time.time, time.monotonic()
        jump, after = float(f["jump"]), float(f.get("after_s", 0))
        time.time = lambda: real() + (jump if time.monotonic() - t0 >= after else 0.0)
        return
    code = getattr(_errno, f.get("errno", "EIO"))

    def wrap(mod, name, path_of):
        orig = getattr(mod, name)

        def call(*a, **k):
            paths = [str(p) for p in path_of(a, k) if isinstance(p, (str, os.PathLike))]
            if any(f["match"] in os.fspath(p) for p in paths):
                if f["kind"] == "slow":
                    time.sleep(float(f["seconds"]))
                elif _fire(f):
                    raise OSError(code, os.strerror(code), paths[-1])
            return orig(*a, **k)
        setattr(mod, name, call)

    two = lambda a, k: a[:2]  # noqa: E731
    one = lambda a, k: a[:1]  # noqa: E731
    if f["call"] in ("replace", "rename"):
        wrap(os, f["call"], two)
    elif f["call"] in ("mkdir", "unlink"):
        wrap(os, f["call"], one)
    elif f["call"] == "rmtree":
        import shutil
        wrap(shutil, "rmtree", one)
    elif f["call"] == "fsync":
        orig = os.fsync

        def fsync(fd):
            try:
                p = os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}")
            except OSError:
                p = ""
            if f["match"] in p:
                if f["kind"] == "slow":
                    time.sleep(float(f["seconds"]))
                elif _fire(f):
                    raise OSError(code, os.strerror(code), p)
            return orig(fd)
        os.fsync = fsync
    elif f["call"] == "tokenizer_file":
        _wrap_tokenizer_file(f, code)
    elif f["call"] in ("open_w", "open_r"):
        orig = io.open
        writing = f["call"] == "open_w"

        def opener(file, mode="r", *a, **k):
            if (isinstance(file, (str, os.PathLike)) and f["match"] in os.fspath(file)
                    and (any(c in mode for c in "wax+") == writing)):
                if f["kind"] == "slow":
                    time.sleep(float(f["seconds"]))
                elif _fire(f):
                    raise OSError(code, os.strerror(code), os.fspath(file))
            return orig(file, mode, *a, **k)
        io.open = builtins.open = opener


if _FAULT:
    _install(json.loads(_FAULT))
