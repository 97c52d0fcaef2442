"""cgpt as an EleutherAI lm-evaluation-harness model, registered as `cgpt`.

    python -m cgpt eval runs/x --tasks hellaswag,piqa      # results beside the run
    import cgpt.eval.harness; lm_eval.simple_evaluate(model="cgpt",
        model_args="pretrained=runs/x,dtype=float32,batch_size=16", tasks=["hellaswag"])

(lm-eval knows the name `cgpt` once this module is imported.) `pretrained` is anything `cgpt.load`
reads: a run directory, a Hugging Face GPT-2 directory or a hub id. Requests are scored the way
lm-eval's own `hf` model scores them (same truncation to the last n_ctx + 1 tokens, same rolling
windows, same stop sequences), so the two agree to float precision; they run batched, longest first,
padded to a few bucket lengths so that XLA compiles a handful of shapes. Optional dependency: `pip
install lm-eval==0.4.13`.
"""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as e:  # lm-eval is optional (requirements-test.txt)
    raise ImportError(
        "evaluating on lm-evaluation-harness tasks needs the optional dependency lm-eval: "
        "`pip install lm-eval==0.4.13`") from e

import jax
import jax.numpy as jnp
import numpy as np
import yaml
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager
from lm_eval.utils import make_table
from tqdm import tqdm

from cgpt.eval.lm import load
from cgpt.fileio import atomic_write_text
from cgpt.model.gpt import forward

EOT = "<|endoftext|>"


@functools.partial(jax.jit, static_argnames=("cfg",))
def _token_logprobs(params, ids, targets, cfg):
    """log p(targets[t] | ids[:t+1]) and whether targets[t] is the argmax, for every t."""
    logits = forward(params, ids, cfg)[0]
    logp = jax.nn.log_softmax(logits, axis=-1)
    tgt = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return tgt, jnp.argmax(logits, axis=-1) == targets


def _bucket(n: int, cap: int) -> int:
    return min(cap, 1 << max(4, (n - 1).bit_length()))


