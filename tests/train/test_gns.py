"""The gradient noise scale's estimator (`cgpt.train.noise`) inside the real step (`make_step`):
on least squares with Gaussian inputs, where |G|^2 and tr(S) are known in closed form, and on a
tiny GPT against per-example gradients computed one example at a time (jax.vmap of grad)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cgpt.config.model import get_config
from cgpt.errors import TrainError
from cgpt.model import gpt as model
from cgpt.train import noise
from cgpt.train.step import make_step

D, SIGMA = 8, 1.0  # least squares: inputs x ~ N(0, I_D), targets x . w* + N(0, SIGMA^2)


def _least_squares(params, rows, cfg):
    x, y = rows[:, :D], rows[:, D]
    return 0.5 * jnp.mean(jnp.square(x @ params["w"] - y))


def _closed_form(delta: np.ndarray) -> tuple[float, float]:
    """(|G|^2, tr(S)) of least squares at w = w* + delta: G = delta and, by Isserlis' theorem,
    S = (|delta|^2 + SIGMA^2) I + delta delta^T."""
    d2 = float(delta @ delta)
    return d2, D * (d2 + SIGMA ** 2) + d2


@pytest.mark.parametrize("accum,rows", [(4, 16), (1, 64)])  # micro-batches, or halves of one
def test_least_squares_noise_scale_within_10_percent(accum, rows):
    rng = np.random.default_rng(0)
    w_star = rng.normal(size=D)
    delta = np.full(D, 1 / np.sqrt(D))  # |G|^2 = 1, tr(S) = 17: B_simple = 17
    params = {"w": jnp.asarray(w_star + delta, jnp.float32)}
    step = jax.jit(make_step(None, optax.set_to_zero(), _least_squares, gns=True))
    est = []
    for _ in range(400):  # fresh batches at the same parameters
        x = rng.normal(size=(accum * rows, D))
        y = x @ w_star + SIGMA * rng.normal(size=accum * rows)
        batch = np.concatenate([x, y[:, None]], 1).reshape(accum, rows, D + 1)
        _, _, m = step(params, optax.set_to_zero().init(params), jnp.asarray(batch, jnp.float32))
        est.append([float(m["gns_g2"]), float(m["gns_trace"])])
    g2, trace = np.mean(est, axis=0)
    g2_true, trace_true = _closed_form(delta)
    assert g2 == pytest.approx(g2_true, rel=0.10)
    assert trace == pytest.approx(trace_true, rel=0.10)
    assert trace / g2 == pytest.approx(trace_true / g2_true, rel=0.10)


def _tiny():
    cfg = get_config("tiny-17k").replace(compute_dtype="float32")
    return cfg, model.init_params(cfg, 0)


def _tokens(rng, rows: int) -> jnp.ndarray:
    """Sequences of a skewed unigram distribution (p ~ 1/rank): at initialisation their true
    gradient is far from zero (uniform tokens would leave |G|^2 ~ 0 there)."""
    p = 1.0 / np.arange(1, 513)
    return jnp.asarray(rng.choice(512, size=(rows, 17), p=p / p.sum()))


@pytest.mark.slow(reason="test_least_squares_noise_scale_within_10_percent")
def test_micro_batch_estimator_against_per_example_brute_force():
    """A tiny GPT, its per-example gradients computed one sequence at a time (jax.vmap of
    jax.grad). Exactly: the step's estimates are the two-batch formulas on the micro-batch
    means of those gradients (8 micro-batches of 2; one micro-batch: its halves of alternate
    rows). In expectation, over 16 batches: the micro-batch estimator (b = 2 of B = 16) and
    the per-example one (b = 1, Gray et al.'s B_small) estimate the same |G|^2 and tr(S)."""
    cfg, params = _tiny()
    zero = optax.set_to_zero()
    step = jax.jit(make_step(cfg, zero, gns=True))
    per = jax.jit(jax.vmap(lambda t: jax.grad(model.loss_fn)(params, t[None], cfg)))

    def per_example(tokens) -> np.ndarray:  # [B, P]
        return np.concatenate([np.asarray(x, np.float64).reshape(tokens.shape[0], -1)
                               for x in jax.tree.leaves(per(tokens))], 1)

    def formulas(micro: np.ndarray, g: np.ndarray):
        b = g.shape[0] // micro.shape[0]
        return noise.two_batch(np.mean(np.sum(micro ** 2, 1)), np.sum(g.mean(0) ** 2), b,
                               g.shape[0])

    rng = np.random.default_rng(1)
    ours, brute = [], []
    for i in range(16):
        tokens = _tokens(rng, 16)
        g = per_example(tokens)
        _, _, m = step(params, zero.init(params), tokens.reshape(8, 2, 17))
        ours.append([float(m["gns_g2"]), float(m["gns_trace"])])
        brute.append(formulas(g, g))  # b = 1: every sequence its own micro-batch
        if i == 0:
            assert ours[0] == pytest.approx(formulas(g.reshape(8, 2, -1).mean(1), g), rel=1e-4)
            _, _, m1 = step(params, zero.init(params), tokens[None])
            halves = np.stack([g[0::2], g[1::2]]).mean(1)
            assert [float(m1["gns_g2"]), float(m1["gns_trace"])] == pytest.approx(
                formulas(halves, g), rel=1e-4)
            assert float(m1["grad_norm"]) == pytest.approx(np.linalg.norm(g.mean(0)), rel=1e-5)
    (g2, trace), (g2_b, trace_b) = np.mean(ours, 0), np.mean(brute, 0)
    assert g2_b > 0 and trace == pytest.approx(trace_b, rel=0.05)
    assert g2 == pytest.approx(g2_b, rel=0.10)
    assert trace / g2 == pytest.approx(trace_b / g2_b, rel=0.10)


def _plain_step(cfg, optimizer):
    """The accumulation step as it was before the noise scale: what `gns=False` must lower to."""

    def step(params, opt_state, batch):
        grad_fn = jax.value_and_grad(model.loss_fn)

        def micro(acc, tokens):
            l, g = grad_fn(params, tokens, cfg)
            return jax.tree.map(jnp.add, acc, (l, g)), None

        zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
        (l, g), _ = jax.lax.scan(micro, zeros, batch)
        n = batch.shape[0]
        l, g = l / n, jax.tree.map(lambda x: x / n, g)
        updates, opt_state = optimizer.update(g, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": l, "grad_norm": optax.global_norm(g)}

    return step


@pytest.mark.slow(reason="test_gns_train's test_off_logs_nothing_of_it")
def test_gns_off_is_the_step_without_it():
    """Off, the step lowers to exactly the program without the feature: zero overhead."""
    cfg, params = _tiny()
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 512, (1, 8, 17)))
    opt = optax.adamw(1e-3)
    off = jax.jit(make_step(cfg, opt))
    _, _, m = off(params, opt.init(params), tokens)
    assert set(m) == {"loss", "grad_norm"}
    assert off.lower(params, opt.init(params), tokens).as_text() == jax.jit(
        _plain_step(cfg, opt)).lower(params, opt.init(params), tokens).as_text()
    p_on, _, m_on = jax.jit(make_step(cfg, opt, gns=True))(params, opt.init(params), tokens)
    p_off, _, _ = off(params, opt.init(params), tokens)
    assert float(m_on["loss"]) == pytest.approx(float(m["loss"]), abs=1e-5)
    diffs = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), p_on, p_off))
    assert max(diffs) < 1e-5  # the halves' mean gradient is the batch's


