"""Faults of the commands' flags and inputs (data prepare, eval, generate, coord-check, plan,
branch, resume, sweep --suggest, and the estimators they call): a flag out of range or without
the flag it needs, a column named twice, a damaged parent run, each refused in one line naming
what the user typed. Each reproduced here first. Fast: most commands below fail before any
model is built; the branch tests share one 10-step parent run."""
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cgpt.cli import main as cli_main
from cgpt.errors import TrainError

REPO = Path(__file__).resolve().parents[2]


def _cgpt(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "cgpt", *argv], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _docs(n: int) -> list[str]:
    rng = random.Random(0)
    words = "the of and a to in is was for on that with as by at from it an were are".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) for _ in range(n)]


def test_a_prepare_error_with_worker_processes_is_one_line_without_a_leak_warning(tmp_path):
    """A damaged file met by a worker of `--num-proc 2` used to end in the error line plus
    multiprocessing's `resource_tracker: ... leaked semaphore objects` (the process ends in
    os._exit, which skipped the collection that releases the pool's and queue's semaphores)."""
    from cgpt.data.tokenizer import train_tokenizer, with_eot

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    body = "".join(json.dumps({"text": t}) + "\n" for t in _docs(200)).encode()
    (src / "good.jsonl").write_bytes(body)
    (src / "sub" / "bad.jsonl.gz").write_bytes(gzip.compress(body)[:100])
    tok = tmp_path / "tok.json"
    with_eot(train_tokenizer([_docs(100)], 300), "test").save(str(tok))
    for variant in ("a", "b"):  # twice: the warning came in every run, not by chance
        r = _cgpt("data", "prepare", str(src), "--tokenizer", str(tok), "--out",
                  str(tmp_path / f"store_{variant}"), "--num-proc", "2", "--no-progress",
                  cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        line = _one_line(r.stderr)
        assert line.startswith("cgpt data: error:") and "bad.jsonl.gz" in line
        assert "leaked" not in r.stderr


@pytest.mark.parametrize("argv", [["list"], ["train", "--help"]])
def test_output_into_a_closed_pipe_ends_quietly(tmp_path, argv):
    """`cgpt list | head -c 10` printed `cgpt list: error: Broken pipe; fix or remove it`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-m", "cgpt", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    p.stdout.read(10)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and not err.strip(), err


@pytest.mark.parametrize("flags, named", [
    (["--num-fewshot", "3"], "--num-fewshot"), (["--limit", "5"], "--limit"),
    (["--output", "r.json"], "--output"), (["--include-path", "."], "--include-path"),
    (["--bootstrap-iters", "10", "--limit", "0.5"], "--limit, --bootstrap-iters")])
def test_lm_eval_flags_without_tasks_are_an_error_not_ignored(capsys, flags, named):
    """`cgpt eval SRC --num-fewshot 3` (no --tasks) used to report a validation loss as if the
    flag had acted; now it is refused before the model loads (SRC need not exist)."""
    assert cli_main(["eval", "/nonexistent/src", "--data", "x", *flags]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"cgpt eval: error: {named}:") and "--tasks" in line


@pytest.mark.parametrize("flags, named", [
    (["--widths", "32,64"], "--widths"), (["--widths", "32,32,32"], "--widths"),
    (["--widths", "0,32,64"], "--widths"), (["--heads", "0"], "--heads"),
    (["--heads", "7"], "--heads 7"), (["--batch", "0"], "--batch"),
    (["--seq-len", "0"], "--seq-len"), (["--seeds", "0"], "--seeds"), (["--lr", "nan"], "--lr"),
    (["--lr=-1"], "--lr"), (["--max-slope", "inf"], "--max-slope"), (["--steps=-1"], "--steps"),
    (["--out", "."], "--out"), (["--out", "cc.xyz"], "--out"),
    (["--out", "/proc/version/cc.png"], "/proc/version is a file")])
def test_coord_check_flags_are_checked_before_any_training(capsys, flags, named):
    """`--heads 0` was read as the preset's heads and trained for minutes; `--widths 32,32,32`
    failed inside the fit; `--out .` or an unknown suffix failed after all the training."""
    assert cli_main(["coord-check", "--steps", "1", "--seeds", "1", *flags]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("cgpt coord-check: error:") and named in line, line


@pytest.mark.parametrize("budgets", [[], ["a", "a", "a"]])
def test_isoflop_fit_without_two_budgets_names_the_budget_column(budgets):
    """An empty DataFrame (a notebook's filter that kept no run) was a KeyError 'C'."""
    import pandas as pd

    from analysis import fit_isoflop

    n = len(budgets)
    df = pd.DataFrame({"N": [1e6, 2e6, 4e6][:n], "D": [4e7, 2e7, 1e7][:n], "C": [2.4e14] * n,
                       "loss": [3.1, 3.0, 3.05][:n], "budget": budgets})
    with pytest.raises(ValueError, match=f"has {len(set(budgets))} isoFLOP budget.*'budget'"):
        fit_isoflop(df)


@pytest.mark.parametrize("flags, named", [(["--mesh", "data=100000000"], "--mesh data=100000000"),
                                          (["--devices", "5000000"], "--devices 5000000")])
def test_a_mesh_past_what_the_cpu_can_emulate_is_refused_before_allocating(capsys, flags, named):
    """`cgpt plan --mesh data=100000000` asked JAX for 1e8 emulated CPU devices: 12 GB of
    host memory and rising after 9 minutes, no output (train --mesh likewise). The refusal
    names the flag as typed (the campaign's second pass: it said `--mesh/--devices`)."""
    assert cli_main(["plan", "--model", "tiny-17k", "--mode", "data_parallel", *flags]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"cgpt plan: error: {named}:") and "4096" in line, line


@pytest.mark.parametrize("flags", [["--mesh", "data=4", "--devices", "2"],
                                   ["--nodes", "2", "--gpus-per-node", "4", "--devices", "16"]])
def test_plan_devices_that_disagree_with_the_mesh_are_refused(capsys, flags):
    """`plan --mesh data=4 --devices 2` planned 4 devices and ignored --devices silently."""
    assert cli_main(["plan", "--model", "tiny-17k", "--mode", "data_parallel", *flags]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("cgpt plan: error: --devices") and "disagrees" in line, line


@pytest.mark.parametrize("lr, match", [
    ([-1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2], r"lr must be finite and > 0, got \[-0.001\]"),
    ([1e-3, 2e-3, float("inf"), 8e-3, 1.6e-2], r"lr must be finite and > 0, got \[inf\]"),
    ([1e-3] * 5, r"got 1 distinct of 5")])
def test_lr_optimum_refuses_bad_lrs_instead_of_dropping_them(lr, match):
    """A negative LR (a typo) was dropped silently and the optimum reported from the rest; five
    equal LRs were reported as 'got 5'. A diverged run (NaN loss) is still left out."""
    from analysis.transfer import lr_optimum

    with pytest.raises(ValueError, match=match):
        lr_optimum(lr, [3.0, 2.95, 2.9, 3.0, 3.2])
    best = lr_optimum([1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2],
                      [3.0, 2.95, 2.9, 3.0, 3.2, float("nan")])
    assert 2e-3 < best.lr < 8e-3


@pytest.mark.parametrize("extra", ["val_loss", "status"])
def test_load_results_refuses_a_column_named_twice(tmp_path, extra):
    """pandas read a second `val_loss` column as `val_loss.1` and the fits used the first."""
    from analysis import load_results
    from cgpt.results_schema import COLUMNS

    row = {"run_id": "r", "model": "m", "seed": 0, "status": "done", "n_params": 1e6,
           "tokens": 2e7, "flops": 1.3e14, "val_loss": 3.0, "mup": False}
    p = tmp_path / "results.csv"
    p.write_text(",".join([*COLUMNS, extra]) + "\n"
                 + ",".join(str(row.get(c, 1)) for c in [*COLUMNS, extra]) + "\n")
    with pytest.raises(ValueError, match=rf"\['{extra}'\] appear more than once"):
        load_results(p)


@pytest.mark.parametrize("flag", ["--batch", "--micro-batch", "--devices", "--seq-len"])
def test_plan_counts_past_int32_are_refused_before_planning(capsys, flag):
    """`plan --batch 1e30` searched the batch's divisors for over 10 minutes (train's values
    are bounded by the value parser; plan built its TrainConfig around it)."""
    assert cli_main(["plan", "--model", "tiny-17k", "--no-compile", flag, str(10 ** 30)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"cgpt plan: error: {flag} {10 ** 30}: must be at most"), line


@pytest.mark.parametrize("where", ["dir", "under_file"])
def test_eval_output_that_cannot_be_written_is_refused_before_the_tasks_run(capsys, tmp_path,
                                                                           where):
    """`eval --tasks ... --output DIR` ran every task (minutes) and then failed writing."""
    pytest.importorskip("lm_eval")
    (tmp_path / "f").write_text("x\n")
    out = tmp_path if where == "dir" else tmp_path / "f" / "r.json"
    assert cli_main(["eval", "/nonexistent/src", "--tasks", "x", "--output", str(out)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"cgpt eval: error: --output {out}"), line


@pytest.mark.parametrize("col, value", [("val_loss", -1.5), ("val_loss", 0)])
def test_load_results_names_a_negative_value_and_its_run(tmp_path, col, value):
    """`sweep --suggest` on a results.csv with a negative val_loss said only 'L must be finite
    and > 0' (the fit's name for it), not the file, column or run."""
    from analysis import load_results
    from cgpt.results_schema import COLUMNS

    row = {"run_id": "r7", "model": "m", "seed": 0, "status": "done", "n_params": 1e6,
           "tokens": 2e7, "flops": 1.3e14, "val_loss": 3.0, "train_loss": 3.1, "mup": False}
    row[col] = value
    p = tmp_path / "results.csv"
    p.write_text(",".join(COLUMNS) + "\n" + ",".join(str(row.get(c, 1)) for c in COLUMNS) + "\n")
    with pytest.raises(ValueError, match=rf"results.csv: column '{col}' is negative.*'r7'"):
        load_results(p)


@pytest.mark.parametrize("limit", ["nan", "inf"])
def test_eval_limit_must_be_finite(capsys, limit):
    """`eval --tasks T --limit nan` passed every check (nan < 0 and nan == 0 are false) and ran
    past 15 minutes inside lm-eval."""
    assert cli_main(["eval", "/nonexistent/src", "--tasks", "x", "--limit", limit]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"cgpt eval: error: --limit {limit}: must be a finite number"), line


@pytest.mark.parametrize("flags, named", [(["--write"], "--write"),
                                          (["--target-flops", "1e20"], "--target-flops"),
                                          (["--budget-flops", "1e20", "--fit-min-flops", "1e9"],
                                           "--budget-flops, --fit-min-flops")])
def test_suggest_flags_without_suggest_are_an_error(capsys, flags, named):
    """`sweep SPEC --dry-run --write` (no --suggest) ignored --write and exited 0."""
    assert cli_main(["sweep", "/nonexistent/spec.yaml", "--dry-run", *flags]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"cgpt sweep: error: {named}: only with --suggest"), line


# ---- cooldown branches of a damaged parent ---------------------------------------------------
def _train_argv(corpus, cache, out, *extra) -> list[str]:
    return ["train", "--model", "tiny-17k", "--data", str(corpus), "--out", str(out),
            "--no-progress", "train.batch_size=8", "train.log_every=1", "train.ckpt_every=5",
            "data.vocab_size=512", "data.seq_len=16", "data.val_sequences=16",
            f"data.cache_dir={cache}", *extra]


@pytest.fixture(scope="module")
def wsd_parent(corpus, tmp_path_factory):
    """A finished 10-step WSD run (decay from step 8), checkpoints 5 and 10."""
    root = tmp_path_factory.mktemp("branch")
    argv = _train_argv(corpus, root / "cache", root / "parent", f"--tokens={8 * 16 * 10}",
                       "train.schedule=wsd")
    assert cli_main(argv) == 0
    return root / "parent", root / "cache"


def _zero_step_5(d: Path) -> None:
    for f in (d / "checkpoints" / "5").rglob("ocdbt.process_0/d/*"):
        f.write_bytes(b"\0" * f.stat().st_size)


@pytest.mark.parametrize("damage, named", [
    (_zero_step_5, "checkpoints/5 is unreadable"),  # was a traceback, config.yaml left in --out
    (lambda d: (d / "metrics.jsonl").unlink(), "metrics.jsonl is missing")])  # was accepted
def test_a_branch_of_a_damaged_parent_is_one_line_and_leaves_nothing(
        corpus, wsd_parent, tmp_path, capsys, damage, named):
    """A zeroed parent checkpoint ended in orbax's traceback after config.yaml and the tokenizer
    were written to --out, so the next launch there was refused as a run without checkpoints;
    a parent whose metrics.jsonl was deleted gave a branch whose log lacked the parent's
    steps. Both are now one line, the parent is untouched and --out is left as it was."""
    parent = tmp_path / "parent"
    shutil.copytree(wsd_parent[0], parent)
    damage(parent)
    before = sorted((p.relative_to(parent), p.stat().st_size) for p in parent.rglob("*")
                    if p.is_file())
    out = tmp_path / "branch"
    argv = _train_argv(corpus, wsd_parent[1], out, "--branch-from", f"{parent}@5",
                       f"--tokens={8 * 16 * 16}")
    capsys.readouterr()
    assert cli_main(argv) == 2
    line = _one_line("\n".join(x for x in capsys.readouterr().err.splitlines()
                               if not x.startswith("tiny-17k: ")))  # start-up lines
    assert line.startswith("cgpt train: error: --branch-from") and named in line, line
    assert not out.exists()
    assert sorted((p.relative_to(parent), p.stat().st_size) for p in parent.rglob("*")
                  if p.is_file()) == before
    # nothing half-made blocks the next launch into the same --out
    assert cli_main(_train_argv(corpus, wsd_parent[1], out, f"--tokens={8 * 16 * 2}")) == 0


# ---- generate and cgpt.load ------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """A 2-layer model saved as an HF directory (no tokenizer files) and loaded, with a byte-level
    BPE tokenizer attached (its vocabulary: the 256 bytes)."""
    import cgpt
    from tokenizers import Tokenizer, models, pre_tokenizers

    from cgpt.config.model import ModelConfig
    from cgpt.model import gpt, hf

    cfg = ModelConfig(n_layer=2, d_model=16, n_head=2, vocab_size=300, n_ctx=32,
                      compute_dtype="float32")
    d = tmp_path_factory.mktemp("hf") / "m"
    hf.save_hf_dir(gpt.init_params(cfg), cfg, d)
    lm = cgpt.load(str(d))
    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    lm.tokenizer = Tokenizer(models.BPE(vocab, [], unk_token=None))
    lm.tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return d, lm


@pytest.mark.parametrize("text, what, where", [("caf\udce9", "prompt", 3),
                                               ("\ud800x", "prompt", 0)])
def test_text_that_is_not_utf8_is_named_not_a_tokenizer_traceback(tiny_lm, text, what, where):
    """A prompt with a byte that is not UTF-8 (argv decodes it to a lone surrogate) ended in
    the tokenizer's `TypeError: TextInputSequence must be str`."""
    lm = tiny_lm[1]
    assert len(lm.generate("cafe", 2)) > 4  # the tokenizer works on UTF-8 text
    with pytest.raises(ValueError, match=rf"^{what}: character {where} .* is not UTF-8 text"):
        lm.generate(text, 2)
    with pytest.raises(ValueError, match=rf"^text: character {where} "):
        lm.encode(text)


@pytest.mark.parametrize("source", [123, None, "", "  "])
def test_load_of_a_source_that_is_no_path_names_it(source):
    """`cgpt.load(123)` said `expected str, bytes or os.PathLike object, not int`; `cgpt.load("")`
    (and `cgpt generate ''`) silently loaded the working directory as `.`."""
    import cgpt
    from cgpt.errors import LoadError

    with pytest.raises(LoadError, match=rf"^source {source!r}: give a cgpt run directory"):
        cgpt.load(source)


@pytest.mark.parametrize("flags, named", [
    (["--seed", str(2 ** 70)], "--seed 1180591620717411303424: must be a 64-bit integer"),
    (["--top-k", "1000"], "--top-k 1000: must be at most the model's vocabulary size 300")])
def test_generate_flags_out_of_range_are_named_as_typed(capsys, tiny_lm, flags, named):
    """`--seed 2**70` ended in `OverflowError: Python int too large to convert to C long`;
    `--top-k` above the vocabulary was named as the library's `top_k`."""
    assert cli_main(["generate", str(tiny_lm[0]), "def", "--max-new-tokens", "4", *flags]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == f"cgpt generate: error: {named}", line


# ---- --resume with other flags ---------------------------------------------------------------
def _saved(tmp_path, **data):
    from cgpt.config.run import from_dict

    out = tmp_path / "run"
    out.mkdir()
    raw = {"preset": "tiny-17k", "model": {"compute_dtype": "float32"},
           "data": {"vocab_size": 512, "seq_len": 16, **data}}
    (out / "config.yaml").write_text(from_dict(raw).to_yaml())
    return out, raw


def test_resume_may_move_the_data_cache(tmp_path):
    """`--resume data.cache_dir=NEW` was refused as another run, although $CGPT_CACHE may
    change between launches unnoticed: the cache holds the same data wherever it is."""
    from cgpt.config.run import from_dict
    from cgpt.train.resume import check_config

    out, raw = _saved(tmp_path, cache_dir=str(tmp_path / "old"))
    for moved in (str(tmp_path / "new"), None):
        run = from_dict({**raw, "data": {**raw["data"], "cache_dir": moved}})
        assert check_config(run, out, resume=True).data.cache_dir == moved
    other = from_dict({**raw, "data": {**raw["data"], "seq_len": 32}})  # the data itself: no
    with pytest.raises(TrainError, match=r"differs .* in data.seq_len; resume with the same"):
        check_config(other, out, resume=True)


def test_resume_with_another_preset_names_both(tmp_path):
    """`--resume --model tiny-45k` named only the derived keys (`model.name, model.n_layer`);
    the preset typed was not in the line."""
    from cgpt.config.run import from_dict
    from cgpt.train.resume import check_config

    out, raw = _saved(tmp_path)
    with pytest.raises(TrainError, match=r"preset \(tiny-17k saved, tiny-45k asked\); resume"):
        check_config(from_dict({**raw, "preset": "tiny-45k"}), out, resume=True)


@pytest.mark.parametrize("col, value", [("tokens", 0), ("n_params", -5)])
def test_suggest_names_the_column_a_log_space_fit_cannot_take(tmp_path, col, value):
    """`--suggest` on a results.csv with a finished run of 0 tokens (or negative n_params)
    failed inside the fit as `N must be finite and > 0`: the fit's variable, not the column."""
    from cgpt.results_schema import COLUMNS
    from cgpt.commands.suggest import analysis_results

    rows = [{"run_id": f"r{i}", "model": "m", "seed": 0, "status": "done", "n_params": 1e6,
             "tokens": 2e7, "flops": 1.3e14, "val_loss": 3.0, "train_loss": 3.1, "mup": False}
            for i in range(4)]
    rows[2][col] = value
    (tmp_path / "results.csv").write_text(",".join(COLUMNS) + "\n" + "".join(
        ",".join(str(r.get(c, 1)) for c in COLUMNS) + "\n" for r in rows))
    with pytest.raises(ValueError, match=rf"results.csv: column '{col}' must be > 0 for a "
                                         rf"finished run, got {value} for run\(s\) \['r2'\]"):
        analysis_results(tmp_path)


@pytest.mark.parametrize("tasks", [[], ["--tasks", "x"]])
def test_eval_batch_size_below_one_is_named_before_the_model_loads(capsys, tasks):
    """`eval --tasks T --batch-size 0` was handed to lm-eval, whose error did not name the
    flag (without --tasks it was checked only after the model loaded)."""
    assert cli_main(["eval", "/nonexistent/src", *tasks, "--batch-size", "0"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == "cgpt eval: error: --batch-size 0: must be at least 1", line


def test_suggest_refuses_rows_whose_n_params_are_not_the_sweeps(tmp_path):
    """results.csv rows with this sweep's run ids but another model's n_params (rows of another
    sweep, or an edited file) were fitted and suggested from, exit 0."""
    from cgpt.results_schema import COLUMNS
    from cgpt import sweep as sw
    from cgpt.commands.suggest import suggest
    from tests.sweep_helpers import make_spec

    sweep = sw.load_sweep(make_spec(tmp_path, "s", {"model": ["tiny-17k"], "seed": [0, 1]}))
    out = tmp_path / "out"
    out.mkdir()
    rows = [{"run_id": r.run_id, "model": r.model, "seed": r.seed, "status": "done",
             "n_params": r.n_params * 3 + 1, "tokens": r.tokens, "flops": r.flops,
             "flops_6nd": 6 * (r.n_params * 3 + 1) * r.tokens, "val_loss": 3.0, "train_loss": 3.1, "mup": False} for r in sweep.runs]
    (out / "results.csv").write_text(",".join(COLUMNS) + "\n" + "".join(
        ",".join(str(r.get(c, 1)) for c in COLUMNS) + "\n" for r in rows))
    r0 = sweep.runs[0]
    with pytest.raises(ValueError, match=rf"results.csv: column 'n_params' differs from the "
                                         rf"sweep's .* for run\(s\) {r0.run_id} "
                                         rf"\({r0.n_params * 3 + 1}, planned {r0.n_params}\)"):
        suggest(sweep, out, 2)


@pytest.mark.parametrize("argv, named", [
    (["--model", "13B", "--mode", "layer_pipelined", "--mesh", "stage=1000000"],
     "--mesh stage=1000000 does not divide n_layer=40"),
    (["--model", "tiny-17k", "--batch", "8", "--micro-batches", "1000000000"],
     "train.micro_batches=1000000000 (--micro-batches) sets a layer_pipelined run's"),
    (["--model", "tiny-17k", "--mode", "data_parallel", "--micro-batches", "2"],
     "but this run is data_parallel"),
])
def test_the_analytic_plan_refuses_a_pipeline_it_could_not_build(capsys, argv, named):
    """`plan --no-compile` answered `fits: true` (bubble 99.99%) for a million pipeline stages
    of a 40-layer model, and dropped --micro-batches without a word where the mode was not
    layer_pipelined: only the compiled path (the strategy) checked either."""
    from cgpt.plan.command import main

    assert main([*argv, "--no-compile", "--json"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and named in err[0], err

