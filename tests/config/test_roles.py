"""Config key roles, written once on the dataclass fields, and the one identity rule that
`--resume` and the sweep share (JAX-free)."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from cgpt.config.data import DataConfig
from cgpt.config.model import ModelConfig
from cgpt.config.run import ROLES, SECTIONS, TrainConfig, config_diff, from_dict, identity, \
    keys, role, with_placement, without
from cgpt.errors import TrainError
from cgpt.sweep.spec import config_hash
from cgpt.train import resume


def test_every_role_on_a_field_is_a_known_role():
    used = {r for cls in SECTIONS.values() for f in dataclasses.fields(cls)
            for r in f.metadata.get("roles", ())}
    assert used == set(ROLES)
    with pytest.raises(ValueError, match="unknown key role 'placment'"):
        keys(TrainConfig, "placment")


def test_the_roles_as_the_code_relies_on_them():
    assert set(keys(TrainConfig, "placement")) == {"mode", "mesh", "micro_batches",
                                                   "host_offload", "micro_batch", "device_memory",
                                                   "wandb"}
    assert set(keys(ModelConfig, "placement")) == {"remat", "loss_chunk"}
    assert keys(DataConfig, "member") == ("seed",)
    assert set(keys(ModelConfig, "member")) == {"name", "init_std", "out_init_std",
                                                "mup_init_std"}
    # what --allow-train-changes accepts never changes what a checkpoint means
    assert not {"tokens", "batch_size", "seed", "mode"} & set(keys(TrainConfig, "changeable"))


def test_a_new_field_costs_one_line():
    @dataclasses.dataclass(frozen=True)
    class Cfg:
        a: int = 1
        b: int = role("placement", "member", default=2)  # the one line

    assert keys(Cfg, "placement") == keys(Cfg, "member") == ("b",)
    assert keys(Cfg, "changeable") == ()


def _run(**train):
    return from_dict({"preset": "tiny-17k", "data": {"vocab_size": 512, "seq_len": 32},
                      "train": {"tokens": 20000, **train}})


def test_identity_drops_placement_only():
    a, b = _run(micro_batch=2).to_dict(), _run(micro_batch=4, mode="data_parallel").to_dict()
    b["model"]["loss_chunk"] = 16
    assert identity(a) == identity(b) and config_hash(a) == config_hash(b)
    assert config_diff(a, b) == ["model.loss_chunk", "train.micro_batch", "train.mode"]
    c = _run(peak_lr=1e-3).to_dict()
    assert config_diff(identity(a), identity(c)) == ["train.peak_lr"]
    assert config_hash(a) != config_hash(c)
    assert "seed" not in without(a, "member")["train"] and "tokens" in without(a, "member")["train"]


def test_resume_and_the_sweep_use_the_same_rule(tmp_path):
    """A launch may place a run differently (the sweep's hash agrees); anything else must be
    asked for (--allow-train-changes, for the changeable keys only)."""
    saved = resume.check_config(_run(micro_batch=2), tmp_path, resume=False, platform="cpu")
    (tmp_path / "config.yaml").write_text(saved.to_yaml())  # as train writes it
    moved = _run(micro_batch=4)
    got = resume.check_config(moved, tmp_path, resume=True, platform="cpu")
    assert got.train.micro_batch == 4 and config_hash(got.to_dict()) == \
        config_hash(yaml.safe_load(saved.to_yaml()))
    assert with_placement(saved, moved) == got
    with pytest.raises(TrainError, match=r"differs .* in train.peak_lr \(to continue with the new "
                                         "values, add --allow-train-changes\\)"):
        resume.check_config(_run(peak_lr=1e-3), tmp_path, resume=True, platform="cpu")
    assert resume.check_config(_run(peak_lr=1e-3), tmp_path, resume=True, allow_changes=True,
                               platform="cpu").train.peak_lr == 1e-3
    with pytest.raises(TrainError, match=r"in train.tokens; resume with the same flags"):
        resume.check_config(_run(tokens=40000), tmp_path, resume=True, allow_changes=True,
                            platform="cpu")
