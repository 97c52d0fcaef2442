"""`cgpt.load` and the `LM` it returns: evaluation and KV-cache generation.

`load` accepts a Hugging Face GPT-2 directory (the released Cerebras-GPT checkpoints), a hub
id resolved through the local HF cache, or a cgpt training run directory. The LM computes
exactly what `transformers.GPT2LMHeadModel` computes (tested to 1e-4 in f32).
"""
from __future__ import annotations

import functools
import math
import os
import re
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cgpt import rundir
from cgpt.model import decode, hf, orbax_format
from cgpt.config.model import ModelConfig
from cgpt.errors import LoadError
from cgpt.model.gpt import cross_entropy, forward
from cgpt.data.tokenizer import load_checkpoint_tokenizer as load_tokenizer  # re-exported

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _next_pow2(n: int) -> int:
    return 1 << max(6, (n - 1).bit_length())


@functools.partial(jax.jit, static_argnames=("cfg",))
def _logits(params, ids, cfg):
    return forward(params, ids, cfg)[0]


@functools.partial(jax.jit, static_argnames=("cfg",))
def _loss(params, ids, cfg):
    logits = forward(params, ids[:, :-1], cfg)[0]
    return cross_entropy(logits, ids[:, 1:])


def _filter_logits(logits, top_k, top_p):
    """Mask all but the top-k tokens and the smallest nucleus with mass >= top_p."""
    neg = jnp.finfo(logits.dtype).min
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, neg, logits)
    if top_p is not None:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep = mass_before < top_p  # always keeps the most likely token
        cutoff = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, neg, logits)
    return logits


@functools.partial(jax.jit, static_argnames=("cfg", "max_new", "cache_len", "greedy", "top_k",
                                             "top_p", "ragged"))
def _generate(params, prompt, lengths, key, temperature, *, cfg, max_new, cache_len, greedy,
              top_k, top_p, ragged=False):
    """Prefill the prompt into a KV cache, then decode `max_new` tokens in one XLA loop.

    ragged: the rows are right-padded prompts of `lengths` [B]; each row continues from its
    own last token at its own positions (one compiled shape for many prompt lengths)."""
    B, P = prompt.shape

    def pick(logits, key):
        if greedy:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        logits = _filter_logits(logits / temperature, top_k, top_p)
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)

    cache = decode.init_cache(cfg, B, cache_len)
    logits, cache = decode.forward(params, prompt, cfg, cache, 0)
    if ragged:
        logits = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)
    keys = jax.random.split(key, max_new)
    out = jnp.zeros((B, max_new), jnp.int32).at[:, 0].set(pick(logits[:, -1], keys[0]))

    def step(i, carry):
        out, cache = carry
        prev = jax.lax.dynamic_slice_in_dim(out, i - 1, 1, axis=1)
        if ragged:
            logits, cache = decode.forward_rows(params, prev, cfg, cache, lengths + i - 1)
        else:
            logits, cache = decode.forward(params, prev, cfg, cache, P + i - 1)
        return out.at[:, i].set(pick(logits[:, -1], keys[i])), cache

    out, _ = jax.lax.fori_loop(1, max_new, step, (out, cache))
    return out


