"""Faults (#33, class 1): nothing outside a run or sweep directory is truncated, appended to,
moved or deleted through a symbolic link planted in it (`cgpt.paths`, the one rule: resolve
before you change, refuse what resolves outside). `checkpoints/` on another disk through a
symlink keeps working. Each test reproduces its fault first: before the rule, `--resume`
wrote its pid into the `.lock` link's target, `--from-step` and the corrupt-checkpoint
fallback rmtree'd step-named folders through `discarded_checkpoints`/`corrupt_checkpoints`,
`--on-change rerun` through `.superseded`, and the sweep appended to a linked `train.log`."""
import csv
import shutil
from pathlib import Path

import pytest
import yaml

from cgpt import paths, rundir
from cgpt.cli import main as cli_main
from cgpt.config.data import DataConfig
from cgpt.config.model import get_config
from cgpt.config.run import RunConfig, TrainConfig
from cgpt.errors import RunDirError
from cgpt.train.loop import train

STEPS = 20
TOKENS = 8 * 16 * STEPS


def _run(corpus, cache) -> RunConfig:
    return RunConfig(
        preset="tiny-17k", model=get_config("tiny-17k"),
        data=DataConfig(source=str(corpus), vocab_size=512, seq_len=16, val_sequences=16,
                        cache_dir=str(cache)),
        train=TrainConfig(tokens=TOKENS, batch_size=8, log_every=1, ckpt_every=5,
                          keep_checkpoints=3, peak_lr=3e-3))


def _flags(corpus, cache, out, *extra):
    return ["train", "--model", "tiny-17k", "--data", str(corpus), "--out", str(out),
            "--no-progress", f"--tokens={TOKENS}", "train.batch_size=8", "train.log_every=1",
            "train.ckpt_every=5", "train.keep_checkpoints=3", "train.peak_lr=0.003",
            "data.vocab_size=512", "data.seq_len=16", "data.val_sequences=16",
            f"data.cache_dir={cache}", *extra]


@pytest.fixture(scope="module")
def base(corpus, tmp_path_factory):
    """A finished 20-step run (checkpoints 10, 15, 20) and its data cache."""
    root = tmp_path_factory.mktemp("paths")
    train(_run(corpus, root / "cache"), root / "base", progress=False)
    return root / "base", root / "cache"


def _killed(base, tmp_path) -> Path:
    """A copy of the base run as if stopped after checkpoint 15."""
    d = tmp_path / "run"
    shutil.copytree(base[0], d)
    (d / "summary.json").unlink()
    shutil.rmtree(d / "checkpoints" / "20")
    return d


def _outside(tmp_path) -> Path:
    """Someone else's directory, holding folders named like steps and a file."""
    o = tmp_path / "elsewhere"
    for s in ("10", "15", "20"):
        (o / s).mkdir(parents=True)
        (o / s / "precious.txt").write_text(f"keep {s}")
    (o / "notes.txt").write_text("mine")
    return o


def _tree(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else None
            for p in sorted(d.rglob("*"))}


def _steps(d: Path) -> list[str]:
    return sorted(p.name for p in (d / "checkpoints").iterdir() if p.name.isdigit())


def _refused(capsys, argv, named: str) -> str:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and named in err and "outside the run directory" in err, err
    assert err.strip().count("\n") == 0, err
    return err


# ---- the rule itself ---------------------------------------------------------------------
def test_the_rule_refuses_what_resolves_outside_and_keeps_what_is_inside(tmp_path):
    top, other = tmp_path / "run", _outside(tmp_path)
    (top / "sub").mkdir(parents=True)
    a = paths.Area(top, ("checkpoints",), "run directory")
    (top / "log").symlink_to(other / "notes.txt")
    (top / "aside").symlink_to(other)
    (top / "ok").symlink_to(top / "sub")  # a link that stays inside is fine
    for op in (lambda: a.append(top / "log"), lambda: a.remove(top / "aside" / "10"),
               lambda: a.move(top / "sub", top / "aside" / "10"),
               lambda: a.open_fd(top / "log", 0, "truncate"), lambda: a.check(["log"])):
        with pytest.raises(RunDirError, match=r"outside the run directory.*Remove the link"):
            op()
    assert _tree(other) == _tree(_outside(tmp_path / "again"))  # nothing changed there
    with a.append(top / "ok" / "x.log") as f:
        f.write("in")
    a.move(top / "ok" / "x.log", top / "y.log")
    assert (top / "y.log").read_text() == "in"
    (top / "checkpoints").symlink_to(other)  # the storage entry may live elsewhere
    a.move(top / "checkpoints" / "20", top / "kept" / "20")
    assert (top / "kept" / "20" / "precious.txt").read_text() == "keep 20"


