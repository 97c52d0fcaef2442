"""The LR schedule against an independent reference: torch's own schedulers, configured as
the published Cerebras-GPT yaml configures ModelZoo's, and stepped as ModelZoo steps them.

ModelZoo's schedulers (`modelzoo/common/pytorch/optim/lr_scheduler.py`, Release 1.8; the same
in `cerebras.pytorch.optim.lr_scheduler`) are torch LR schedulers stepped once after every
`optimizer.step()`, so the update with 0-based index k runs at lr(k). The 111M yaml chains
Linear 0 -> 6e-4 over 1525 steps and Linear 6e-4 -> 6e-5 over 7512 steps, 9037 = max_steps in
all: the last update (k = 9036) runs at 6e-5 + 5.4e-4/7512 and 6e-5 is reached at k = 9037,
after training. torch's LinearLR and CosineAnnealingLR compute the same values as ModelZoo's
PolynomialLR (power 1) and CosineDecayLR up to their last step.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cgpt.train import optim
from cgpt.config.model import get_config

torch = pytest.importorskip("torch")


def _torch_lrs(r: optim.Recipe) -> np.ndarray:
    """The lr of every update, k = 0..total-1, from torch schedulers in a torch loop."""
    from torch.optim import lr_scheduler as ls

    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=r.peak_lr)
    W, T = r.warmup_steps, r.total_steps
    warm = ls.LambdaLR(opt, lambda s: s / W)  # ModelZoo Linear 0 -> peak over W steps
    end = r.end_lr_fraction
    if r.schedule == "wsd":
        start = r.decay_start
        parts = [warm, ls.ConstantLR(opt, factor=1.0, total_iters=0),
                 ls.LinearLR(opt, start_factor=1.0, end_factor=end, total_iters=T - start)]
        milestones = [W, start]
    elif r.decay == "linear":
        parts = [warm, ls.LinearLR(opt, start_factor=1.0, end_factor=end, total_iters=T - W)]
        milestones = [W]
    else:
        parts = [warm, ls.CosineAnnealingLR(opt, T_max=T - W, eta_min=end * r.peak_lr)]
        milestones = [W]
    sched = ls.SequentialLR(opt, parts, milestones=milestones)
    lrs = []
    for _ in range(T):
        lrs.append(opt.param_groups[0]["lr"])  # the lr this update runs at
        opt.step()
        sched.step()
    return np.array(lrs)


def _applied_lrs(r: optim.Recipe) -> np.ndarray:
    """The lr the optax optimizer applies at every update: a constant gradient 0.5 on an
    undecayed parameter makes Adam's step exactly 0.5 / (0.5 + eps), times -lr."""
    tx = optim.make_optimizer(r, get_config("tiny-17k"))
    params = {"ln_f": {"bias": jnp.zeros((), jnp.float32)}}
    grads = {"ln_f": {"bias": jnp.float32(0.5)}}

    @jax.jit
    def run(state):
        def body(state, _):
            upd, state = tx.update(grads, state, params)
            return state, -upd["ln_f"]["bias"]
        return jax.lax.scan(body, state, None, length=r.total_steps)[1]

    return np.asarray(run(tx.init(params)), np.float64) * (0.5 + r.adam_eps) / 0.5


CASES = {  # (peak, decay, warmup, total)
    "111M": (6e-4, "linear", 1525, 9037),   # the published yaml
    "1.3B": (2e-4, "cosine", 346, 24_334),
    "cpu-50-linear": (2e-3, "linear", 5, 50),  # the CPU rule: warmup 10% of the run
    "cpu-50-cosine": (2e-3, "cosine", 5, 50),
    "cpu-12-linear": (2e-3, "linear", 1, 12),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow(
    reason="the same stepping at 111M runs by default")) if n == "1.3B" else n for n in CASES])
def test_schedule_equals_modelzoo_stepping_in_torch(name):
    peak, decay, warmup, total = CASES[name]
    r = optim.Recipe(peak_lr=peak, decay=decay, adam_eps=1e-8, batch_size=8,
                     warmup_steps=warmup, total_steps=total)
    ref = _torch_lrs(r)
    ours = np.array([optim.lr_at(r, k) for k in range(total)])
    np.testing.assert_allclose(ours, ref, rtol=2e-5, atol=peak * 1e-6)
    np.testing.assert_allclose(_applied_lrs(r), ref, rtol=2e-5, atol=peak * 1e-6)
    # The last trained step runs one decay step above the end LR; the end LR itself is the
    # schedule's value at step == total_steps (never trained), for both shapes.
    d = total - warmup
    last = 0.1 + 0.9 * (1 / d if decay == "linear" else (1 - np.cos(np.pi / d)) / 2)
    assert ref[-1] == pytest.approx(peak * last, rel=1e-6)
    assert optim.lr_at(r, total) == pytest.approx(0.1 * peak, rel=1e-6)


def test_wsd_linear_cooldown_equals_torch():
    r = optim.Recipe(peak_lr=1e-3, decay="linear", adam_eps=1e-8, batch_size=8, warmup_steps=10,
                     total_steps=110, schedule="wsd", decay_fraction=0.2)
    ref = _torch_lrs(r)
    np.testing.assert_allclose([optim.lr_at(r, k) for k in range(110)], ref, rtol=2e-5,
                               atol=1e-9)
    np.testing.assert_allclose(_applied_lrs(r), ref, rtol=2e-5, atol=1e-9)
    assert ref[-1] == pytest.approx(1e-4 + 9e-4 / 22)


@pytest.mark.parametrize("schedule,decay", [("published", "linear"), ("published", "cosine"),
                                            ("wsd", "linear"), ("wsd", "1-sqrt")])
def test_lr_at_is_the_schedule_computed_on_the_host(schedule, decay, monkeypatch):
    """The logged LR (`optim.lr_at`) is the optax schedule evaluated outside jit, as the loop
    logged it before, bit for bit at every step (the cosine decay within 2 ulp: its cos is
    the platform's), and it is computed without JAX, so it never waits on a queued step."""
    for warmup, total, peak, end in ((5, 50, 2e-3, 0.1), (37, 371, 6e-4, 0.1),
                                     (1, 12, 3e-3, 0.0), (150, 200, 4e-3, 0.25)):
        r = optim.Recipe(peak_lr=peak, decay=decay, adam_eps=1e-8, batch_size=8,
                         warmup_steps=warmup, total_steps=total, schedule=schedule,
                         end_lr_fraction=end)
        sched = optim.schedule(r)
        eager = np.array([float(sched(k)) for k in range(total + 2)], np.float32)
        with monkeypatch.context() as m:
            for name in ("jax", "jnp", "optax"):  # any use of JAX on the way fails
                m.setattr(optim, name, None)
            host = np.array([optim.lr_at(r, k) for k in range(total + 2)], np.float32)
        ulps = np.abs(host.view(np.int32) - eager.view(np.int32))
        assert ulps.max() <= (2 if decay == "cosine" else 0), (r, ulps.max())
