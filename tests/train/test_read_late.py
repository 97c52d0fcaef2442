"""No host sync per step: the loop reads a step's scalars after queuing the next step
(`cgpt.train.loop.run`), a non-finite step found a step late stops as before, and the processes
of a job agree on a checkpoint step through the key-value store, not a device collective
(`cgpt.sharding.distributed.StepAgreement`)."""
import json
import random
import threading
import time
from pathlib import Path

import jax.numpy as jnp
import pytest
from jax._src.array import ArrayImpl

from cgpt.config.data import DataConfig
from cgpt.config.model import get_config
from cgpt.config.run import RunConfig, TrainConfig
from cgpt.errors import TrainError
from cgpt.sharding.distributed import DistributedError, StepAgreement
from cgpt.train import fit
from cgpt.train.loop import train

STEPS = 8
LONG = 24  # more logged steps than the old loop computed learning rates for at once


def _run(corpus, tmp_path, **kw) -> RunConfig:
    base = dict(tokens=8 * 16 * STEPS, batch_size=8, log_every=1, eval_every=1000,
                ckpt_every=1000, keep_checkpoints=5, peak_lr=3e-3)
    base.update(kw)
    return RunConfig(preset="tiny-17k", model=get_config("tiny-17k"),
                     data=DataConfig(source=str(corpus), vocab_size=512, seq_len=16,
                                     val_sequences=16, cache_dir=str(tmp_path / "cache")),
                     train=TrainConfig(**base))


def _wrap_step(monkeypatch, wrap):
    """Make the loop train with wrap(step_fn) in place of the fitted step."""
    real = fit.fit_step

    def fit_step(*args, **kwargs):
        res, step_fn, fitted = real(*args, **kwargs)
        return res, wrap(step_fn), fitted

    monkeypatch.setattr(fit, "fit_step", fit_step)


@pytest.mark.slow(reason=(
    "no twin (a late read's stop: test_a_nonfinite_step_read_late_stops_there_...)"))
def test_a_step_is_read_once_after_the_next_is_queued(corpus, tmp_path, monkeypatch):
    """Every device-to-host read in the loop is recorded (ArrayImpl._value, which float(),
    bool(), np.asarray and jax.device_get all go through): between queuing step k+1 and
    step k+2 the only reads are step k's loss and grad_norm, and nothing at all is read
    between queuing the first step and the second. LONG steps, every one logged: no step but
    the last is read at once (the logged learning rate is the host's, `optim.lr_at`, which
    needs no idle device to compute)."""
    events, owner, keep = [], {}, []

    def wrap(step_fn):
        def step(params, opt_state, batch):
            params, opt_state, m = step_fn(params, opt_state, batch)
            n = sum(e[0] == "dispatch" for e in events)
            events.append(("dispatch", n))
            owner.update({id(m["loss"]): n, id(m["grad_norm"]): n})
            keep.append(m)  # no id reuse
            return params, opt_state, m
        return step

    value = ArrayImpl._value

    def read(self):
        if self._npy_value is None:  # an actual transfer, not a cached value
            events.append(("read", owner.get(id(self), "other")))
        return value.fget(self)

    _wrap_step(monkeypatch, wrap)
    monkeypatch.setattr(ArrayImpl, "_value", property(read))
    train(_run(corpus, tmp_path, tokens=8 * 16 * LONG), tmp_path / "run", progress=False)
    monkeypatch.undo()

    first = events.index(("dispatch", 0))
    steps = [i for i, e in enumerate(events) if e[0] == "dispatch"]
    assert len(steps) == LONG
    assert events[steps[0] + 1:steps[1]] == []  # the first step is not waited on
    for k in range(LONG - 2):  # between dispatching k+1 and k+2: step k's two scalars
        assert events[steps[k + 1] + 1:steps[k + 2]] == [("read", k)] * 2, (k, events[first:])
    # the last step is read at once (it is evaluated and checkpointed), after step LONG-2
    assert events[steps[-1] + 1:steps[-1] + 5] == [("read", LONG - 2)] * 2 + [
        ("read", LONG - 1)] * 2
    log = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, LONG + 1)) and "val_loss" in log[-1]


