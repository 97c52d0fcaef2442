"""`cgpt train --resume` of a run killed after checkpoint 15 with one config key changed, by
flag or by editing config.yaml, one key per role: the model's shape, the data, the batch and
seed, the budget, the schedule, the optimizer (changeable with --allow-train-changes), the
cadence, where things are cached. As in levanter/MaxText: a resume that would not continue the
same run is refused in one line naming the key (and the flag that allows it, where one does)
with the run untouched; an allowed change finishes with a complete, strict result."""
from qa.context import complete, strict
from qa.damage import resume
from qa.registry import add

BAD = {  # name -> (extra argv, what the one line must name)
    "n_layer": (["model.n_layer=3"], "n_layer"),
    "d_model": (["model.d_model=64"], "d_model"),
    "preset": (["--model", "tiny-45k"], "tiny-45k"),
    "seq_len": (["data.seq_len=32"], "seq_len"),
    "vocab_size": (["data.vocab_size=256"], "vocab_size"),
    "batch_size": (["train.batch_size=4"], "batch_size"),
    "seed_flag": (["--seed", "1"], "seed"),
    "schedule": (["train.schedule=wsd"], "schedule"),
    "compute_dtype": (["model.compute_dtype=bfloat16"], "compute_dtype"),
    "peak_lr_without_allow": (["train.peak_lr=1e-3"], "--allow-train-changes"),
    "tokens_below_the_checkpoint": ([f"--tokens={8 * 16 * 5}"], "tokens"),
    "model_change_with_allow": (["--allow-train-changes", "model.n_layer=3"], "n_layer"),
}
for _n, (_extra, _text) in BAD.items():
    add(f"flag_{_n}", "error", "resume", lambda ctx, e=_extra, t=_text: {
        **resume(ctx, lambda d: None, *e), "expect_text": t, "timeout": 900})


def _edit(key: str, value: str):
    """config.yaml edited by hand: `key: value` set under its section."""
    def damage(d):
        import yaml
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        section, name = key.split(".")
        cfg.setdefault(section, {})[name] = yaml.safe_load(value)
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    return damage


EDITS = {  # name -> (key, value, what the one line must name)
    "n_layer": ("model.n_layer", "3", "n_layer"),
    "unknown_key": ("train.learning_rate", "0.1", "learning_rate"),
    "seq_len_string": ("data.seq_len", "sixteen", "seq_len"),
    "peak_lr": ("train.peak_lr", "0.5", "peak_lr"),
}
for _n, (_key, _value, _text) in EDITS.items():
    add(f"edited_config_{_n}", "error", "resume", lambda ctx, k=_key, v=_value, t=_text: {
        **resume(ctx, _edit(k, v)), "expect_text": t, "timeout": 900})


def _changes_recorded(d, key):
    def check():
        try:
            changes = strict((d / "config_changes.json").read_text())
        except (OSError, ValueError) as e:
            return f"config_changes.json: {e}"
        if key not in str(changes):
            return f"config_changes.json does not name {key}: {changes}"
        return strict((d / "summary.json").read_text()) and None
    return check


def _allowed(extra, key, full_log=True):
    def make(ctx):
        spec = resume(ctx, lambda d: None, "--allow-train-changes", *extra)
        d = __import__("pathlib").Path(spec["argv"][spec["argv"].index("--out") + 1])
        recorded = _changes_recorded(d, key)
        spec["check_ok"] = (lambda: complete(d)() or recorded()) if full_log else recorded
        spec["check"] = None
        spec["timeout"] = 900
        return spec
    return make


add("allowed_peak_lr_lower", "ok", "resume", _allowed(["train.peak_lr=1e-3"], "peak_lr"))
add("allowed_ckpt_every", "ok", "resume", _allowed(["train.ckpt_every=2"], "ckpt_every"))
add("allowed_log_every", "ok", "resume", _allowed(["train.log_every=2"], "log_every",
                                                  full_log=False))
add("cache_dir_moved", "ok", "resume", lambda ctx: {
    **resume(ctx, lambda d: None, f"data.cache_dir={ctx.fresh('cache')}",
             expect_complete=True), "timeout": 900})
add("tokens_extended", "either", "resume", lambda ctx: {
    **resume(ctx, lambda d: None, f"--tokens={8 * 16 * 30}"), "expect_text": "tokens",
    "timeout": 900})
