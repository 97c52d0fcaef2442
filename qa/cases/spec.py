"""Sweep specs: a wrong type or value for each key, damaged YAML, bad `--set` items. Each must
be refused by `cgpt sweep SPEC --dry-run --no-fit` with one error line; a valid spec passes.

Retired (tests/faults/test_faults_sweep.py carries them): alias bombs in grid.overrides and
base.train.tokens, a recursive alias, 5,000-deep nesting, a directory as the spec; the wrong
types of filter, grid.branches (a map), per_model, slurm, estimate, base.train, name, models,
grid.overrides[].name and base.data.source in its table; `--set estimate.flops_per_s=0`."""
import json

import yaml

from qa.registry import add

BASE = {"name": "camp", "base": {"preset": "tiny-17k", "data": {"vocab_size": 512, "seq_len": 16},
                                 "train": {"batch_size": 4, "tokens": 640}},
        "grid": {"model": ["tiny-17k"], "seed": [0]}}


def _with(path: str, value) -> dict:
    spec = json.loads(json.dumps(BASE))
    *parents, last = path.split("/")
    d = spec
    for p in parents:
        d = d.setdefault(p, {})
    d[last] = value
    return spec


BAD = {
    "name-map": _with("name", {"a": 1}), "description-map": _with("description", {"a": [1]}),
    "base-int": _with("base", 5), "base-list": _with("base", [1]),
    "base-train-tokens-list": _with("base/train/tokens", [1]),
    "base-model-str": _with("base/model", "x"), "base-preset-list": _with("base/preset", [1]),
    "models-list": _with("models", [1]),
    "models-preset-list": {**_with("models", {"m": {"preset": [1]}}), "grid": {"model": ["m"]}},
    "grid-list": _with("grid", [1]), "grid-model-map": _with("grid/model", {"a": 1}),
    "grid-model-nested": _with("grid/model", [[1]]),
    "grid-tokens-map": _with("grid/tokens", {"a": 1}),
    "grid-tokens-str": _with("grid/tokens", "abc"),
    "grid-tpp-neg": _with("grid/tokens_per_param", -1),
    "grid-flops-zero": _with("grid/flops", 0), "grid-seed-str": _with("grid/seed", "x"),
    "grid-seed-float": _with("grid/seed", 1.5), "grid-overrides-int": _with("grid/overrides", 5),
    "grid-overrides-entry-int": _with("grid/overrides", [5]),
    "grid-overrides-value-list": _with("grid/overrides", [{"train.peak_lr": [1]}]),
    "grid-branches-str": _with("grid/branches", "x"),
    "grid-branches-zero": _with("grid/branches", [0]),
    "grid-branches-two": _with("grid/branches", [2]),
    "per-model-list": _with("per_model", [1]),
    "per-model-bad-value": _with("per_model", {"tiny-17k": {"train.batch_size": "x"}}),
    "per-model-slurm-nodes-str": _with("per_model", {"tiny-17k": {"slurm.nodes": "two"}}),
    "filter-int": _with("filter", 5), "filter-one": _with("filter", {"tokens_per_param": [1]}),
    "require-int": _with("require", 5), "require-nested": _with("require", [[1]]),
    "require-map": _with("require", {"a": 1}),
    "estimate-fps-str": _with("estimate", {"flops_per_s": "abc"}),
    "estimate-fps-inf": _with("estimate", {"flops_per_s": float("inf")}),
    "estimate-startup-neg": _with("estimate", {"startup_s": -5}),
    "estimate-unknown": _with("estimate", {"speed": 1}),
    "estimate-memory-str": _with("estimate", {"device_memory": "lots"}),
    "slurm-str": _with("slurm", "x"),
    "slurm-nodes-str": _with("slurm", {"nodes": "x", "gpus_per_node": 1}),
}
TEXT = {"empty-file": b"", "scalar-file": b"42\n", "list-file": b"- a\n- b\n",
        "invalid-yaml": b"a: [1,\n", "tabs": b"name:\tx\n\tgrid: 1\n",
        "binary": b"\x00\xff\xfe\x80garbage"}
SETS = {"set-value-list": ["--set", "train.peak_lr=[1]"],
        "set-slurm-nodes": ["--set", "slurm.nodes=x"],
        "set-unknown-section": ["--set", "foo.bar=1"], "set-no-equals": ["--set", "train.peak_lr"]}


def _dry_run(name: str, content: bytes, *extra: str, expect: str = "error"):
    def make(ctx):
        p = ctx.fresh(f"spec-{name}.yaml")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
        return {"argv": ["sweep", str(p), "--dry-run", "--no-fit", *extra], "timeout": 300}
    add(name, expect, "spec", make)


for _n, _spec in BAD.items():
    _dry_run(_n, yaml.safe_dump(_spec).encode())
for _n, _text in TEXT.items():
    _dry_run(_n, _text)
for _n, _flags in SETS.items():
    _dry_run(_n, yaml.safe_dump(BASE).encode(), *_flags)
_dry_run("valid", yaml.safe_dump(BASE).encode(), expect="ok")
add("missing-file", "error", "spec",
    lambda ctx: {"argv": ["sweep", str(ctx.root / "nope.yaml"), "--dry-run", "--no-fit"]})
