"""`python -m cgpt {train,sweep,plan,list,eval,generate,data}` (also the `cgpt` console script)."""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
import traceback
from pathlib import Path

import cgpt
from cgpt import stop, sweep
from cgpt.config import backend, flops
from cgpt.config.data import DataConfig
from cgpt.config.model import get_config, list_configs
from cgpt.config.overrides import apply_overrides, coerce_source, seed_overrides
from cgpt.config.run import from_dict, load_yaml
from cgpt.data import prepare
from cgpt.data.batches import load_data
from cgpt.eval import coordcheck
from cgpt.paths import check_destination
from cgpt.plan import command as plan
from cgpt.rundir import TOKENIZER_FILE, json_line, read_config
from cgpt.sharding.axes import mesh_size
from cgpt.sweep import compare as sweep_compare


_OVERRIDE = re.compile(r"^(model|data|train)\.\w+=")


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train one model (Chinchilla-optimal by default)",
                       description="Train one model. Extra section.key=value arguments override "
                       "the config, e.g. train.peak_lr=1e-3 model.remat=true data.seq_len=128.")
    p.add_argument("--model", help="preset name (see `cgpt list`); overrides the config's preset")
    p.add_argument("--config", help="YAML file with preset/model/data/train sections")
    p.add_argument("--tokens", help="'chinchilla' (20 tokens/parameter) or a token count, e.g. 2e6")
    p.add_argument("--data", help="'default', a local file/folder, or hf:<name>[:<config>]")
    p.add_argument("--out", help="run directory (default: runs/<model>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its last complete checkpoint")
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
    p.add_argument("overrides", nargs="*", metavar="section.key=value")


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
    _emulate_cpu_devices(run.train.mesh)
    distributed.initialize(args.peer_timeout)  # a multi-process job (JAX_* or SLURM env)
    distributed.agree("config", {**run.to_dict(), "flags": {
        k: getattr(args, k) for k in ("resume", "from_step", "allow_train_changes",
                                      "branch_from")}})  # every process: one run
    out = Path(args.out or f"runs/{run.model.name}")
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
    print(f"{'name':14s} {'layers':>6s} {'d_model':>7s} {'heads':>5s} {'params':>15s} "
          f"{'non-emb':>15s} {'chinchilla D':>15s} {'FLOPs':>9s}")
    for n in list_configs():
        c = get_config(n)
        D = c.chinchilla_tokens()
        print(f"{n:14s} {c.n_layer:6d} {c.d_model:7d} {c.n_head:5d} {c.num_params():15,d} "
              f"{c.num_params(embedding=False):15,d} {D:15,d} {flops.train_flops(c, D):9.2e}")
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
                         "eval reports the validation loss on --data")

    backend.start_platform()
    if args.tasks:  # lm-evaluation-harness tasks: cgpt/eval/harness.py
        try:
            from cgpt.eval.harness import run_tasks  # loads JAX, lm_eval: only when this runs
        except ImportError as e:
            raise ValueError(str(e)) from e
        return run_tasks(args)

    for flag, v, low in (("--seq-len", args.seq_len, 2), ("--sequences", args.sequences, 1)):
        if v is not None and v < low:
            raise ValueError(f"{flag} {v}: must be at least {low}")
    lm = cgpt.load(args.source, dtype=args.dtype)
    if lm.tokenizer is None:
        raise ValueError(f"{args.source}: no tokenizer files, so text cannot be evaluated")
    seq_len = lm.config.n_ctx if args.seq_len is None else args.seq_len
    if seq_len > lm.config.n_ctx:
        raise ValueError(f"--seq-len {seq_len} exceeds the model's context n_ctx="
                         f"{lm.config.n_ctx}")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / TOKENIZER_FILE).write_text(lm.tokenizer.to_str())  # tmp: as a run
        data = load_data(DataConfig(source=args.data, seq_len=seq_len,
                                    val_sequences=args.sequences, tokenizer=tmp), tmp)
        total, n = 0.0, 0
        for batch in data.val_batches(args.batch_size):  # every held-out sequence, weighted
            total += lm.loss(batch) * len(batch)
            n += len(batch)
    print(json_line({"source": str(args.source), "data": args.data, "seq_len": seq_len,
                     "sequences": n, "val_loss": total / n}))  # strict: NaN is null, named
    return 0


