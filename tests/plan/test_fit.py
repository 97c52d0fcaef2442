"""A step that fits (`cgpt.train.fit`): the search's order and cost, and train/plan choosing from the
compiled step's memory on emulated CPU devices."""
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import jax
import pytest

from cgpt.config import backend
from cgpt.train import fit
from cgpt.plan import command as plan
from cgpt.config.model import get_config
from cgpt.config.data import DataConfig
from cgpt.config.run import RunConfig, TrainConfig, from_dict
from cgpt.errors import TrainError
from cgpt.train.loop import train


# ---- the search on a memory model (no compiles) ---------------------------------------------
class FakeCompiled:
    def __init__(self, total: int):
        self.total = total

    def memory_analysis(self):
        state = min(self.total, 1000)  # every candidate's arguments: state and batch
        return SimpleNamespace(argument_size_in_bytes=state, output_size_in_bytes=0,
                               temp_size_in_bytes=self.total - state, alias_size_in_bytes=0)


def _fake(per_token: int, remat_saving: float = 0.5, accum_buffer: int = 0):
    """compile_fn whose step needs state + micro x per_token (less with remat, plus a
    gradient buffer once it accumulates), recording what was compiled."""
    calls = []

    def compile_fn(m: int, remat: str):
        calls.append((m, remat))
        act = m * per_token * (remat_saving if remat == "full" else 1)
        return FakeCompiled(int(1000 + act + (accum_buffer if m < 90 else 0)))

    return compile_fn, calls


def test_first_candidate_that_fits_is_the_only_compile():
    compile_fn, calls = _fake(per_token=10)
    choice, compiled = fit.search(fit.divisors_desc(90), 90, compile_fn, device_memory=10**6)
    assert (choice.micro_batch, choice.accum, choice.remat, choice.fits) == (90, 1, "save_dots", True)
    assert calls == [(90, "save_dots")] and compiled.total == 1900


def test_remat_before_accumulation_then_bisection():
    # 90 sequences: off needs 1000 + 900*10, on 1000 + 450*10 -> remat on at full batch fits
    compile_fn, calls = _fake(per_token=100)
    choice, _ = fit.search(fit.divisors_desc(90), 90, compile_fn,
                           device_memory=fit.memory_for(6000))
    assert calls == [(90, "save_dots"), (90, "full")]
    assert (choice.micro_batch, choice.remat) == (90, "full")
    # a tighter budget: bisect the divisors with remat on, then retry remat off there
    compile_fn, calls = _fake(per_token=100, accum_buffer=200)
    usable = 1000 + 200 + 15 * 100  # remat off fits at 15 sequences, remat on at 30
    choice, _ = fit.search(fit.divisors_desc(90), 90, compile_fn,
                           device_memory=fit.memory_for(usable))
    assert (choice.micro_batch, choice.accum, choice.remat) == (30, 3, "full")
    assert len(calls) <= 2 + 1 + 4 + 1  # full batch x2, the smallest, log2(11) steps, remat off
    assert choice.fits and len(choice.tried) == len(calls)
    # every divisor larger than the choice was either compiled and too big, or skipped
    assert all(c.bytes["total"] > choice.usable for c in choice.tried
               if c.micro_batch > choice.micro_batch)


def test_cost_fn_trades_the_forward_recompute_for_a_smaller_micro_batch():
    """With a cost model (GPUs), full remat at the largest micro-batch that fits it competes
    with the largest smaller micro-batch on the rung below: the faster wins. Without one
    (CPU), the search is memory-only, as before."""
    usable = 1000 + 200 + 15 * 100  # the rung below fits at 15 sequences, full remat at 30
    memory = fit.memory_for(usable)
    cheap_low = lambda m, r: (4 / 3 if r == "full" else 1.0)  # noqa: E731 - recompute: +1/3
    compile_fn, calls = _fake(per_token=100, accum_buffer=200)
    choice, _ = fit.search(fit.divisors_desc(90), 90, compile_fn, memory, models=fit.Models(seconds=cheap_low))
    assert (choice.micro_batch, choice.accum, choice.remat) == (15, 6, "save_dots")
    assert choice.fits and len(calls) <= 2 + 1 + 4 + 1 + 1 + 4  # + the lower rung's bisection
    dear_low = lambda m, r: 1.0 if r == "full" else 2.0  # noqa: E731 - e.g. re-gathers
    compile_fn, _ = _fake(per_token=100, accum_buffer=200)
    choice, _ = fit.search(fit.divisors_desc(90), 90, compile_fn, memory, models=fit.Models(seconds=dear_low))
    assert (choice.micro_batch, choice.remat) == (30, "full")
    compile_fn, _ = _fake(per_token=100, accum_buffer=200)
    assert fit.search(fit.divisors_desc(90), 90, compile_fn, memory)[0].remat == "full"


