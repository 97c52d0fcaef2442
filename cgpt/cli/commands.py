"""`cgpt`'s commands: the parser of every subcommand and what train, list, generate and eval
run (the others register their own: sweep, plan, data prepare, coord-check). Loaded by
`cgpt.cli.main` once the stop guard is in place."""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
from pathlib import Path

import cgpt
from cgpt import rundir
from cgpt.commands import sweep
from cgpt.config import backend, flops
from cgpt.config.data import DataConfig
from cgpt.config.model import get_config, list_configs
from cgpt.config.overrides import apply_overrides, coerce_source, seed_overrides
from cgpt.config.run import from_dict, load_yaml
from cgpt.data import prepare
from cgpt.data.batches import load_data
from cgpt.eval import coordcheck
from cgpt.eval.split import run_split, split_loss
from cgpt.paths import check_destination
from cgpt.plan import command as plan
from cgpt.rundir import SUMMARY_FILE, TOKENIZER_FILE, json_line, read_config
from cgpt.sharding.axes import mesh_size
from cgpt.commands import compare as sweep_compare


_OVERRIDE = re.compile(r"^(model|data|train)\.\w+=")
EVAL_SEQUENCES = 128  # eval --data: held-out sequences of the corpus
EVAL_BATCH = 16  # eval --data, --tasks: rows per batch
COMPARE = "sweep compare"  # a subcommand of two words


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train one model (Chinchilla-optimal by default)",
                       description="Train one model. Extra section.key=value arguments override "
                       "the config, e.g. train.peak_lr=1e-3 model.remat=true data.seq_len=128.")
    p.add_argument("--model", help="preset name (see `cgpt list`); overrides the config's preset")
    p.add_argument("--config", help="YAML file with preset/model/data/train sections")
    p.add_argument("--tokens", help="'chinchilla' (20 tokens/parameter) or a token count, e.g. 2e6")
    p.add_argument("--data", help="'default', a local file/folder, or hf:<name>[:<config>]")
    p.add_argument("--out", help="run directory (default: runs/<model>)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its last complete checkpoint (the "
                       "default when --out holds a run; its config must match)")
    again.add_argument("--no-resume", action="store_true",
                       help="never continue a run: refuse an --out that holds one")
    p.add_argument("--allow-train-changes", action="store_true",
                   help="with --resume: continue with changed train.* optimizer settings "
                   "(peak_lr, warmup_steps, decay, clip_norm, ...), e.g. after a NaN")
    p.add_argument("--from-step", type=int, metavar="STEP",
                   help="with --resume: continue from the kept checkpoint at STEP; later ones "
                   "move to discarded_checkpoints/")
    p.add_argument("--mode",
                   help="single | data_parallel | weight_streaming | layer_pipelined | auto")
    p.add_argument("--mesh", help="device mesh, e.g. data=2,stage=4")
    p.add_argument("--seed", type=int,
                   help="replicate seed: sets train.seed (init) and data.seed (data order)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--branch-from", metavar="RUN@STEP",
                   help="cooldown branch: start from a WSD run's stable-phase checkpoint at STEP "
                   "and decay to the --tokens budget (the run's config, unless overridden)")
    p.add_argument("--peer-timeout", type=int, metavar="SECONDS",
                   help="multi-process jobs: seconds after which the other processes stop with "
                        "an error when one stopped responding (default 100)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value",
                   help="config overrides, e.g. train.peak_lr=1e-3 data.seq_len=128 (anywhere "
                   "among the flags)")


