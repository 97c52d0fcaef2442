"""Run-directory layout and Orbax checkpoints.

A run directory holds `config.yaml`, `tokenizer.json`, `metrics.jsonl`, `events/`
(TensorBoard), `checkpoints/<step>/` and, once finished, `summary.json`. Orbax writes each
checkpoint into a temporary directory and renames it when complete, so a SIGKILL leaves
either the previous checkpoints or a finished new one, never a half-written one that is
trusted. Parameters and optimizer state are separate items, so `cgpt.load(run_dir)` reads
only the parameters.
"""
from __future__ import annotations

import logging
import shutil
import sys
import time
import warnings
from pathlib import Path

import jax
import yaml

from cgpt import distributed, rundir
from cgpt.config import ModelConfig
from cgpt.errors import LoadError

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
CKPT_DIR = "checkpoints"
DISCARDED_DIR = "discarded_checkpoints"


def brief(e: BaseException, limit: int = 160) -> str:
    """An exception as one short line: TensorStore errors carry a ~60-line JSON spec."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    for cut in (" See full TensorStore details", " TensorStore(", " {"):
        text = text.split(cut, 1)[0]
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _set_aside(src: Path, aside: Path) -> None:
    """Move a checkpoint directory out of the way; in a multi-process job process 0 alone moves
    it (the others wait at a barrier before they reload)."""
    if not distributed.is_writer():
        return
    aside.parent.mkdir(exist_ok=True)
    shutil.rmtree(aside, ignore_errors=True)
    shutil.move(str(src), str(aside))


def is_run_dir(path: Path) -> bool:
    """A cgpt run (not a Hugging Face directory): by its config.yaml, checkpoints/ or log."""
    return not (path / "config.json").exists() and bool(rundir.recognise(path))


def nonfinite_tensor(params) -> str | None:
    """The name ('h/attn/w_qkv') of the first parameter holding NaN or inf, or None."""
    import numpy as np

    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not np.isfinite(np.asarray(x, np.float32)).all():
            return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
    return None


def _manager(run_dir: Path, keep: int | None = None, create: bool = True):
    import orbax.checkpoint as ocp

    opts = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False,
                                        create=create)
    return ocp.CheckpointManager((run_dir / CKPT_DIR).absolute(), options=opts)


class _HoldErrors(logging.Filter):
    """Holds back error records (Orbax logs a traceback per failed writer thread) until
    `release()` re-emits them; records of a failure that is raised anyway are dropped."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            self.records.append(record)
            return False
        return True

    def release(self) -> None:
        records, self.records = self.records, []
        for r in records:
            logging.getLogger(r.name).handle(r)


class _DropStorageAftermath(logging.Filter):
    """Drops the log records of a save the storage refused: Orbax's writer threads log their
    tracebacks as they end (`absl`), and asyncio logs the unretrieved ENOSPC futures of
    TensorStore's pending writes when they are garbage-collected (often at exit)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "absl":
            return not (record.levelno >= logging.ERROR and "orbax" in record.pathname)
        exc = record.exc_info[1] if record.exc_info else None
        text = record.getMessage()
        return not ("never retrieved" in text and (
            (exc is not None and rundir.storage_oserror(exc) is not None)
            or rundir.storage_oserror(RuntimeError(text)) is not None))


def _closed_loop(u) -> bool:
    return isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed"


def _orbax_write(u) -> bool:
    """An Orbax write coroutine finalized unfinished (at interpreter exit, after a failed save)."""
    code = getattr(u.object, "cr_code", None)
    return code is not None and "orbax" in code.co_filename


def _mute_storage_aftermath(hook) -> None:
    """After a save the storage refused, silence its aftermath for the rest of the process.

    The run is ending with one error line; what would follow it is noise with no new facts:
    Orbax's threads log a traceback each as they end, TensorStore's C++ threads deliver the
    remaining writes' results into the event loop Orbax already closed (each an unraisable
    "Event loop is closed" traceback), asyncio logs their unretrieved ENOSPC futures, and the
    write coroutines still pending are finalized at exit (each an unraisable ImportError).
    All arrive asynchronously, up to interpreter exit, so the hooks stay for the process's
    life; they drop nothing else. `hook`: the unraisable hook to pass everything else to."""
    if getattr(hook, "_cgpt_storage", False):
        sys.unraisablehook = hook
    else:
        def quiet(u):
            if not (_closed_loop(u) or _orbax_write(u)):
                hook(u)
        quiet._cgpt_storage = True
        sys.unraisablehook = quiet
    for name in ("absl", "asyncio"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropStorageAftermath) for f in log.filters):
            log.addFilter(_DropStorageAftermath())


class _DropUnretrieved(logging.Filter):
    """After a failed restore: asyncio's "exception was never retrieved" records of its reads
    (cgpt itself runs no event loop, so there are no others)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "never retrieved" not in record.getMessage()


