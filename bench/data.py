"""Token-store preparation throughput and memory: `cgpt data prepare` vs raw `tokenizers`.

Generates a JSONL corpus of --gb gigabytes (real text: random slices of the running Python's
standard-library sources, split over --files files as the Pile is) and its .jsonl.zst form
under --dir, trains a 50,257-entry byte-level BPE (GPT-2's size) on a sample, then measures,
in the same run and on the same text:

* raw: `Tokenizer.encode_batch_fast` on batches of documents, all cores (its own threads),
  timing only the encode calls (reading and JSON parsing excluded);
* prepare: `python -m cgpt data prepare` on the JSONL folder and on the .zst folder (all
  cores), wall time, and the peak summed RSS of its whole process tree (sampled every 0.2 s).

    python bench/data.py [--gb 1.0] [--files 8] [--dir /tmp/cgpt-bench-data]
Targets: prepare >= 80% of the raw tokens/s; peak RSS <= 2 GB. The corpus is never committed.
Also printed: tokens per CPU-second of each side, the fair comparison on a machine shared with
other jobs, where wall-clock rates follow the neighbours' load. (psutil comes with orbax.)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def make_corpus(out: Path, gb: float, files: int, seed: int = 0) -> list[Path]:
    """JSONL files of documents that are random slices (200 B .. 20 KB) of the stdlib text."""
    from cgpt.data import corpus

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "jsonl" / f"part{i:02d}.jsonl" for i in range(files)]
    if all(p.is_file() for p in paths) and sum(p.stat().st_size for p in paths) >= gb * 1e9:
        return paths
    text = "\n".join(t for _, t, _ in corpus.documents())
    rng = np.random.default_rng(seed)
    per_file = gb * 1e9 / files
    for path in paths:
        path.parent.mkdir(exist_ok=True)
        with open(path, "w") as f:
            size = 0
            while size < per_file:
                n = int(rng.integers(200, 20_000))
                a = int(rng.integers(0, len(text) - n))
                line = json.dumps({"text": text[a:a + n]}) + "\n"
                f.write(line)
                size += len(line)
    return paths


def compress(paths: list[Path], out: Path) -> list[Path]:
    import zstandard

    out.mkdir(exist_ok=True)
    done = []
    for p in paths:
        z = out / (p.name + ".zst")
        if not z.is_file():
            with open(p, "rb") as src, open(str(z) + ".tmp", "wb") as dst:
                zstandard.ZstdCompressor(level=3, threads=-1).copy_stream(src, dst)
            os.replace(str(z) + ".tmp", z)
        done.append(z)
    return done


def tokenizer(path: Path, sample: Path):
    from cgpt.data.tokenizer import train_tokenizer

    if not path.is_file():
        with open(sample) as f:
            docs = [json.loads(line)["text"] for _, line in zip(range(3000), f)]
        train_tokenizer([docs[i:i + 100] for i in range(0, len(docs), 100)], 50257).save(str(path))
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def raw_throughput(tok, paths: list[Path]) -> tuple[int, float, float]:
    """(tokens, seconds inside encode_batch_fast, CPU seconds of those calls) over every document."""
    tok.encode_special_tokens = True
    tokens, busy, cpu = 0, 0.0, 0.0
    for p in paths:
        batch, size = [], 0
        with open(p) as f:
            for line in f:
                batch.append(json.loads(line)["text"])
                size += len(batch[-1])
                if size >= 1 << 22:
                    t0, c0 = time.perf_counter(), time.process_time()
                    encs = tok.encode_batch_fast(batch, add_special_tokens=False)
                    busy, cpu = busy + time.perf_counter() - t0, cpu + time.process_time() - c0
                    tokens += sum(len(e) for e in encs) + len(batch)  # + one <|endoftext|> each, as stored
                    batch, size = [], 0
        if batch:
            t0, c0 = time.perf_counter(), time.process_time()
            encs = tok.encode_batch_fast(batch, add_special_tokens=False)
            busy, cpu = busy + time.perf_counter() - t0, cpu + time.process_time() - c0
            tokens += sum(len(e) for e in encs) + len(batch)
    return tokens, busy, cpu


def run_prepare(source: Path, tok_path: Path, out: Path) -> dict:
    """Wall time and peak RSS (summed over the process tree) of `cgpt data prepare`."""
    import shutil

    import psutil

    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "cgpt", "data", "prepare", str(source), "--tokenizer", str(tok_path),
           "--out", str(out), "--no-progress"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root, peak, peak_one, cpu = psutil.Process(proc.pid), 0, 0, {}
    while proc.poll() is None:
        try:
            procs = [root] + root.children(recursive=True)
            rss = []
            for p in procs:
                try:
                    with p.oneshot():
                        rss.append(p.memory_info().rss)
                        t = p.cpu_times()
                        cpu[p.pid] = t.user + t.system  # the last sample before it exits
                except psutil.Error:
                    pass
            peak, peak_one = max(peak, sum(rss)), max([peak_one] + rss)
        except psutil.Error:
            pass
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    out_s, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"prepare failed ({proc.returncode}): {err[-2000:]}")
    m = json.loads((out / "manifest.json").read_text())
    cpu_s = sum(cpu.values())
    return {"tokens": m["num_tokens"], "seconds": wall, "tokens_per_s": m["num_tokens"] / wall,
            "cpu_seconds": cpu_s, "tokens_per_cpu_s": m["num_tokens"] / cpu_s,
            "peak_rss_gb": peak / 1e9, "peak_rss_one_process_gb": peak_one / 1e9, "shards": len(m["shards"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=1.0, help="JSONL corpus size (>= 1 for the target)")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--dir", default="/tmp/cgpt-bench-data")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from cgpt.data.sources import cpu_count

    d = Path(args.dir)
    t0 = time.perf_counter()
    jsonl = make_corpus(d, args.gb, args.files)
    zst = compress(jsonl, d / "zst")
    tok_path = d / "tokenizer-50257.json"
    tok = tokenizer(tok_path, jsonl[0])
    gb = sum(p.stat().st_size for p in jsonl) / 1e9
    print(f"corpus: {gb:.2f} GB JSONL in {len(jsonl)} files, {sum(p.stat().st_size for p in zst) / 1e9:.2f} GB "
          f".zst; tokenizer {tok.get_vocab_size()} tokens; {cpu_count()} cores "
          f"(setup {time.perf_counter() - t0:.0f} s)", flush=True)
    tokens, busy, cpu = raw_throughput(tok, jsonl)
    raw = tokens / busy
    print(f"raw tokenizers encode_batch_fast: {tokens:,} tokens in {busy:.1f} s = {raw:,.0f} tokens/s; "
          f"{tokens / cpu:,.0f} tokens per CPU-second", flush=True)
    results = {"raw": {"tokens": tokens, "seconds": busy, "tokens_per_s": raw, "cpu_seconds": cpu,
                       "tokens_per_cpu_s": tokens / cpu}}
    for name, src in (("jsonl", d / "jsonl"), ("jsonl.zst", d / "zst")):
        r = run_prepare(src, tok_path, d / f"store-{name}")
        if r["tokens"] != tokens:
            raise RuntimeError(f"{name}: prepare made {r['tokens']} tokens, raw encode {tokens}")
        r["vs_raw"] = r["tokens_per_s"] / raw
        r["cpu_efficiency_vs_raw"] = r["tokens_per_cpu_s"] / results["raw"]["tokens_per_cpu_s"]
        results[name] = r
        print(f"cgpt data prepare ({name}): {r['tokens_per_s']:,.0f} tokens/s = {r['vs_raw']:.0%} of raw "
              f"(target >= 80%); per CPU-second {r['cpu_efficiency_vs_raw']:.0%} of raw; "
              f"{r['seconds']:.1f} s, {r['shards']} shards, peak RSS {r['peak_rss_gb']:.2f} GB "
              f"summed over its processes (target <= 2 GB; largest one {r['peak_rss_one_process_gb']:.2f} GB)",
              flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