def build_run(args):
    raw = load_yaml(args.config) if args.config else {}
    if getattr(args, "branch_from", None) and not args.config:  # the parent's config by default
        from cgpt.train.branch import parse_spec  # loads JAX: only when this runs

        raw = read_config(parse_spec(args.branch_from)[0])
    if args.model:
        raw["preset"] = args.model
    flags = []
    if args.tokens is not None:
        flags.append(f"train.tokens={args.tokens}")
    if args.data is not None:
        if not args.data.strip():
            raise ValueError(f"--data {args.data!r}: empty; give a folder or file of text, a "
                             "prepared store, or hf:<dataset> (is a shell variable unset?)")
        flags.append(f"data.source={args.data}")
    if args.mode is not None:
        flags.append(f"train.mode={args.mode}")
    if args.mesh is not None:
        flags.append(f"train.mesh={args.mesh}")
    if args.seed is not None:  # a replicate: new init and new data order
        flags += [f"{k}={v}" for k, v in seed_overrides(args.seed).items()]
    if not raw.get("preset") and not (raw.get("model") or {}).get("name"):
        raise ValueError("--model is required (or a config with 'preset'); "
                         "see `python -m cgpt list` for names")
    raw = coerce_source(apply_overrides(raw, flags + list(args.overrides)))
    return from_dict(raw, args.config or "command line")


def _emulate_cpu_devices(mesh_spec: str | None) -> None:
    """On a CPU host, expose as many (emulated) devices as --mesh asks for. Only the CPU
    backend reads this, and only if no JAX computation has started yet."""
    if mesh_spec:
        from cgpt.sharding.distributed import devices_per_process  # loads JAX: only when this runs
        from cgpt.sharding import emulate_cpu_devices  # loads JAX: only when this runs

        emulate_cpu_devices(devices_per_process(mesh_size(mesh_spec)))


def cmd_train(args) -> int:
    from cgpt.sharding import distributed  # loads JAX: only when this runs
    from cgpt.train.loop import train  # loads JAX: only when this runs

    if args.out is not None:
        check_destination(args.out, "--out")
    run = build_run(args)
    out = Path(args.out or f"runs/{run.model.name}")
    # a run directory resumes by default (levanter, torchtitan, MaxText); --no-resume refuses
    args.resume = args.resume or (not args.no_resume and (out / rundir.CONFIG_FILE).exists())
    _emulate_cpu_devices(run.train.mesh)
    distributed.initialize(args.peer_timeout)  # a multi-process job (JAX_* or SLURM env)
    distributed.agree("config", {**run.to_dict(), "flags": {
        k: getattr(args, k) for k in ("resume", "from_step", "allow_train_changes",
                                      "branch_from")}})  # every process: one run
    branch_from = None
    if args.branch_from:
        # loads JAX: only when this runs
        from cgpt.train.branch import branch_run, parse_spec, precheck

        branch_from = parse_spec(args.branch_from)
        run = branch_run(branch_from[0], run)
        precheck(branch_from, run)  # before the launch writes anything into --out
    summary = train(run, out, resume=args.resume, progress=not args.no_progress,
                    allow_changes=args.allow_train_changes, from_step=args.from_step,
                    branch_from=branch_from)
    if not distributed.is_writer():
        return 0
    keys = ("model", "n_params", "tokens", "flops", "train_loss", "val_loss", "tokens_per_s",
            "mfu", "epochs", "wall_time_s")
    print(json.dumps({k: summary[k] for k in keys}, indent=2))
    print(f"run directory: {out}")
    return 0


def cmd_list(args) -> int:
    print(f"{'name':14s} {'layers':>6s} {'d_model':>7s} {'heads':>5s} {'vocab':>6s} "
          f"{'context':>7s} {'params':>15s} {'non-emb':>15s} {'chinchilla D':>15s} "
          f"{'FLOPs':>9s}")
    for n in list_configs():
        c = get_config(n)
        D = c.chinchilla_tokens()
        print(f"{n:14s} {c.n_layer:6d} {c.d_model:7d} {c.n_head:5d} {c.vocab_size:6d} "
              f"{c.n_ctx:7d} {c.num_params():15,d} {c.num_params(embedding=False):15,d} "
              f"{D:15,d} {flops.train_flops(c, D):9.2e}")
    return 0


