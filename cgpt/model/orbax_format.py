"""A run's checkpoints as Orbax keeps them, `checkpoints/<step>/` in its run directory
(`cgpt.rundir`), and their one reader, shared by training (`cgpt.train.checkpoint`, which
writes them) and `cgpt.load` (`cgpt.eval.lm`), so that eval never reaches into train.

Each checkpoint holds two items, `params` and `opt_state`, so a reader restores only the
parameters. Orbax writes a checkpoint into a temporary directory and renames it when complete:
a reader sees the previous checkpoints or a finished new one, never a half-written one.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Callable

import jax
import numpy as np
from etils import epath

from cgpt import rundir
from cgpt.config.model import ModelConfig
from cgpt.data.tokenizer import load_checkpoint_tokenizer, sha256 as tokenizer_sha256
from cgpt.errors import CheckpointsChanged, LoadError
from cgpt.model import orbax_quiet as quiet


def brief(e: BaseException, limit: int = 160) -> str:
    """An exception as one short line: TensorStore errors carry a ~60-line JSON spec."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    for cut in (" See full TensorStore details", " TensorStore(", " {"):
        text = text.split(cut, 1)[0]
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def nonfinite_tensor(params) -> str | None:
    """The name ('h/attn/w_qkv') of the first parameter holding NaN or inf, or None."""
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not np.isfinite(np.asarray(x, np.float32)).all():
            return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
    return None


def manager(run_dir: Path, keep: int | None = None, create: bool = True, on_written=None):
    """Orbax's manager; asynchronous when `on_written` (called before each commit) is given."""
    import orbax.checkpoint as ocp  # loads JAX: only when this runs

    opts = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=create, enable_async_checkpointing=on_written is not None,
        async_options=ocp.AsyncOptions(post_finalization_callback=on_written)
        if on_written is not None else None)
    return ocp.CheckpointManager((run_dir / rundir.CKPT_DIR).absolute(), options=opts)


def restore_newest(mngr, run_dir: Path, items: dict, fix: str,
                   set_aside: Callable[[int], Path] | None = None
                   ) -> tuple[int, dict, list[int]] | None:
    """(step, {item: tree}, bad steps) from the newest checkpoint that restores every item
    ({name: abstract tree}); None when there is none. Each newer one that fails is warned
    about and, with `set_aside` (moves a step's checkpoint away, returns where), moved.
    When every checkpoint fails: a LoadError naming `fix`, and nothing is changed (a run
    whose checkpoints are all unreadable is never silently restarted). CheckpointsChanged
    when one vanished while it was read (list them again)."""
    import orbax.checkpoint as ocp  # loads JAX: only when this runs

    bad = []
    for step in sorted(mngr.all_steps(), reverse=True):
        try:
            out = quiet.quiet_restore(lambda: mngr.restore(step, args=ocp.args.Composite(
                **{k: ocp.args.StandardRestore(v) for k, v in items.items()})))
        except Exception as e:  # orbax/tensorstore raise many types for bad files
            if not (run_dir / rundir.CKPT_DIR / str(step)).exists():
                raise CheckpointsChanged(step) from None
            bad.append((step, e))
            continue
        for b, e in bad:
            moved = "" if set_aside is None else f" (moved it to {set_aside(b)})"
            warnings.warn(f"{run_dir / rundir.CKPT_DIR / str(b)}: checkpoint is unreadable "
                          f"({brief(e)}); falling back to step {step}{moved}", stacklevel=3)
        return step, out, [b for b, _ in bad]
    if bad:
        why = _config_mismatch(run_dir, bad[0][0], items)
        if why is not None:
            raise LoadError(f"{run_dir / rundir.CONFIG_FILE}: does not describe the run's "
                            f"checkpoints ({why}): it was edited after they were written; "
                            "restore its model section")
        raise LoadError(
            f"{run_dir / rundir.CKPT_DIR}: none of the checkpoints {[b for b, _ in bad]} could "
            f"be restored (newest error: {brief(bad[0][1])}); nothing was changed. Fix the "
            f"cause, or {fix}")
    return None


def _config_mismatch(run_dir: Path, step: int, items: dict) -> str | None:
    """The first parameter whose shape in checkpoint `step` (its metadata) differs from the
    one the config gives, or None (also when the metadata cannot be read)."""
    import orbax.checkpoint as ocp  # loads JAX: only when this runs

    if "params" not in items:
        return None
    try:
        meta = ocp.StandardCheckpointHandler().metadata(
            epath.Path(run_dir / rundir.CKPT_DIR / str(step) / "params"))
    except Exception:  # damaged metadata: the restore's own error says more
        return None

    def shapes(tree) -> dict[str, tuple]:
        return {"/".join(str(getattr(k, "key", k)) for k in path): tuple(getattr(v, "shape", ()))
                for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}

    want, have = shapes(items["params"]), shapes(meta)
    for k, shape in want.items():
        if k not in have:
            return f"parameter {k} is not in checkpoint {step}"
        if have[k] != shape:
            return f"parameter {k}: shape {list(shape)} by config.yaml, {list(have[k])} in " \
                   f"checkpoint {step}"
    extra = sorted(set(have) - set(want))
    return f"checkpoint {step} holds parameter {extra[0]}, which config.yaml lacks" if extra \
        else None


def _check_run_tokenizer(run_dir: Path, tokenizer, cfg: ModelConfig) -> None:
    """The run's tokenizer.json is the one it trained with: no id past the model's vocabulary,
    and (a finished run) the hash summary.json recorded. A swapped file would load and then
    encode every prompt with a tokenizer the model never saw."""
    if tokenizer is None:
        return
    path = run_dir / rundir.TOKENIZER_FILE
    n = tokenizer.get_vocab_size(with_added_tokens=True)
    if n > cfg.vocab_size:
        raise LoadError(f"{path}: {n:,} tokens, more than the model's vocab_size "
                        f"{cfg.vocab_size:,}: not this run's tokenizer; restore the run's own")
    data = (rundir.try_json(run_dir / rundir.SUMMARY_FILE) or {}).get("data")
    want = data.get("tokenizer_sha256") if isinstance(data, dict) else None
    if isinstance(want, str) and tokenizer_sha256(tokenizer) != want:
        raise LoadError(f"{path}: not the tokenizer this run trained with (its sha256 differs "
                        f"from data.tokenizer_sha256 in {rundir.SUMMARY_FILE}); restore the "
                        "run's own tokenizer.json (its data store keeps a copy)")


def load_run(run_dir: Path, compute_dtype: str = "float32"):
    """(ModelConfig, params, tokenizer, step) from the newest good checkpoint of a cgpt run."""
    from cgpt.model.gpt import init_params  # loads JAX: only when this runs

    raw = rundir.read_config(run_dir)
    try:
        cfg = ModelConfig.from_dict(raw["model"]).replace(compute_dtype=compute_dtype)
    except (TypeError, ValueError) as e:
        raise LoadError(f"{run_dir / rundir.CONFIG_FILE}: key 'model': {e}") from e
    abstract = jax.eval_shape(lambda: init_params(cfg))
    ckpts = run_dir / rundir.CKPT_DIR
    if not ckpts.is_dir():
        raise LoadError(f"{ckpts} " + ("is a file, not the run's checkpoint directory"
                                       if ckpts.exists() else "is missing")
                        + "; restore it (or train the run with --resume)")
    tokenizer = load_checkpoint_tokenizer(run_dir)
    _check_run_tokenizer(run_dir, tokenizer, cfg)
    for _ in range(5):  # a run that is training may replace its checkpoints meanwhile
        try:
            mngr = manager(run_dir, create=False)  # reading only: never creates or deletes
            found = restore_newest(mngr, run_dir, {"params": abstract}, "load another run")
            break
        except (FileNotFoundError, CheckpointsChanged):
            time.sleep(0.2)
    else:
        raise LoadError(f"{ckpts}: its checkpoints kept changing while they were read (a run "
                        "training into it saves and deletes them); retry, or load a copy")
    if found is None:
        raise LoadError(f"{ckpts}: no complete checkpoint yet; train longer or "
                        "resume the run with --resume")
    step, out, _ = found
    bad = nonfinite_tensor(out["params"])
    if bad is not None:
        raise LoadError(f"{ckpts / str(step)}: tensor {bad!r} holds NaN or inf values (the "
                        "trainer never saves such a checkpoint, so the file is damaged); "
                        "move that step's directory away to load the previous checkpoint")
    return cfg, out["params"], tokenizer, step
