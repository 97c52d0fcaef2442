"""Sweep specs in YAML that parses, but not as its writer meant: YAML 1.1's readings of `no`,
`1e-3`, `010`, `1:30` and dates; tags; merge keys; several documents; byte-order marks and
other encodings; keys and names no one expects. `cgpt sweep SPEC --dry-run --no-fit` must plan
what the writer meant or refuse with one line naming the key (the `spec` group tries wrong
types and broken YAML; these are the surprises of valid YAML)."""
from qa.registry import add

HEAD = ("name: odd\nbase:\n  preset: tiny-17k\n  data: {vocab_size: 512, seq_len: 16}\n"
        "  train: {batch_size: 4, tokens: 640}\n")
GRID = "grid:\n  model: [tiny-17k]\n  seed: [0]\n"
VALID = HEAD + GRID


def _sub(old: str, new: str, text: str = VALID) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _in_plan(*words):
    """The dry run's table names each of `words` (what the writer meant was planned)."""
    def check(res):
        missing = [w for w in words if w not in res.stdout]
        return f"the plan does not show {missing}" if missing else None
    return check


class _Like:
    """The dry run's table must equal the one of this spec text (the same request, written
    plainly)."""

    def __init__(self, text: str):
        self.text = text


def _table(out: str) -> list[str]:
    """The plan's rows and totals: the stdout less its first line (which names the spec file)."""
    return out.strip().splitlines()[1:]