def _utf8(text: str, what: str) -> str:
    """`text` if it is UTF-8 text; a byte that was not (argv decoded with surrogateescape) or a
    lone surrogate is one error naming where, not the tokenizer's TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what}: character {e.start} ({text[e.start]!a}) is not UTF-8 text (a "
                         "byte the terminal or file did not decode as UTF-8, or a lone "
                         "surrogate); give it as UTF-8") from None
    return text


class LM:
    """A loaded language model: `.config`, `.tokenizer`, `.logits`, `.loss`, `.generate`;
    `.step` is the training step of a cgpt run's checkpoint (None for other sources)."""

    def __init__(self, config: ModelConfig, params: dict, tokenizer=None,
                 step: int | None = None):
        self.config = config
        self.params = params
        self.tokenizer = tokenizer
        self.step = step

    def __repr__(self) -> str:
        c = self.config
        return (f"LM({c.name!r}, {c.num_params():,} params, {c.n_layer}x{c.d_model}, "
                f"compute={c.compute_dtype}, tokenizer={'yes' if self.tokenizer else 'no'})")

    @property
    def params(self) -> dict:
        return self._params

    @params.setter
    def params(self, params: dict) -> None:
        self._params = jax.tree.map(jnp.asarray, params)
        self._decode = None

    def _decode_params(self) -> dict:
        """The weights in the layout decoding streams fastest, made on the first `generate`
        (one extra copy of the weights, kept until `params` is replaced)."""
        if self._decode is None:
            self._decode = decode.decode_layout(self._params)
        return self._decode

    # ---- inputs ----------------------------------------------------------------------
    def _ids(self, ids, what: str = "ids", max_len: int | None = None) -> jax.Array:
        if isinstance(ids, str):
            ids = self.encode(_utf8(ids, what))
        arr = np.asarray(ids)
        if arr.ndim == 1:
            arr = arr[None]
        if arr.size == 0:
            raise ValueError(f"{what}: empty (no tokens); give at least one token, e.g. "
                             "'<|endoftext|>' to sample from the start of a document")
        if arr.ndim != 2 or arr.shape[1] == 0 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{what}: expected integer token ids shaped [B, T] or [T], "
                             f"got dtype {arr.dtype} shape {arr.shape}")
        if arr.min() < 0 or arr.max() >= self.config.vocab_size:
            raise ValueError(f"{what}: token ids must lie in [0, {self.config.vocab_size}), "
                             f"got range [{arr.min()}, {arr.max()}]")
        limit = max_len or self.config.n_ctx
        if arr.shape[1] > limit:
            raise ValueError(f"{what}: length {arr.shape[1]} exceeds {limit} (context "
                             f"n_ctx={self.config.n_ctx})")
        return jnp.asarray(arr, jnp.int32)

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer files (tokenizer.json or "
                             "vocab.json+merges.txt); pass token ids instead of text")
        return self.tokenizer.encode(_utf8(text, "text")).ids

    def decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer; cannot decode ids to text")
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    # ---- evaluation ------------------------------------------------------------------
    def logits(self, ids) -> np.ndarray:
        """float32 logits [B, T, V]."""
        return np.asarray(_logits(self.params, self._ids(ids), self.config))

    def loss(self, ids) -> float:
        """Mean next-token cross-entropy in nats over ids [B, T] (2 <= T <= n_ctx + 1: the
        model reads ids[:, :-1] and predicts ids[:, 1:])."""
        x = self._ids(ids, max_len=self.config.n_ctx + 1)
        if x.shape[1] < 2:
            raise ValueError("loss: need at least 2 tokens per row to predict a next token")
        return float(_loss(self.params, x, self.config))

    def _check_sampling(self, max_new_tokens, temperature, top_k, top_p) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got "
                             f"{temperature}")
        if top_k is not None and not 1 <= top_k <= self.config.vocab_size:
            raise ValueError(f"top_k must be in [1, {self.config.vocab_size}], got {top_k}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")

    def _run_generate(self, ids, lengths, max_new_tokens, temperature, top_k, top_p, seed,
                      longest: int) -> np.ndarray:
        total = longest + max_new_tokens
        if total > self.config.n_ctx:
            raise ValueError(f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) "
                             f"exceeds the context n_ctx={self.config.n_ctx}")
        cache_len = min(self.config.n_ctx, _next_pow2(max(total, ids.shape[1])))
        return np.asarray(_generate(
            self._decode_params(), ids, lengths, jax.random.key(seed),
            jnp.float32(max(temperature, 1e-6)), cfg=self.config, max_new=max_new_tokens,
            cache_len=cache_len, greedy=temperature == 0.0, top_k=top_k, top_p=top_p,
            ragged=lengths is not None))

    def generate(self, prompt, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int = 0):
        """Continue a prompt with a KV cache; greedy at temperature 0.

        Token ids in -> int array [B, P + max_new_tokens] out (prompt included, as in HF).
        Text in -> text out (prompt + continuation).
        """
        as_text = isinstance(prompt, str)
        ids = self._ids(prompt, "prompt")
        self._check_sampling(max_new_tokens, temperature, top_k, top_p)
        new = self._run_generate(ids, None, max_new_tokens, temperature, top_k, top_p, seed,
                                 ids.shape[1])
        out = np.concatenate([np.asarray(ids), new], axis=1)
        return self.decode(out[0]) if as_text else out

    def generate_ragged(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                        temperature: float = 0.0, top_k: int | None = None,
                        top_p: float | None = None, seed: int = 0,
                        pad_to: int | None = None) -> np.ndarray:
        """Continue prompts of different lengths as one batch -> new tokens [B, max_new_tokens].

        The prompts are right-padded to `pad_to` (default: the next power of two >= 16 of the
        longest, at most n_ctx), so all lengths within a bucket share one compiled program;
        greedy results equal `generate` on each prompt alone.
        """
        if not prompts:
            raise ValueError("generate_ragged: no prompts")
        lengths = [len(p) for p in prompts]
        longest = max(lengths)
        P = pad_to or min(self.config.n_ctx, 1 << max(4, (longest - 1).bit_length()))
        if min(lengths) < 1 or not longest <= P <= self.config.n_ctx:
            raise ValueError(f"generate_ragged: prompt lengths {min(lengths)}..{longest} with "
                             f"pad_to={P}; every prompt needs 1..pad_to tokens and pad_to at "
                             f"most n_ctx={self.config.n_ctx}")
        padded = np.zeros((len(prompts), P), np.int64)
        for r, p in enumerate(prompts):
            padded[r, :len(p)] = p
        ids = self._ids(padded, "prompts")
        self._check_sampling(max_new_tokens, temperature, top_k, top_p)
        return self._run_generate(ids, jnp.asarray(lengths, jnp.int32), max_new_tokens,
                                  temperature, top_k, top_p, seed, longest)