def test_given_micro_batch_and_remat_are_only_checked():
    compile_fn, calls = _fake(per_token=100)
    choice, _ = fit.search([45], 90, compile_fn, device_memory=10**9, remat=False,
                           micro_given=True)
    assert calls == [(45, "save_dots")] and (choice.micro_batch, choice.accum) == (45, 2)
    choice, _ = fit.search([45], 90, compile_fn, device_memory=5000, remat=False,
                           micro_given=True)
    assert not choice.fits
    msg = choice.error("13B on 8 devices")
    assert msg.startswith("13B on 8 devices: the step as set (micro-batch 45, remat save_dots) needs")
    assert "a smaller train.micro_batch" in msg and "model.remat=full" in msg


def test_nothing_fits_names_the_numbers_and_the_fix():
    compile_fn, calls = _fake(per_token=100)
    choice, _ = fit.search(fit.divisors_desc(90), 90, compile_fn,
                           device_memory=fit.memory_for(1020))  # the state fits, no step does
    assert not choice.fits and (choice.micro_batch, choice.remat) == (1, "full")
    msg = choice.error("13B (12.9B params), weight_streaming on 8 devices")
    assert "micro-batch 1, remat full" in msg and "per device" in msg and "usable" in msg
    assert "more devices" in msg and "slurm.nodes" in msg and "compute_dtype=bfloat16" in msg
    # the arguments alone (state and batch, the same in every candidate) do not fit: one
    # compile decides it (`plan --device-memory 1KB` compiled every rung, minutes at load)
    compile_fn, calls = _fake(per_token=100)
    choice, _ = fit.search(fit.divisors_desc(90), 90, compile_fn, device_memory=1000)
    assert not choice.fits and calls == [(90, "save_dots")] and len(choice.tried) == 1
    assert "more devices" in choice.error("tiny")


# ---- plan and train on emulated devices -----------------------------------------------------
# tiny-116k, batch 32 x 128 tokens on 4 data-parallel devices: activations dominate, so a
# small device memory forces accumulation (measured: 8 rows/replica 14 MB, 2 rows 5 MB).
SHAPE = dict(batch=32, seq_len=128)


def _devices(n: int = 4):
    if jax.device_count() < n:
        pytest.skip(f"needs {n} emulated CPU devices (conftest sets 8)")
    return jax.devices()[:n]


def _plan(**kw) -> dict:
    # planned for this CPU, so that train here makes the same choices (its dtype too)
    return plan.plan("tiny-116k", "data_parallel", "data=4", 4, compile_devices=_devices(), **SHAPE,
                     platform="cpu", **kw)


@pytest.fixture(scope="module")
def full_step():
    """The default plan on big devices: the no-accumulation step, one compile."""
    return _plan(device_memory="80GB")


def test_plan_defaults_are_trains(full_step):
    r = full_step
    assert (r["micro_batch"], r["accum"], r["remat"]) == (8, 1, "save_dots")
    assert r["fit"]["searched"] == ["micro_batch", "remat"] and len(r["fit"]["tried"]) == 1
    run = from_dict({"preset": "tiny-116k"})
    assert run.model.remat is None and run.train.micro_batch is None  # train: also searched
    assert run.model.compute_dtype == get_config("tiny-116k").compute_dtype == "auto"
    assert r["dtype"] == backend.resolve(run.model, "cpu").compute_dtype == "float32"
    assert plan.plan("tiny-116k", "data_parallel", "data=4", 4, compile_devices=_devices(),
                     **SHAPE)["dtype"] == backend.resolve(run.model, "gpu").compute_dtype


@pytest.fixture(scope="module")
def accumulating(full_step):
    """The plan on devices whose usable memory is 55% of what the full step needs."""
    memory = fit.memory_for(int(0.55 * full_step["per_device_bytes"]["total"]))
    return _plan(device_memory=memory)


@pytest.mark.slow(reason=(
    "test_remat_before_accumulation_then_bisection (the search, without compiles)"))
