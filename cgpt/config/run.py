"""One training run's full configuration: model + data + training, YAML in and out.

`key=value` overrides are `cgpt.config.overrides`, built on this module (never the reverse).

A run directory's `config.yaml` is exactly `RunConfig.to_dict()`, so a run can be reproduced
or resumed from it alone. Unknown keys and bad values are errors that name the key.
"""
from __future__ import annotations

import dataclasses
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from cgpt.config.model import ModelConfig, get_config
from cgpt.config.data import DataConfig
from cgpt.config.units import parse_bytes
from cgpt.config.values import StrictLoader, typed_section

MODES = ("single", "data_parallel", "weight_streaming", "layer_pipelined", "auto")
# What a config key is for beyond its value, written once on its field (`role`, or
# `metadata={"roles": (...)}` in the model's and data's configs) and read by `keys`:
ROLES = {
    # how a step runs on the hardware at hand, not what is trained (`cgpt.train.fit` may
    # choose another micro-batch on other devices), and where its log also goes (train.wandb):
    # a launch's values win on --resume and when the sweep compares a run with its spec; not
    # part of a run's `identity`
    "placement": "may change between launches of one run; not part of its identity",
    # a preset changed only in these keeps the preset's name (`_reshaped_name`)
    "execution": "how the model runs, not what it is",
    # one fused program (`cgpt.train.fused`) trains runs equal in everything else
    "member": "the members of a fused group may differ in it",
    # the optimizer's values and the cadences, recorded with their step (config_changes.json)
    "changeable": "`--resume --allow-train-changes` may change it",
}


# W&B's project names (and entities) exclude these characters and are at most 128 long
WANDB_PROJECT = re.compile(r"(?:[^/\\#?%:\s]{1,128}/)?[^/\\#?%:\s]{1,128}")


def role(*roles: str, default=None):
    """A TrainConfig field's `default`, with its `ROLES` as the field's metadata."""
    return field(default=default, metadata={"roles": roles})


@dataclass(frozen=True)
class TrainConfig:
    """Training knobs. `None` means "the preset's published value" (see `cgpt.train.optim`)."""

    tokens: int | str = "chinchilla"  # "chinchilla" = 20 tokens/parameter, or a token count
    batch_size: int | None = None  # global batch in sequences
    # per-replica micro-batch; accumulation fills the rest
    micro_batch: int | None = role("placement")
    peak_lr: float | None = role("member", "changeable")
    # "linear" | "cosine"; with schedule wsd "linear" | "1-sqrt"
    decay: str | None = role("member", "changeable")
    # "published" | "wsd" (warmup-stable-decay, see cgpt.train.optim)
    schedule: str = role("member", default="published")
    decay_fraction: float = role("member", default=0.2)  # wsd: the final fraction that decays
    warmup_steps: int | None = role("member", "changeable")
    adam_eps: float | None = role("changeable")
    weight_decay: float = role("member", "changeable", default=0.1)
    clip_norm: float = role("member", "changeable", default=1.0)
    end_lr_fraction: float = role("member", "changeable", default=0.1)
    seed: int = role("member", default=0)
    log_every: int = role("member", "changeable", default=10)
    # log the gradient noise scale (cgpt.train.noise, docs/gns.md); off: the step without it
    gns: bool = role("changeable", default=False)
    eval_every: int | None = role("member", "changeable")  # None: ~10 evaluations per run
    eval_batches: int | None = role("changeable")  # None: the whole validation split
    ckpt_every: int | None = role("member", "changeable")  # None: ~10 checkpoints per run
    keep_checkpoints: int = role("member", "changeable", default=2)
    checkpoint_minutes: float | None = None  # also checkpoint every this many minutes (wall clock)
    mode: str = role("placement", default="single")
    # e.g. "data=2,stage=4"; empty = all devices on the mode's main axis
    mesh: str = role("placement", default="")
    micro_batches: int | None = role("placement")  # layer_pipelined: micro-batches per step
    # removed: true is an error (cgpt.sharding.HOST_OFFLOAD_REMOVED)
    host_offload: bool = role("placement", default=False)
    # e.g. "16GB": memory per device for the fit (cgpt.train.fit) and `--mode auto`; None: what
    # the device reports (allocator limit; RAM / devices on CPU)
    device_memory: str | None = role("placement")
    # a Weights & Biases project ("PROJECT" or "ENTITY/PROJECT") that also gets the log
    # (`cgpt.train.wandb_log`); None: none
    wandb: str | None = role("placement")

    def __post_init__(self) -> None:
        t = self.tokens
        if isinstance(t, str):
            if t != "chinchilla":
                try:
                    object.__setattr__(self, "tokens", int(float(t)))
                except ValueError:
                    raise ValueError(f"train.tokens={t!r}: use 'chinchilla' or a token count "
                                     "such as 2e6") from None
        elif isinstance(t, float) and t.is_integer():
            object.__setattr__(self, "tokens", int(t))
        if (not isinstance(self.tokens, (int, str))
                or isinstance(self.tokens, int) and self.tokens < 1):
            raise ValueError(f"train.tokens must be 'chinchilla' or a positive count, got {t!r}")
        for name in ("batch_size", "micro_batch", "warmup_steps", "eval_every", "eval_batches",
                     "ckpt_every", "micro_batches"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"train.{name} must be a positive int or null, got {v!r}")
        for name in ("log_every", "keep_checkpoints"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"train.{name} must be a positive int, got {v!r}")
        if self.checkpoint_minutes is not None and not self.checkpoint_minutes > 0:
            raise ValueError(f"train.checkpoint_minutes must be > 0 or null, got "
                             f"{self.checkpoint_minutes!r}")
        if self.peak_lr is not None and not self.peak_lr > 0:
            raise ValueError(f"train.peak_lr must be > 0, got {self.peak_lr}")
        for name, low, high, null in (("clip_norm", 0, math.inf, False),  # inf: no clipping
                                      ("weight_decay", 0, math.inf, False),
                                      ("adam_eps", 0, 1, True), ("end_lr_fraction", 0, 1, False)):
            v = getattr(self, name)
            if v is None and null:
                continue
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)
            if not (ok and
                    (low < v if name in ("clip_norm", "adam_eps") else low <= v) and v <= high):
                raise ValueError(f"train.{name} must be a number in "
                                 f"{'(' if name in ('clip_norm', 'adam_eps') else '['}{low}, "
                                 f"{high}], got {v!r}")
        if self.schedule not in ("published", "wsd"):
            raise ValueError(f"train.schedule={self.schedule!r}; use 'published' or 'wsd'")
        decays = ("linear", "1-sqrt") if self.schedule == "wsd" else ("linear", "cosine")
        if self.decay not in (None, *decays):
            raise ValueError(f"train.decay={self.decay!r} with train.schedule={self.schedule}; "
                             f"use {' or '.join(repr(d) for d in decays)}")
        if not 0 < self.decay_fraction <= 1:
            raise ValueError(f"train.decay_fraction={self.decay_fraction} must be in (0, 1]")
        if self.mode not in MODES:
            raise ValueError(f"train.mode={self.mode!r}; use one of {', '.join(MODES)}")
        if self.device_memory is not None:
            parse_bytes(self.device_memory, "train.device_memory")
        if self.wandb is not None and not WANDB_PROJECT.fullmatch(self.wandb):
            raise ValueError(f"train.wandb={self.wandb!r}: give a W&B project, PROJECT or "
                             "ENTITY/PROJECT (up to 128 characters, none of \\#?%: and no "
                             "spaces), or null for none")
        if self.batch_size and self.micro_batch and self.batch_size % self.micro_batch:
            raise ValueError(f"train.batch_size={self.batch_size} is not a multiple of "
                             f"train.micro_batch={self.micro_batch}")