def test_a_nonfinite_step_read_late_stops_there_before_the_next_checkpoint(
        corpus, tmp_path, monkeypatch):
    """Step 5's loss is made NaN on the device. The loop learns it only after step 6 (a
    checkpoint step) was queued: it stops at step 5 with steps 1-4 logged and the checkpoint of
    step 3 as the last good one; step 6's state is neither logged nor saved."""
    def wrap(step_fn):
        calls = [0]

        def step(params, opt_state, batch):
            params, opt_state, m = step_fn(params, opt_state, batch)
            calls[0] += 1
            if calls[0] == 5:
                m = {**m, "loss": m["loss"] * jnp.nan}
            return params, opt_state, m
        return step

    _wrap_step(monkeypatch, wrap)
    out = tmp_path / "run"
    with pytest.raises(TrainError, match=r"loss is nan at step 5; training stopped before saving "
                                         r"anything from it\. The last good checkpoint \(step 3"):
        train(_run(corpus, tmp_path, ckpt_every=3), out, progress=False)
    logged = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3, 4]
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == ["3"]


# ---- agreement between processes --------------------------------------------------------
class _Store:
    """The coordination service's key-value store, shared by threads standing in for
    processes; counts the calls."""

    def __init__(self):
        self.kv, self.lock, self.calls = {}, threading.Lock(), 0

    def key_value_set(self, key, value, allow_overwrite=False):
        with self.lock:
            assert allow_overwrite or key not in self.kv
            self.kv[key] = value
            self.calls += 1

    def key_value_dir_get(self, prefix):
        with self.lock:
            self.calls += 1
            return [(k, v) for k, v in self.kv.items() if k.startswith(prefix)]


def _job(n: int, steps: int, triggers: dict, seed: int) -> list[list]:
    """n threads run a loop shaped like cgpt's: before polling step k, a process waits until
    every process has queued step k-1 (its read of step k-1's scalars, the result of a
    collective); `triggers` {(process, step): (due, signum)} are local triggers. Returns each
    process's agreed (step, due, signum) actions."""
    store, rng = _Store(), random.Random(seed)
    queued = [-1] * n
    cond = threading.Condition()
    acts = [[] for _ in range(n)]
    errors = []
    agree = [StepAgreement(store, i, n, key="job") for i in range(n)]
    delays = [[rng.random() * 2e-3 for _ in range(steps)] for _ in range(n)]

    def proc(i):
        try:
            due = sig = 0
            for k in range(steps):
                with cond:
                    queued[i] = k
                    cond.notify_all()
                    cond.wait_for(lambda: min(queued) >= k - 1)  # read step k-1
                time.sleep(delays[i][k])
                d, s = triggers.get((i, k), (0, 0))
                due, sig = due or d, sig or s
                got = agree[i].poll(k, bool(due), sig)
                if got is not None:
                    acts[i].append((k, *got))
                    due = sig = 0
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
            with cond:
                queued[i] = steps
                cond.notify_all()

    threads = [threading.Thread(target=proc, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return acts, store


@pytest.mark.parametrize("seed", range(4))
def test_processes_agree_on_the_step_through_the_store(seed):
    """4 processes at uneven speeds; a signal reaches process 2 at its step 10, a wall-clock
    interval falls due in process 0 at step 30: every process acts at the same steps with the
    same answer, within MARGIN steps of the last process's trigger step."""
    acts, store = _job(4, 60, {(2, 10): (0, 10), (0, 30): (1, 0)}, seed)
    assert all(a == acts[0] for a in acts), acts
    (s1, due1, sig1), (s2, due2, sig2) = acts[0]
    assert (due1, sig1, due2, sig2) == (False, 10, True, 0)
    assert 10 <= s1 <= 10 + 2 + StepAgreement.MARGIN and 30 <= s2 <= 30 + 2 + StepAgreement.MARGIN
    # one key-value call per step and process, plus one publication per process and round
    assert store.calls <= 4 * 60 + 4 * 2


def test_a_process_that_learns_the_agreed_step_too_late_fails_loudly():
    store = _Store()
    a, b = StepAgreement(store, 0, 2, key="job"), StepAgreement(store, 1, 2, key="job")
    assert a.poll(3, False, 15) is None and b.poll(3, False, 0) is None  # both published 3
    with pytest.raises(DistributedError, match="agreed checkpoint step 5 only at step 9"):
        a.poll(9, False, 15)
    assert b.poll(5, False, 0) == (False, 15)
