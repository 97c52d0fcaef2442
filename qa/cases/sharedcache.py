"""One cache shared by two users (a lab's $CGPT_CACHE on a group disk): user A (this process's
user) prepares data and compiles programs there, user B (uid 65534, `nobody`) trains with the
same cache; the cache's folders made under umask 022 or 077, or a sticky world-writable one;
JAX's persistent compilation cache (what a sweep's runs share) damaged between two launches.
B must train to A's numbers on what it can read, or stop with one line naming the cache folder
and the fix ($CGPT_CACHE / data.cache_dir); nothing of A's may change."""
import os
import random
import shutil
import stat
import sysconfig
from pathlib import Path

from qa.context import TRAIN, complete, lines, same_as_base
from qa.registry import add

NOBODY = 65534
RUN_AS = """
import os, runpy, sys
def readable(paths):
    return [p.replace({stdlib!r}, {copy!r}, 1) for p in paths]
sys.path[:] = readable(sys.path)
for m in list(sys.modules.values()):  # packages imported at start-up (collections, encodings)
    if isinstance(getattr(m, "__path__", None), list):
        m.__path__[:] = readable(m.__path__)
os.setgroups([]); os.setgid({uid}); os.setuid({uid}); os.umask(0o022)
os.environ["HOME"] = {home!r}
sys.argv = ["cgpt", *{argv!r}]
runpy.run_module("cgpt", run_name="__main__", alter_sys=True)
"""


def _stdlib_for_b(ctx) -> Path:
    """The interpreter's standard library where user B can read it: the interpreter may live
    in a folder only its owner can enter (pyenv under /root), and after the drop to uid 65534
    every module imported later (dataclasses, json, ...) would be ModuleNotFoundError. A copy in
    the workspace (hard links where the filesystem allows) that B's sys.path points at."""
    def build(ctx):
        src, dst = Path(sysconfig.get_paths()["stdlib"]), ctx.root / "stdlib-b"

        def link(a, b):  # a file B could not read is copied, never chmod-ed in place
            if os.stat(a).st_mode & stat.S_IROTH:
                try:
                    return os.link(a, b)
                except OSError:
                    pass
            shutil.copy2(a, b)
            os.chmod(b, os.stat(b).st_mode | 0o444)
        shutil.copytree(src, dst, copy_function=link, symlinks=True, ignore=shutil.ignore_patterns(
            "site-packages", "test", "idlelib", "tkinter", "ensurepip", "lib2to3"))
        for p in (dst, *dst.rglob("*")):
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        return dst
    return ctx.once("stdlib-b", build)


def _open_up(ctx) -> None:
    """Let user B reach the workspace (mkdtemp made it owner-only) and its TMPDIR."""
    for p in (ctx.root, ctx.root / "cases", ctx.corpus):
        p.mkdir(exist_ok=True)
        p.chmod(0o755)
    ctx.tmp.chmod(0o1777)


def _owned(p: Path, uid: int = NOBODY) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    os.chown(p, uid, uid)
    return p


def _argv(ctx, out: Path, cache: Path | None, *extra: str) -> list[str]:
    """The small run (qa.context.TRAIN), its data cached in `cache` (None: $CGPT_CACHE)."""
    return ["train", "--data", str(ctx.corpus), "--out", str(out), *TRAIN,
            *([f"data.cache_dir={cache}"] if cache else []), *extra]


def _as_a(ctx, argv, umask: int = 0o022, env: dict | None = None):
    """User A's command (this process's user, under `umask`), run while the case is set up."""
    old = os.umask(umask)
    try:
        ctx.tag.env = env or {}
        r = ctx.cgpt(argv)
    finally:
        os.umask(old)
        ctx.tag.env = {}
    if r.returncode:
        raise RuntimeError(f"user A's command failed:\n{r.stderr[-1500:]}")


def _as_b(ctx, argv) -> str:
    home = _owned(ctx.fresh("home-b"))
    return RUN_AS.format(uid=NOBODY, home=str(home), argv=argv,
                         stdlib=sysconfig.get_paths()["stdlib"], copy=str(_stdlib_for_b(ctx)))


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_uid)
            for p in root.rglob("*") if p.is_file() and "/jax/" not in f"/{p.relative_to(root)}"}


def _a_unchanged(cache: Path, before: dict):
    def check():
        now = {k: v for k, v in _snapshot(cache).items() if k in before}
        return None if now == before else "user A's cache entries changed"
    return check


def _b_case(umask_a: int, *, via_env: bool = False, cache_mode: int | None = None,
            b_extra: tuple = (), a_first: bool = True):
    def make(ctx):
        _open_up(ctx)
        cache = ctx.fresh("shared-cache")
        cache.mkdir(parents=True)
        if cache_mode is not None:
            cache.chmod(cache_mode)
        env = {"CGPT_CACHE": str(cache)} if via_env else {}
        arg_cache = None if via_env else cache
        a_out = ctx.fresh("out-a")
        if a_first:
            _as_a(ctx, _argv(ctx, a_out, arg_cache), umask_a, env)
        before = _snapshot(cache)
        b_out = _owned(ctx.fresh("out-b"))
        spec = {"python": _as_b(ctx, _argv(ctx, b_out, arg_cache, *b_extra)), "env": env,
                "timeout": 900, "expect_text": str(cache), "check": _a_unchanged(cache, before)}
        if not b_extra:
            spec["check_ok"] = same_as_base(ctx, b_out)
        else:
            spec["check_ok"] = complete(b_out)
        return spec
    return make


