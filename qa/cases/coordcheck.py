"""`cgpt coord-check` (μP coordinate check) with widths, heads and step counts that cannot make
a check, and an `--out` that cannot be written. Each is one line naming the flag before any
model is built: a researcher must not wait minutes to learn a width was a typo."""
from qa.registry import add

FAST = ["--steps", "1", "--seeds", "1", "--batch", "2", "--seq-len", "8"]
BAD = {  # name -> (flags, what the one line must name)
    "widths_empty": (["--widths", ""], "--widths"),
    "widths_letters": (["--widths", "a,b,c"], "--widths"),
    "widths_two": (["--widths", "32,64"], "--widths"),
    "widths_zero": (["--widths", "0,32,64"], "--widths"),
    "widths_negative": (["--widths", "-32,32,64"], "--widths"),
    "widths_repeated": (["--widths", "32,32,32"], "--widths"),
    "widths_not_divisible_by_heads": (["--widths", "33,65,129"], "head"),
    "heads_zero": (["--heads", "0"], "--heads"),
    "heads_not_dividing": (["--heads", "7"], "--heads"),
    "steps_negative": (["--steps=-2"], "--steps"),
    "batch_zero": (["--batch", "0"], "--batch"),
    "seq_len_zero": (["--seq-len", "0"], "--seq-len"),
    "seeds_zero": (["--seeds", "0"], "--seeds"),
    "lr_nan": (["--lr", "nan"], "--lr"),
    "lr_negative": (["--lr=-0.01"], "--lr"),
    "max_slope_nan": (["--max-slope", "nan"], "--max-slope"),
    "preset_unknown": (["--preset", "tiny-1t"], "tiny-1t"),
    "out_is_a_directory": (["--out", "."], "--out"),
    "out_under_a_file": (["--out", "/proc/version/cc.png"], "/proc/version"),
    "out_unknown_format": (["--out", "cc.xyz"], "xyz"),
}
for _n, (_flags, _text) in BAD.items():
    add(_n, "error", "coordcheck", lambda ctx, f=_flags, t=_text: {
        "argv": ["coord-check", "--widths", "32,64,128", *FAST, *f], "expect_text": t,
        "timeout": 900})