def cmd_generate(args) -> int:
    checks = (("--max-new-tokens", args.max_new_tokens, args.max_new_tokens >= 1, ">= 1"),
              ("--top-k", args.top_k, args.top_k is None or args.top_k >= 1, ">= 1"),
              ("--top-p", args.top_p, args.top_p is None or 0 < args.top_p <= 1, "in (0, 1]"),
              ("--temperature", args.temperature,
               math.isfinite(args.temperature) and args.temperature >= 0, "finite and >= 0"),
              ("--seed", args.seed, -2 ** 63 <= args.seed < 2 ** 63, "a 64-bit integer"))
    for flag, v, ok, want in checks:  # before the model loads, named as typed
        if not ok:
            raise ValueError(f"{flag} {v}: must be {want}")
    backend.start_platform()
    lm = cgpt.load(args.source, dtype=args.dtype)
    if args.max_new_tokens >= lm.config.n_ctx:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: the prompt and the new tokens "
                         f"must fit the model's context of {lm.config.n_ctx} tokens; use at "
                         f"most {lm.config.n_ctx - 1} (less the prompt's length)")
    if args.top_k is not None and args.top_k > lm.config.vocab_size:
        raise ValueError(f"--top-k {args.top_k}: must be at most the model's vocabulary size "
                         f"{lm.config.vocab_size}")
    print(lm.generate(args.prompt, args.max_new_tokens, temperature=args.temperature,
                      top_k=args.top_k, top_p=args.top_p, seed=args.seed))
    return 0


def cmd_eval(args) -> int:
    for flag, v, low in (("--limit", args.limit, 0), ("--num-fewshot", args.num_fewshot, 0),
                         ("--bootstrap-iters", args.bootstrap_iters, 0),
                         ("--batch-size", args.batch_size, 1)):  # lm-eval's batch size too
        if v is not None and (v < low or (flag == "--limit" and not 0 < v < float("inf"))):
            raise ValueError(f"{flag} {v}: must be "
                             f"{'a finite number > 0' if flag == '--limit' else f'at least {low}'}")
    given = [f for f, v in (("--num-fewshot", args.num_fewshot), ("--limit", args.limit),
                            ("--include-path", args.include_path), ("--output", args.output),
                            ("--bootstrap-iters", args.bootstrap_iters)) if v is not None]
    if given and not args.tasks:  # never silently ignored: the user expects them to act
        raise ValueError(f"{', '.join(given)}: only with --tasks (lm-eval tasks); without it "
                         "eval reports a validation loss (the run's own split, or --data's)")
    loss_only = [f for f, v in (("--data", args.data), ("--seq-len", args.seq_len),
                                ("--sequences", args.sequences)) if v is not None]
    if loss_only and args.tasks:  # the tasks bring their own documents
        raise ValueError(f"{', '.join(loss_only)}: for the validation loss, not with --tasks "
                         "(lm-eval tasks read their own documents); drop them or --tasks")

    backend.start_platform()
    if args.tasks:  # lm-evaluation-harness tasks: cgpt/eval/harness.py
        try:
            from cgpt.eval.harness import run_tasks  # loads JAX, lm_eval: only when this runs
        except ImportError as e:
            raise ValueError(str(e)) from e
        args.dtype, args.batch_size = args.dtype or "float32", args.batch_size or EVAL_BATCH
        return run_tasks(args)

    for flag, v, low in (("--seq-len", args.seq_len, 2), ("--sequences", args.sequences, 1)):
        if v is not None and v < low:
            raise ValueError(f"{flag} {v}: must be at least {low}")
    own = args.data is None and rundir.is_run(args.source)  # the run's own validation split
    if own:
        fixed = [f for f, v in (("--seq-len", args.seq_len), ("--sequences", args.sequences))
                 if v is not None]
        if fixed:  # they would change the split, so the loss would not be the run's
            raise ValueError(f"{', '.join(fixed)}: the run's own validation split is fixed by "
                             f"its config.yaml (data.seq_len, data.val_sequences); to evaluate "
                             "other sequences, name a corpus with --data (e.g. --data default)")
        split = run_split(args.source)
    # the run's compute dtype for its own split (as it evaluated), else float32
    dtype = args.dtype or (read_config(args.source)["model"].get("compute_dtype", "float32")
                           if own else "float32")
    lm = cgpt.load(args.source, dtype=dtype)
    if lm.tokenizer is None:
        raise ValueError(f"{args.source}: no tokenizer files, so text cannot be evaluated")
    if own:
        data = load_data(split.data, args.source)  # the run's tokenizer.json, its store
        loss, n = split_loss(lm.loss, data, split, args.batch_size)
        print(json_line({"source": str(args.source), "data": "the run's validation split",
                         "step": lm.step, "seq_len": data.seq_len, "sequences": n,
                         "val_loss": loss, "run_val_loss": split.recorded}))
        notes = []  # one line: which checkpoint, which sequences
        if split.recorded is None:  # no summary.json yet: say which checkpoint was read
            notes.append(f"{args.source} has not finished (no val_loss in its {SUMMARY_FILE}); "
                         f"this is its newest checkpoint, step {lm.step}")
        if not split.exact:
            notes.append(f"all {n} validation sequences were read: no {SUMMARY_FILE} records "
                         "its evaluation batch (the run reads whole batches of its micro-batch)")
        if notes:
            print("note: " + "; ".join(notes), file=sys.stderr)
        return 0
    data_source = args.data or "default"
    seq_len = lm.config.n_ctx if args.seq_len is None else args.seq_len
    if seq_len > lm.config.n_ctx:
        raise ValueError(f"--seq-len {seq_len} exceeds the model's context n_ctx="
                         f"{lm.config.n_ctx}")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / TOKENIZER_FILE).write_text(lm.tokenizer.to_str())  # tmp: as a run
        data = load_data(DataConfig(source=data_source, seq_len=seq_len,
                                    val_sequences=args.sequences or EVAL_SEQUENCES,
                                    tokenizer=tmp), tmp)
        total, n = 0.0, 0
        for batch in data.val_batches(args.batch_size or EVAL_BATCH):  # every one, weighted
            total += lm.loss(batch) * len(batch)
            n += len(batch)
    print(json_line({"source": str(args.source), "data": data_source, "seq_len": seq_len,
                     "sequences": n, "val_loss": total / n}))  # strict: NaN is null, named
    return 0


