"""Hugging Face GPT-2 format <-> cgpt parameters.

The released Cerebras-GPT checkpoints are plain HF GPT-2 (`config.json` + safetensors or
PyTorch `.bin`, possibly sharded). HF's Conv1D stores kernels [in, out] exactly as cgpt
does, so mapping is renaming plus stacking the per-layer tensors on the `layers` axis.

Safety: `.bin` files are opened with `torch.load(weights_only=True)` (no pickled code runs),
torch is imported only for them, and no remote code is ever executed. Every failure raises
`LoadError` naming the file and the key: never a silent random init.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import safetensors.numpy
from safetensors import SafetensorError, safe_open

from cgpt.config.model import ModelConfig
from cgpt.config.values import typed
from cgpt.errors import LoadError  # noqa: F401 - re-exported (`from cgpt.model.hf import ...`)
from cgpt.model.export import write_export
from cgpt.rundir import TOKENIZER_FILE

# HF GPT-2 names follow from cgpt's parameter tree (`model.param_specs`) by one rule: the
# module path joined with dots, kernels and LayerNorm scales called `weight`, per-layer
# tensors under `h.<i>.` (HF stores one tensor per layer where cgpt stacks them).
_LEAF_NAMES = {"kernel": "weight", "scale": "weight", "bias": "bias"}


def _hf_name(path: tuple[str, ...]) -> str:
    *modules, leaf = path
    return ".".join([*modules, _LEAF_NAMES[leaf]]) if modules else f"{leaf}.weight"


def key_map(cfg: ModelConfig) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """({top-level HF name: param path},
    {per-layer HF name (after `h.<i>.`): path in params["h"]})."""
    from cgpt.model.gpt import param_specs  # loads JAX: only when this runs

    paths = list(param_specs(cfg))
    top = {_hf_name(p): p for p in paths if p[0] != "h"}
    layer = {_hf_name(p[1:]): p[1:] for p in paths if p[0] == "h"}
    return top, layer


_BUFFERS = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")  # causal-mask buffers, not params
_LAYER_RE = re.compile(r"^h\.(\d+)\.(.+)$")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json",
                "pytorch_model.bin", "pytorch_model.bin.index.json")


# ---- config --------------------------------------------------------------------------------
def config_from_hf(cfg: dict, path: Path, compute_dtype: str = "float32") -> ModelConfig:
    """Translate a GPT-2 `config.json`; anything cgpt would compute differently is an error."""

    def bad(key, why):
        raise LoadError(f"{path}: key {key!r} {why}")

    mt = cfg.get("model_type")
    if mt != "gpt2":
        bad("model_type", f"is {mt!r}; cgpt loads GPT-2 architecture checkpoints "
            "(Cerebras-GPT) only")
    for arch in cfg.get("architectures") or []:
        if arch not in ("GPT2LMHeadModel", "GPT2Model"):
            bad("architectures", f"lists {arch!r}; only GPT2LMHeadModel/GPT2Model are supported "
                "(custom μP classes need their own code, which cgpt never runs)")
    act = cfg.get("activation_function", "gelu_new")
    if act != "gelu":
        bad("activation_function", f"is {act!r}; cgpt implements the exact erf GELU ('gelu') "
            "that Cerebras-GPT uses")
    mup = cfg.get(MUP_KEY)
    for key, default, want in (("scale_attn_weights", True, True),
                               ("scale_attn_by_inverse_layer_idx", False, False),
                               ("tie_word_embeddings", True, mup is None)):
        if cfg.get(key, default) != want:
            bad(key, f"is {cfg.get(key, default)!r}; cgpt supports only {want!r}"
                + (f" (an untied head is read only from a cgpt μP export with '{MUP_KEY}')"
                   if key == "tie_word_embeddings" else ""))
    def value(key: str, kind: str = "int", default=None):  # 2.5 layers: refused, not truncated
        if key not in cfg and default is None:
            bad(key, "is missing")
        try:
            v = typed(key, cfg.get(key, default), (kind,), given=f"{path}: key {key!r}")
        except ValueError as e:
            raise LoadError(str(e)) from None
        if isinstance(cfg.get(key), str):  # JSON has numbers: "512" is a writer's mistake
            bad(key, f"is the string {cfg[key]!r}, not a number; write it without quotes "
                "(transformers would read it as text too)")
        return v
    try:
        return ModelConfig(
            name=str(cfg.get("_name_or_path") or path.name or "hf"), n_layer=value("n_layer"),
            d_model=value("n_embd"), n_head=value("n_head"),
            d_ffn=value("n_inner") if cfg.get("n_inner") is not None else None,
            vocab_size=value("vocab_size"), n_ctx=value("n_positions"),
            ln_eps=value("layer_norm_epsilon", "float", 1e-5), compute_dtype=compute_dtype,
            **_mup_fields(mup, path))
    except (TypeError, ValueError) as e:  # named by config.json's keys, not cgpt's fields
        msg = re.sub(r"\bmodel\.(\w+)", lambda m: _HF_KEYS.get(m.group(1), m.group(1)), str(e))
        raise LoadError(f"{path}: inconsistent GPT-2 config: {msg}") from e


_HF_KEYS = {"d_model": "n_embd", "d_ffn": "n_inner", "n_ctx": "n_positions",
            "d_head": "the head size", "ln_eps": "layer_norm_epsilon"}  # others: the same


def config_to_hf(cfg: ModelConfig, eot_id: int | None = None) -> dict:
    """GPT-2 config.json; bos/eos = the tokenizer's <|endoftext|> (GPT-2's 50256 by default)."""
    eot = eot_id if eot_id is not None else (50256 if cfg.vocab_size > 50256 else None)
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "n_layer": cfg.n_layer, "n_embd": cfg.d_model, "n_head": cfg.n_head,
        "n_inner": cfg.d_ffn, "n_positions": cfg.n_ctx, "vocab_size": cfg.vocab_size,
        "activation_function": "gelu", "layer_norm_epsilon": cfg.ln_eps,
        "tie_word_embeddings": True, "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.0, "attn_pdrop": 0.0, "embd_pdrop": 0.0,
        "bos_token_id": eot, "eos_token_id": eot, "torch_dtype": "float32",
        **({"tie_word_embeddings": False, MUP_KEY: {
            "mup_base_width": cfg.mup_base_width, "mup_embed_mult": cfg.mup_embed_mult,
            "mup_init_std": cfg.mup_init_std}} if cfg.mup else {}),
    }


# ---- tensor files --------------------------------------------------------------------------
def _read_safetensors(f: Path) -> dict[str, np.ndarray]:
    try:
        with safe_open(str(f), framework="numpy") as fh:
            return {k: fh.get_tensor(k) for k in fh.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise LoadError(f"{f}: not a readable safetensors file ({e}); re-download it") from e


def _read_bin(f: Path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError as e:
        raise LoadError(
            f"{f}: reading PyTorch .bin checkpoints needs torch (`pip install torch`); "
            "or convert the checkpoint to safetensors") from e
    try:
        sd = torch.load(str(f), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for corrupt or unsafe pickles
        text = str(e)
        code = re.search(r"GLOBAL (\S+)", text)
        if code or "Weights only load failed" in text:  # torch's several lines of advice
            what = f"it would call {code.group(1)}" if code else "it holds more than tensors"
            raise LoadError(f"{f}: refused: {what}, and cgpt reads .bin files weights-only, "
                            "running no code from them; if you trust the file, convert it to "
                            "safetensors") from e
        first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
        raise LoadError(f"{f}: not a loadable weights-only PyTorch file ({first})") from e
    if not isinstance(sd, dict):
        raise LoadError(f"{f}: expected a state dict of tensors, got {type(sd).__name__}")
    out = {}
    for k, t in sd.items():
        if not isinstance(t, torch.Tensor):
            raise LoadError(f"{f}: key {k!r} is a {type(t).__name__}, not a tensor")
        out[k] = t.detach().to(torch.float32).numpy() if t.is_floating_point() else t.numpy()
    return out


def _weight_files(d: Path) -> list[Path]:
    """The weight files of an HF directory, preferring safetensors, following an index."""
    for name in WEIGHT_FILES:
        f = d / name
        if not f.exists():
            continue
        _check_regular(f)
        if name.endswith(".index.json"):
            try:
                wmap = json.loads(f.read_bytes().decode())["weight_map"]
            except (ValueError, KeyError, TypeError, OSError) as e:
                raise LoadError(f"{f}: not a valid shard index (needs a 'weight_map'): {e}") from e
            if not isinstance(wmap, dict) or not wmap:
                raise LoadError(f"{f}: 'weight_map' must map tensor names to shard file names")
            shards = [_shard(f, d, s) for s in sorted(set(map(str, wmap.values())))]
            for k, s in wmap.items():
                if not isinstance(s, str):
                    raise LoadError(f"{f}: 'weight_map' entry {k!r} is {s!r}, not a file name")
            for s in shards:
                if not s.exists():
                    raise LoadError(f"{f}: lists shard {s.name!r}, which is missing from {d}")
                _check_regular(s)
            return shards
        return [f]
    raise LoadError(f"{d}: no weights found; expected one of {', '.join(WEIGHT_FILES)}")


def _check_regular(f: Path) -> None:
    """A FIFO or a device would block `open` forever or read without end (a link is fine)."""
    if not f.is_file():
        raise LoadError(f"{f} is not a regular file (a FIFO, device, socket or directory); a "
                        "checkpoint's config and weights are plain files: replace it")


def _shard(index: Path, d: Path, name: str) -> Path:
    """A shard named by an index: a relative path that stays inside the checkpoint directory
    (never '../other-model/...' or '/etc/passwd'). Checked on the name, not the resolved path:
    a hub cache's shards are symlinks into its blob store, which is fine."""
    norm = os.path.normpath(name)
    if os.path.isabs(name) or norm == ".." or norm.startswith(".." + os.sep) or norm == ".":
        raise LoadError(f"{index}: shard {name!r} lies outside {d}; an index may only name "
                        "files inside its own directory")
    return d / norm


