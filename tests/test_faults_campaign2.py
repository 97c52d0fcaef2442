"""Faults found by campaign 4 (qa/cases/sweepdata.py): a sweep's run files damaged, read by
analysis.read_curves / gns.noise_table. Each was a parser message without the file, a KeyError,
or a silent use of another run's curve; now one error naming the file (no JAX: fast)."""
import json
import shutil
from pathlib import Path

import pytest

import analysis as A
from analysis import gns

REPO = Path(__file__).resolve().parents[1]
RUN = "tiny-13k_d269k_s0"


@pytest.fixture
def demo(tmp_path):
    d = tmp_path / "demo"
    shutil.copytree(REPO / "notebooks" / "data" / "demo", d)
    return d


@pytest.fixture
def cb(tmp_path):
    d = tmp_path / "cb"
    shutil.copytree(REPO / "notebooks" / "data" / "critical_batch", d)
    return d


@pytest.mark.parametrize("damage, named", [
    (lambda b: b.replace(b"\n", b"\n}{garbage\n", 1), "line 2 is not JSON"),
    (lambda b: b"\x00\xff\xfe" * 10, "not UTF-8"),
    (lambda b: json.dumps([json.loads(x) for x in b.decode().splitlines()]).encode(),
     "not an object"),
    (lambda b: b"".join(json.dumps({**json.loads(x), "loss": None}).encode() + b"\n"
                        for x in b.splitlines()), "all null"),
    (lambda b: b"".join(json.dumps({**json.loads(x), "tokens": [1]}).encode() + b"\n"
                        for x in b.splitlines()), "'tokens' must be a number"),
])
def test_a_damaged_training_log_is_named(demo, damage, named):
    log = demo / RUN / "metrics.jsonl"
    log.write_bytes(damage(log.read_bytes()))
    with pytest.raises(ValueError, match=named) as e:
        A.read_curves(demo)
    assert str(log) in str(e.value)


def test_a_torn_last_line_is_dropped_with_a_warning(demo):
    log = demo / RUN / "metrics.jsonl"
    whole = len(A.read_curves(demo))
    log.write_bytes(log.read_bytes()[:-40])
    with pytest.warns(UserWarning, match="cut short"):
        assert len(A.read_curves(demo)) < whole


def test_a_stale_run_dir_never_lends_another_runs_curve(demo):
    """results.csv's run_dir names an existing folder of another run, the run's own is gone."""
    import pandas as pd
    csv = demo / "results.csv"
    df = pd.read_csv(csv)
    shutil.rmtree(demo / df.loc[0, "run_id"])
    df.loc[0, "run_dir"] = str(demo / RUN)
    df.to_csv(csv, index=False)
    with pytest.raises(ValueError, match="holds another run"):
        A.read_curves(demo)


@pytest.mark.parametrize("text, named", [
    ("{oops", "not JSON"), ("[1, 2]", "not the run's summary"),
])
def test_a_damaged_summary_is_named_by_noise_table(cb, text, named):
    s = next(cb.glob("*/summary.json"))
    s.write_text(text)
    with pytest.raises(ValueError, match=named) as e:
        gns.noise_table(cb)
    assert str(s) in str(e.value)


def test_a_summary_without_seq_len_or_a_log_without_step_is_named(cb):
    s = next(cb.glob("*/summary.json"))
    body = json.loads(s.read_text())
    s.write_text(json.dumps({k: v for k, v in body.items() if k != "seq_len"}))
    with pytest.raises(ValueError, match="'seq_len' is missing"):
        gns.noise_table(cb)
    s.write_text(json.dumps(body))
    log = s.parent / "metrics.jsonl"
    log.write_text("".join(json.dumps({k: v for k, v in json.loads(x).items() if k != "step"})
                           + "\n" for x in log.read_text().splitlines()))
    with pytest.raises(ValueError, match=r"no \['step'\]"):
        gns.noise_table(cb)


def test_a_bad_noise_estimate_names_the_run(cb):
    log = next(cb.glob("*/metrics.jsonl"))
    log.write_text("".join(json.dumps({**json.loads(x), "gns_g2": -1.0}) + "\n"
                           for x in log.read_text().splitlines()))
    with pytest.raises(ValueError, match="not positive") as e:
        gns.noise_table(cb)
    assert str(log) in str(e.value)