def run(argv: list[str]) -> int:
    """Parse `argv` and run its command (under `cgpt.cli.main`, the edge)."""
    if argv[:2] == ["sweep", "compare"]:  # the subcommand of two words (`_add_compare`)
        argv = [COMPARE, *argv[2:]]
    ap = parser()
    if argv[:1] == ["train"]:  # section.key=value overrides may sit between flags, as in MaxText
        is_override = [bool(_OVERRIDE.match(a)) for a in argv]
        argv = [a for a, o in zip(argv, is_override) if not o] + \
            [a for a, o in zip(argv, is_override) if o]
    args = ap.parse_args(argv)
    handlers = {"train": cmd_train, "list": cmd_list, "generate": cmd_generate, "eval": cmd_eval}
    return args.func(args) if hasattr(args, "func") else handlers[args.command](args)


def parser() -> argparse.ArgumentParser:
    """`cgpt`'s command line: every subcommand, its arguments and their help."""
    ap = argparse.ArgumentParser(prog="cgpt", description="Cerebras-GPT scaling-law studies")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           title="commands (cgpt COMMAND --help for each)")
    _add_train(sub)
    sub.add_parser("list", help="list model presets with N, D and FLOPs",
                   description="Every model preset --model accepts: its shape, vocabulary and "
                   "context, parameters N (all, and outside the embeddings), the "
                   "Chinchilla-optimal tokens D = 20 N and the training FLOPs of N on D.")
    g = sub.add_parser("generate", help="generate text from a checkpoint or run directory",
                       description="Continue PROMPT with the model in SOURCE (a KV cache; "
                       "greedy unless --temperature) and print the prompt and continuation.")
    g.add_argument("source", metavar="SOURCE", help="a cgpt run directory, a Hugging Face "
                   "GPT-2 directory or a hub id (e.g. cerebras/Cerebras-GPT-111M)")
    g.add_argument("prompt", metavar="PROMPT", help="the text to continue")
    g.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 is greedy decoding")
    g.add_argument("--top-k", type=int, help="sample only from the k most likely tokens "
                   "(default: all)")
    g.add_argument("--top-p", type=float, help="sample only from the smallest set of tokens "
                   "whose probability reaches p (default: 1, all)")
    g.add_argument("--seed", type=int, default=0, help="the sampling seed")
    g.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="compute dtype; parameters stay float32")
    e = sub.add_parser(
        "eval", help="validation loss of a run or checkpoint (or lm-eval tasks)",
        description="The validation loss of a checkpoint. A run directory is evaluated on its "
        "own validation split (its data settings, tokenizer and the fixed held-out sequences "
        "its val_loss was measured on), reproducing summary.json's val_loss (printed beside "
        "it as run_val_loss); --data evaluates another corpus instead. With --tasks: "
        "lm-evaluation-harness tasks.")
    e.add_argument("source", metavar="SOURCE",
                   help="a cgpt run directory, a Hugging Face GPT-2 directory or a hub id "
                   "(e.g. cerebras/Cerebras-GPT-111M)")
    e.add_argument("--data", help="evaluate on this corpus instead: 'default' (the embedded "
                   "corpus), a local file/folder, a prepared store or hf:<name>[:<config>] "
                   "(default: a run's own validation split; 'default' for other checkpoints)")
    e.add_argument("--seq-len", type=int, help="with --data: tokens per sequence "
                   "(default: the model's n_ctx)")
    e.add_argument("--sequences", type=int, help="with --data: held-out sequences evaluated, "
                   f"spread over the corpus (default {EVAL_SEQUENCES})")
    e.add_argument("--batch-size", type=int, help="sequences per forward pass (default: the "
                   f"run's evaluation batch for its own split, else {EVAL_BATCH})")
    e.add_argument("--dtype", choices=("float32", "bfloat16"), help="compute dtype (default: "
                   "the run's for its own split, else float32); parameters stay float32")
    e.add_argument("--tasks", help="lm-evaluation-harness tasks, e.g. hellaswag,piqa (needs "
                   "lm-eval); results go to SOURCE/lm_eval/ unless --output")
    e.add_argument("--num-fewshot", type=int, help="--tasks: few-shot examples (task default)")
    e.add_argument("--limit", type=float, help="--tasks: documents per task (or a fraction < 1)")
    e.add_argument("--include-path", help="--tasks: a folder of extra task YAMLs (local data)")
    e.add_argument("--output", help="--tasks: results JSON path")
    e.add_argument("--bootstrap-iters", type=int,
                   help="--tasks: bootstrap resamples for the stderr (default 100000; 0: none)")

    sweep.register(sub)
    _add_compare(sub)
    plan.register(sub)
    prepare.register(sub)  # `cgpt data prepare`
    coordcheck.register(sub)
    for p in _parsers(ap):  # every subcommand's help ends with its defaults
        p.formatter_class = DefaultsHelp
    return ap


