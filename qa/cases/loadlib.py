"""`cgpt.load` called from a notebook on damaged or unusual directories: checkpoint folders
with strangers in them (a half-written Orbax temp folder, a zero-padded copy, a user's notes),
a sweep or a checkpoint step given instead of a run, a run's tokenizer or config.yaml swapped
or extended, HF exports with keys missing or added. Each must load the newest good checkpoint
with its own tokenizer, or be one CgptError / ValueError / OSError naming the file and the
fix (printed here as `cgpt load: error: ...`). The `load` group runs `cgpt generate`/`eval` on
damaged checkpoints; these are the library's path and the directory's layout."""
import json
import shutil

import yaml

from qa.cases.sweepdir import reference as sweep_reference
from qa.context import library
from qa.registry import add

PROBE = "lm = cgpt.load(SRC)\nprint(lm.generate('def ', max_new_tokens=4))"
PRELUDE = "import cgpt\n"


def _spec(src, text=None, code=PROBE):
    body = f"SRC = {src!r}\n{code}"
    return {"python": library(body, "load", PRELUDE), "timeout": 600,
            **({"expect_text": text} if text else {})}


def _run(ctx):
    return ctx.run_copy(resumable=False)


def _same_weights(ctx, src, step: int = 20):
    """The load gave the base run's weights of `step` (compared by a loss on fixed tokens)."""
    def check():
        code = ("import cgpt, numpy as np\nt = np.arange(64).reshape(4, 16) % 500\n"
                f"a = cgpt.load({str(src)!r}).loss(t)\n"
                f"print(a)\n")
        ref = ctx.python(code.replace(str(src), str(ctx.base)))
        got = ctx.python(code)
        if got.returncode or ref.returncode or got.stdout != ref.stdout:
            return f"loaded other weights than step {step}: {got.stdout.strip()} vs " \
                   f"{ref.stdout.strip()} {got.stderr[-200:]}"
        return None
    return check


def _mk(ctx, d, *parts):
    p = d.joinpath(*parts)
    p.mkdir(parents=True, exist_ok=True)
    return p


def stray_folder(ctx):
    d = _run(ctx)
    (_mk(ctx, d, "checkpoints", "notes") / "todo.txt").write_text("compare with 13B\n")
    return {**_spec(str(d)), "check_ok": _same_weights(ctx, d)}


def orbax_temp_newer(ctx):
    d = _run(ctx)
    _mk(ctx, d, "checkpoints", "25.orbax-checkpoint-tmp-1732800000")
    return {**_spec(str(d)), "check_ok": _same_weights(ctx, d)}


def only_orbax_temp(ctx):
    d = _run(ctx)
    for s in ("10", "15", "20"):
        (d / "checkpoints" / s).rename(d / "checkpoints" / f"{s}.orbax-checkpoint-tmp-1")
    return _spec(str(d), "checkpoint")


def zero_padded_copy(ctx):
    d = _run(ctx)
    shutil.copytree(d / "checkpoints" / "10", d / "checkpoints" / "0030")
    return {**_spec(str(d)), "check_ok": _same_weights(ctx, d)}


def trailing_slash(ctx):
    d = _run(ctx)
    return {**_spec(str(d) + "/"), "check_ok": _same_weights(ctx, d)}


def tilde_path(ctx):
    return _spec("~/no-such-run-of-cgpt-qa", "no-such-run")


def sweep_dir_instead_of_run(ctx):
    return _spec(str(sweep_reference(ctx)), "sweep")


def checkpoint_step_dir(ctx):
    return _spec(str(_run(ctx) / "checkpoints" / "20"), "20")


def run_symlink(ctx):
    d = _run(ctx)
    link = ctx.fresh("link")
    link.symlink_to(d)
    return {**_spec(str(link)), "check_ok": _same_weights(ctx, d)}


