"""Fault campaign for the data / sweep-spec / sweep half of issue #23 (not part of the suite).

Every case runs the real CLI (`python -m cgpt ...`) as a subprocess against deliberately bad
input and classifies what came back:

  error      non-zero exit with one `cgpt <cmd>: error: ...` line, no traceback (wanted for bad input)
  ok         exit 0 (wanted where the input is fine or the damage is recoverable)
  traceback  a Python traceback, a signal death or no clean error line
  hang       no exit within the case's time limit
  lost       the command "succeeded" but the files disagree (a run or shard lost or wrong)
  orphan     a process of the killed command outlived it

    PYTHONPATH=$PWD python bench/fault_campaign_sweep.py [--repo DIR] [--only GROUP] [--keep]

--repo runs the cases against another checkout (e.g. `git archive` of the base commit) to
count before/after. Groups: spec, data, store, signals, sweepdir.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ERROR_LINE = re.compile(r"^cgpt [\w ]+: error: ", re.M)
TAG = f"CGPT_CAMPAIGN_{os.getpid()}"
ONLY: list[str] = []  # -k: case-name substrings (empty: every case)


def want(name: str) -> bool:
    return not ONLY or any(k in name for k in ONLY)


class Ctx:
    def __init__(self, repo: Path, ws: Path):
        self.repo, self.ws = repo, ws
        self.env = {**os.environ, "PYTHONPATH": str(repo), "JAX_PLATFORMS": "cpu",
                    "TOKENIZERS_PARALLELISM": "false", TAG: "1", "PYTHONUNBUFFERED": "1"}

    def popen(self, args: list[str], log: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "cgpt", *args], cwd=self.ws, env=self.env,
                                stdout=open(log.with_suffix(".out"), "w"),
                                stderr=open(log.with_suffix(".err"), "w"),
                                start_new_session=True)

    def cli(self, args: list[str], timeout: float = 300) -> tuple[str, str]:
        log = self.ws / f"log{time.monotonic_ns()}"
        p = self.popen(args, log)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return "hang", ""
        err = log.with_suffix(".err").read_text(errors="replace")
        return classify(rc, err), err


def classify(rc: int, err: str) -> str:
    if rc == 0:
        return "ok"
    if "Traceback (most recent call last)" in err or rc < 0:
        return "traceback"
    lines = [x for x in err.splitlines() if x.strip()]
    if lines and ERROR_LINE.match(lines[-1]) and len(ERROR_LINE.findall(err)) == 1:
        return "error"
    return "traceback"


def tagged_pids() -> list[int]:
    """Live processes started by this campaign's commands (they inherit TAG)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if f"{TAG}=1".encode() in env.split(b"\0") and stat.split(")")[-1].split()[0] != "Z":
            out.append(int(d.name))
    return out


# ---- spec cases ------------------------------------------------------------------------
BASE_SPEC = {"name": "camp", "base": {"preset": "tiny-17k", "data": {"vocab_size": 512,
             "seq_len": 16}, "train": {"batch_size": 4, "tokens": 640}},
             "grid": {"model": ["tiny-17k"], "seed": [0]}}


def _with(path: str, value):
    spec = json.loads(json.dumps(BASE_SPEC))
    *parents, last = path.split("/")
    d = spec
    for p in parents:
        d = d.setdefault(p, {})
    d[last] = value
    return spec