# ---- run directories -------------------------------------------------------------------
@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_a_lock_linked_elsewhere_is_never_written(base, corpus, tmp_path, capsys, dangling):
    d = _killed(base, tmp_path)
    target = tmp_path / "victim.txt"
    if not dangling:
        target.write_text("someone's data\n")
    (d / ".lock").unlink(missing_ok=True)
    (d / ".lock").symlink_to(target)
    if dangling:
        assert cli_main(_flags(corpus, base[1], d, "--resume")) == 2
        assert "broken symbolic link" in capsys.readouterr().err
        assert not target.exists()
        return
    _refused(capsys, _flags(corpus, base[1], d, "--resume"), str(d / ".lock"))
    assert target.read_text() == "someone's data\n"  # was cut and held the pid
    assert _steps(d) == ["10", "15"] and not (d / "summary.json").exists()


@pytest.mark.parametrize("case", ["from-step", "corrupt"])
def test_an_aside_folder_linked_elsewhere_is_never_emptied(base, corpus, tmp_path, capsys,
                                                           case):
    d = _killed(base, tmp_path)
    other = _outside(tmp_path)
    before = _tree(other)
    if case == "from-step":
        (d / rundir.DISCARDED_DIR).symlink_to(other)
        extra = ["--resume", "--from-step", "10"]
    else:
        (d / rundir.CORRUPT_DIR).symlink_to(other)
        for f in (d / "checkpoints" / "15").rglob("*"):
            if f.is_file() and f.stat().st_size > 0 and "params" in str(f):
                f.write_bytes(b"\x00" * 7)
        extra = ["--resume"]
    name = rundir.DISCARDED_DIR if case == "from-step" else rundir.CORRUPT_DIR
    _refused(capsys, _flags(corpus, base[1], d, *extra), str(d / name))
    assert _tree(other) == before  # 15 and 20 were rmtree'd there, then replaced
    assert _steps(d) == ["10", "15"]


def test_checkpoints_on_another_disk_through_a_symlink_keep_working(corpus, tmp_path):
    """train, resume, --from-step and the corrupt-checkpoint fallback, with checkpoints/ a
    symlink: all work, and nothing outside that cgpt did not make is moved or deleted."""
    disk = _outside(tmp_path / "disk2")
    ck = disk / "run-ckpts"
    ck.mkdir()
    d, cache = tmp_path / "run", tmp_path / "cache"
    d.mkdir()
    (d / "checkpoints").symlink_to(ck)
    mine = _tree(disk)
    assert cli_main(_flags(corpus, cache, d)) == 0
    assert _steps(d) == ["10", "15", "20"] and (d / "checkpoints").is_symlink()
    (ck / "notes.txt").write_text("a note beside the checkpoints")
    (d / "summary.json").unlink()  # stopped after checkpoint 15
    shutil.rmtree(ck / "20")
    assert cli_main(_flags(corpus, cache, d, "--resume")) == 0
    assert _steps(d) == ["10", "15", "20"]
    (d / "summary.json").unlink()
    assert cli_main(_flags(corpus, cache, d, "--resume", "--from-step", "10")) == 0
    assert sorted(p.name for p in (d / rundir.DISCARDED_DIR).iterdir()) == ["15", "20"]
    (d / "summary.json").unlink()
    for f in (ck / "20").rglob("*"):
        if f.is_file() and f.stat().st_size > 0 and "params" in str(f):
            f.write_bytes(b"\x00" * 7)
    with pytest.warns(UserWarning, match="checkpoints/20.*falling back to step 15"):
        assert cli_main(_flags(corpus, cache, d, "--resume")) == 0
    assert (d / rundir.CORRUPT_DIR / "20").is_dir() and (d / "summary.json").is_file()
    assert _steps(d) == ["10", "15", "20"] and (d / "checkpoints").is_symlink()
    assert (ck / "notes.txt").read_text() == "a note beside the checkpoints"
    assert {k: v for k, v in _tree(disk).items() if not k.startswith("run-ckpts")} == \
        {k: v for k, v in mine.items() if not k.startswith("run-ckpts")}


# ---- sweep directories -------------------------------------------------------------------
def _spec(tmp: Path, seeds) -> Path:
    corpus = tmp / "corpus"
    corpus.mkdir(exist_ok=True)
    (corpus / "a.txt").write_text(" ".join(f"word{i % 97} the model" for i in range(4000)))
    base = {"preset": "tiny-17k", "model": {"vocab_size": 300},
            "data": {"source": str(corpus), "vocab_size": 300, "seq_len": 16,
                     "val_sequences": 4, "cache_dir": str(tmp / "cache")},
            "train": {"batch_size": 4, "tokens": 640}}
    p = tmp / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "s", "base": base,
                                 "grid": {"model": ["tiny-17k"], "seed": list(seeds)}}))
    return p