def test_small_device_memory_forces_accumulation(full_step, accumulating):
    full = full_step["per_device_bytes"]["total"]
    r, memory = accumulating, accumulating["device_memory"]
    assert r["fits"] and r["accum"] > 1 and r["micro_batch"] * r["accum"] == 8
    assert r["per_device_bytes"]["total"] <= r["usable_memory"] < full
    assert r["fit"]["tried"][0] == {"micro_batch": 8, "remat": "save_dots", "total": full}
    # an explicit micro-batch is honoured (and only checked)
    given = _plan(device_memory=memory, micro_batch=8, remat=False)
    assert (given["micro_batch"], given["accum"], given["fits"]) == (8, 1, False)
    assert given["fit"]["searched"] == []


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import sysconfig
    d = tmp_path_factory.mktemp("corpus")
    lib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py"):
        shutil.copy(lib / name, d / name)
    return d


def _run(corpus, tmp_path, **kw) -> RunConfig:
    return RunConfig(
        preset="tiny-116k", model=get_config("tiny-116k"),
        data=DataConfig(source=str(corpus), vocab_size=512, seq_len=128, val_sequences=8,
                        cache_dir=str(tmp_path / "cache")),
        train=TrainConfig(tokens=32 * 128 * 3, batch_size=32, mode="data_parallel",
                          mesh="data=4", **kw))


@pytest.mark.slow(reason=(
    "test_plan_defaults_are_trains (the plan and train defaults agree), fit's unit tests"))
def test_train_chooses_what_plan_chooses_and_records_it(corpus, tmp_path, accumulating):
    _devices()
    planned, memory = accumulating, accumulating["device_memory"]
    s = train(_run(corpus, tmp_path, device_memory=str(memory)), tmp_path / "run",
              progress=False)
    p = s["placement"]
    assert (p["micro_batch"], p["accum"], p["remat"]) == (
        planned["micro_batch"], planned["accum"], planned["remat"])
    assert p["bytes_per_device"] == planned["per_device_bytes"]["total"] and p["fits"]
    assert p["device_memory"] == memory
    # config.yaml keeps what was asked (chosen per launch), so a resume elsewhere may differ
    saved = json.loads(json.dumps(__import__("yaml").safe_load(
        (tmp_path / "run" / "config.yaml").read_text())))
    assert saved["train"]["micro_batch"] is None and saved["model"]["remat"] is None


@pytest.mark.slow  # fit's refusal is unit-tested by default; this is its end-to-end twin
def test_train_stops_before_writing_when_nothing_fits(corpus, tmp_path):
    _devices()
    with pytest.raises(TrainError) as e:
        train(_run(corpus, tmp_path, device_memory="200KB"), tmp_path / "run", progress=False)
    msg = str(e.value)
    assert msg.startswith("tiny-116k (") and "data_parallel on 4 device(s) (data=4)" in msg
    assert "per device" in msg and "usable (200 kB per device less 10% outside the allocator's pool and 5% of " \
        "the pool kept free)" in msg
    assert "more devices" in msg
    assert not (tmp_path / "run").exists()
    with pytest.raises(TrainError, match="a smaller train.micro_batch"):
        train(_run(corpus, tmp_path, device_memory="1MB", micro_batch=8), tmp_path / "run2",
              progress=False)


def test_old_run_dirs_resume_and_the_launch_picks_its_own_step(tmp_path):
    """A run directory written before the fit existed (model.remat: false, an explicit
    micro-batch) resumes under a launch that leaves both unset, and vice versa: they are
    chosen per launch, like the mode and mesh."""
    from cgpt.sweep.spec import config_hash
    from cgpt.train.resume import check_config

    # a run directory records its concrete dtype (cgpt.config.backend.resolve); an old one float32
    old = from_dict({"preset": "tiny-17k", "model": {"remat": False, "compute_dtype": "float32"},
                     "train": {"batch_size": 8, "micro_batch": 2}})
    (tmp_path / "config.yaml").write_text(old.to_yaml())
    new = from_dict({"preset": "tiny-17k", "model": {"compute_dtype": "float32"},
                     "train": {"batch_size": 8}})
    assert check_config(new, tmp_path, resume=True) == new
    assert config_hash(old.to_dict()) == config_hash(new.to_dict())  # the sweep's identity too
    with pytest.raises(TrainError, match="train.batch_size"):  # what is trained still counts
        check_config(from_dict({"preset": "tiny-17k", "train": {"batch_size": 16}}), tmp_path,
                    resume=True)