def config_unknown_key(ctx):
    d = _run(ctx)
    c = yaml.safe_load((d / "config.yaml").read_text())
    c["model"]["rope_theta"] = 10000
    (d / "config.yaml").write_text(yaml.safe_dump(c))
    return _spec(str(d), "rope_theta")


def config_extra_section(ctx):
    d = _run(ctx)
    c = yaml.safe_load((d / "config.yaml").read_text())
    c["notes"] = {"owner": "me"}
    (d / "config.yaml").write_text(yaml.safe_dump(c))
    return _spec(str(d), "notes")


def tokenizer_deleted(ctx):
    d = _run(ctx)
    (d / "tokenizer.json").unlink()
    return _spec(str(d), "tokenizer.json")


def tokenizer_smaller_vocab(ctx):
    """The run's tokenizer.json replaced by another one of 300 tokens (the model has 512)."""
    d = _run(ctx)
    code = ("from cgpt.data.tokenizer import train_tokenizer, with_eot\n"
            f"with_eot(train_tokenizer([['def f(x): return x'] * 50], 300), 'qa')"
            f".save({str(d / 'tokenizer.json')!r})")
    r = ctx.python(code)
    if r.returncode:
        raise RuntimeError(r.stderr[-500:])
    return _spec(str(d), "tokenizer.json")


def summary_garbage(ctx):
    d = _run(ctx)
    (d / "summary.json").write_text("{oops")
    return {**_spec(str(d)), "check_ok": _same_weights(ctx, d)}


def metrics_deleted(ctx):
    d = _run(ctx)
    (d / "metrics.jsonl").unlink()
    return {**_spec(str(d)), "check_ok": _same_weights(ctx, d)}


def checkpoints_symlink_loop(ctx):
    d = _run(ctx)
    shutil.rmtree(d / "checkpoints")
    (d / "checkpoints").symlink_to(d / "checkpoints")
    return _spec(str(d), "checkpoints")


def _hf_edit(f):
    def make(ctx):
        d = ctx.hf_copy()
        c = json.loads((d / "config.json").read_text())
        f(c)
        (d / "config.json").write_text(json.dumps(c))
        return d
    return make


def hf_missing_n_embd(ctx):
    return _spec(str(_hf_edit(lambda c: c.pop("n_embd"))(ctx)), "n_embd")


def hf_n_layer_more_than_weights(ctx):
    return _spec(str(_hf_edit(lambda c: c.update(n_layer=c["n_layer"] + 1))(ctx)), "h.")


def hf_extra_key(ctx):
    d = _hf_edit(lambda c: c.update(my_note="fine-tuned"))(ctx)
    return {**_spec(str(d))}


def hf_tokenizer_deleted(ctx):
    d = ctx.hf_copy()
    (d / "tokenizer.json").unlink()
    return _spec(str(d), "tokenizer")


def hf_vocab_size_string(ctx):
    return _spec(str(_hf_edit(lambda c: c.update(vocab_size="512"))(ctx)), "vocab_size")


def load_dtype_float16(ctx):
    return _spec(str(ctx.base), "float16", "cgpt.load(SRC, dtype='float16')")


def load_bytes_path(ctx):
    return _spec(str(ctx.base).encode(), "source", "cgpt.load(SRC)")


CASES = {"ok": [stray_folder, orbax_temp_newer, zero_padded_copy, trailing_slash, run_symlink,
                summary_garbage, metrics_deleted, hf_extra_key],
         "error": [only_orbax_temp, tilde_path, sweep_dir_instead_of_run, checkpoint_step_dir,
                   tokenizer_deleted, tokenizer_smaller_vocab, checkpoints_symlink_loop,
                   hf_missing_n_embd, hf_n_layer_more_than_weights, hf_vocab_size_string,
                   load_dtype_float16, load_bytes_path],
         "either": [config_unknown_key, config_extra_section, hf_tokenizer_deleted]}
for _expect, _fs in CASES.items():
    for _f in _fs:
        add(_f.__name__, _expect, "loadlib", _f)