def _quiet_restore(restore):
    """restore(), with the aftermath of a failure kept off the terminal: TensorStore delivers
    late reads into the event loop Orbax closed (unraisable "Event loop is closed" errors) and
    Orbax's threads log their tracebacks, during the call and after it. The caller reports the
    failure in one line; on success anything held back is passed on."""
    held, absl = _HoldErrors(), logging.getLogger("absl")
    absl.addFilter(held)
    unraisable, prev_hook = [], sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(u) if (
        _closed_loop(u) or _orbax_write(u)) else prev_hook(u)
    try:
        out = restore()
    except BaseException:
        _mute_storage_aftermath(prev_hook)
        absl.removeFilter(held)
        aio = logging.getLogger("asyncio")  # the failed reads' futures, logged when collected
        if not any(isinstance(f, _DropUnretrieved) for f in aio.filters):
            aio.addFilter(_DropUnretrieved())
        raise
    sys.unraisablehook = prev_hook
    absl.removeFilter(held)
    held.release()
    for u in unraisable:
        prev_hook(u)
    return out


class Checkpointer:
    """Save/restore {params, opt_state, step} with the last `keep` checkpoints kept."""

    def __init__(self, run_dir: Path, keep: int = 2):
        self.run_dir = Path(run_dir)
        self.mngr = _manager(self.run_dir, keep)

    def steps(self) -> list[int]:
        return sorted(self.mngr.all_steps())

    def save(self, step: int, params, opt_state) -> None:
        """Write checkpoint `step`. If the storage refuses (disk full, quota, read-only), the
        error names the checkpoint's path and the failure's aftermath is not printed."""
        import orbax.checkpoint as ocp

        held, absl = _HoldErrors(), logging.getLogger("absl")
        absl.addFilter(held)
        # TensorStore reports writes that end after Orbax closed its event loop as unraisable
        # "Event loop is closed" errors, possibly before the save returns: held back here
        unraisable, prev_hook = [], sys.unraisablehook
        sys.unraisablehook = lambda u: unraisable.append(u) if _closed_loop(u) else prev_hook(u)
        error = None
        try:
            self.mngr.save(step, args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                opt_state=ocp.args.StandardSave(opt_state)), force=True)
            self.mngr.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - re-raised below
            error = e
        except BaseException:
            sys.unraisablehook = prev_hook
            absl.removeFilter(held)
            raise
        cause = rundir.storage_oserror(error) if error is not None else None
        if cause is None:
            sys.unraisablehook = prev_hook
            absl.removeFilter(held)
            held.release()
            for u in unraisable:
                prev_hook(u)
            if error is not None:
                raise error
            return
        _mute_storage_aftermath(prev_hook)  # replaces the hold above in one assignment
        absl.removeFilter(held)  # its records are of the failure raised here: dropped
        raise OSError(cause.errno, cause.strerror, str(self.run_dir / CKPT_DIR / str(step))
                      ) from error

    def discard_after(self, step: int) -> list[int]:
        """Move the checkpoints newer than `step` to `discarded_checkpoints/` (a rewind)."""
        later = [s for s in self.steps() if s > step]
        for s in later:
            _set_aside(self.run_dir / CKPT_DIR / str(s), self.run_dir / DISCARDED_DIR / str(s))
        if later:
            distributed.barrier(f"discard-after-{step}")  # process 0 moved them; all reload
            self.mngr.reload()
        return later

    def restore_latest(self, abstract_params, abstract_opt_state):
        """(step, params, opt_state) from the newest readable checkpoint, or None if none.

        A checkpoint that fails to restore (corrupted on disk) is skipped with a warning and
        the previous one is used.
        """
        import orbax.checkpoint as ocp

        bad = []
        for step in reversed(self.steps()):
            try:
                out = _quiet_restore(lambda: self.mngr.restore(step, args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(abstract_params),
                    opt_state=ocp.args.StandardRestore(abstract_opt_state))))
            except Exception as e:  # orbax/tensorstore raise many types for bad files
                bad.append((step, e))
                continue
            for b, e in bad:  # newer ones that failed: set aside so their steps can be rewritten
                src = self.run_dir / CKPT_DIR / str(b)
                aside = self.run_dir / "corrupt_checkpoints" / str(b)
                warnings.warn(f"{src}: checkpoint is unreadable ({brief(e)}); "
                              f"falling back to step {step} (moved it to {aside})", stacklevel=2)
                _set_aside(src, aside)
            if bad:
                distributed.barrier(f"corrupt-aside-{step}")  # process 0 moved them; all reload
                self.mngr.reload()
            return step, out["params"], out["opt_state"]
        if bad:  # never silently restart a run whose checkpoints all fail to load
            raise LoadError(
                f"{self.run_dir / CKPT_DIR}: none of the checkpoints {[b for b, _ in bad]} could "
                f"be restored (newest error: {brief(bad[0][1])}); nothing "
                "was changed. Fix the cause, or move the checkpoints away to start over")
        return None

    def close(self) -> None:
        self.mngr.close()


