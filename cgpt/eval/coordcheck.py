"""`python -m cgpt coord-check`: the μP coordinate check (Yang et al. 2021, "Tensor Programs V").

μP promises that every activation's typical coordinate size is independent of the width,
at initialization and after training at the proxy's learning rate. The check trains the
same model at several widths for a few steps at a large learning rate and records the mean
|x| of the embeddings, each block's output, each block's attention logits (QK^T x scale)
and the output logits. Plotted against the width on log-log axes, μP gives flat (or
shrinking) curves; the standard parametrization (SP) gives curves that grow with the width,
and so does a μP with one multiplier missing. The verdict is the slope of log mean|x|
against log width after the first update: a slope above `max_slope` anywhere is a blow-up.

Everything here reuses the real model functions (`cgpt.model.gpt`) and the real optimizer
(`cgpt.train.optim.make_optimizer`, whose μP rule gives the decoder kernels LR x 1/m_w).
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from cgpt.config.model import ModelConfig, get_config
from cgpt.config.recipe import Recipe
from cgpt.train.notice import BarClock

# jax, the model and the optimizer are imported inside the functions that use them, so that
# registering this subcommand costs the `cgpt` CLI nothing.

DEFAULT_MAX_SLOPE = 0.25  # |x| may grow at most ~ width^0.25; SP's blow-ups are ~ width^0.5..1


@dataclass(frozen=True)
class CoordCheck:
    """Mean |x| per activation, step and width for one parametrization, and its verdict."""

    name: str
    widths: tuple[int, ...]
    steps: int
    # stats[activation] = array [steps + 1, len(widths)]: row t is after t optimizer updates
    stats: dict[str, np.ndarray] = field(repr=False)
    max_slope: float = DEFAULT_MAX_SLOPE

    def slopes(self) -> dict[str, np.ndarray]:
        """Per activation, the least-squares slope of log mean|x| on log width at each step."""
        lw = np.log(np.asarray(self.widths, float))
        lw = lw - lw.mean()
        return {k: (np.log(v) - np.log(v).mean(1, keepdims=True)) @ lw / (lw @ lw)
                for k, v in self.stats.items()}

    def worst(self) -> tuple[str, int, float]:
        """(activation, step, slope) of the steepest growth after the first update."""
        best = ("", 0, -math.inf)
        for k, s in self.slopes().items():
            t = int(np.argmax(s[1:])) + 1
            if s[t] > best[2]:
                best = (k, t, float(s[t]))
        return best

    @property
    def passed(self) -> bool:
        return self.worst()[2] <= self.max_slope

    def verdict(self) -> str:
        act, t, s = self.worst()
        word = "PASS" if self.passed else "FAIL"
        return (f"{self.name}: {word}: steepest growth {act} at step {t}: mean|x| ~ width^{s:.2f} "
                f"(limit {self.max_slope}) over widths {list(self.widths)}")


def activation_stats(params: dict, ids, cfg: ModelConfig):
    """(logits, {activation: mean |x|}) from one forward pass of the real model functions."""
    import jax  # loads JAX: only when this runs
    import jax.numpy as jnp  # loads JAX: only when this runs

    from cgpt.model import gpt as M  # loads JAX: only when this runs

    stats = {}
    x = M.embed(params, ids, cfg)
    stats["embedding"] = jnp.abs(x).mean()
    B, T, _ = x.shape
    mask = jnp.tril(jnp.ones((T, T), bool))
    for i in range(cfg.n_layer):
        p = jax.tree.map(lambda a, i=i: a[i], params["h"])
        q, k, _ = M.qkv_heads(p, x, cfg)  # [B, T, H, Dh]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * cfg.attn_scale
        stats[f"attn_logits.{i}"] = jnp.abs(scores).sum(where=mask) / (B * cfg.n_head * mask.sum())
        x = M.block(p, x, cfg)
        stats[f"block.{i}"] = jnp.abs(x).mean()
    logits = M.head(params, x, cfg)
    stats["output_logits"] = jnp.abs(logits).mean()
    return logits, stats


def run_width(cfg: ModelConfig, tokens: np.ndarray, lr: float, steps: int, seed: int) -> dict:
    """Train `cfg` for `steps` Adam updates at a constant `lr` (the real recipe otherwise) on
    `tokens` [B, T+1]; mean |x| of every activation after 0, 1, ..., `steps` updates."""
    import jax  # loads JAX: only when this runs
    import jax.numpy as jnp  # loads JAX: only when this runs
    import optax  # loads JAX: only when this runs

    from cgpt.model import gpt as M  # loads JAX: only when this runs
    from cgpt.train.optim import make_optimizer  # loads JAX: only when this runs

    recipe = Recipe(peak_lr=lr, decay="linear", adam_eps=1e-8, batch_size=tokens.shape[0],
                    warmup_steps=1, total_steps=steps + 2, end_lr_fraction=1.0)
    opt = make_optimizer(recipe, cfg)
    params = M.init_params(cfg, seed)
    state = opt.init(params)
    # The schedule warms up from 0 over one step; spend that step on nothing.
    state = opt.update(jax.tree.map(jnp.zeros_like, params), state, params)[1]
    ids = jnp.asarray(tokens)

    def loss(p):
        logits, st = activation_stats(p, ids[:, :-1], cfg)
        return M.cross_entropy(logits, ids[:, 1:]), st

    @jax.jit
    def step(p, s):
        (_, st), g = jax.value_and_grad(loss, has_aux=True)(p)
        upd, s = opt.update(g, s, p)
        return optax.apply_updates(p, upd), s, st

    rows = []
    for _ in range(steps + 1):  # the last update is not measured: one compiled function only
        params, state, st = step(params, state)
        rows.append(st)
    return {k: np.array([float(r[k]) for r in rows]) for k in rows[0]}


def coord_check(configs: dict[int, ModelConfig], name: str, *, lr: float = 1e-2, steps: int = 4,
                batch: int = 8, seq_len: int = 32, seeds: int = 1,
                max_slope: float = DEFAULT_MAX_SLOPE, progress: bool = False) -> CoordCheck:
    """Run the check on {width: config}; mean |x| is averaged over `seeds` initializations;
    `progress`: a bar over the widths and seeds (each a compile and a few steps).

    The data is a fixed batch of random token ids (the same for every width), so the check
    needs no corpus and measures only the parametrization.
    """
    widths = tuple(sorted(configs))
    if len(widths) < 3:
        raise ValueError(f"coord-check needs at least 3 widths to fit a slope, got {list(widths)}")
    vocab = {c.vocab_size for c in configs.values()}
    if len(vocab) != 1:
        raise ValueError(f"coord-check widths must share one vocabulary, got {sorted(vocab)}")
    tokens = np.random.default_rng(0).integers(0, vocab.pop(), (batch, seq_len + 1))
    per_width = []
    bar = tqdm(total=len(widths) * seeds, desc=f"coord check {name}", unit="model",
               disable=not progress, file=sys.stderr, dynamic_ncols=True)
    with BarClock(bar):  # a width's first model compiles for ~10 s: the clock moves meanwhile
        for w in widths:
            runs = []
            for s in range(seeds):
                bar.set_postfix_str(f"width {w}, seed {s}")
                runs.append(run_width(configs[w], tokens, lr, steps, s))
                bar.update(1)
            per_width.append({k: np.mean([r[k] for r in runs], axis=0) for k in runs[0]})
    bar.close()
    order = sorted(per_width[0], key=_display_order)
    stats = {k: np.stack([pw[k] for pw in per_width], axis=1) for k in order}
    return CoordCheck(name, widths, steps, stats, max_slope)


def _display_order(name: str) -> tuple:
    """embedding, then per layer attention logits and block output, then output logits."""
    if name == "embedding":
        return (0, 0, "")
    if name == "output_logits":
        return (2, 0, "")
    kind, layer = name.rsplit(".", 1)
    return (1, int(layer), kind)


def family(preset: str, widths: list[int], mup: bool, heads: int | None = None) -> dict:
    """{width: config}: `preset`'s shape at each width (depth and head count kept), μP or SP.

    μP's base width stays the preset's (`mup_base_width`), so m_w = width / base.
    """
    base = get_config(preset)
    out = {}
    for w in widths:
        n_head = heads or base.n_head
        if w % n_head:
            raise ValueError(f"--widths: {w} is not a multiple of the {n_head} heads ("
                             + (f"--heads {heads}" if heads else f"{preset}'s; set --heads")
                             + ")")
        out[w] = base.replace(name=f"{base.name}-w{w}", d_model=w, n_head=n_head, mup=mup)
    return out


def plot(checks: list[CoordCheck], path: str | Path) -> Path:
    """One row per parametrization, one panel per activation: mean |x| against width, one
    line per training step (the classic coordinate-check figure)."""
    import matplotlib  # loads matplotlib: only when this runs
    import matplotlib.ticker  # loads matplotlib: only when this runs

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # loads matplotlib: only when this runs

    keys = list(checks[0].stats)
    fig, axes = plt.subplots(len(checks), len(keys), figsize=(2.4 * len(keys), 2.4 * len(checks)),
                             squeeze=False)
    colors = plt.cm.viridis(np.linspace(0, 0.9, checks[0].steps + 1))
    for r, c in enumerate(checks):
        for j, k in enumerate(keys):
            ax = axes[r, j]
            for t, row in enumerate(c.stats[k]):
                ax.loglog(c.widths, row, "o-", ms=3, color=colors[t], label=f"step {t}")
            ax.set_xticks(c.widths, [str(w) for w in c.widths])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.set_title(f"{c.name}: {k}", fontsize=8)
            ax.tick_params(labelsize=7)
            if r == len(checks) - 1:
                ax.set_xlabel("width", fontsize=8)
        axes[r, 0].set_ylabel("mean |x|  " + ("PASS" if c.passed else "FAIL"), fontsize=8)
    axes[0, -1].legend(fontsize=6)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- CLI -------------------------------------------------------------------------------------
def register(subparsers) -> argparse.ArgumentParser:
    """Add `coord-check` to the `cgpt` CLI's subparsers (handler in `args.func`)."""
    p = subparsers.add_parser("coord-check", help="μP coordinate check: activation sizes "
                              "against width, μP vs SP, with a pass/fail verdict",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", "--preset", dest="preset", default="tiny-45k",
                   help="preset whose shape is widened (depth, heads, vocabulary, μP base "
                   "width), as train's and plan's --model; --preset is the older name")
    p.add_argument("--widths", default="32,64,128,256", help="comma-separated widths (>= 3)")
    p.add_argument("--heads", type=int, help="heads at every width (default: the preset's)")
    p.add_argument("--lr", type=float, default=1e-2, help="constant peak LR (large on purpose)")
    p.add_argument("--steps", type=int, default=4, help="optimizer updates to record")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=32, help="tokens per sequence")
    p.add_argument("--seeds", type=int, default=2, help="initializations averaged per width")
    p.add_argument("--max-slope", type=float, default=DEFAULT_MAX_SLOPE,
                   help="largest allowed growth exponent of mean|x| in width")
    p.add_argument("--out", default="runs/coord_check.png",
                   help="figure to write (its folder is created), beside the runs train writes")
    p.set_defaults(func=cmd_coord_check)
    return p


