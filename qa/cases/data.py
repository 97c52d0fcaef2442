"""`cgpt data prepare`: damaged source files, bad flags, damaged token-store files (a rerun must
redo what is missing and give the reference store's shards), training on a damaged store.

Retired (tests/faults/test_faults_sweep.py carries them): truncated or bad-CRC .jsonl.gz,
truncated or random .jsonl.zst, random or truncated .parquet, 100,000-deep .jsonl and .json; a
manifest that is a list, a shard record cut short, plan.json a list."""
from __future__ import annotations

import gzip
import json
import os
import random
import shutil
from pathlib import Path

from qa.registry import add


def docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = "the of and a to in is was for on that with as by at from his it an were are".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) for _ in range(n)]


def jsonl(texts) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()


def good(ctx) -> Path:
    """400 documents of JSONL."""
    def build(ctx):
        p = ctx.root / "good.jsonl"
        p.write_bytes(jsonl(docs(400)))
        return p
    return ctx.once("data_good", build)


def tokenizer(ctx) -> str:
    """A 300-token BPE trained by `cgpt data prepare --tokenizer train` on `good`."""
    def build(ctx):
        out = ctx.root / "tokstore"
        r = ctx.cgpt(["data", "prepare", str(good(ctx)), "--tokenizer", "train",
                      "--vocab-size", "300", "--out", str(out), "--no-progress"])
        if r.returncode:
            raise RuntimeError(f"the tokenizer's prepare failed:\n{r.stderr[-1000:]}")
        return str(out / "tokenizer.json")
    return ctx.once("data_tokenizer", build)


def prepare(ctx, src, out, *extra) -> list[str]:
    return ["data", "prepare", str(src), "--tokenizer", tokenizer(ctx), "--out", str(out),
            "--no-progress", *extra]


def shas(store: Path) -> list[str]:
    return [s["sha256"] for s in json.loads((store / "manifest.json").read_text())["shards"]]


# ---- source files ----------------------------------------------------------------------------
def _parquet(path: Path, table: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table(table), path)


def _zst(data: bytes) -> bytes:
    import zstandard
    return zstandard.ZstdCompressor().compress(data)


SOURCES = {  # name -> (file name, how to write it)
    "gz-random": ("a.jsonl.gz", lambda p: p.write_bytes(os.urandom(2000))),
    "gz-empty": ("a.jsonl.gz", lambda p: p.write_bytes(b"")),
    "json-gz-truncated": ("a.json.gz", lambda p: p.write_bytes(
        gzip.compress(json.dumps([{"text": "x"}] * 50).encode())[:40])),
    "zst-empty": ("a.jsonl.zst", lambda p: p.write_bytes(b"")),
    "json-zst-random": ("a.json.zst", lambda p: p.write_bytes(os.urandom(500))),
    "parquet-empty": ("a.parquet", lambda p: p.write_bytes(b"")),
    "parquet-int-column": ("a.parquet", lambda p: _parquet(p, {"text": list(range(10))})),
    "parquet-no-column": ("a.parquet", lambda p: _parquet(p, {"body": docs(10)})),
    "jsonl-deep-in-object": ("a.jsonl", lambda p: p.write_bytes(
        ('{"text": ' + "[" * 100000 + "]" * 100000 + "}\n").encode())),
    "json-array-truncated": ("a.json", lambda p: p.write_bytes(
        json.dumps([{"text": "x"}] * 50).encode()[:-30])),
    "json-array-of-ints": ("a.json", lambda p: p.write_bytes(b"[1, 2, 3]")),
    "json-scalar": ("a.json", lambda p: p.write_bytes(b"42")),
    "jsonl-bad-line": ("a.jsonl", lambda p: p.write_bytes(jsonl(docs(200))[:2000]
                                                          + b"{not json\n")),
    "jsonl-not-object": ("a.jsonl", lambda p: p.write_bytes(b"[1,2]\n")),
    "jsonl-no-column": ("a.jsonl", lambda p: p.write_bytes(b'{"body": "x"}\n')),
    "jsonl-int-column": ("a.jsonl", lambda p: p.write_bytes(b'{"text": 5}\n')),
    "jsonl-binary": ("a.jsonl", lambda p: p.write_bytes(os.urandom(3000))),
    "jsonl-empty": ("a.jsonl", lambda p: p.write_bytes(b"")),
    "txt-binary": ("a.txt", lambda p: p.write_bytes(b"\xff\xfe\x00\x81" * 100)),
    "txt-empty": ("a.txt", lambda p: p.write_bytes(b"")),
    "md-binary": ("a.md", lambda p: p.write_bytes(b"\x80" * 50)),
    "py-latin1": ("a.py", lambda p: p.write_bytes("caf\xe9 = 1\n".encode("latin-1"))),
    "unsupported-ext": ("a.csv", lambda p: p.write_bytes(b"text\nx\n")),
}


def _one_bad_in_folder(d: Path) -> None:
    (d / "good.jsonl").write_bytes(jsonl(docs(200)))
    (d / "sub").mkdir()
    (d / "sub" / "bad.jsonl.gz").write_bytes(gzip.compress(jsonl(docs(200)))[:100])


def _dir_named_jsonl(d: Path) -> None:
    (d / "x.jsonl").mkdir()


def _symlink_loop(d: Path) -> None:
    (d / "a.jsonl").symlink_to(d / "a.jsonl")


FOLDERS = {"folder-one-bad": _one_bad_in_folder, "dir-named-jsonl": _dir_named_jsonl,
           "symlink-loop": _symlink_loop}


