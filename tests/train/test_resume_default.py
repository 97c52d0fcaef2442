"""`cgpt train --out DIR` continues the run DIR holds when its config matches (levanter,
torchtitan and MaxText resume by default), saying so in one line; a different config is
refused as before, and --no-resume refuses any run directory."""
import json

import pytest

from cgpt.cli import main as cli_main


def _flags(corpus, out, tokens=8 * 16 * 12):
    return ["train", "--model", "tiny-17k", "--data", str(corpus), "--out", str(out),
            "--no-progress", f"--tokens={tokens}", "train.batch_size=8", "data.vocab_size=512",
            "data.seq_len=16", "data.val_sequences=16", "train.ckpt_every=6"]


def _one_error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0], lines
    return lines[0]


def test_a_run_directory_resumes_by_default(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main(_flags(corpus, out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert "tiny-17k: micro-batch 8 x 1" in (err := capsys.readouterr().err)
    assert "; compiled in " in err  # the fit's compiles, timed (the wait said what it was)
    assert cli_main(_flags(corpus, out)) == 0  # finished: nothing retrained, said so
    assert "finished already" in capsys.readouterr().err
    (out / "summary.json").unlink()  # interrupted after its last checkpoint
    assert cli_main(_flags(corpus, out)) == 0
    err = capsys.readouterr().err
    assert f"resuming the run in {out} from step 12 of 12" in err
    assert json.loads((out / "summary.json").read_text())["val_loss"] == summary["val_loss"]

    # a different config is refused as with --resume; --no-resume refuses the directory
    assert cli_main(_flags(corpus, out, tokens=8 * 16 * 20)) == 2
    assert "differs" in (e := _one_error(capsys)) and "train.tokens" in e and "new --out" in e
    assert cli_main([*_flags(corpus, out), "--no-resume"]) == 2
    assert "--no-resume" in _one_error(capsys)


def test_resume_and_no_resume_exclude_each_other(corpus, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main([*_flags(corpus, tmp_path / "x"), "--resume", "--no-resume"])
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