def _check_args(args) -> list[int]:
    """The widths, after every flag is checked: a typo is one line naming the flag before
    minutes of training, not a failure inside them (or after them, writing the figure)."""
    try:
        widths = [int(w) for w in args.widths.split(",")]
    except ValueError:
        raise ValueError(f"--widths {args.widths!r}: use comma-separated integers, e.g. "
                         "32,64,128,256") from None
    if len(set(widths)) < 3 or min(widths) < 1:
        raise ValueError(f"--widths {args.widths}: need at least 3 distinct widths >= 1 to fit "
                         "a slope, e.g. 32,64,128,256")
    for flag, v in (("--steps", args.steps), ("--batch", args.batch), ("--seq-len", args.seq_len),
                    ("--seeds", args.seeds), ("--heads", 1 if args.heads is None else args.heads)):
        if v < 1:
            raise ValueError(f"{flag} {v}: must be >= 1")
    for flag, v in (("--lr", args.lr), ("--max-slope", args.max_slope)):
        if not math.isfinite(v) or (flag == "--lr" and v <= 0):
            raise ValueError(f"{flag} {v}: must be a finite number" + (" > 0" if flag == "--lr"
                                                                       else ""))
    if args.seq_len > get_config(args.preset).n_ctx:
        raise ValueError(f"--seq-len {args.seq_len} exceeds {args.preset}'s context")
    _check_figure_path(Path(args.out))
    return widths