def _add_compare(sub) -> None:
    """`cgpt sweep compare`: two finished sweeps, not a spec, so not an argument of `sweep`
    (whose first positional is the spec) but a subcommand of two words (`run` reads `sweep
    compare` as one), listed by `cgpt --help`."""
    own = sweep_compare.parser()
    p = sub.add_parser(COMPARE, parents=[own], add_help=False, description=own.description,
                       help="compare two finished sweeps: the compute recipe A needs for "
                       "recipe B's loss")
    p.set_defaults(func=sweep_compare.run)


class DefaultsHelp(argparse.HelpFormatter):
    """Help that names the default of every argument that has one (not None, False or empty)
    and does not name it already, so `--help` shows what an omitted flag means."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text, d = action.help or "", action.default
        shown = action.option_strings or action.nargs in ("?", "*")
        none = d is None or d is False or d is argparse.SUPPRESS or d == []  # 0 is a value
        if text and shown and not none and "default" not in text:
            text += " (default: %(default)s)"
        return text


def _parsers(ap: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`ap` and every subcommand's parser under it."""
    out = [ap]
    for a in ap._actions:  # argparse keeps subparsers only here
        if isinstance(a, argparse._SubParsersAction):
            for p in a.choices.values():
                out += _parsers(p)
    return out

