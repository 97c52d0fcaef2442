"""A fused job's start (#21 item 5): the sweep's worker compiles a group's step ahead
(`fused_loop.compile_group`) and the group then trains with that very program; what the
group prepares while its step compiles (`fused_prep.Prepare`, a background thread) reaches
the loop, its errors included."""
import json

import jax
import pytest

from cgpt.config.data import DataConfig
from cgpt.config.model import get_config
from cgpt.config.run import RunConfig, TrainConfig
from cgpt.train import fused, fused_loop


def _runs(corpus, cache):  # test_fused.py's shape and step count: one compile in a session
    return [RunConfig(
        preset="tiny-17k", model=get_config("tiny-17k").replace(compute_dtype="float32"),
        data=DataConfig(source=str(corpus), vocab_size=512, seq_len=16, val_sequences=16,
                        cache_dir=str(cache), seed=s),
        train=TrainConfig(tokens=8 * 16 * 20, batch_size=8, seed=s, peak_lr=lr, eval_every=10,
                          ckpt_every=10))
        for s, lr in ((0, 3e-3), (1, 1e-3))]


@pytest.fixture(scope="module")
def ahead(corpus, tmp_path_factory):
    """Two members' runs, their group's step compiled ahead."""
    runs = _runs(corpus, tmp_path_factory.mktemp("cache"))
    cached = ["init"] if jax.config.jax_compilation_cache_dir else []  # conftest sets one
    assert fused_loop.compile_group(runs) == ["fused step", *cached]
    return runs


def test_a_group_trains_with_the_step_compiled_ahead(ahead, tmp_path, monkeypatch):
    def no_compile(*a, **k):
        raise AssertionError("the group compiled its step again")

    monkeypatch.setattr(fused, "make_fused_step", no_compile)
    outs = [tmp_path / "a", tmp_path / "b"]
    got = fused_loop.train_fused(ahead, outs, progress=False)
    assert [r["steps"] for r in got] == [20, 20]
    losses = [json.loads((o / "summary.json").read_text())["val_loss"] for o in outs]
    assert losses[0] != losses[1]  # two members, two learning rates and seeds


def test_an_error_while_preparing_reaches_the_launch(ahead, tmp_path, monkeypatch):
    def broken(recipes):
        raise ValueError("stack_hyper broke")

    monkeypatch.setattr(fused, "stack_hyper", broken)  # called in the Prepare thread
    with pytest.raises(ValueError, match="stack_hyper broke"):
        fused_loop.train_fused(ahead, [tmp_path / "a", tmp_path / "b"], progress=False)
    assert not (tmp_path / "a" / "summary.json").exists()