def load(source: str | Path, dtype: str = "float32") -> LM:
    """Load a Hugging Face GPT-2 directory, a hub id, or a cgpt run directory.

    `dtype` is the compute dtype ("float32" or "bfloat16"); parameters stay float32.
    """
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype={dtype!r}; use 'float32' or 'bfloat16'")
    if not isinstance(source, (str, os.PathLike)) or not str(source).strip():
        raise LoadError(f"source {source!r}: give a cgpt run directory, a Hugging Face GPT-2 "
                        "directory or a hub id such as 'cerebras/Cerebras-GPT-111M'")
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise LoadError(f"{path}: not a checkpoint directory; pass the directory holding "
                            "config.json and the weights")
        if rundir.is_run(path):
            cfg, params, tok, step = orbax_format.load_run(path, dtype)
            return LM(cfg, params, tok, step)
        cfg, params = hf.load_hf_dir(path, dtype)
        return LM(cfg, params, load_tokenizer(path))
    if _HUB_ID.match(str(source)) and not Path(str(source).split("/")[0]).is_dir():
        local = hf.resolve_hub_id(str(source))
        cfg, params = hf.load_hf_dir(local, dtype)
        return LM(cfg, params, load_tokenizer(local))
    raise LoadError(f"{source}: no such directory, and not a hub id like "
                    "'cerebras/Cerebras-GPT-111M'")


def save_hf(lm: LM, out_dir: str | Path) -> Path:
    """Write `lm` as a Hugging Face GPT-2 directory (`GPT2LMHeadModel.from_pretrained` loads it)."""
    params = jax.tree.map(np.asarray, lm.params)
    return hf.save_hf_dir(params, lm.config.replace(compute_dtype="float32"), Path(out_dir),
                          lm.tokenizer)
