"""Issue 42, class 2: a token store is checked against itself when it is opened (shard files
inside it, their sizes and total, its tokenizer's hash, vocab_size and eot_id), each damage one
error naming the field and the fix; a token id outside the vocabulary is named as such, not
left to become a NaN loss blamed on the learning rate."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from cgpt.data.sources import DataError
from cgpt.data.store import TokenStore

WORDS = "tokens shard store manifest worker the a of model loss scale data".split()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from cgpt.data.prepare import prepare
    from cgpt.data.tokenizer import train_tokenizer, with_eot

    root = tmp_path_factory.mktemp("store")
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(WORDS, size=int(rng.integers(20, 120)))) for _ in range(300)]
    src = root / "a.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    tok = with_eot(train_tokenizer([docs], 300), "train")
    prepare(str(src), tok, root / "s", num_proc=1, progress=False, unit_bytes=8 << 10)
    other = with_eot(train_tokenizer([docs[::-1][:50]], 280), "train")
    other.save(str(root / "other.json"))
    return root / "s"


def _copy(store, tmp_path, **manifest_changes):
    d = tmp_path / "s"
    shutil.copytree(store, d)
    m = json.loads((d / "manifest.json").read_text())
    m.update(manifest_changes)
    (d / "manifest.json").write_text(json.dumps(m))
    return d, m


def _refused(d, *words):
    with pytest.raises(DataError) as e:
        TokenStore(d)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


def test_an_intact_store_opens(store):
    s = TokenStore(store)
    assert len(s.manifest["shards"]) > 1 and len(np.asarray(s.tokens())) == s.num_tokens


def test_a_swapped_tokenizer_is_refused(store, tmp_path):
    d, _ = _copy(store, tmp_path)
    shutil.copy(store.parent / "other.json", d / "tokenizer.json")
    _refused(d, "tokenizer.json", "tokenizer_sha256", "restore")
    (d / "tokenizer.json").unlink()
    _refused(d, "tokenizer.json", "missing")


@pytest.mark.parametrize("where", ["parent", "absolute", "link"])
def test_a_shard_outside_the_store_is_refused(store, tmp_path, where):
    d, m = _copy(store, tmp_path)
    outside = tmp_path / "outside.bin"
    shutil.copy(d / m["shards"][0]["file"], outside)
    name = {"parent": "../outside.bin", "absolute": str(outside),
            "link": "shards/link.bin"}[where]
    if where == "link":
        (d / "shards" / "link.bin").symlink_to(outside)
    m["shards"][0]["file"] = name
    (d / "manifest.json").write_text(json.dumps(m))
    _refused(d, "shards[0].file", "inside the store")


def test_shard_sizes_and_the_total_are_checked(store, tmp_path):
    d, m = _copy(store, tmp_path, num_tokens=None)
    m["num_tokens"] = sum(s["num_tokens"] for s in m["shards"]) + 7
    (d / "manifest.json").write_text(json.dumps(m))
    _refused(d, "num_tokens", "hold")
    shutil.rmtree(d)
    d, m = _copy(store, tmp_path)
    f = d / m["shards"][1]["file"]
    f.write_bytes(f.read_bytes()[:-2])  # one token short
    _refused(d, "shards[1].num_tokens", "bytes")
    m["shards"][1]["num_tokens"] = -1
    (d / "manifest.json").write_text(json.dumps(m))
    _refused(d, "shards[1].num_tokens", "-1")


@pytest.mark.parametrize("key,value", [("vocab_size", 299), ("eot_id", 3),
                                       ("vocab_size", 70000)])
def test_vocab_size_and_eot_id_are_the_tokenizers(store, tmp_path, key, value):
    d, _ = _copy(store, tmp_path, **{key: value})
    _refused(d, key)


def test_an_id_outside_the_vocabulary_is_named_so(store, tmp_path):
    from cgpt.config.data import DataConfig
    from cgpt.data.batches import load_data

    d, m = _copy(store, tmp_path)
    f = d / m["shards"][0]["file"]
    a = np.fromfile(f, dtype=m["dtype"])
    a[40] = 4000  # a damaged byte pair: an id the 300-token vocabulary lacks
    a.tofile(f)
    data = load_data(DataConfig(source=str(d), seq_len=16, val_sequences=2))
    with pytest.raises(DataError) as e:
        for step in range(data.num_train_sequences // 4 + 1):
            data.train_batch(step, 4)
    msg = str(e.value)
    assert "token id 4000 at position 40" in msg and "vocab_size 300" in msg, msg
    assert "peak_lr" not in msg and str(d) in msg
