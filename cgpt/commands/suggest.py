"""`cgpt sweep SPEC --suggest K [--write]`: the next K runs for a finished sweep, and the spec's
`runs:` list that holds them.

A suggestion from `analysis.suggest_runs` is (n_params, tokens). A spec can only train model
shapes it names (presets, or `models:` entries), so the planner is given exactly the sweep's
model sizes (`sizes=`): each suggestion is one of the sweep's models at a token count chosen
freely. `--write` copies the spec to `<stem>_next.yaml` with the suggestions appended under
`runs:` (one `{model, tokens, seed}` each); launching the copy with the same `--out` skips the
finished grid runs and trains only the new ones.

The planner is `suggest_runs`' default (`PLANNER`, method="robust": measured on the family of
simulated studies in bench/design.py, docs/analysis.md), and no run longer than the corpus (its
training tokens, read from results.csv as tokens / epochs): L(N, D) counts fresh tokens. Its
warnings (a short reach, too few runs for a noise estimate, a budget over 100x the fitted runs'
compute: where it lost to a grid there) are printed after the table.
Notebook 05's real rounds were planned with method="bootstrap" (their plan.json).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import yaml

import analysis
from cgpt.config.run import safe_load

# suggest_runs settings: its default planner, on the forecast loss.
PLANNER = dict(objective="loss", method="robust")
MIN_RUNS = 4          # the robust planner's MAP fit plans from 4 runs (the fit itself needs 5)


def corpus_tokens(res) -> float | None:
    """The training tokens of one pass over the corpus, from results.csv (tokens / epochs; the
    smallest over runs), or None when no run recorded its epochs."""
    if "epochs" not in res.columns:
        return None
    t, e = res["tokens"].to_numpy(float), res["epochs"].to_numpy(float)
    ok = np.isfinite(e) & (e > 0)
    return float((t[ok] / e[ok]).min()) if ok.any() else None


def analysis_results(out: Path):
    """The sweep's finished runs (results.csv; a count that a log-space fit cannot take is
    refused there, naming the column and the runs)."""
    return analysis.load_results(out, finished_only=True)


def suggest(sweep, out: Path, k: int, target_flops: float | None = None,
            budget_flops: float | None = None, fit_min_flops: float | None = None):
    """The next k runs for the sweep in `out` (its results.csv), as a DataFrame with the
    model name; defaults: target 100x the largest finished run, budget the sweep's compute,
    no run past one pass over the corpus. attrs["warnings"]: the planner's warnings (where it
    lost to a grid in bench/design.py's family), which print_suggestions prints."""
    res = analysis_results(out)
    planned = {r.run_id: r.n_params for r in sweep.runs}
    off = [f"{i} ({n:g}, planned {planned[i]})" for i, n in zip(res["run_id"], res["n_params"])
           if i in planned and n != planned[i]]
    if off:  # the fit would read N of another model: rows of another sweep, or edited
        raise ValueError(f"{res.attrs['source']}: column 'n_params' differs from the sweep's "
                         f"{sweep.path} for run(s) {', '.join(off[:5])}; pass the --out of "
                         "this spec's sweep, or fix those rows")
    if len(res) < MIN_RUNS:
        raise ValueError(f"{out}: {len(res)} finished run(s); --suggest fits L(N, D) (5 "
                         f"parameters, with a prior on the exponents) and needs at least "
                         f"{MIN_RUNS} finished runs at 2 or more D/N")
    c = 6 * res["n_params"] * res["tokens"]
    kept = 0 if fit_min_flops is None else int((c >= fit_min_flops).sum())
    if fit_min_flops is not None and kept < 6:
        raise ValueError(f"--fit-min-flops {fit_min_flops:g} leaves {kept} of {len(res)} finished "
                         "runs to fit; L(N, D) needs at least 6: lower it")
    target = float(target_flops or 100 * c.max())
    budget = float(budget_flops or c.sum())
    names = {}
    for r in sweep.runs:
        names.setdefault(r.n_params, r.model if r.model else r.run_id.split("_")[0])

    corpus = corpus_tokens(res)
    with warnings.catch_warnings(record=True) as caught:    # where the planner lost to a grid
        warnings.simplefilter("always")
        s = analysis.suggest_runs(res, target, budget, max_runs=k, sizes=sorted(names),
                                  max_tokens=corpus, fit_min_flops=fit_min_flops, **PLANNER)
    plan = [w for w in caught if issubclass(w.category, UserWarning)]
    for w in caught:                                        # others (numpy's) as they were
        if w not in plan:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    s.insert(0, "model", [names[int(n)] for n in s["n_params"]])
    s["tokens"] = s["tokens"].round().astype(int)
    s.attrs.update(target=target, budget=budget, corpus=corpus,
                   warnings=[str(w.message) for w in plan])
    return s


