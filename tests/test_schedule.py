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


@pytest.mark.parametrize("name", list(CASES))
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
