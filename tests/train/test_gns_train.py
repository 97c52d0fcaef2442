"""train.gns in real runs: the noise scale in metrics.jsonl, TensorBoard and summary.json, the
same under data parallelism (8 emulated CPU devices) and for each member of a fused group."""
import json
import struct

import pytest

from cgpt import rundir
from cgpt.config.data import DataConfig
from cgpt.config.model import get_config
from cgpt.config.run import RunConfig, TrainConfig, from_dict
from cgpt.train import noise
from cgpt.train.fused_loop import train_fused
from cgpt.train.loop import train

STEPS = 12


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _run(corpus, cache, **train_kw) -> RunConfig:
    base = dict(tokens=8 * 16 * STEPS, batch_size=8, log_every=2, peak_lr=3e-3, gns=True,
                ckpt_every=STEPS, eval_every=STEPS)
    base.update(train_kw)
    return RunConfig(
        preset="tiny-17k", model=get_config("tiny-17k").replace(compute_dtype="float32"),
        data=DataConfig(source=str(corpus), vocab_size=512, seq_len=16, val_sequences=16,
                        cache_dir=str(cache)),
        train=TrainConfig(**base))


def _log(out):
    return rundir.read_metrics(out / rundir.METRICS_FILE)


def _tb_scalars(events_dir) -> dict:
    """{tag: {step: value}} from the TensorBoard event files (TFRecord framing)."""
    from tensorboardX.proto import event_pb2

    out = {}
    for f in events_dir.glob("events.out.tfevents.*"):
        data, i = f.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for v in ev.summary.value:
                out.setdefault(v.tag, {})[ev.step] = v.simple_value
    return out


def test_config_key_defaults_off():
    assert TrainConfig().gns is False
    assert from_dict({"preset": "tiny-17k", "train": {"gns": True}}).train.gns is True
    with pytest.raises(ValueError, match="train.gns"):
        from_dict({"preset": "tiny-17k", "train": {"gns": 1}})


def test_logged_in_metrics_tensorboard_and_summary(corpus, cache, tmp_path):
    out = tmp_path / "run"
    s = train(_run(corpus, cache), out, progress=False)
    log = _log(out)
    assert [r["step"] for r in log] == list(range(2, STEPS + 1, 2))
    assert all(set(noise.STEP_KEYS + noise.EMA_KEYS[:2]) <= set(r) for r in log)
    last = log[-1]
    assert last["gns_b_simple"] == pytest.approx(last["gns_trace_ema"] / last["gns_g2_ema"])
    assert {k: s[k] for k in noise.EMA_KEYS} == {k: last[k] for k in noise.EMA_KEYS}
    assert s["gns_b_simple"] > 0
    tb = _tb_scalars(out / rundir.EVENTS_DIR)
    assert tb["train/gns_b_simple"][STEPS] == pytest.approx(last["gns_b_simple"], rel=1e-6)
    assert tb["train/gns_trace"][2] == pytest.approx(log[0]["gns_trace"], rel=1e-6)


def test_off_logs_nothing_of_it(corpus, cache, tmp_path):
    out = tmp_path / "run"
    s = train(_run(corpus, cache, gns=False, tokens=8 * 16 * 4), out, progress=False)
    assert not any(k.startswith("gns") for r in _log(out) for k in r)
    assert not any(k.startswith("gns") for k in s)


@pytest.mark.slow(reason="data parallel = one device: test_sharding; the estimate: test_gns.py")
def test_data_parallel_estimates_equal_one_device(corpus, cache, tmp_path):
    """The batch split over 8 replicas (one sequence each, so the halves span devices)."""
    one = _log_of(train, _run(corpus, cache), tmp_path / "one")
    dp = _log_of(train, _run(corpus, cache, mode="data_parallel"), tmp_path / "dp")
    for a, b in zip(one, dp):
        for k in noise.STEP_KEYS:
            assert b[k] == pytest.approx(a[k], rel=2e-3, abs=1e-5), (a["step"], k)


@pytest.mark.slow(reason=(
    "fused = solo: test_fused_members_equal_solo_runs; the logged estimate: "
    "test_logged_in_metrics_tensorboard_and_summary"))
def test_fused_members_log_their_own_noise_scale(corpus, cache, tmp_path):
    runs = [_run(corpus, cache, peak_lr=lr) for lr in (3e-3, 1e-2)]
    outs = [tmp_path / f"m{i}" for i in range(2)]
    train_fused(runs, outs, progress=False)
    solo = _log_of(train, runs[1], tmp_path / "solo1")
    fused = [_log(o) for o in outs]
    assert fused[0][-1]["gns_g2"] != fused[1][-1]["gns_g2"]  # each member's own gradients
    for a, b in zip(solo, fused[1]):
        for k in noise.STEP_KEYS + ("gns_g2_ema",):
            assert b[k] == pytest.approx(a[k], rel=1e-3, abs=1e-6), (a["step"], k)


def _log_of(train_fn, run, out):
    train_fn(run, out, progress=False)
    return _log(out)