CASES = {  # name -> (spec text or bytes, expect, what a refusal must name, stdout check)
    "model_no_is_false": (_sub("[tiny-17k]", "[tiny-17k, no]"), "error", "model", None),
    "model_null_entry": (_sub("[tiny-17k]", "[tiny-17k, null]"), "error", "model", None),
    "model_scalar_not_list": (_sub("[tiny-17k]", "tiny-17k"), "ok", None,
                              _in_plan("tiny-17k")),
    "model_unicode_lookalike": (_sub("[tiny-17k]", "[tíny-17k]"), "error", "tíny-17k", None),
    "model_set_tag": (_sub("[tiny-17k]", "!!set {tiny-17k: null}"), "error", "model", None),
    "model_empty_list": (_sub("[tiny-17k]", "[]"), "error", "model", None),
    "seed_octal_010": (_sub("seed: [0]", "seed: [010]"), "either", "seed", None),
    "seed_invalid_octal_08": (_sub("seed: [0]", "seed: [08]"), "error", "seed", None),
    "seed_alias_of_model_list": (_sub("model: [tiny-17k]\n  seed: [0]",
                                      "model: &m [tiny-17k]\n  seed: *m"), "error", "seed", None),
    "seed_bool_true": (_sub("seed: [0]", "seed: [true]"), "error", "seed", None),
    # YAML 1.1 reads 1e3 (no dot, no exponent sign) as the string '1e3': cgpt reads a count
    # written so as the number (as `--tokens 1e3` does), so the plan is the one of 1000
    "tokens_1e3_string": (_sub("tokens: 640", "tokens: 1e3"), "ok", None,
                          _Like(_sub("tokens: 640", "tokens: 1000"))),
    "tokens_underscores": (_sub("tokens: 640", "tokens: 1_280"), "ok", None, _in_plan("d1.28k")),
    "tokens_hex": (_sub("tokens: 640", "tokens: 0x500"), "ok", None, _in_plan("d1.28k")),
    "tokens_sexagesimal": (_sub("tokens: 640", "tokens: 21:20"), "either", "tokens", None),
    "tokens_quoted": (_sub("tokens: 640", "tokens: '640'"), "ok", None, _in_plan("d640")),
    "tokens_float_no_sign_exp": (_sub("tokens: 640", "tokens: 6.4e2"), "ok", None,
                                 _in_plan("d640")),
    "tokens_inf": (_sub("tokens: 640", "tokens: .inf"), "error", "tokens", None),
    "tokens_date": (_sub("tokens: 640", "tokens: 2024-01-01"), "error", "tokens", None),
    "peak_lr_1e-3_string": (_sub("batch_size: 4,", "batch_size: 4, peak_lr: 1e-3,"), "ok", None,
                            None),
    "peak_lr_nan_in_overrides": (VALID + "  overrides: [{train.peak_lr: .nan}]\n", "error",
                                 "peak_lr", None),
    "override_1e-3_string": (VALID + "  overrides: [{train.peak_lr: 1e-3}, "
                             "{train.peak_lr: 2e-3}]\n", "ok", None, None),
    "name_null": (_sub("name: odd", "name: ~"), "either", "name", None),
    "name_date": (_sub("name: odd", "name: 2024-01-01"), "either", "name", None),
    "name_int": (_sub("name: odd", "name: 42"), "either", "name", None),
    "name_newline": (_sub("name: odd", 'name: "odd\\nline"'), "either", "name", None),
    "name_very_long": (_sub("name: odd", "name: " + "x" * 300), "either", "name", None),
    "python_object_tag": (_sub("name: odd", "name: !!python/object/apply:os.system [echo hi]"),
                          "error", "python/object", None),
    "binary_tag": (_sub("name: odd", "name: !!binary aGVsbG8="), "either", "name", None),
    "merge_key_models": (HEAD + "models:\n  base_m: &b {preset: tiny-17k, n_head: 2}\n"
                         "  wide: {<<: *b, d_model: 24}\n"
                         "grid:\n  model: [wide]\n  seed: [0]\n", "ok", None, _in_plan("wide")),
    "two_documents": (VALID + "---\n" + VALID, "error", "document", None),
    "document_end_then_junk": (VALID + "...\n%garbage\n", "either", None, None),
    "yaml_1_2_directive": ("%YAML 1.2\n---\n" + VALID, "either", None, None),
    "utf8_bom": ("\ufeff" + VALID, "ok", None, _in_plan("tiny-17k")),
    "utf16_with_bom": (VALID.encode("utf-16"), "either", "UTF", None),
    "latin1_description": (("description: caf\xe9 runs\n" + VALID).encode("latin-1"), "error",
                           "UTF-8", None),
    "crlf": (VALID.replace("\n", "\r\n"), "ok", None, _in_plan("tiny-17k")),
    "dotted_key_top_level": (VALID + "train.tokens: 640\n", "error", "train.tokens", None),
    "grid_key_typo": (_sub("seed: [0]", "seeds: [0]"), "error", "seeds", None),
    "base_key_typo": (_sub("  train: {", "  trian: {"), "error", "trian", None),
    "per_model_not_in_grid": (VALID + "per_model:\n  tiny-45k: {train.batch_size: 8}\n",
                              "either", "tiny-45k", None),
    "block_scalar_description": ("description: |\n  line one\n  line two\n" + VALID, "ok", None,
                                 None),
    "tokens_duplicates_after_parsing": (_sub("tokens: 640", "tokens: 640") + "  tokens: "
                                        "[640, 640.0]\n", "error", "640", None),
}


def _dry_run(ctx, text) -> list[str]:
    p = ctx.fresh("spec.yaml")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return ["sweep", str(p), "--out", str(ctx.fresh("sw")), "--dry-run", "--no-fit"]


def _make(text, check):
    def make(ctx):
        spec = {"argv": _dry_run(ctx, text), "timeout": 300}
        if isinstance(check, _Like):
            ref = ctx.cgpt(_dry_run(ctx, check.text), 300)
            if ref.returncode:
                raise RuntimeError(f"the plain spec's dry run failed: {ref.stderr[-500:]}")
            want = _table(ref.stdout)
            spec["stdout_check"] = lambda res: None if _table(res.stdout) == want else (
                f"the plan differs from the plain spec's: {_table(res.stdout)[:2]} != {want[:2]}")
        elif check:
            spec["stdout_check"] = check
        return spec
    return make


for _n, (_text, _expect, _named, _check) in CASES.items():
    _mk = _make(_text, _check)
    add(_n, _expect, "yamlodd", _mk if _named is None else
        (lambda ctx, m=_mk, t=_named: {**m(ctx), "expect_text": t}))