BAD_SPECS = {  # name -> spec (every one must be refused with one error line)
    "name-list": _with("name", [1, 2]), "name-map": _with("name", {"a": 1}),
    "description-map": _with("description", {"a": [1]}),
    "base-int": _with("base", 5), "base-list": _with("base", [1]),
    "base-train-int": _with("base/train", 5), "base-train-tokens-list": _with("base/train/tokens", [1]),
    "base-model-str": _with("base/model", "x"), "base-preset-list": _with("base/preset", [1]),
    "base-data-source-map": _with("base/data/source", {"a": 1}),
    "models-list": _with("models", [1]), "models-int-entry": _with("models", {"m": 5}),
    "models-preset-list": {**_with("models", {"m": {"preset": [1]}}),
                           "grid": {"model": ["m"]}},
    "grid-list": _with("grid", [1]), "grid-model-map": _with("grid/model", {"a": 1}),
    "grid-model-nested": _with("grid/model", [[1]]), "grid-tokens-map": _with("grid/tokens", {"a": 1}),
    "grid-tokens-str": _with("grid/tokens", "abc"), "grid-tpp-neg": _with("grid/tokens_per_param", -1),
    "grid-flops-zero": _with("grid/flops", 0), "grid-seed-str": _with("grid/seed", "x"),
    "grid-seed-float": _with("grid/seed", 1.5), "grid-overrides-int": _with("grid/overrides", 5),
    "grid-overrides-entry-int": _with("grid/overrides", [5]),
    "grid-overrides-value-list": _with("grid/overrides", [{"train.peak_lr": [1]}]),
    "grid-overrides-name-list": _with("grid/overrides", [{"name": [1], "train.peak_lr": 1e-3}]),
    "grid-branches-str": _with("grid/branches", "x"), "grid-branches-zero": _with("grid/branches", [0]),
    "grid-branches-two": _with("grid/branches", [2]), "grid-branches-map": _with("grid/branches", {"a": 1}),
    "per-model-list": _with("per_model", [1]), "per-model-int": _with("per_model", {"tiny-17k": 5}),
    "per-model-entry-list": _with("per_model", {"tiny-17k": [1]}),
    "per-model-bad-value": _with("per_model", {"tiny-17k": {"train.batch_size": "x"}}),
    "filter-int": _with("filter", 5), "filter-strs": _with("filter", {"tokens_per_param": ["a", "b"]}),
    "filter-one": _with("filter", {"tokens_per_param": [1]}),
    "filter-null": _with("filter", {"tokens_per_param": [None, 2]}),
    "require-int": _with("require", 5), "require-nested": _with("require", [[1]]),
    "require-map": _with("require", {"a": 1}),
    "estimate-int": _with("estimate", 5), "estimate-list": _with("estimate", [1]),
    "estimate-fps-zero": _with("estimate", {"flops_per_s": 0}),
    "estimate-fps-neg": _with("estimate", {"flops_per_s": -1e9}),
    "estimate-fps-str": _with("estimate", {"flops_per_s": "abc"}),
    "estimate-fps-inf": _with("estimate", {"flops_per_s": float("inf")}),
    "estimate-mfu-neg": _with("estimate", {"mfu": -0.5, "device_flops": 1e12}),
    "estimate-startup-neg": _with("estimate", {"startup_s": -5}),
    "estimate-unknown": _with("estimate", {"speed": 1}),
    "estimate-memory-str": _with("estimate", {"device_memory": "lots"}),
    "slurm-int": _with("slurm", 5), "slurm-list": _with("slurm", [1]), "slurm-str": _with("slurm", "x"),
    "slurm-nodes-str": _with("slurm", {"nodes": "x", "gpus_per_node": 1}),
    "slurm-gpus-neg": _with("slurm", {"nodes": 1, "gpus_per_node": -1}),
    "per-model-slurm-nodes-str": _with("per_model", {"tiny-17k": {"slurm.nodes": "two"}}),
}
BAD_SPEC_TEXT = {  # name -> raw file content
    "empty-file": "", "scalar-file": "42\n", "list-file": "- a\n- b\n", "invalid-yaml": "a: [1,\n",
    "tabs": "name:\tx\n\tgrid: 1\n", "binary": b"\x00\xff\xfe\x80garbage",
    "alias-bomb-overrides": None, "alias-bomb-tokens": None, "recursive-alias": "a: &a [1, *a]\n",
    "deep-nesting": "a: " + "[" * 5000 + "]" * 5000 + "\n",
}
BAD_SETS = {"set-value-list": ["--set", "train.peak_lr=[1]"], "set-slurm-nodes": ["--set", "slurm.nodes=x"],
            "set-estimate-zero": ["--set", "estimate.flops_per_s=0"],
            "set-unknown-section": ["--set", "foo.bar=1"], "set-no-equals": ["--set", "train.peak_lr"]}


