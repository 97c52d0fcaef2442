"""Issue 33, classes 2 and 6: values are read by the type of the field they set (one strict
parser for command-line values, overrides, configs and sweep specs), and errors name what the
user typed. No training: configs are built and checked, and nothing is written."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cgpt.cli.commands import build_run
from cgpt.config.model import ModelConfig
from cgpt.config.overrides import apply_overrides
from cgpt.config.run import from_dict, load_yaml
from cgpt.config.values import MAX_INT, scalar, typed
from cgpt.train.resolve import recipe_of

REPO = Path(__file__).resolve().parents[2]


def _train_args(*overrides: str, **flags) -> argparse.Namespace:
    base = dict(model="tiny-17k", config=None, tokens=None, data=None, mode=None, mesh=None,
                seed=None, branch_from=None, overrides=list(overrides))
    return argparse.Namespace(**{**base, **flags})


# ---- class 2: a bool is not a number, paths are verbatim, keys are given once ---------------
@pytest.mark.parametrize("item", ["train.peak_lr=true", "train.peak_lr=yes",
                                  "train.weight_decay=on", "model.n_layer=true"])
def test_a_bool_on_the_command_line_is_not_a_number(item):
    key = item.partition("=")[0]
    with pytest.raises(ValueError, match=rf"'{key}=\w+'.*is not a"):
        build_run(_train_args(item))


@pytest.mark.parametrize("text", ["yes", "on", "true"])
def test_a_yaml_bool_in_a_config_or_sweep_base_is_not_a_number(tmp_path, text):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"preset: tiny-17k\ntrain:\n  peak_lr: {text}\n")
    with pytest.raises(ValueError, match=r"c.yaml: train.peak_lr=True: is the boolean true"):
        from_dict(load_yaml(cfg), str(cfg))
    from cgpt import sweep as sw

    spec = tmp_path / "s.yaml"
    spec.write_text(f"base:\n  train: {{peak_lr: {text}}}\ngrid:\n  model: [tiny-17k]\n"
                    "  tokens: [1e5]\n")
    with pytest.raises(ValueError, match="train.peak_lr=True: is the boolean true"):
        sw.load_sweep(spec)


@pytest.mark.parametrize("path", ["/x/c #2", "yes", "1e3", "null", "a\nb", " 007 ", "~/d"])
def test_data_and_paths_are_taken_verbatim(path):
    run = build_run(_train_args(data=path))
    assert run.data.source == path  # not '/x/c', True, 1000.0, None, 'a b', 7 or expanded
    run = build_run(_train_args(f"data.tokenizer={path}", f"data.cache_dir={path}"))
    assert run.data.tokenizer == path and run.data.cache_dir == path


def test_a_yaml_path_that_is_not_text_is_refused_not_stringified(tmp_path):
    for value, kind in (("yes", "boolean"), ("2.5", "number"), ("017", "number")):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"preset: tiny-17k\ndata:\n  source: {value}\n")
        with pytest.raises(ValueError, match=rf"data.source=.*{kind}.*quote it"):
            from_dict(load_yaml(cfg), str(cfg))
    cfg.write_text("preset: tiny-17k\ndata:\n  source: '2.0e3'\n")  # quoted: the text
    assert from_dict(load_yaml(cfg)).data.source == "2.0e3"


@pytest.mark.parametrize("text, first, second", [
    ("preset: tiny-17k\ntrain: {seed: 1}\npreset: tiny-45k\n", "line 1, column 1",
     "line 3, column 1"),
    ("preset: tiny-17k\ntrain:\n  seed: 1\ntrain:\n  seed: 2\n", "line 2, column 1",
     "line 4, column 1"),
    ("preset: tiny-17k\ntrain: {seed: 1, seed: 2}\n", "line 2, column 9", "line 2, column 18"),
])
def test_a_key_given_twice_in_a_config_is_refused_with_both_lines(tmp_path, text, first,
                                                                   second):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ValueError, match=rf"c.yaml: .*given twice \({first} and {second}\)"):
        load_yaml(cfg)


def test_a_key_given_twice_in_a_sweep_spec_is_refused(tmp_path):
    from cgpt import sweep as sw

    spec = tmp_path / "s.yaml"
    spec.write_text("grid:\n  model: [tiny-17k]\n  tokens: [1e5]\n"
                    "grid:\n  model: [tiny-45k]\n  tokens: [1e5]\n")
    with pytest.raises(ValueError, match=r"key 'grid' is given twice \(line 1, column 1 and "
                                         r"line 4, column 1\)"):
        sw.load_sweep(spec)
    # YAML merge keys still work: an explicit key may override a merged one
    spec.write_text("x: &b {model: [tiny-17k], tokens: [1e5]}\ngrid:\n  <<: *b\n"
                    "  tokens: [2e5]\n")
    from cgpt.config.run import safe_load
    assert safe_load(spec.read_text(), "s")["grid"]["tokens"] == ["2e5"]


@pytest.mark.parametrize("item", ["model.n_layer=2.5", "train.seed=1.5",
                                  "train.batch_size=64.5", "data.seq_len=1e-1"])
def test_a_fraction_is_not_truncated_into_a_count(item):
    with pytest.raises(ValueError, match="not a whole number"):
        build_run(_train_args(item))


def test_numbers_still_read_as_numbers():
    run = build_run(_train_args("train.peak_lr=6e-4", "train.batch_size=6.4e1", "model.remat=true",
                                "train.decay=null", "train.clip_norm=inf", tokens="2e5"))
    assert run.train.peak_lr == 6e-4 and run.train.batch_size == 64
    assert run.model.remat == "full" and run.train.decay is None
    assert run.train.clip_norm == float("inf") and run.train.tokens == 200_000
    assert scalar("2") == 2 and scalar("true") is True and scalar("01:00:00") == "01:00:00"


def test_data_prepare_into_a_store_of_another_vocabulary_is_refused(tmp_path, capsys):
    from cgpt.cli import main

    words = [f"w{i % 37}x{i % 11}" for i in range(4000)]
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": " ".join(words[i::7])}) + "\n" for i in range(7)))
    store = tmp_path / "S"

    def prepare(vocab: str) -> int:
        return main(["data", "prepare", str(src), "--tokenizer", "train", "--vocab-size", vocab,
                     "--out", str(store), "--num-proc", "1", "--no-progress"])

    assert prepare("300") == 0
    before = (store / "manifest.json").read_text()
    capsys.readouterr()
    assert prepare("400") == 2
    err = capsys.readouterr().err
    assert "trained with a 300-token vocabulary, and --vocab-size 400" in err
    assert (store / "manifest.json").read_text() == before
    assert prepare("300") == 0  # the same request is still the no-op it was


# ---- class 6: one error line naming what the user set --------------------------------------
@pytest.mark.parametrize("item, match", [
    ("train.tokens=1e30", r"train.tokens=1e\+30 is .* steps .* at most 2,147,483,647 steps"),
    ("train.tokens=1e18", r"train.tokens=1e\+18 is .* steps"),
])
def test_a_token_budget_beyond_an_int32_step_count_is_refused(item, match):
    run = build_run(_train_args(item))  # a budget may exceed int32: the step count may not
    with pytest.raises(ValueError, match=match):
        recipe_of(run)


@pytest.mark.parametrize("item, match", [
    ("train.weight_decay=inf", "train.weight_decay=inf'.*finite"),
    ("train.peak_lr=nan", "train.peak_lr=nan'.*finite"),
    ("train.batch_size=1.2e29", r"beyond 2,147,483,647"),
    (f"train.seed={MAX_INT + 1}", r"beyond 2,147,483,647"),
])
def test_non_finite_and_huge_values_are_refused_at_the_flag(item, match):
    with pytest.raises(ValueError, match=match):
        build_run(_train_args(item))


@pytest.mark.parametrize("fields, named, not_named", [
    (dict(d_model=2**30, n_head=2), "model.d_model=1073741824 makes the MLP width",
     "d_ffn and d_head must"),
    (dict(ln_eps=-1.0), "model.ln_eps must be a finite number > 0", "ModelConfig"),
    (dict(n_head=3), "model.n_head=3 does not divide model.d_model=64", "ModelConfig"),
])
def test_model_errors_name_the_key_the_user_set(fields, named, not_named):
    with pytest.raises(ValueError) as e:
        ModelConfig(**fields)
    assert named in str(e.value) and not_named not in str(e.value)


def test_typed_reports_how_the_value_was_given():
    with pytest.raises(ValueError, match=r"^--flag x: is not a number$"):
        typed("train.peak_lr", "x", ("float",), given="--flag x")
    with pytest.raises(ValueError, match="cannot be null"):
        typed("train.seed", None, ("int",))
    with pytest.raises(ValueError, match="a list, not a number"):
        typed("train.peak_lr", [1], ("float",))


def test_cli_says_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    for argv in (["train.peak_lr=true"], ["--tokens", "1e30"], ["train.seed=1.5"]):
        p = subprocess.run([sys.executable, "-m", "cgpt", "train", "--model", "tiny-17k",
                            "--out", str(out), "--no-progress", *argv], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300,
                           env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
        assert p.returncode == 2, p.stderr
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
        assert not out.exists()


def test_a_token_budget_below_one_batch_is_refused_not_rounded_up_to_a_step():
    """`tokens: 3` (or batch_size 1e9) planned one whole step: a run of 16B tokens for a
    budget of 640. The budget is refused with the key, the batch and the fix."""
    from cgpt.config.recipe import steps_for_tokens

    assert steps_for_tokens(64, 4, 16) == 1 and steps_for_tokens(127, 4, 16) == 1
    with pytest.raises(ValueError, match=r"train.tokens=63 is less than one step of "
                       r"train.batch_size=4 x data.seq_len=16 = 64 tokens: raise train.tokens"):
        steps_for_tokens(63, 4, 16)

