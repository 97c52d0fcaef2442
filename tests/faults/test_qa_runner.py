"""The fault-campaign runner (qa/): its registry, its classification of outcomes, and one
cheap case end to end. The campaign itself is slow and runs by hand (docs/faults.md)."""
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from qa import campaign
from qa.registry import EXPECTS, add, all_cases

REPO = Path(__file__).resolve().parents[2]


def _res(rc: int, err: str = "") -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(["cgpt"], rc, "", err)


def test_every_case_is_registered_once_with_a_known_expectation():
    cases = all_cases()
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)) and len(ids) > 300
    assert {c.expect for c in cases} <= set(EXPECTS)
    groups = {c.group for c in cases}
    assert {"rundir", "load", "flags", "signals", "spec", "data", "store", "prepare",
            "sweepdir", "analysis", "concurrent"} <= groups


def test_a_name_registered_twice_or_a_bad_expectation_is_refused(monkeypatch):
    from qa import registry
    monkeypatch.setattr(registry, "_CASES", dict(registry._CASES))  # leave the real one as is
    make = lambda ctx: {"argv": ["list"]}  # noqa: E731
    add("twice", "ok", "test-registry", make)
    with pytest.raises(ValueError, match="registered twice"):
        add("twice", "ok", "test-registry", make)
    with pytest.raises(ValueError, match="expect must be one of"):
        add("maybe", "sometimes", "test-registry", make)


@pytest.mark.parametrize("expect, results, outcome", [
    ("error", [_res(2, "tiny-17k: ...\ncgpt train: error: x is bad\n")], "error"),
    ("error", [_res(0)], "ACCEPTED"),
    ("ok", [_res(2, "cgpt train: error: no\n")], "REFUSED"),
    ("either", [_res(2, "Traceback (most recent call last):\n  ...\nValueError: x\n")],
     "TRACEBACK"),
    ("error", [_res(1, "some library message\n")], "TRACEBACK"),
    ("error", [_res(2, "cgpt sweep: error: a\ncgpt sweep: error: b\n")], "TRACEBACK"),
    ("either", [_res(-11, "")], "TRACEBACK"),
    ("either", [_res(130, "cgpt train: interrupted; rerun with --resume\n")], "error"),
    ("either", [_res(0), _res(2, "cgpt train: error: in use by pid 7\n")], "error"),
    ("error", [_res(2, "usage: cgpt ...\ncgpt: error: argument command: invalid choice\n")],
     "error"),  # argparse's line before a subcommand is chosen
    ("error", [_res(2, "cgpt coord-check: error: --widths 64: ...\n")], "error"),
    ("error", [_res(2, "cgpt data prepare: error: the following arguments are required\n")],
     "error"),
])
def test_classify(expect, results, outcome):
    assert campaign.classify(expect, results)[0] == outcome


@pytest.mark.parametrize("outcome, verdict", [
    ("ok", "OK"), ("error", "OK"), ("MISLEADING", "WEAK"), ("TRACEBACK", "TRACEBACK"),
    ("SETUP", "SETUP"), ("ACCEPTED", "FAIL"), ("REFUSED", "FAIL"), ("LOST", "FAIL"),
    ("ORPHAN", "FAIL"), ("HANG", "FAIL")])
def test_verdicts(outcome, verdict):
    assert campaign.verdict(outcome) == verdict


def test_sigterm_before_the_handlers_is_a_clean_stop():
    killed = _res(-signal.SIGTERM, "")
    assert campaign.classify("either", [killed], sent=signal.SIGTERM)[0] == "error"
    assert campaign.classify("either", [killed])[0] == "TRACEBACK"


def test_select_by_group_name_or_glob():
    cases = all_cases()
    flags = campaign.select(cases, "flags")
    assert flags and all(c.group == "flags" for c in flags)
    sig = campaign.select(cases, "signals:SIGINT*")
    assert sig and all(c.group == "signals" and c.name.startswith("SIGINT") for c in sig)
    assert campaign.select(cases, "") == cases


def test_the_runner_lists_and_runs_a_case(tmp_path):
    """Two analysis cases (no JAX) through `python -m qa.campaign`, as a user runs it."""
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "qa.campaign", "--list", "--only", "analysis"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and '"analysis": 19' in out.stdout, out.stderr
    report = tmp_path / "out.json"
    run = subprocess.run([sys.executable, "-m", "qa.campaign", "--only",
                          "analysis:fit_level_95,analysis:fit_x_strings", "--json",
                          str(report)], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert '"cases": 2, "as_wanted": 2, "error": 2' in run.stdout, run.stdout
    rows = json.loads(report.read_text())
    assert [r["outcome"] for r in rows] == ["error", "error"]
    assert "level=95" in rows[0]["msg"]