@register_model("cgpt")
class CgptLM(TemplateLM):
    """model_args: pretrained (required), dtype (float32 | bfloat16), batch_size."""

    def __init__(self, pretrained: str | None = None, dtype: str = "float32",
                 batch_size: int | str = 16, max_gen_toks: int = 256, lm=None, **ignored):
        super().__init__()

        if lm is None:
            if not pretrained:
                raise ValueError("lm-eval model 'cgpt' needs model_args pretrained=<run dir, "
                                 "HF directory or hub id>")
            lm = load(pretrained, dtype=dtype)
        if lm.tokenizer is None:
            raise ValueError(f"{pretrained}: no tokenizer files (tokenizer.json or vocab.json + "
                             "merges.txt); lm-eval tasks are text, so a tokenizer is required")
        eot = lm.tokenizer.token_to_id(EOT)
        if eot is None:
            raise ValueError(f"{pretrained}: the tokenizer has no {EOT} token, which scores "
                             "empty contexts and rolling windows (as in GPT-2)")
        if str(batch_size).startswith("auto"):
            raise ValueError("model 'cgpt': batch_size=auto is not supported; pass a number")
        self.lm, self._eot, self.batch_size = lm, eot, int(batch_size)
        self.max_length = lm.config.n_ctx
        self.max_gen_toks = int(max_gen_toks)

    # ---- tokens ------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self._eot

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kw) -> list[int]:
        return self.lm.tokenizer.encode(string, add_special_tokens=False).ids

    def tok_decode(self, ids) -> str:
        return self.lm.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    # ---- scoring -----------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None,
                              **kw) -> list[tuple[float, bool]]:
        """Sum of log p(continuation | context) and whether greedy decoding gives it, for
        (key, context ids, continuation ids) requests, longest first in batches."""
        rows = []
        for i, (_, ctx, cont) in enumerate(requests):
            if not cont:
                raise ValueError(f"lm-eval request {i}: empty continuation")
            whole = (list(ctx) + list(cont))[-(self.max_length + 1):]
            rows.append((i, whole[:-1], whole[1:], min(len(cont), len(whole) - 1)))
        order = sorted(range(len(rows)), key=lambda j: -len(rows[j][1]))
        bs = int(override_bs or self.batch_size)
        out: list = [None] * len(rows)
        cfg = self.lm.config
        for b in tqdm(range(0, len(order), bs), disable=disable_tqdm, desc="cgpt loglikelihood"):
            batch = [rows[j] for j in order[b:b + bs]]
            T = _bucket(max(len(r[1]) for r in batch), self.max_length)
            ids = np.zeros((bs, T), np.int32)
            tgt = np.zeros((bs, T), np.int32)
            for k, (_, inp, t, _) in enumerate(batch):
                ids[k, :len(inp)], tgt[k, :len(t)] = inp, t
            lp, greedy = jax.device_get(_token_logprobs(self.lm.params, ids, tgt, cfg))
            for k, (i, inp, _, n) in enumerate(batch):
                sl = slice(len(inp) - n, len(inp))
                out[i] = (float(lp[k, sl].astype(np.float64).sum()), bool(greedy[k, sl].all()))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Total log-likelihood of each text, in disjoint n_ctx windows (lm-eval's scheme)."""
        windows, owner = [], []
        for i, (text,) in enumerate(r.args for r in requests):
            for w in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None,) + w)
                owner.append(i)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for i, (s, _) in zip(owner, scores):
            totals[i] += s
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled) continuations cut at the first stop sequence. Requests with the
        same generation settings run in batches, longest first, right-padded to a few bucket
        lengths: one compiled program per bucket, not per prompt length."""
        eos = self.tok_decode([self._eot])
        jobs = []
        for i, (context, gen_kwargs) in enumerate(r.args for r in requests):
            kw = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            until = handle_stop_sequences(kw.pop("until", None), eos=eos)
            n = int(kw.pop("max_gen_toks"))
            if n >= self.max_length:
                raise ValueError(f"lm-eval request {i}: max_gen_toks={n} leaves no room for "
                                 f"the context in n_ctx={self.max_length}")
            ids = (self.tok_encode(context) or [self._eot])[-(self.max_length - n):]
            temp = float(kw.get("temperature", 0.0)) if kw.get("do_sample") else 0.0
            jobs.append((i, ids, n, temp, until))
        groups: dict = {}
        for job in sorted(jobs, key=lambda j: -len(j[1])):  # longest first, as `hf`
            groups.setdefault((job[2], job[3]), []).append(job)
        out: list = [None] * len(jobs)
        pbar = tqdm(total=len(jobs), disable=disable_tqdm, desc="cgpt generate_until")
        bs = self.batch_size
        for (n, temp), group in groups.items():
            for b in range(0, len(group), bs):
                chunk = group[b:b + bs]
                prompts = [j[1] for j in chunk]
                prompts += [[self._eot]] * (bs - len(chunk))  # one batch shape per bucket
                gen = self.lm.generate_ragged(prompts, n, temperature=temp,
                                              pad_to=_bucket(len(prompts[0]), self.max_length))
                for job, row in zip(chunk, gen):
                    text = self.tok_decode(row)
                    for stop in job[4]:
                        if stop:
                            text = text.split(stop)[0]
                    out[job[0]] = text
                pbar.update(len(chunk))
        pbar.close()
        return out


# ---- `python -m cgpt eval SOURCE --tasks ...` -------------------------------------------
def default_output(source: str) -> Path:
    """Results beside the run: SOURCE/lm_eval/results_<time>.json for a local directory,
    else ./lm_eval/<hub id, / as __>/results_<time>.json."""
    name = f"results_{time.strftime('%Y%m%d-%H%M%S')}.json"
    src = Path(source).expanduser()
    if src.is_dir():
        return src / "lm_eval" / name
    return Path("lm_eval") / str(source).replace("/", "__") / name


def run_tasks(args) -> int:
    """The `eval --tasks` path: lm-eval's `simple_evaluate` on the `cgpt` model."""
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ValueError(f"--tasks {args.tasks!r}: name at least one lm-eval task")
    out = Path(args.output) if args.output else default_output(args.source)
    _check_output(out)  # before the tasks run (minutes), not after
    model = CgptLM(pretrained=args.source, dtype=args.dtype, batch_size=args.batch_size)
    manager = _checked_manager(TaskManager)(include_path=args.include_path) \
        if args.include_path else _checked_manager(TaskManager)()
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        broken = _unparsable_yamls(Path(args.include_path)) if args.include_path else []
        raise ValueError(f"--tasks: unknown lm-eval task(s) {unknown}; " + (
            f"these task YAMLs under --include-path do not parse (lm-eval skips them): "
            f"{'; '.join(broken)}" if broken else "see `lm_eval --tasks list`" + (
                "" if args.include_path else ", or add --include-path DIR for task YAMLs of "
                "your own")))
    limit = args.limit if args.limit is None or args.limit < 1 else int(args.limit)
    res = simple_evaluate(model=model, tasks=tasks, num_fewshot=args.num_fewshot,
                          limit=limit, task_manager=manager, log_samples=False,
                          bootstrap_iters=100000 if args.bootstrap_iters is None
                          else args.bootstrap_iters)
    out.parent.mkdir(parents=True, exist_ok=True)
    keep = {k: res[k] for k in ("results", "versions", "n-shot", "configs", "higher_is_better",
                                "n-samples") if k in res}
    keep["source"] = str(args.source)
    atomic_write_text(out, json.dumps(keep, indent=2, default=str))
    print(make_table(res))
    print(f"results: {out}")
    return 0


