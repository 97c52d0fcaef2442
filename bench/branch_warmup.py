"""What a cooldown branch pays for inheriting its parent's warmup.

`grid.branches` gives every branch the parent's warmup (10% of the parent's steps), so a branch
at a quarter of the budget spends 40% of its steps warming up. This trains, per parent budget
and init seed: the WSD parent, branches at 1/4 and 1/2 of its budget (`--branch-from`), and
independent WSD runs of those budgets warmed up for their own length (10%). It prints each
branch's final validation loss against the independent run's. The model and data are the
ones tests/train/test_branch.py uses (tiny-17k, six stdlib modules, batch 8 x 16 tokens, peak 3e-3).

    python bench/branch_warmup.py [--parents 200 400] [--seeds 0 1 2]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parents", type=int, nargs="+", default=[200, 400])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()

    from cgpt.config.model import get_config
    from cgpt.config.data import DataConfig
    from cgpt.config.run import RunConfig, TrainConfig
    from cgpt.train.loop import train

    tmp = Path(tempfile.mkdtemp())
    corpus = tmp / "corpus"
    corpus.mkdir()
    lib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py"):
        shutil.copy(lib / name, corpus / name)

    def run(steps: int, warmup: int, seed: int) -> RunConfig:
        return RunConfig(
            preset="tiny-17k", model=get_config("tiny-17k"),
            data=DataConfig(source=str(corpus), vocab_size=512, seq_len=16, val_sequences=32,
                            cache_dir=str(tmp / "cache")),
            train=TrainConfig(tokens=128 * steps, batch_size=8, log_every=5, eval_every=10 ** 6,
                              ckpt_every=10, keep_checkpoints=100, peak_lr=3e-3, schedule="wsd",
                              warmup_steps=warmup, seed=seed))

    print("parent seed branch | warmup: inherited  own | val loss: branch  own-warmup  diff")
    for total in args.parents:
        for seed in args.seeds:
            parent = tmp / f"p{total}_{seed}"
            warm = round(0.1 * total)
            train(run(total, warm, seed), parent, progress=False)
            for steps in (total // 4, total // 2):
                at = (steps - round(0.2 * steps)) // 10 * 10  # last checkpoint before the decay
                b = train(run(steps, warm, seed), tmp / f"b{total}_{steps}_{seed}",
                          progress=False, branch_from=(parent, at))["val_loss"]
                own = train(run(steps, max(1, round(0.1 * steps)), seed),
                            tmp / f"w{total}_{steps}_{seed}", progress=False)["val_loss"]
                print(f"{total:6d} {seed:4d} {steps:6d} | {warm:17d} {round(0.1 * steps):4d} | "
                      f"{b:15.4f} {own:11.4f} {100 * (b / own - 1):+5.2f}%", flush=True)
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