def _check_figure_path(out: Path) -> None:
    import matplotlib  # loads matplotlib: only when this runs

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # loads matplotlib: only when this runs

    kinds = plt.gcf().canvas.get_supported_filetypes()
    plt.close("all")
    if out.is_dir():
        raise ValueError(f"--out {out} is a directory; name the figure file, e.g. "
                         f"{out / 'coord_check.png'}")
    if out.suffix[1:].lower() not in kinds:
        raise ValueError(f"--out {out}: a figure file ending in one of "
                         f"{', '.join('.' + k for k in sorted(kinds))}, e.g. coord_check.png")
    parent = next((p for p in out.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"--out {out}: {parent} is a file, so the figure cannot be written there")


def cmd_coord_check(args) -> int:
    """Exit status 0 when μP passes and SP fails (the expected picture), 1 otherwise."""
    widths = _check_args(args)
    checks = []
    for name, mup in (("μP", True), ("SP", False)):
        cfgs = family(args.preset, widths, mup, args.heads)
        checks.append(coord_check(cfgs, name, lr=args.lr, steps=args.steps, batch=args.batch,
                                  seq_len=args.seq_len, seeds=args.seeds,
                                  max_slope=args.max_slope, progress=True))
        c = checks[-1]
        for k, s in c.slopes().items():
            print(f"  {c.name:3s} {k:16s} slope per step: " + " ".join(f"{v:+.2f}" for v in s))
        print(c.verdict())
    print(f"figure: {plot(checks, args.out)}")
    return 0 if checks[0].passed and not checks[1].passed else 1