def _source_case(name, fill, file_name=None):
    def make(ctx):
        d = ctx.fresh(f"src-{name}")
        d.mkdir(parents=True)
        src = d
        if file_name:
            src = d / file_name
            fill(src)
        else:
            fill(d)
        return {"argv": prepare(ctx, src, ctx.fresh("store"), "--num-proc", "2"),
                "timeout": 300}
    add(name, "error", "data", make)


for _n, (_file, _fill) in SOURCES.items():
    _source_case(_n, _fill, _file)
for _n, _fill in FOLDERS.items():
    _source_case(_n, _fill)


# ---- flags -----------------------------------------------------------------------------------
def _flag_case(name, extra_of):
    def make(ctx):
        argv = prepare(ctx, good(ctx), ctx.fresh("store"))
        extra = extra_of(ctx)
        for i in range(0, len(extra), 2):  # replace the flag if present
            if extra[i] in argv:
                argv[argv.index(extra[i]) + 1] = extra[i + 1]
            else:
                argv += extra[i:i + 2]
        return {"argv": argv, "timeout": 300}
    add(name, "error", "data", make)


def _made(p: Path, data: bytes | None) -> str:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.mkdir() if data is None else p.write_bytes(data)
    return str(p)


_flag_case("num-proc-zero", lambda ctx: ["--num-proc", "0"])
_flag_case("num-proc-neg", lambda ctx: ["--num-proc", "-3"])
_flag_case("vocab-size-zero", lambda ctx: ["--tokenizer", "train", "--vocab-size", "0"])
_flag_case("tokenizer-missing", lambda ctx: ["--tokenizer", str(ctx.root / "nope.json")])
_flag_case("tokenizer-garbage", lambda ctx: [
    "--tokenizer", _made(ctx.fresh("garbage.json"), b"{not json")])
_flag_case("tokenizer-dir-empty", lambda ctx: ["--tokenizer", _made(ctx.fresh("tokdir"), None)])
_flag_case("out-is-file", lambda ctx: ["--out", _made(ctx.fresh("afile"), b"x")])
_flag_case("out-nonempty", lambda ctx: [
    "--out", str(Path(_made(ctx.fresh("nonempty") / "x", b"x")).parent)])


# ---- damaged store files ---------------------------------------------------------------------
def reference(ctx) -> Path:
    """A store of `good`, prepared with one process."""
    def build(ctx):
        out = ctx.root / "refstore"
        r = ctx.cgpt(prepare(ctx, good(ctx), out, "--num-proc", "1"))
        if r.returncode:
            raise RuntimeError(f"the reference prepare failed:\n{r.stderr[-1000:]}")
        return out
    return ctx.once("data_reference", build)


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])


def _edit(key: str, value=None, delete: bool = False):
    def damage(p: Path):
        m = json.loads(p.read_text())
        if delete:
            del m[key]
        else:
            m[key] = value
        p.write_text(json.dumps(m))
    return damage


STORE = {  # name -> (file, damage, manifest removed first (unfinished), expect)
    "manifest-truncated": ("manifest.json", _truncate, False, "error"),
    "manifest-no-dtype": ("manifest.json", _edit("dtype", delete=True), False, "error"),
    "manifest-binary": ("manifest.json", lambda p: p.write_bytes(b"\xff\xfe\x00"), False,
                        "error"),
    "plan-truncated-unfinished": ("plan.json", _truncate, True, "error"),
    "plan-no-units": ("plan.json", _edit("units", [{"kind": "jsonl"}]), True, "error"),
    "shard-record-list": ("shards/000000.json", lambda p: p.write_bytes(b"[]"), True, "ok"),
    "shard-bin-missing": ("shards/000000.bin", lambda p: p.unlink(), True, "ok"),
    "stale-tmp-shard": ("shards/000000.bin.x.tmp", lambda p: p.write_bytes(b"junk"), False, "ok"),
    "lock-file-garbage": (".prepare.lock", lambda p: p.write_bytes(b"\xff" * 10), False, "ok"),
}


def _store_copy(ctx, name: str, rel: str, damage, unfinished: bool) -> Path:
    ref = reference(ctx)
    d = ctx.fresh(f"store-{name}")
    shutil.copytree(ref, d)
    if unfinished:
        (d / "manifest.json").unlink()
    damage(d / rel)
    return d


def _store_case(name, rel, damage, unfinished, expect):
    def make(ctx):
        d = _store_copy(ctx, name, rel, damage, unfinished)
        ref = reference(ctx)
        same = lambda: None if shas(d) == shas(ref) else "shards differ from the reference"  # noqa
        return {"argv": prepare(ctx, good(ctx), d, "--num-proc", "1"), "check_ok": same,
                "timeout": 300}
    add(name, expect, "store", make)


for _n, (_rel, _damage, _unfinished, _expect) in STORE.items():
    _store_case(_n, _rel, _damage, _unfinished, _expect)


def _train_on(name, rel, damage):
    def make(ctx):
        d = _store_copy(ctx, name, rel, damage, False)
        return {"argv": ["train", "--model", "tiny-17k", "--data", str(d), "--out",
                         str(ctx.fresh("run")), "--tokens", "640", "--no-progress",
                         "train.batch_size=4", "data.seq_len=16"], "expect_text": "manifest"}
    add(f"train-on-{name}", "error", "store", make)


_train_on("manifest-list", "manifest.json", lambda p: p.write_bytes(b"[]"))
_train_on("manifest-no-dtype", "manifest.json", _edit("dtype", delete=True))