def read_state_dict(files: list[Path]) -> tuple[dict[str, np.ndarray], dict[str, Path]]:
    """All tensors of an HF directory's weight files, and which file each key came from."""
    tensors, origin = {}, {}
    for f in files:
        part = _read_safetensors(f) if f.suffix == ".safetensors" else _read_bin(f)
        for k, v in part.items():
            tensors[k], origin[k] = v, f
    return tensors, origin


# ---- mapping -------------------------------------------------------------------------------
def params_from_state_dict(sd: dict[str, np.ndarray], origin: dict[str, Path],
                           cfg: ModelConfig, where: Path) -> dict:
    """Rename and stack HF tensors into cgpt's param tree, checking every name and shape."""
    from cgpt.model.gpt import param_specs  # loads JAX: only when this runs

    shapes = {path: shape for path, (shape, _) in param_specs(cfg).items()}
    top_keys, layer_keys = key_map(cfg)
    top, layers, lm_head = {}, [dict() for _ in range(cfg.n_layer)], None
    for key, arr in sd.items():
        name = key[len("transformer."):] if key.startswith("transformer.") else key
        src = origin.get(key, where)
        if _BUFFERS.match(name):
            continue
        if name == "lm_head.weight":
            lm_head = (arr, src)
        elif name in top_keys:
            top[top_keys[name]] = arr
        elif (m := _LAYER_RE.match(name)) and m.group(2) in layer_keys:
            i = int(m.group(1))
            if i >= cfg.n_layer:
                raise LoadError(f"{src}: key {key!r} is layer {i}, but config.json has "
                                f"n_layer={cfg.n_layer}")
            layers[i][layer_keys[m.group(2)]] = arr
        else:
            raise LoadError(f"{src}: unexpected key {key!r}; not part of a GPT-2 LM "
                            "(is this the right architecture?)")

    def check(path, arr, shape, key):
        if tuple(arr.shape) != tuple(shape):
            raise LoadError(f"{origin.get(key, where)}: key {key!r} has shape {tuple(arr.shape)}, "
                            f"expected {tuple(shape)} from config.json")
        if not np.issubdtype(arr.dtype, np.floating) and arr.dtype.name != "bfloat16":
            raise LoadError(f"{origin.get(key, where)}: key {key!r} has dtype {arr.dtype}, "
                            "expected a floating-point tensor")
        arr = np.asarray(arr, dtype=np.float32)
        if not np.isfinite(arr).all():
            raise LoadError(f"{origin.get(key, where)}: tensor {key!r} holds "
                            f"{int((~np.isfinite(arr)).sum())} NaN or inf value(s); the file is "
                            "damaged: re-download or re-export it")
        return arr

    def put(tree, path, val):
        for p in path[:-1]:
            tree = tree.setdefault(p, {})
        tree[path[-1]] = val

    params: dict = {}
    for name, path in top_keys.items():
        key = "transformer." + name
        if path not in top:
            raise LoadError(f"{where}: missing tensor {key!r} (also tried without 'transformer.')")
        put(params, path, check(path, top[path], shapes[path], key))
    for name, path in layer_keys.items():
        per_layer = []
        for i in range(cfg.n_layer):
            key = f"transformer.h.{i}.{name}"
            if path not in layers[i]:
                raise LoadError(f"{where}: missing tensor {key!r}")
            per_layer.append(check(path, layers[i][path], shapes[("h", *path)][1:], key))
        put(params, ("h",) + path, np.stack(per_layer))
    if lm_head is not None:
        arr, src = lm_head
        if arr.shape != params["wte"].shape or not np.array_equal(
                np.asarray(arr, np.float32), params["wte"]):
            raise LoadError(f"{src}: key 'lm_head.weight' differs from 'transformer.wte.weight'; "
                            "cgpt (like Cerebras-GPT) ties the LM head to the token embedding")
    return params