@dataclass(frozen=True)
class RunConfig:
    preset: str
    model: ModelConfig
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        return {"preset": self.preset, "model": dataclasses.asdict(self.model),
                "data": dataclasses.asdict(self.data), "train": dataclasses.asdict(self.train)}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}


def cadence(every: int | None, total_steps: int) -> int:
    """Steps between evaluations (or checkpoints): `every`, or when unset a tenth of the run."""
    return every or max(1, total_steps // 10)


def keys(cls, role: str) -> tuple[str, ...]:
    """The fields of the config class `cls` that have `role` (one of `ROLES`)."""
    if role not in ROLES:
        raise ValueError(f"unknown key role {role!r}; roles: {', '.join(ROLES)}")
    return tuple(f.name for f in dataclasses.fields(cls) if role in f.metadata.get("roles", ()))


def without(cfg: dict, role: str) -> dict:
    """A run config's dict (`RunConfig.to_dict()`, or its YAML) less the keys with `role`."""
    return {s: ({k: v for k, v in sec.items() if k not in keys(SECTIONS[s], role)}
                if s in SECTIONS and isinstance(sec, dict) else sec) for s, sec in cfg.items()}


def identity(cfg: dict) -> dict:
    """What makes two runs the same run: a config's dict less its placement keys. The sweep
    hashes it (`cgpt.sweep.spec.config_hash`) and `--resume` compares it
    (`cgpt.train.resume.check_config`)."""
    return without(cfg, "placement")


def config_diff(a: dict, b: dict) -> list[str]:
    """The `section.key` names whose values differ between two run config dicts."""
    return [f"{s}.{k}" for s in SECTIONS for k in a.get(s) or {}
            if a[s][k] != (b.get(s) or {}).get(k)] + (
        ["preset"] if a.get("preset") != b.get("preset") else [])


def with_placement(cfg: RunConfig, launch: RunConfig) -> RunConfig:
    """`cfg` with `launch`'s placement keys (a resumed run placed as this launch asks)."""
    take = lambda cls, new: {k: getattr(new, k) for k in keys(cls, "placement")}  # noqa: E731
    return dataclasses.replace(
        cfg, model=cfg.model.replace(**take(ModelConfig, launch.model)),
        train=dataclasses.replace(cfg.train, **take(TrainConfig, launch.train)))


def _coerce(section: str, cls, values: dict):
    """Check keys and type every value by its field (`cgpt.config.values`: a bool is not a
    number, 2.5 is not an int, "6e-4" that YAML 1.1 left as text is a number)."""
    return typed_section(section, cls, values)


MIN_VOCAB = 257


def _reshaped_name(base: ModelConfig, model: ModelConfig, given: dict) -> str:
    """A preset changed beyond execution settings is named for it ("tiny-17k+n_layer=4"),
    so summaries and results never report it as the preset; an explicit name wins."""
    if given.get("name") not in (None, base.name):
        return model.name
    changed = [f"{f.name}={getattr(model, f.name)}" for f in dataclasses.fields(model)
               if f.name not in keys(ModelConfig, "execution") and f.name in given
               and getattr(model, f.name) != getattr(base, f.name)]
    return "+".join([base.name, ",".join(changed)]) if changed else base.name


def from_dict(raw: dict, where: str = "config") -> RunConfig:
    """Build a RunConfig from a raw dict ({preset, model, data, train}), validating every key."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping with keys preset/model/data/train")
    bad = sorted(set(raw) - {"preset", "model", "data", "train"})
    if bad:
        raise ValueError(f"{where}: unknown top-level key(s) {bad}; use preset, model, data, train")
    model_raw = dict(raw.get("model") or {})
    preset = raw.get("preset") or model_raw.pop("preset", None) or model_raw.get("name")
    if not preset:
        raise ValueError(f"{where}: set 'preset' (a model name such as cpu-1.7m or 111M; "
                         "see `python -m cgpt list`)")
    try:
        base = get_config(str(preset))
        model_raw = _coerce("model", ModelConfig, model_raw)
        model = base.replace(**model_raw)
        model = model.replace(name=_reshaped_name(base, model, model_raw))
        data_raw = _coerce("data", DataConfig, dict(raw.get("data") or {}))
        if "vocab_size" not in data_raw and model.vocab_size < MIN_VOCAB:
            raise ValueError(f"model.vocab_size={model.vocab_size} is below {MIN_VOCAB}, the "
                             "smallest byte-level BPE vocabulary (256 bytes + <|endoftext|>); "
                             f"set model.vocab_size >= {MIN_VOCAB}")
        # A preset implies its data shape: a tokenizer of its vocabulary, its full context.
        data_raw.setdefault("vocab_size", model.vocab_size)
        data_raw.setdefault("seq_len", model.n_ctx)
        data = DataConfig(**data_raw)
        train = TrainConfig(**_coerce("train", TrainConfig, dict(raw.get("train") or {})))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from e
    if data.seq_len > model.n_ctx:
        raise ValueError(f"{where}: data.seq_len={data.seq_len} exceeds model.n_ctx={model.n_ctx}")
    return RunConfig(preset=str(preset), model=model, data=data, train=train)


MAX_YAML_VALUES = 100_000  # values a config may expand to through its aliases


def _expanded_size(node, sizes: dict, path: set) -> int:
    """Values `node` stands for once every alias is expanded (shared nodes counted per use,
    each computed once, so a billion-laughs bomb is sized in time linear in the file)."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in path:
        raise ValueError("a YAML alias refers to a collection that contains it")
    if isinstance(node, yaml.ScalarNode):
        return 1
    path.add(id(node))
    items = node.value if isinstance(node, yaml.SequenceNode) else \
        [x for pair in node.value for x in pair]
    n = 1 + sum(_expanded_size(x, sizes, path) for x in items)
    path.discard(id(node))
    sizes[id(node)] = n
    return n


def safe_load(text: str, where: str):
    """yaml.safe_load, refusing documents whose aliases (&anchor / *alias) expand to more than
    MAX_YAML_VALUES values or refer to themselves: the composed graph is sized before any
    Python object is built, so an alias bomb costs no memory (and is never printed)."""
    try:
        loader = StrictLoader(text)  # a key given twice is an error, not the last kept
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            try:
                n = _expanded_size(node, {}, set())
            except ValueError as e:
                raise ValueError(f"{where}: {e}; write the values out instead") from None
            if n > MAX_YAML_VALUES:
                raise ValueError(f"{where}: its YAML aliases (*name) expand to {n:.3g} values, "
                                 f"over the limit of {MAX_YAML_VALUES}; write the values out "
                                 "instead of nesting aliases")
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not valid YAML ({' '.join(str(e).split())})") from None
    except RecursionError:
        raise ValueError(f"{where}: nested too deeply (over ~{sys.getrecursionlimit() // 10} "
                         "levels); flatten it") from None


def load_yaml(path: str | Path, what: str = "config file",
              keys: str = "preset/model/data/train") -> dict:
    """A YAML mapping from `path`; every failure names the file (and `what` it should be)."""
    p = Path(path)
    try:
        raw = safe_load(p.read_text(), str(p))
    except FileNotFoundError:
        raise ValueError(f"{what} {p} not found") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {p} is a directory; give the YAML file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text (byte {e.start}); a {what} is YAML") from None
    except OSError as e:
        raise ValueError(f"{what} {p}: cannot read it ({e.strerror or e})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{p}: a {what} is a mapping with keys {keys}")
    return raw