def bomb(where: str) -> str:
    lines = ["name: bomb", "base:", "  preset: tiny-17k", "  train:", "    tokens: 640"]
    anchors = ["&a0 [x, x, x, x, x, x, x, x, x]"] + [
        f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    defs = "\n".join(f"    l{i}: {a}" for i, a in enumerate(anchors))
    if where == "overrides":
        return "\n".join(lines) + "\ngrid:\n  model: tiny-17k\n  overrides:\n" + "\n".join(
            f"    - {a}" for a in anchors) + "\n"
    return ("name: bomb\ndescription:\n" + defs + "\nbase:\n  preset: tiny-17k\n  train:\n"
            "    tokens: *a8\ngrid:\n  model: tiny-17k\n")


def spec_cases(c: Ctx) -> list[tuple[str, str, str]]:
    out = []
    for name, spec in BAD_SPECS.items():
        p = c.ws / f"spec_{name}.yaml"
        p.write_text(yaml.safe_dump(spec))
        out.append((f"spec:{name}", "error", c.cli(["sweep", str(p), "--dry-run", "--no-fit"], 120)))
    for name, text in BAD_SPEC_TEXT.items():
        p = c.ws / f"spec_{name}.yaml"
        if text is None:
            text = bomb("overrides" if "overrides" in name else "tokens")
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        out.append((f"spec:{name}", "error", c.cli(["sweep", str(p), "--dry-run", "--no-fit"], 60)))
    p = c.ws / "spec_ok.yaml"
    p.write_text(yaml.safe_dump(BASE_SPEC))
    for name, flags in BAD_SETS.items():
        out.append((f"spec:{name}", "error", c.cli(["sweep", str(p), "--dry-run", "--no-fit", *flags], 120)))
    for name, path in (("missing-file", c.ws / "nope.yaml"), ("directory", c.ws)):
        out.append((f"spec:{name}", "error", c.cli(["sweep", str(path), "--dry-run", "--no-fit"], 60)))
    out.append(("spec:valid", "ok", c.cli(["sweep", str(p), "--dry-run", "--no-fit"], 120)))
    return out


# ---- data cases ------------------------------------------------------------------------
def _docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = "the of and a to in is was for on that with as by at from his it an were are".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) for _ in range(n)]


def _jsonl(docs) -> bytes:
    return "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()


def _parquet(path: Path, table: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table(table), path)


def _zst(data: bytes) -> bytes:
    import zstandard
    return zstandard.ZstdCompressor().compress(data)