def state_dict_from_params(params: dict, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """cgpt params -> HF GPT-2 tensors (`transformer.*`; the tied lm_head is implied)."""
    sd = {}
    top_keys, layer_keys = key_map(cfg)
    for name, path in top_keys.items():
        t = params
        for p in path:
            t = t[p]
        sd["transformer." + name] = np.asarray(t, np.float32)
    for name, path in layer_keys.items():
        t = params["h"]
        for p in path:
            t = t[p]
        t = np.asarray(t, np.float32)
        for i in range(cfg.n_layer):
            sd[f"transformer.h.{i}.{name}"] = np.ascontiguousarray(t[i])
    return sd


# ---- μP export: fold the multipliers into the weights -------------------------------------
# Cerebras ModelZoo's μP -> SP converter: GPT-2 has no embedding or logit multiplier and
# scales attention by 1/sqrt(d_head), so an exported μP model carries the embedding scale in
# wte/wpe, the logit scale in an untied lm_head (= wte x 1/m_w), and the extra 1/sqrt(d_head)
# of μP's QK^T/d_head in the query weights. config.json keeps the μP fields under MUP_KEY so
# that `cgpt.load` can undo the folding and return the μP model it came from.
MUP_KEY = "cgpt_mup"


def _mup_fields(block, path: Path) -> dict:
    if block is None:
        return {}
    try:
        return {"mup": True, "mup_base_width": int(block["mup_base_width"]),
                "mup_embed_mult": float(block["mup_embed_mult"]),
                "mup_init_std": float(block["mup_init_std"])}
    except (KeyError, TypeError, ValueError) as e:
        raise LoadError(f"{path}: key {MUP_KEY!r} must hold mup_base_width, mup_embed_mult and "
                        f"mup_init_std ({e!r})") from e


def _query_columns(cfg: ModelConfig) -> slice:
    return slice(0, cfg.n_head * cfg.d_head)  # c_attn columns are [Q | K | V]


def fold_mup(sd: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """A μP model's HF tensors (from `state_dict_from_params`) -> plain GPT-2 tensors with the
    same logits: embeddings x embed_mult, untied lm_head = wte x 1/m_w, Q / sqrt(d_head)."""
    sd = dict(sd)
    wte = sd["transformer.wte.weight"]
    sd["lm_head.weight"] = (wte * np.float32(cfg.logits_mult)).astype(np.float32)
    for k in ("transformer.wte.weight", "transformer.wpe.weight"):
        sd[k] = (sd[k] * np.float32(cfg.embed_mult)).astype(np.float32)
    q, extra = _query_columns(cfg), np.float32(1 / math.sqrt(cfg.d_head))
    for i in range(cfg.n_layer):
        for k in (f"transformer.h.{i}.attn.c_attn.weight", f"transformer.h.{i}.attn.c_attn.bias"):
            t = sd[k].copy()
            t[..., q] *= extra
            sd[k] = t
    return sd


def unfold_mup(sd: dict[str, np.ndarray], origin: dict[str, Path], cfg: ModelConfig,
               where: Path) -> dict[str, np.ndarray]:
    """Inverse of `fold_mup`, checking that lm_head is the scaled embedding (cgpt ties it)."""
    sd = {(k if k.startswith(("transformer.", "lm_head")) else "transformer." + k): v
          for k, v in sd.items()}
    origin = {(k if k.startswith(("transformer.", "lm_head")) else "transformer." + k): v
              for k, v in origin.items()}
    head = sd.pop("lm_head.weight", None)
    if head is None:
        raise LoadError(f"{where}: missing tensor 'lm_head.weight', which a μP export "
                        f"('{MUP_KEY}' in config.json) carries untied")
    out = dict(sd)
    for k in ("transformer.wte.weight", "transformer.wpe.weight"):
        if k not in out:
            raise LoadError(f"{where}: missing tensor {k!r}")
        out[k] = np.asarray(out[k], np.float32) / np.float32(cfg.embed_mult)
    wte = out["transformer.wte.weight"]
    if head.shape != wte.shape or not np.allclose(
            np.asarray(head, np.float32), wte * np.float32(cfg.logits_mult), rtol=1e-5,
            atol=1e-7 * float(np.abs(head).max(initial=0))):
        raise LoadError(f"{origin.get('lm_head.weight', where)}: key 'lm_head.weight' is not "
                        f"the μP head (token embedding / embed_mult x 1/m_w = "
                        f"{cfg.logits_mult:g}); cgpt ties the LM head to the embedding, so a "
                        "μP export whose head was trained separately cannot be read")
    q, back = _query_columns(cfg), np.float32(math.sqrt(cfg.d_head))
    for i in range(cfg.n_layer):
        for k in (f"transformer.h.{i}.attn.c_attn.weight", f"transformer.h.{i}.attn.c_attn.bias"):
            if k in out:
                t = np.array(out[k], np.float32)
                t[..., q] *= back
                out[k] = t
    return out


# ---- directories ---------------------------------------------------------------------------
def load_hf_dir(d: Path, compute_dtype: str = "float32") -> tuple[ModelConfig, dict]:
    cfg_file = d / "config.json"
    if not cfg_file.exists():
        raise LoadError(f"{d}: not a checkpoint (no config.json); expected a Hugging Face GPT-2 "
                        "directory, a hub id such as 'cerebras/Cerebras-GPT-111M', or a cgpt run")
    _check_regular(cfg_file)  # not a directory, nor a FIFO that would block the read
    try:
        raw = json.loads(cfg_file.read_bytes().decode())
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise LoadError(f"{cfg_file}: not valid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise LoadError(f"{cfg_file}: expected a JSON object (a GPT-2 config), got "
                        f"{type(raw).__name__}")
    cfg = config_from_hf(raw, cfg_file, compute_dtype)
    sd, origin = read_state_dict(_weight_files(d))  # bounded by the files on disk
    held, n = sum(a.size for a in sd.values()), cfg.num_params()
    if n > 2 * held:  # before config.json sizes anything; a few missing tensors: named below
        raise LoadError(f"{cfg_file}: describes {n:,} parameters (n_layer={cfg.n_layer}, n_embd="
                        f"{cfg.d_model}, vocab_size={cfg.vocab_size}), but the weight files "
                        f"hold {held:,} values: config.json does not belong to these weights")
    if cfg.mup:
        sd = unfold_mup(sd, origin, cfg, d)
    return cfg, params_from_state_dict(sd, origin, cfg, d)


def save_hf_dir(params: dict, cfg: ModelConfig, out: Path, tokenizer=None) -> Path:
    """Write an HF GPT-2 directory, replacing only an earlier export (`model.export`); a μP
    model is written with its multipliers folded into the weights (`fold_mup`)."""
    def write(tmp: Path) -> None:
        eot = tokenizer.token_to_id("<|endoftext|>") if tokenizer is not None else None
        (tmp / "config.json").write_text(json.dumps(config_to_hf(cfg, eot), indent=2))
        sd = state_dict_from_params(params, cfg)
        safetensors.numpy.save_file(fold_mup(sd, cfg) if cfg.mup else sd,
                                    str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save(str(tmp / TOKENIZER_FILE))

    return write_export(out, write)


def resolve_hub_id(repo_id: str) -> Path:
    """A hub id -> a local snapshot through the HF cache (downloads only when online)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as e:
        raise LoadError(f"{repo_id!r}: resolving hub ids needs huggingface_hub "
                        "(`pip install huggingface_hub`), or pass a local directory") from e
    patterns = ["config.json", "*.safetensors", "*.safetensors.index.json", "*.bin",
                "*.bin.index.json", TOKENIZER_FILE, "vocab.json", "merges.txt"]
    try:
        # HF_HUB_CACHE is read at call time so a caller (or test) can point at another cache.
        return Path(snapshot_download(repo_id, allow_patterns=patterns,
                                      cache_dir=os.environ.get("HF_HUB_CACHE")))
    except LocalEntryNotFoundError as e:
        raise LoadError(
            f"{repo_id!r} is not in the local Hugging Face cache and the hub is unreachable "
            f"(offline). Download it on a machine with internet (`hf download {repo_id}`, then "
            "copy ~/.cache/huggingface) or pass the path of a local checkpoint directory") from e
    except Exception as e:  # repository not found, gated, network errors
        raise LoadError(f"{repo_id!r}: could not fetch from the Hugging Face hub: {e}") from e