def test_one_odd_micro_batch_is_a_clear_error():
    cfg, params = _tiny()
    tokens = jnp.zeros((1, 3, 17), jnp.int32)
    with pytest.raises(TrainError, match="train.gns.*does not split in halves"):
        make_step(cfg, optax.set_to_zero(), gns=True)(params, (), tokens)


def test_smoother_replay_equals_the_live_smoothing():
    """A resumed run rebuilds the smoothing from its kept log: the same values from there on."""
    rng = np.random.default_rng(4)
    live, records = noise.Smoother(), []
    for step in range(5, 200, 5):
        est = {"gns_g2": float(rng.normal(1.0, 0.5)), "gns_trace": float(rng.normal(20, 5))}
        records.append({"step": step, "loss": 1.0, **live.update(step, est)})
    assert records[-1]["gns_b_simple"] == pytest.approx(
        records[-1]["gns_trace_ema"] / records[-1]["gns_g2_ema"])
    again = noise.Smoother.replay(records[:20])
    for r in records[20:]:
        got = again.update(r["step"], {k: r[k] for k in noise.STEP_KEYS})
        assert got == {k: v for k, v in r.items() if k not in ("step", "loss")}


def test_smoothing_weights_decay_per_step():
    s = noise.Smoother(beta=0.5)
    s.update(1, {"gns_g2": 1.0, "gns_trace": 4.0})
    rec = s.update(3, {"gns_g2": 2.0, "gns_trace": 4.0})  # two steps on: weight 0.25 vs 1
    assert rec["gns_g2_ema"] == pytest.approx((0.25 * 1 + 2) / 1.25)
    assert rec["gns_b_simple"] == pytest.approx(4.0 / rec["gns_g2_ema"])
    assert "gns_b_simple" not in noise.Smoother().update(1, {"gns_g2": -1.0, "gns_trace": 4.0})