def bad_sources(ws: Path) -> dict[str, Path]:
    d = ws / "sources"
    d.mkdir()
    good = _jsonl(_docs(200))
    files: dict[str, tuple[str, bytes | None]] = {
        "gz-truncated": ("a.jsonl.gz", gzip.compress(good)[:300]),
        "gz-random": ("a.jsonl.gz", os.urandom(2000)),
        "gz-empty": ("a.jsonl.gz", b""),
        "gz-bad-crc": ("a.jsonl.gz", gzip.compress(good)[:-8] + b"\0" * 8),
        "json-gz-truncated": ("a.json.gz", gzip.compress(json.dumps([{"text": "x"}] * 50).encode())[:40]),
        "zst-truncated": ("a.jsonl.zst", _zst(good)[:300]),
        "zst-random": ("a.jsonl.zst", os.urandom(2000)),
        "zst-empty": ("a.jsonl.zst", b""),
        "json-zst-random": ("a.json.zst", os.urandom(500)),
        "parquet-random": ("a.parquet", os.urandom(3000)),
        "parquet-empty": ("a.parquet", b""),
        "parquet-truncated": ("a.parquet", None),
        "parquet-int-column": ("a.parquet", None),
        "parquet-no-column": ("a.parquet", None),
        "jsonl-deep": ("a.jsonl", ("[" * 100000 + "]" * 100000 + "\n").encode()),
        "jsonl-deep-in-object": ("a.jsonl", ('{"text": ' + "[" * 100000 + "]" * 100000 + "}\n").encode()),
        "json-array-deep": ("a.json", ("[" * 100000 + "]" * 100000).encode()),
        "json-array-truncated": ("a.json", json.dumps([{"text": "x"}] * 50).encode()[:-30]),
        "json-array-of-ints": ("a.json", b"[1, 2, 3]"),
        "json-scalar": ("a.json", b"42"),
        "jsonl-bad-line": ("a.jsonl", good[:2000] + b"{not json\n"),
        "jsonl-not-object": ("a.jsonl", b"[1,2]\n"),
        "jsonl-no-column": ("a.jsonl", b'{"body": "x"}\n'),
        "jsonl-int-column": ("a.jsonl", b'{"text": 5}\n'),
        "jsonl-binary": ("a.jsonl", os.urandom(3000)),
        "jsonl-empty": ("a.jsonl", b""),
        "txt-binary": ("a.txt", b"\xff\xfe\x00\x81" * 100),
        "txt-empty": ("a.txt", b""),
        "md-binary": ("a.md", b"\x80" * 50),
        "py-latin1": ("a.py", "caf\xe9 = 1\n".encode("latin-1")),
        "unsupported-ext": ("a.csv", b"text\nx\n"),
    }
    out = {}
    for name, (fname, data) in files.items():
        p = d / name / fname
        p.parent.mkdir()
        if data is not None:
            p.write_bytes(data)
        elif name == "parquet-truncated":
            _parquet(p, {"text": _docs(300)})
            p.write_bytes(p.read_bytes()[:-200])
        elif name == "parquet-int-column":
            _parquet(p, {"text": list(range(10))})
        else:
            _parquet(p, {"body": _docs(10)})
        out[name] = p
    mixed = d / "folder-one-bad"
    mixed.mkdir()
    (mixed / "good.jsonl").write_bytes(good)
    (mixed / "sub").mkdir()
    (mixed / "sub" / "bad.jsonl.gz").write_bytes(gzip.compress(good)[:100])
    out["folder-one-bad"] = mixed
    dirfile = d / "dir-named-jsonl"
    (dirfile / "x.jsonl").mkdir(parents=True)
    out["dir-named-jsonl"] = dirfile
    loop = d / "symlink-loop"
    loop.mkdir()
    (loop / "a.jsonl").symlink_to(loop / "a.jsonl")
    out["symlink-loop"] = loop
    return out


def data_cases(c: Ctx) -> list[tuple[str, str, tuple]]:
    good = c.ws / "good.jsonl"
    good.write_bytes(_jsonl(_docs(400)))
    res = c.cli(["data", "prepare", str(good), "--tokenizer", "train", "--vocab-size", "300",
                 "--out", str(c.ws / "tokstore"), "--no-progress"], 300)
    assert res[0] == "ok", res
    tok = str(c.ws / "tokstore" / "tokenizer.json")
    out = []
    for name, src in bad_sources(c.ws).items():
        args = ["data", "prepare", str(src), "--tokenizer", tok, "--out", str(c.ws / f"out_{name}"),
                "--no-progress", "--num-proc", "2"]
        # empty text files / empty jsonl: a store with no documents is refused (error)
        if want(f"data:{name}"):
            out.append((f"data:{name}", "error", c.cli(args, 180)))
    flags = {
        "num-proc-zero": ["--num-proc", "0"], "num-proc-neg": ["--num-proc", "-3"],
        "vocab-size-zero": ["--tokenizer", "train", "--vocab-size", "0"],
        "tokenizer-missing": ["--tokenizer", str(c.ws / "nope.json")],
        "tokenizer-garbage": ["--tokenizer", str(_write(c.ws / "garbage.json", b"{not json"))],
        "tokenizer-dir-empty": ["--tokenizer", str(_mkdir(c.ws / "emptytokdir"))],
        "out-is-file": ["--out", str(_write(c.ws / "afile", b"x"))],
        "out-nonempty": ["--out", str(_write(c.ws / "nonempty" / "x", b"x").parent)],
    }
    for name, extra in flags.items():
        args = ["data", "prepare", str(good), "--tokenizer", tok, "--out", str(c.ws / f"out_{name}"),
                "--no-progress"]
        for i in range(0, len(extra), 2):  # replace the flag if present
            if extra[i] in args:
                args[args.index(extra[i]) + 1] = extra[i + 1]
            else:
                args += extra[i:i + 2]
        if want(f"data:{name}"):
            out.append((f"data:{name}", "error", c.cli(args, 180)))
    return out