def read_run_config(run_dir: Path) -> dict:
    f = Path(run_dir) / CONFIG_FILE
    if not f.exists():
        found = rundir.recognise(run_dir)
        raise LoadError(f"{f} is missing" + (f" (the directory holds a run: {', '.join(found)})"
                                             if found else "")
                        + "; restore the run's config.yaml, or pass a run directory")
    try:
        cfg = yaml.safe_load(f.read_bytes().decode())
    except IsADirectoryError:
        raise LoadError(f"{f} is a directory; the run's config must be a YAML file") from None
    except UnicodeDecodeError as e:
        raise LoadError(f"{f}: not a text file (byte {e.start} is not UTF-8); restore the "
                        "run's config.yaml") from None
    except (OSError, yaml.YAMLError) as e:
        raise LoadError(f"{f}: unreadable run config ({e})") from e
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        raise LoadError(f"{f}: expected a mapping with a 'model' section")
    return cfg


def load_run(run_dir: Path, compute_dtype: str = "float32"):
    """(ModelConfig, params, tokenizer) from the newest good checkpoint of a cgpt run."""
    import orbax.checkpoint as ocp
    from cgpt.model import init_params
    from cgpt.tokenizer import load_checkpoint_tokenizer

    raw = read_run_config(run_dir)
    try:
        cfg = ModelConfig.from_dict(raw["model"]).replace(compute_dtype=compute_dtype)
    except (TypeError, ValueError) as e:
        raise LoadError(f"{run_dir / CONFIG_FILE}: key 'model': {e}") from e
    abstract = jax.eval_shape(lambda: init_params(cfg))
    ckpts = run_dir / CKPT_DIR
    if not ckpts.is_dir():
        raise LoadError(f"{ckpts} " + ("is a file, not the run's checkpoint directory"
                                       if ckpts.exists() else "is missing")
                        + "; restore it (or train the run with --resume)")
    tokenizer = load_checkpoint_tokenizer(run_dir)
    for _ in range(5):  # a run that is training may replace its checkpoints meanwhile
        try:
            mngr = _manager(run_dir, create=False)  # reading only: never creates or deletes
            steps = sorted(mngr.all_steps())
        except FileNotFoundError:
            time.sleep(0.2)
            continue
        if not steps:
            raise LoadError(f"{ckpts}: no complete checkpoint yet; train longer or "
                            "resume the run with --resume")
        got = _restore_newest(mngr, steps, ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract)), ckpts)
        if got is not None:
            break
    else:
        raise LoadError(f"{ckpts}: its checkpoints kept changing while they were read (a run "
                        "training into it saves and deletes them); retry, or load a copy")
    step, out = got
    if out is None:
        raise LoadError(f"{ckpts}: every checkpoint ({', '.join(map(str, steps))}) is unreadable")
    bad = nonfinite_tensor(out["params"])
    if bad is not None:
        raise LoadError(f"{ckpts / str(step)}: tensor {bad!r} holds NaN or inf values (the "
                        "trainer never saves such a checkpoint, so the file is damaged); "
                        "move that step's directory away to load the previous checkpoint")
    return cfg, out["params"], tokenizer


def _restore_newest(mngr, steps: list[int], args, ckpts: Path):
    """(step, restored) of the newest readable checkpoint, (None, None) when none is, or None
    when one vanished while it was read (a training run replaced it: list them again)."""
    for step in reversed(steps):
        try:
            return step, _quiet_restore(lambda: mngr.restore(step, args=args))
        except Exception as e:  # noqa: BLE001 - a damaged or (mid-save) vanished checkpoint
            if not (ckpts / str(step)).exists():
                return None
            warnings.warn(f"{ckpts / str(step)}: unreadable checkpoint ({brief(e)}); "
                          "trying the previous one", stacklevel=3)
    return None, None