def _check_output(out: Path) -> None:
    """The results file can be written: not a directory, and under no file."""
    if out.is_dir():
        raise ValueError(f"--output {out} is a directory; name the results file, e.g. "
                         f"{out / 'results.json'}")
    parent = next((p for p in out.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"--output {out}: {parent} is a file, so the results cannot be "
                         "written there")


def _unparsable_yamls(root: Path) -> list[str]:
    """'file: why' for each task YAML under `root` that does not parse: lm-eval's index skips
    those silently, so their tasks would otherwise be reported as unknown. Tags such as
    `!function` are accepted unread (only the YAML syntax is checked)."""
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    out = []
    for f in sorted(root.glob("**/*.yaml")) if root.is_dir() else [root]:
        try:
            yaml.load(f.read_text(errors="replace"), Loader=Loader)  # noqa: S506 (safe base)
        except yaml.YAMLError as e:
            out.append(f"{f}: {' '.join(str(e).split())}")
        except OSError as e:
            out.append(f"{f}: {e.strerror or e}")
    return out


def _checked_manager(base):
    """lm-eval's TaskManager whose `load` turns a task that cannot be built (its data file
    empty or unreadable: lm-eval and `datasets` raise many types, StopIteration among them)
    or that has no documents into one ValueError naming the task, instead of a traceback."""

    class Checked(base):
        def load(self, task_list, *a, **kw):
            try:
                loaded = super().load(task_list, *a, **kw)
            except Exception as e:  # noqa: BLE001 - a third-party boundary, re-raised named
                raise ValueError(f"--tasks: lm-eval could not build task(s) {task_list}: "
                                 f"{type(e).__name__}: {str(e) or 'no data'}; check the task "
                                 "YAML's dataset_path and data_files (an empty data file has "
                                 "no documents)") from e
            for name, task in (loaded.get("tasks") or {}).items():
                docs = getattr(task, "eval_docs", None)
                if docs is not None and len(docs) == 0:
                    raise ValueError(f"--tasks: lm-eval task {name!r} has no documents in its "
                                     "evaluation split; check its data files")
            return loaded

    return Checked