def main(argv: list[str] | None = None) -> int:
    """The process's edge (`python -m cgpt` runs it; a test or library may call it): the one
    place a stop or an error becomes one line and an exit status (`cgpt.stop.status`). Ctrl-C
    anywhere, a scheduler's signal before the loop: one line, not a traceback or a silent
    death (`python -m cgpt` installed the handlers from its first statement already). In a
    multi-process job a failed process leaves with the others, a bug's traceback printed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    old: dict = {}
    try:
        try:
            old = stop.GUARD.defer(command)
            code = _main(argv)
        except BaseException as e:  # noqa: BLE001 - `status` picks what it ends
            code = stop.status(e, command)
            if code is None:  # SystemExit (argparse, --help), a bug: as Python would end
                if _job() is None:
                    raise
                if isinstance(e, SystemExit):
                    code = e.code if isinstance(e.code, int) else 1
                else:
                    traceback.print_exc()  # unexpected: the traceback, then leave with the rest
                    code = 1
        if code and _job() is not None:
            from cgpt.sharding import distributed  # imports JAX: only once a job was joined

            distributed.leave(code)  # no JAX exit barrier on the error path (see there)
        return code
    finally:
        stop.GUARD.restore(old)


def _job() -> tuple[int, int] | None:
    """The multi-process job this process joined, if any (JAX started: never starts it)."""
    if "jax" not in sys.modules:
        return None
    from cgpt.sharding import distributed  # JAX is imported already: nothing to start

    return distributed.joined()


def _main(argv: list[str]) -> int:
    if argv[:2] == ["sweep", "compare"]:  # two finished sweeps, not a spec: its own parser
        return sweep_compare.run(sweep_compare.parser().parse_args(argv[2:]))
    ap = argparse.ArgumentParser(prog="cgpt", description="Cerebras-GPT scaling-law studies")
    sub = ap.add_subparsers(dest="command", required=True)
    _add_train(sub)
    sub.add_parser("list", help="list model presets with N, D and FLOPs")
    g = sub.add_parser("generate", help="generate text from a checkpoint or run directory")
    g.add_argument("source")
    g.add_argument("prompt")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int)
    g.add_argument("--top-p", type=float)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--dtype", default="float32")
    e = sub.add_parser("eval", help="validation loss of a checkpoint on a corpus")
    e.add_argument("source")
    e.add_argument("--data", default="default")
    e.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's n_ctx)")
    e.add_argument("--sequences", type=int, default=128)
    e.add_argument("--batch-size", type=int, default=16)
    e.add_argument("--dtype", default="float32")
    e.add_argument("--tasks", help="lm-evaluation-harness tasks, e.g. hellaswag,piqa (needs "
                   "lm-eval); results go to SOURCE/lm_eval/ unless --output")
    e.add_argument("--num-fewshot", type=int, help="--tasks: few-shot examples (task default)")
    e.add_argument("--limit", type=float, help="--tasks: documents per task (or a fraction < 1)")
    e.add_argument("--include-path", help="--tasks: a folder of extra task YAMLs (local data)")
    e.add_argument("--output", help="--tasks: results JSON path")
    e.add_argument("--bootstrap-iters", type=int,
                   help="--tasks: bootstrap resamples for the stderr (default 100000; 0: none)")

    sweep.register(sub)
    plan.register(sub)
    prepare.register(sub)  # `cgpt data prepare`
    coordcheck.register(sub)
    if argv[:1] == ["train"]:  # section.key=value overrides may sit between flags, as in MaxText
        is_override = [bool(_OVERRIDE.match(a)) for a in argv]
        argv = [a for a, o in zip(argv, is_override) if not o] + \
            [a for a, o in zip(argv, is_override) if o]
    args = ap.parse_args(argv)
    handlers = {"train": cmd_train, "list": cmd_list, "generate": cmd_generate, "eval": cmd_eval}
    return args.func(args) if hasattr(args, "func") else handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