def _write(p: Path, data: bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


# ---- damaged store files ---------------------------------------------------------------
def store_cases(c: Ctx) -> list[tuple[str, str, tuple]]:
    good = c.ws / "good.jsonl"
    tok = str(c.ws / "tokstore" / "tokenizer.json")
    ref = c.ws / "refstore"
    args = lambda out: ["data", "prepare", str(good), "--tokenizer", tok, "--out", str(out),  # noqa
                        "--no-progress", "--num-proc", "1"]
    assert c.cli(args(ref), 300)[0] == "ok"
    damage = {  # name -> (file, content, expected)
        "manifest-truncated": ("manifest.json", "trunc", "error"),
        "manifest-list": ("manifest.json", b"[]", "error"),
        "manifest-no-dtype": ("manifest.json", "nodtype", "error"),
        "manifest-binary": ("manifest.json", b"\xff\xfe\x00", "error"),
        "plan-truncated-unfinished": ("plan.json", "trunc-nomanifest", "error"),
        "plan-list-unfinished": ("plan.json", b"[1]", "error"),
        "plan-no-units": ("plan.json", "nounits", "error"),
        "shard-record-truncated": ("shards/000000.json", "trunc-nomanifest", "ok"),
        "shard-record-list": ("shards/000000.json", b"[]", "ok"),
        "shard-bin-missing": ("shards/000000.bin", None, "ok"),
        "stale-tmp-shard": ("shards/000000.bin.x.tmp", b"junk", "ok"),
        "lock-file-garbage": (".prepare.lock", b"\xff" * 10, "ok"),
    }
    out = []
    for name, (fname, content, expected) in damage.items():
        d = c.ws / f"store_{name}"
        shutil.copytree(ref, d)
        p = d / fname
        if content is None or "nomanifest" in str(content):
            (d / "manifest.json").unlink()
        if content is None:
            p.unlink()
        elif content in ("trunc", "trunc-nomanifest"):
            p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])
        elif content == "nodtype":
            m = json.loads(p.read_text())
            del m["dtype"]
            p.write_text(json.dumps(m))
        elif content == "nounits":
            m = json.loads(p.read_text())
            m["units"] = [{"kind": "jsonl"}]
            p.write_text(json.dumps(m))
            (d / "manifest.json").unlink()
        else:
            p.write_bytes(content)
        res = c.cli(args(d), 180)
        if res[0] == "ok" and expected == "ok":
            a, b = (json.loads((x / "manifest.json").read_text()) for x in (ref, d))
            if [s["sha256"] for s in a["shards"]] != [s["sha256"] for s in b["shards"]]:
                res = ("lost", "shards differ from the reference prepare")
        out.append((f"store:{name}", expected, res))
    # training on a damaged store: data.source=DIR
    for name in ("manifest-list", "manifest-no-dtype"):
        d = c.ws / f"store_{name}"
        res = c.cli(["train", "--model", "tiny-17k", "--data", str(d), "--out", str(c.ws / f"run_{name}"),
                     "--tokens", "640", "--no-progress", "train.batch_size=4", "data.seq_len=16"], 300)
        out.append((f"store:train-on-{name}", "error", res))
    return out