@pytest.mark.parametrize("name", [rundir.LOG_FILE, rundir.LOCK_FILE])
def test_a_sweep_never_appends_through_a_linked_run_file(tmp_path, capsys, name):
    from cgpt import sweep as sw

    s = sw.load_sweep(_spec(tmp_path, [0]))
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    victim.write_text("someone's log\n")
    rid = s.runs[0].run_id
    (out / rid).mkdir(parents=True)
    (out / rid / name).symlink_to(victim)
    assert sw.launch(s, out, compile_cache=None) == 1
    assert victim.read_text() == "someone's log\n"  # the sweep's header and train's output
    with open(out / "results.csv", newline="") as f:
        row = next(csv.DictReader(f))
    assert row["status"] == "failed" and "outside the run directory" in row["error"], row
    assert str(out / rid / name) in row["error"]


@pytest.mark.parametrize("target", [
    pytest.param("dir", marks=pytest.mark.slow(reason="the dangling link runs by default")),
    "dangling"])
def test_rerun_never_moves_into_a_linked_superseded(tmp_path, capsys, target):
    from cgpt import sweep as sw

    out = tmp_path / "out"
    s = sw.load_sweep(_spec(tmp_path, [0]))
    assert sw.launch(s, out, compile_cache=None) == 0
    other = _outside(tmp_path)
    before = _tree(other)
    rid = s.runs[0].run_id
    (out / ".superseded").symlink_to(other if target == "dir" else tmp_path / "gone")
    (other / f"{rid}.x").mkdir()
    before = _tree(other)
    raw = yaml.safe_load((tmp_path / "s.yaml").read_text())
    raw["base"]["train"]["peak_lr"] = 1e-3  # the config changed: --on-change rerun supersedes
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    s2 = sw.load_sweep(tmp_path / "s.yaml")
    with pytest.raises(RunDirError, match=r"\.superseded.*outside the sweep directory"):
        sw.launch(s2, out, compile_cache=None, on_change="rerun")
    assert _tree(other) == before and (out / rid / "summary.json").is_file()
    assert not (tmp_path / "gone").exists()


# ---- a cache directory that is a file -------------------------------------------------------
@pytest.mark.parametrize("under", [False, True], ids=["is-a-file", "under-a-file"])
def test_a_cgpt_cache_that_is_a_file_is_named_with_the_fix(tmp_path, monkeypatch, under):
    """Before: `cgpt train: error: <file>/locks: Not a directory`, after the step compiled,
    naming neither CGPT_CACHE nor the fix."""
    from cgpt.config import backend
    from cgpt.data.batches import cache_root

    f = tmp_path / "cache-file"
    f.write_text("not a folder\n")
    cache = f / "sub" if under else f
    for call in (lambda: backend.cache_home({"CGPT_CACHE": str(cache)}),
                 lambda: backend.compile_cache_dir({"CGPT_CACHE": str(cache)})):  # the sweep's
        with pytest.raises(ValueError, match=rf"^CGPT_CACHE={cache}: {cache} (is a file|lies "
                           rf"under {f}, a file), not a directory; point CGPT_CACHE at a "
                           "directory"):
            call()
    with pytest.raises(ValueError, match=rf"^data.cache_dir={cache}: .* give data.cache_dir a "
                       "directory"):
        cache_root(DataConfig(cache_dir=str(cache)))
    assert backend.cache_home({"CGPT_CACHE": str(tmp_path / "new" / "c")}) == \
        tmp_path / "new" / "c"  # missing: made when used


def test_train_with_cgpt_cache_a_file_is_one_line_and_writes_nothing(corpus, tmp_path,
                                                                      monkeypatch, capsys):
    f = tmp_path / "cache-file"
    f.write_text("not a folder\n")
    monkeypatch.setenv("CGPT_CACHE", str(f))
    out = tmp_path / "run"
    flags = [x for x in _flags(corpus, tmp_path / "unused", out) if "cache_dir" not in x]
    assert cli_main(flags) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert err == [f"cgpt train: error: CGPT_CACHE={f}: {f} is a file, not a directory; point "
                   "CGPT_CACHE at a directory (made if missing), or unset it to use "
                   "~/.cache/cgpt"], err
    assert f.read_text() == "not a folder\n" and rundir.recognise(out) == []