def smallest_budget_check(res, fit_min_flops: float | None = None) -> str:
    """One line: the fit's residual sd (log L) with and without the runs at the smallest compute
    level (6ND to one significant digit), and a hint when dropping them lowers it over 2x: runs
    of a few hundred steps can sit off the law (notebook 05's 1e11 runs: 2.3% vs 0.45%)."""
    from analysis.design import fit_ls, residual_sd  # loads pandas: only when this runs

    c = (6 * res["n_params"] * res["tokens"]).to_numpy(float)
    keep = c >= (fit_min_flops or 0)
    level = np.array([float(f"{v:.0e}") for v in c])
    low = level == level[keep].min()
    rest = keep & ~low
    if rest.sum() < 7 or len(np.unique(level[rest])) < 2:
        return ""
    sds = []
    for m in (keep, rest):
        n, d, y = (res[col].to_numpy(float)[m] for col in ("n_params", "tokens", "val_loss"))
        sds.append(residual_sd(fit_ls(n, d, y, n_boot=0)[0], n, d, y))
    cut = float(f"{np.sqrt(c[keep & low].max() * c[rest].min()):.2g}")
    line = (f"fit residual sd (log L): {sds[0]:.4f} on {int(keep.sum())} runs, {sds[1]:.4f} "
            f"without the {int((keep & low).sum())} at {level[keep].min():.0e} FLOPs")
    if sds[0] > 2 * sds[1]:
        line += (f"; those runs look off the law: --fit-min-flops {cut:.2g} leaves them out of "
                 "the fit")
    return line


def print_suggestions(sweep, out: Path, k: int, target_flops=None, budget_flops=None,
                      write: bool = False, fit_min_flops: float | None = None) -> int:
    s = suggest(sweep, out, k, target_flops, budget_flops, fit_min_flops)
    corpus = s.attrs["corpus"]
    print(f"next {len(s)} run(s) for {out}: each shrinks the forecast of the compute-optimal loss "
          f"at C = {s.attrs['target']:.3g} most per FLOP; budget "
          f"{s.attrs['budget']:.3g} FLOPs (6ND), {s['flops'].sum():.3g} used; "
          + (f"at most {corpus:.4g} tokens a run (one pass over the corpus)" if corpus else
             "no token cap (results.csv has no epochs)")
          + ("" if fit_min_flops is None else f"; fit on runs >= {fit_min_flops:.3g} FLOPs"))
    print(s.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"forecast sd of log loss at the target: {s.attrs['sd_log_loss_before']:.4f} now, "
          f"{s['sd_log_loss'].iloc[-1]:.4f} with these runs (the fit's linearisation)"
          if len(s) else "")
    for w in s.attrs["warnings"]:
        print(f"warning: {w}")
    check = smallest_budget_check(analysis_results(out), fit_min_flops)
    if check:
        print(check)
    if write:
        raw = safe_load(Path(sweep.path).read_text(), str(sweep.path))  # the spec's one reader
        # A new seed: a suggestion next to a finished run is a replicate (fresh init and data
        # order), not a rerun of the same computation.
        seed = 1 + max(r.seed for r in sweep.runs)
        raw["runs"] = list(raw.get("runs") or []) + [
            {"model": m, "tokens": int(t), "seed": seed} for m, t in zip(s["model"], s["tokens"])]
        dest = Path(sweep.path).with_name(f"{Path(sweep.path).stem}_next.yaml")
        dest.write_text(yaml.safe_dump(raw, sort_keys=False))
        print(f"wrote {dest} (the spec plus these runs under runs:); launch it with "
              f"--out {out} to train only the new runs")
    return 0