# ---- signals and concurrency -----------------------------------------------------------
def _wait_for(pred, timeout: float) -> bool:
    t = time.time() + timeout
    while time.time() < t:
        if pred():
            return True
        time.sleep(0.1)
    return False


def _children(pid: int) -> list[int]:
    return [p for p in tagged_pids() if p != pid]


def signal_cases(c: Ctx) -> list[tuple[str, str, tuple]]:
    big = c.ws / "big"
    big.mkdir()
    for i in range(6):  # ~6 x 3 MB: a few seconds of tokenizing per worker on a loaded machine
        (big / f"part{i}.jsonl").write_bytes(_jsonl(_docs(25000, i)))
    tok = str(c.ws / "tokstore" / "tokenizer.json")
    ref = c.ws / "sigref"
    base = lambda out, t=tok: ["data", "prepare", str(big), "--tokenizer", t, "--out", str(out),  # noqa
                               "--no-progress", "--num-proc", "2"]
    assert c.cli(base(ref), 600)[0] == "ok"
    ref_sha = [s["sha256"] for s in json.loads((ref / "manifest.json").read_text())["shards"]]
    out = []
    shards = lambda d: any((d / "shards").glob("*.json"))  # noqa: E731 - a unit finished
    phases = {"startup": lambda p, d: time.time() - p.t0 > 0.5,  # Python and cgpt importing
              "plan-written": lambda p, d: (d / "plan.json").exists(),
              "workers": lambda p, d: len(_children(p.pid)) >= 2,
              "shards-partial": lambda p, d: shards(d),
              "tokenizer-training": lambda p, d: time.time() - p.t0 > 4.0}
    cases = [(sig, phase, False) for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT,
                                             signal.SIGUSR1) for phase in phases]
    cases += [(signal.SIGINT, "workers", True), (signal.SIGTERM, "workers", True)]  # to the group
    for sig, phase, group in cases:
        name = f"signals:prepare-{sig.name}-{phase}" + ("-group" if group else "")
        if not want(name):
            continue
        tag = f"{sig.name}_{phase}{'_group' if group else ''}"
        d, log = c.ws / f"sig_{tag}", c.ws / f"siglog_{tag}"
        t = "train" if phase == "tokenizer-training" else tok
        args = base(d, t) + (["--vocab-size", "300"] if t == "train" else [])
        p = c.popen(args, log)
        p.t0 = time.time()
        _wait_for(lambda: phases[phase](p, d) or p.poll() is not None, 300)
        try:
            os.killpg(p.pid, sig) if group else os.kill(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            rc = p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            out.append((name, "ok", ("hang", "")))
            continue
        survived = _wait_for(lambda: not _children(p.pid), 10) is False
        for q in _children(p.pid):
            os.kill(q, signal.SIGKILL)
        if survived:
            out.append((name, "ok", ("orphan", "workers outlived the prepare")))
            continue
        err = log.with_suffix(".err").read_text(errors="replace")
        lines = [x for x in err.splitlines() if x.strip()]
        if sig != signal.SIGKILL and rc != 0 and not (
                rc == 128 + sig and len(lines) == 1 and re.match(
                    r"cgpt data: (interrupted|stopped by SIG\w+); rerun the same command", lines[0])):
            out.append((name, "ok", ("traceback", f"rc={rc}, not one line: {err[-600:]}")))
            continue
        res = c.cli(args, 600)
        if res[0] == "ok" and t != "train":
            sha = [s["sha256"] for s in json.loads((d / "manifest.json").read_text())["shards"]]
            if sha != ref_sha:
                res = ("lost", "the resumed store differs from the reference")
        out.append((name, "ok", res))
    if not want("signals:prepare-concurrent"):
        return out
    # two prepares of one --out
    d = c.ws / "concurrent"
    p = c.popen(base(d), c.ws / "conc_a")
    _wait_for(lambda: len(_children(p.pid)) >= 2, 120)
    second = c.cli(base(d), 120)
    rc = p.wait(600)
    first_ok = rc == 0
    out.append(("signals:prepare-concurrent-second", "error", second))
    out.append(("signals:prepare-concurrent-first", "ok", ("ok" if first_ok else "traceback", "")))
    return out


# ---- sweep directories -------------------------------------------------------------------
SWEEP_SPEC = {"name": "dirs", "base": {"preset": "tiny-17k", "data": {"vocab_size": 512, "seq_len": 16,
              "val_sequences": 8}, "train": {"batch_size": 4, "tokens": 640, "eval_every": 10}},
              "grid": {"model": ["tiny-17k"], "seed": [0]}}


def sweepdir_cases(c: Ctx) -> list[tuple[str, str, tuple]]:
    spec = c.ws / "sweep_dirs.yaml"
    spec.write_text(yaml.safe_dump(SWEEP_SPEC))
    ref = c.ws / "sweep_ref"
    flags = ["--no-compile-cache"]
    res = c.cli(["sweep", str(spec), "--out", str(ref), *flags], 600)
    assert res[0] == "ok", res
    rid = "tiny-17k_d640_s0"
    damage = {  # name -> (relative file, content, expected)
        "summary-truncated": (f"{rid}/summary.json", "half", "ok"),
        "summary-list": (f"{rid}/summary.json", b"[]", "ok"),
        "summary-random": (f"{rid}/summary.json", os.urandom(64), "ok"),
        "summary-empty": (f"{rid}/summary.json", b"", "ok"),
        "failed-json-truncated": (f"{rid}/failed.json", b'{"error": "bo', "ok"),
        "config-truncated": (f"{rid}/config.yaml", "half-nosummary", "error"),
        "config-binary": (f"{rid}/config.yaml", b"\xff\x00\xfe" * 30, "error"),
        "config-alias-bomb": (f"{rid}/config.yaml", bomb("tokens").encode(), "error"),
        "results-csv-directory": ("results.csv", "dir", "error"),
        "sweep-yaml-directory": ("sweep.yaml", "dir", "error"),
        "sweep-lock-directory": (".sweep.lock", "dir", "error"),
        "sweep-lock-garbage": (".sweep.lock", b"\xff\xfe garbage", "ok"),
        "run-dir-is-file": (rid, "file", "error"),
        "identity-garbage": (f"{rid}/identity.json", b"\x00\x01", "ok"),
        "run-yaml-deleted-unfinished": (f"{rid}/run.yaml", "delete-nosummary", "ok"),
        "run-dir-deleted": (rid, "rmtree", "ok"),
    }
    out = []
    for name, (rel, content, expected) in damage.items():
        if not want(f"sweepdir:{name}"):
            continue
        d = c.ws / f"sweepdir_{name}"
        shutil.copytree(ref, d, symlinks=True)
        p = d / rel
        if isinstance(content, str) and "nosummary" in content:
            (d / rid / "summary.json").unlink()
        if content == "dir":
            p.unlink(missing_ok=True)
            p.mkdir()
        elif content == "file":
            shutil.rmtree(p)
            p.write_text("x")
        elif content == "rmtree":
            shutil.rmtree(p)
        elif isinstance(content, str) and content.startswith("half"):
            p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])
        elif content == "delete-nosummary":
            p.unlink()
        else:
            if name.startswith("failed"):
                (d / rid / "summary.json").unlink()
            p.write_bytes(content)
        res = c.cli(["sweep", str(spec), "--out", str(d), *flags], 600)
        if res[0] == "ok":
            import csv
            rows = list(csv.DictReader(open(d / "results.csv")))
            try:
                json.loads((d / rid / "summary.json").read_text())
                summary_ok = True
            except (OSError, ValueError):
                summary_ok = False
            if not (rows and rows[0]["status"] == "done" and summary_ok):
                res = ("lost", f"results.csv status {rows[0]['status'] if rows else None}, "
                               f"summary parses: {summary_ok}")
        out.append((f"sweepdir:{name}", expected, res))
    # signals on a sweep: SIGKILL / SIGINT while a run trains, and a concurrent launch
    for sig in (signal.SIGKILL, signal.SIGINT, signal.SIGTERM):
        if not want(f"signals:sweep-{sig.name}"):
            continue
        d = c.ws / f"sweepsig_{sig.name}"
        p = c.popen(["sweep", str(spec), "--out", str(d), *flags], c.ws / f"sweepsig_{sig.name}")
        _wait_for(lambda: (d / rid / "config.yaml").exists(), 300)
        os.kill(p.pid, sig)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            out.append((f"signals:sweep-{sig.name}", "ok", ("hang", "")))
            continue
        if not _wait_for(lambda: not _children(p.pid), 30):
            for q in _children(p.pid):
                os.kill(q, signal.SIGKILL)
            out.append((f"signals:sweep-{sig.name}", "ok", ("orphan", "")))
            continue
        err = (c.ws / f"sweepsig_{sig.name}").with_suffix(".err").read_text(errors="replace")
        if "Traceback (most recent call last)" in err:
            out.append((f"signals:sweep-{sig.name}", "ok", ("traceback", err)))
            continue
        out.append((f"signals:sweep-{sig.name}", "ok",
                    c.cli(["sweep", str(spec), "--out", str(d), *flags], 600)))
    if not want("signals:sweep-concurrent"):
        return out
    d = c.ws / "sweep_concurrent"
    p = c.popen(["sweep", str(spec), "--out", str(d), *flags], c.ws / "sweepconc")
    _wait_for(lambda: (d / ".sweep.lock").exists() and (d / "results.csv").exists(), 300)
    out.append(("signals:sweep-concurrent-second", "error",
                c.cli(["sweep", str(spec), "--out", str(d), *flags], 300)))
    rc = p.wait(600)
    out.append(("signals:sweep-concurrent-first", "ok", ("ok" if rc == 0 else "traceback", "")))
    return out