add("b_reuses_a_store_umask022", "ok", "sharedcache", _b_case(0o022))
add("b_reuses_a_store_via_cgpt_cache", "ok", "sharedcache", _b_case(0o022, via_env=True))
add("b_cannot_read_a_store_umask077", "either", "sharedcache", _b_case(0o077))
NEW_STORE = ("data.vocab_size=300", "model.vocab_size=300")  # B's own store beside A's
add("b_new_store_in_a_folder", "either", "sharedcache", _b_case(0o022, b_extra=NEW_STORE))
add("b_new_store_in_sticky_folder", "ok", "sharedcache",
    _b_case(0o022, cache_mode=0o1777, b_extra=NEW_STORE))
add("b_first_in_sticky_folder", "ok", "sharedcache",
    _b_case(0o022, cache_mode=0o1777, a_first=False))


def _then_a(ctx):
    """B prepares in a sticky shared folder, then A (another user) trains on B's store."""
    _open_up(ctx)
    cache = ctx.fresh("shared-cache")
    cache.mkdir(parents=True)
    cache.chmod(0o1777)
    r = ctx.python(_as_b(ctx, _argv(ctx, _owned(ctx.fresh("out-b")), cache)))
    if r.returncode:
        raise RuntimeError(f"user B's command failed:\n{r.stderr[-1500:]}")
    a_out = ctx.fresh("out-a")
    return {"argv": _argv(ctx, a_out, cache), "check_ok": same_as_base(ctx, a_out),
            "timeout": 900}


add("a_reuses_b_store", "ok", "sharedcache", _then_a)

COMPILE = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _damaged_compile_cache(damage):
    """A trains with a persistent compilation cache, the entries are damaged, A trains again."""
    def make(ctx):
        jc = ctx.fresh("jax-cache")
        env = {**COMPILE, "JAX_COMPILATION_CACHE_DIR": str(jc)}
        _as_a(ctx, _argv(ctx, ctx.fresh("out"), ctx.root / "cache"), env=env)
        entries = [p for p in jc.rglob("*") if p.is_file()]
        if not entries:
            raise RuntimeError(f"no compilation cache entries were written to {jc}")
        for p in entries:
            damage(p)
        out = ctx.fresh("out")
        return {"argv": _argv(ctx, out, ctx.root / "cache"), "env": env, "timeout": 900,
                "check_ok": same_as_base(ctx, out), "expect_text": str(jc)}
    return make


def _flip(p: Path):
    b = bytearray(p.read_bytes())
    rng = random.Random(0)
    for _ in range(max(1, len(b) // 100)):
        b[rng.randrange(len(b))] ^= 0xFF
    p.write_bytes(bytes(b))


add("compile_cache_truncated", "ok", "sharedcache",
    _damaged_compile_cache(lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])))
add("compile_cache_emptied", "ok", "sharedcache",
    _damaged_compile_cache(lambda p: p.write_bytes(b"")))
add("compile_cache_bits_flipped", "either", "sharedcache", _damaged_compile_cache(_flip))


def _b_with_a_compile_cache(ctx):
    """B trains with A's compilation cache, which B can read but not write."""
    _open_up(ctx)
    jc = ctx.fresh("jax-cache")
    env = {**COMPILE, "JAX_COMPILATION_CACHE_DIR": str(jc)}
    _as_a(ctx, _argv(ctx, ctx.fresh("out"), ctx.root / "cache"), env=env)
    (ctx.root / "cache").chmod(0o755)
    b_out = _owned(ctx.fresh("out-b"))
    b_cache = _owned(ctx.fresh("cache-b"))
    return {"python": _as_b(ctx, _argv(ctx, b_out, b_cache)), "env": env, "timeout": 900,
            "check_ok": same_as_base(ctx, b_out)}


add("b_reads_a_compile_cache", "ok", "sharedcache", _b_with_a_compile_cache)


def _cache_env_case(value_of, expect, text=None):
    def make(ctx):
        out = ctx.fresh("out")
        spec = {"argv": _argv(ctx, out, None), "env": {"CGPT_CACHE": value_of(ctx)},
                "timeout": 900, "check_ok": same_as_base(ctx, out)}
        if text:
            spec["expect_text"] = text
        return spec
    return make


def _a_file(ctx) -> str:
    p = ctx.fresh("cache-file")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("not a folder\n")
    return str(p)


add("cgpt_cache_is_a_file", "error", "sharedcache",
    _cache_env_case(_a_file, "error", "CGPT_CACHE"))
add("cgpt_cache_relative", "ok", "sharedcache",
    _cache_env_case(lambda ctx: "rel-cache", "ok"))
add("cgpt_cache_under_a_file", "error", "sharedcache",
    _cache_env_case(lambda ctx: _a_file(ctx) + "/sub", "error", "CGPT_CACHE"))