GROUPS = {"spec": spec_cases, "data": data_cases, "store": store_cases, "signals": signal_cases,
          "sweepdir": sweepdir_cases}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--only", help="comma-separated groups: " + ", ".join(GROUPS))
    ap.add_argument("--json", help="write every case's outcome here")
    ap.add_argument("--keep", action="store_true", help="keep the workspace")
    ap.add_argument("-k", default="", help="only cases whose name contains one of these "
                    "(comma-separated); the setup of their groups still runs")
    args = ap.parse_args()
    ws = Path(tempfile.mkdtemp(prefix="cgpt-campaign-"))
    c = Ctx(Path(args.repo).resolve(), ws)
    ONLY[:] = [k for k in args.k.split(",") if k]
    groups = args.only.split(",") if args.only else list(GROUPS)
    if any(g in groups for g in ("store", "signals")) and "data" not in groups:
        groups.insert(0, "data")  # the tokenizer and corpus they use
    results = []
    try:
        for g in groups:
            for name, expected, (outcome, err) in GROUPS[g](c):
                if not want(name):
                    continue
                ok = outcome == expected
                results.append({"case": name, "expected": expected, "outcome": outcome, "pass": ok,
                                "stderr_tail": err[-400:] if not ok else ""})
                print(f"{'PASS' if ok else 'FAIL'} {name}: {outcome} (wanted {expected})"
                      + ("" if ok else f"\n     {err.strip().splitlines()[-1][:300] if err.strip() else ''}"),
                      flush=True)
    finally:
        for q in tagged_pids():
            os.kill(q, signal.SIGKILL)
        if not args.keep:
            shutil.rmtree(ws, ignore_errors=True)
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    n_pass = sum(r["pass"] for r in results)
    print(f"\n{len(results)} cases: {n_pass} as wanted, {len(results) - n_pass} not; outcomes {counts}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if n_pass == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
