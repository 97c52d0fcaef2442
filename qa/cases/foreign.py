"""What users of the schedule law, the critical batch, `bring_in` and `compare` feed them from
other codebases (data built by qa/foreign.py, the way each tool writes it, read back with
pandas or a regex):

  wandb    W&B history exports (`_step` from 0, custom x-axes, NaN-padded rows of HF Trainer's
           evaluations and of Lightning's LR monitor, resumed runs, duplicate names) into
           fit_schedule_law
  nanogpt  nanoGPT's `iter N: loss X, time ...` log parsed into fit_schedule_law with the
           schedule rebuilt from get_lr
  cbtable  steps-to-target CSVs typed by hand (thousands separators, `n/a`, `>10000`, units
           in cells and headers, batches in tokens) into measure_critical_batch/fit_tradeoff
  units    papers' tables with units in the header (`params (M)`, `tokens (B)`, `PF-days`)
           or mixed units into bring_in
  cmpin    ladders from other tools (W&B summaries, strings, swapped pairs, PF-days) into
           compare

A case that must succeed checks the answer against the truth the data was built from (the
law's prediction of the cgpt-format fit, B_crit = 64, m = 2). `csvedit`: results.csv edited by
hand while a sweep runs (the sweep ends with every run `done`)."""
from qa.registry import add

H = "from qa.foreign import *\nimport analysis as A, numpy as np, pandas as pd\n"
LAW = "run(lambda: predicted(A.fit_schedule_law(c, **FIT{kw}){scale}), want=reference())"


def _near(tol: float, rel: bool = False):
    def check(r):
        import json
        if r.returncode != 0:
            return None   # a refusal is classified as such (REFUSED where it must succeed)
        try:
            out = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return f"no result on stdout: {r.stdout[-200:]!r}"
        got, want = out["value"], out["want"]
        err = abs(got - want) / (abs(want) if rel else 1)
        return None if err <= tol else f"wrong answer: {got} where the truth is {want}"
    return check


def _warned(text: str):
    def check(r):
        import json
        if r.returncode != 0:
            return None
        out = json.loads(r.stdout.strip().splitlines()[-1])
        return None if any(text in w for w in out["warnings"]) else \
            f"no warning naming {text!r} (warnings: {out['warnings']})"
    return check


def _py(group: str, name: str, expect: str, code: str, text: str | None = None,
        check=None, warn: str | None = None) -> None:
    def make(ctx):
        spec = {"python": H + code, "timeout": 300}
        if text:
            spec["expect_text"] = text
        if check:
            spec["stdout_check"] = check
        if warn:
            spec["silent_check"] = _warned(warn)
        return spec
    add(name, expect, group, make)


def law(group, name, prep: str, kw: str = "", scale: str = ""):
    """A case that must fit the same law as cgpt-format curves (final loss within 0.03);
    `scale`: the LR unit the curves are in (the prediction's schedule is divided by it)."""
    _py(group, name, "ok", prep + "\n" + LAW.format(kw=kw, scale=scale), check=_near(0.03))


def refused(group, name, prep: str, text: str, kw: str = ""):
    _py(group, name, "error", prep + "\n" + LAW.format(kw=kw, scale=""), text=text)


# ---- wandb ----------------------------------------------------------------------------------
W = "c = as_curves(pd.read_csv(wandb_export({})), {!r})"
refused("wandb", "raw_wandb_columns", "c = pd.read_csv(wandb_export())", "run_id")
refused("wandb", "underscore_step_from_0", W.format("", "_step"), "step 0")
law("wandb", "custom_step_from_1", W.format("'Step', 1", "Step"))
law("wandb", "step_as_float", W.format("'Step', 1", "Step") + "\nc['step'] = c.step * 1.0")
law("wandb", "hf_trainer_eval_rows", W.format("'Step', 1, val_rows=True", "Step"))
refused("wandb", "hf_trainer_eval_rows_val_loss", W.format("'Step', 1, val_rows=True", "Step"),
        "step 50", ", metric='val_loss'")
law("wandb", "hf_global_step_eval_rows",
    W.format("'train/global_step', 1, val_rows=True", "train/global_step"))
law("wandb", "lightning_lr_monitor_every_10",
    W.format("'step', 1, every=10, lr_every_step=True", "step"))
law("wandb", "lightning_lr_monitor_every_50",
    W.format("'step', 1, every=50, lr_every_step=True", "step"))
refused("wandb", "lightning_step_from_0", W.format("'step', 0, every=10, lr_every_step=True",
                                                   "step"), "step 0")
refused("wandb", "sampled_without_schedules", W.format("'Step', 1, every=10", "Step"),
        "schedules")
law("wandb", "sampled_with_schedules", W.format("'Step', 1, every=10", "Step")
    + "\nc = c.drop(columns=['lr'])", ", schedules={k: sched(k) for k in KINDS}")
law("wandb", "sampled_with_schedules_and_lr", W.format("'Step', 1, every=10", "Step"),
    ", schedules={k: sched(k) for k in KINDS}")
refused("wandb", "schedules_as_dataframe", W.format("'Step', 1, every=10", "Step"),
        "schedules", ", schedules=pd.DataFrame({k: sched(k) for k in KINDS})")
law("wandb", "schedules_as_lists", W.format("'Step', 1, every=10", "Step"),
    ", schedules={k: list(sched(k)) for k in KINDS}")
law("wandb", "schedules_as_series", W.format("'Step', 1, every=10", "Step"),
    ", schedules={k: pd.Series(sched(k)) for k in KINDS}")
refused("wandb", "schedules_sampled_steps_from_0", W.format("'Step', 0, every=10", "Step"),
        "shift the steps", ", schedules={k: sched(k) for k in KINDS}")
law("wandb", "loss_as_text", W.format("'Step', 1", "Step")
    + "\nc['loss'] = c.loss.map('{:.5f}'.format)")
law("wandb", "loss_nan_text_mid_run", W.format("'Step', 1", "Step")
    + "\nc['loss'] = c.loss.astype(object).where(c.step % 7 != 0, 'NaN')")
refused("wandb", "loss_inf_mid_run", W.format("'Step', 1", "Step")
        + "\nc.loc[c.step == 150, 'loss'] = np.inf", "step 150")
refused("wandb", "loss_nan_tail_diverged", W.format("'Step', 1", "Step")
        + "\nc.loc[(c.run_id == 'cos') & (c.step > 280), 'loss'] = np.nan", "281")
refused("wandb", "run_name_blank_in_rows", W.format("'Step', 1", "Step")
        + "\nc.loc[c.step == 3, 'run_id'] = np.nan", "run_id")
refused("wandb", "two_step_columns_renamed", "e = pd.read_csv(wandb_export('Step', 1))\n"
        "e['_step'] = e.Step - 1\nc = e.rename(columns={'Name': 'run_id', 'Step': 'step', "
        "'_step': 'step', 'train/loss': 'loss', 'train/lr': 'lr'})", "curves")
refused("wandb", "resumed_run_steps_logged_twice", W.format("'Step', 1", "Step")
        + "\nc = pd.concat([c, c[(c.run_id == 'cos') & c.step.between(100, 150)]])",
        "step 100")
refused("wandb", "two_runs_same_display_name", W.format("'Step', 1", "Step")
        + "\nc['run_id'] = c.run_id.replace({'wsd': 'cos'})", "run_id")
law("wandb", "extra_wandb_columns", W.format("'Step', 1", "Step")
    + "\nc['system/gpu.0.memory'] = 12.5\nc['epoch'] = c.step / 300")
law("wandb", "rows_sorted_descending", W.format("'Step', 1", "Step")
    + "\nc = c.sort_values(['run_id', 'step'], ascending=False)")
refused("wandb", "lr_logged_as_zero", W.format("'Step', 1", "Step") + "\nc['lr'] = 0.0",
        "positive lr")
law("wandb", "lr_as_multiplier", W.format("'Step', 1", "Step") + "\nc['lr'] = c.lr / PEAK",
    scale=", PEAK")
law("wandb", "lr_as_text", W.format("'Step', 1", "Step") + "\nc['lr'] = c.lr.map('{:.6e}'.format)")
refused("wandb", "summary_row_in_step_column", W.format("'Step', 1", "Step")
        + "\nc = pd.concat([c, pd.DataFrame({'run_id': ['cos'], 'step': ['Summary'], "
        "'loss': [2.5], 'lr': [1e-4]})])", "step")
law("wandb", "step_as_text", W.format("'Step', 1", "Step") + "\nc['step'] = c.step.astype(str)")
refused("wandb", "curves_a_csv_path", "c = str(wandb_export('Step', 1))", "read_csv")
refused("wandb", "curves_none", "c = None", "curves")
refused("wandb", "curves_a_list_of_frames", W.format("'Step', 1", "Step")
        + "\nc = [g for _, g in c.groupby('run_id')]", "curves")
refused("wandb", "val_loss_not_renamed", "c = as_curves(pd.read_csv(wandb_export('Step', 1)),"
        " 'Step').drop(columns=['val_loss'])", "val_loss", ", metric='val_loss'")
refused("wandb", "only_the_constant_run", W.format("'Step', 1", "Step")
        + "\nc = c[c.run_id == 'const']", "decay")
refused("wandb", "sampled_every_100_too_few", W.format("'Step', 1, every=100", "Step"),
        "after its LR peak", ", schedules={k: sched(k) for k in KINDS}")
refused("wandb", "lr_nan_where_loss_logged", W.format("'Step', 1", "Step")
        + "\nc.loc[c.step == 77, 'lr'] = np.nan", "lr")
refused("wandb", "step_with_a_gap", W.format("'Step', 1", "Step")
        + "\nc = c[c.step != 120]", "step 120")

# ---- nanogpt --------------------------------------------------------------------------------
N = ("c = pd.concat([parse_nanogpt(nanogpt_log(k{}), k{}) for k in KINDS], "
     "ignore_index=True)")
S = ", schedules=nanogpt_schedules()"
law("nanogpt", "iter_plus_one_with_get_lr", N.format("", ""), S)
law("nanogpt", "every_iter_logged", N.format(", interval=1", ""), S)
law("nanogpt", "every_50_iters", N.format(", interval=50", ""), S)
refused("nanogpt", "iter_from_0_with_get_lr", N.format("", ", plus_one=False"), "step 0", S)
refused("nanogpt", "iter_from_0_no_schedules", N.format(", interval=1", ", plus_one=False")
        + "\nc['lr'] = np.concatenate([sched(k) for k in KINDS])", "step 0")
refused("nanogpt", "no_lr_no_schedules", N.format("", ""), "schedules")
refused("nanogpt", "resumed_log_repeats_iters", N.format(", resumed_at=150", ""), "step 151", S)
refused("nanogpt", "diverged_loss_nan", N.format(", diverge_at=200", ""), "201", S)
refused("nanogpt", "get_lr_one_short", N.format(", interval=1", ""), "schedules",
        ", schedules={k: v[:-1] for k, v in nanogpt_schedules().items()}")
law("nanogpt", "get_lr_to_max_iters_inclusive", N.format("", ""),
    ", schedules=nanogpt_schedules(extra=1)")
law("nanogpt", "get_lr_as_floats", N.format("", ""),
    ", schedules={k: [float(x) for x in v] for k, v in nanogpt_schedules().items()}")
refused("nanogpt", "get_lr_with_nan", N.format("", ""), "schedules",
        ", schedules={k: np.where(np.arange(T) == 9, np.nan, v) for k, v in "
        "nanogpt_schedules().items()}")
refused("nanogpt", "get_lr_negative", N.format("", ""), "lr",
        ", schedules={k: v - 2e-4 for k, v in nanogpt_schedules().items()}")
refused("nanogpt", "same_run_id_for_all", "c = pd.concat([parse_nanogpt(nanogpt_log(k), 'ckpt')"
        " for k in KINDS], ignore_index=True)", "run_id", ", schedules={'ckpt': sched('cos')}")
refused("nanogpt", "val_lines_as_val_loss",
        "import re\nc = pd.concat([pd.DataFrame([(k, int(m[1]), float(m[2])) for m in "
        "re.finditer(r'step (\\d+): train loss [\\d.]+, val loss ([\\d.]+)', nanogpt_log(k))],"
        " columns=['run_id', 'step', 'val_loss']) for k in KINDS])\nc['step'] += 1",
        "after its LR peak", S + ", metric='val_loss'")
refused("nanogpt", "ddp_ranks_print_twice", N.format("", "") + "\nc = pd.concat([c, c])",
        "step", S)
refused("nanogpt", "schedules_keyed_by_other_names", N.format("", ""), "schedules",
        ", schedules={k + '.log': v for k, v in nanogpt_schedules().items()}")
refused("nanogpt", "schedules_for_a_run_not_parsed", N.format("", "")
        + "\nc = c[c.run_id != 'wsd']", "schedules", S)

# ---- cbtable --------------------------------------------------------------------------------
B = "rows = [{'batch_size': int(b), 'steps': steps_at(b)} for b in BATCHES]\n"
MCB = "run(lambda: float(A.measure_critical_batch(t, n_boot=50{kw})[0].b_crit.iloc[0]), " \
      "want=64.0)"


def crit(name, prep: str, kw: str = ""):
    _py("cbtable", name, "ok", B + prep + "\n" + MCB.format(kw=kw), check=_near(0.01, True))


def crit_refused(name, prep: str, text: str, kw: str = ""):
    _py("cbtable", name, "error", B + prep + "\n" + MCB.format(kw=kw), text=text)


crit("plain_csv", "t = steps_csv(rows)")
crit_refused("thousands_separators_everywhere",
             "for r in rows: r['steps'] = f\"{r['steps']:,.0f}\"\nt = steps_csv(rows)", "steps")
crit_refused("thousands_separator_in_one_row",
             "rows[0]['steps'] = f\"{rows[0]['steps']:,.0f}\"\nt = steps_csv(rows)", "steps")
for _mark in ("", "n/a", "-", "NaN", "N/A"):
    crit(f"not_reached_as_{_mark or 'blank'}".replace("/", "").replace("-", "dash"),
         f"rows[0]['steps'] = {_mark!r}\nt = steps_csv(rows)")
crit_refused("not_reached_as_greater_than", "rows[0]['steps'] = '>10000'\nt = steps_csv(rows)",
             "steps")
crit_refused("steps_with_k_suffix", "rows[0]['steps'] = '3k'\nt = steps_csv(rows)", "steps")
crit_refused("steps_as_wall_time", "rows[0]['steps'] = '1:23:45'\nt = steps_csv(rows)", "steps")
crit("steps_fractional", "for r in rows: r['steps'] = round(r['steps'], 2)\nt = steps_csv(rows)")
crit_refused("steps_zero", "rows[0]['steps'] = 0\nt = steps_csv(rows)", "steps")
crit_refused("steps_negative", "rows[0]['steps'] = -3000\nt = steps_csv(rows)", "steps")
crit("steps_inf_text_never_reached", "rows[0]['steps'] = 'inf'\nt = steps_csv(rows)")
for _h in ("batch size,steps", "Batch Size (seqs),steps", "bs,steps", "batch_size,Steps"):
    crit_refused(f"header_{_h.split(',')[0 if 'atch' in _h or 'bs' in _h else 1]}"
                 .replace(" ", "_").replace("(", "").replace(")", "") + ("_S" if "Steps" in _h
                                                                        else ""),
                 f"t = steps_csv(rows, {_h!r})", "batch_size" if "Steps" not in _h else "steps")
crit_refused("batch_size_with_unit_text",
             "for r in rows: r['batch_size'] = f\"{r['batch_size']} seqs\"\nt = steps_csv(rows)",
             "batch_size")
crit_refused("batch_size_zero", "rows[0]['batch_size'] = 0\nt = steps_csv(rows)", "batch_size")
crit_refused("batch_in_tokens_with_seq_len",
             "for r in rows: r['batch_size'] *= 2048; r['seq_len'] = 2048\nt = steps_csv(rows)",
             "tokens")
crit_refused("target_with_unit_text",
             "for r in rows: r['target'] = '3.5 nats'\nt = steps_csv(rows)", "target")
_py("cbtable", "two_targets", "ok", B + "rows2 = [dict(r, target=3.5) for r in rows] + "
    "[dict(r, target=3.3, steps=2 * r['steps']) for r in rows]\nt = steps_csv(rows2)\n"
    "run(lambda: sorted(A.measure_critical_batch(t, n_boot=50)[0].b_crit.round(3).tolist()), "
    "want=[64.0, 64.0])", check=lambda r: None if r.returncode or '"value": [64.0, 64.0]'
    in r.stdout else f"wrong answer: {r.stdout[-200:]}")
_py("cbtable", "target_reached_by_two_sizes_only", "ok", B + "rows2 = [dict(r, target=3.5) for "
    "r in rows] + [dict(r, target=3.3, steps=(2 * r['steps'] if r['batch_size'] < 128 else "
    "'')) for r in rows]\nt = steps_csv(rows2)\n"
    "run(lambda: A.measure_critical_batch(t, n_boot=50)[0].target.tolist(), want=[3.5])",
    warn="3.3")
crit_refused("model_size_as_text", "for r in rows: r['N'] = '125M'\nt = steps_csv(rows)", "'N'")
_py("cbtable", "two_models", "ok", B + "rows2 = [dict(r, N=125e6) for r in rows] + "
    "[dict(r, N=350e6, steps=2 * r['steps']) for r in rows]\nt = steps_csv(rows2)\n"
    "run(lambda: float(A.measure_critical_batch(t, n_boot=50)[0].b_crit.max()), want=64.0)",
    check=_near(0.01, True))
crit_refused("seq_len_as_text", "for r in rows: r['seq_len'] = '2k'\nt = steps_csv(rows)",
             "seq_len")
crit_refused("b_simple_as_text", "for r in rows: r['b_simple'] = 'x'\nt = steps_csv(rows)",
             "b_simple")
crit("b_simple_with_blanks", "for i, r in enumerate(rows): r['b_simple'] = '' if i % 2 else 50\n"
     "t = steps_csv(rows)")
crit("peak_lr_as_text", "for r in rows: r['peak_lr'] = '3e-4'\nt = steps_csv(rows)")
crit_refused("peak_lr_garbage", "for r in rows: r['peak_lr'] = 'x'\nt = steps_csv(rows)",
             "peak_lr")
crit_refused("two_rows_per_batch_no_peak_lr", "t = steps_csv(rows + rows)", "peak_lr")
crit("two_lrs_per_batch", "t = steps_csv([dict(r, peak_lr=1e-3) for r in rows] + "
     "[dict(r, peak_lr=3e-4, steps=r['steps'] * 1.5) for r in rows])")
crit("pandas_index_column_kept", "t = steps_csv(rows).reset_index().rename(columns={'index': "
     "'Unnamed: 0'})")
crit_refused("table_a_csv_path", "t = str(WORK / 'steps.csv')\nsteps_csv(rows)", "read_csv")
crit_refused("table_a_list_of_dicts", "t = rows", "DataFrame")
_py("cbtable", "n_boot_as_text", "error", B + "t = steps_csv(rows)\n"
    "run(lambda: A.measure_critical_batch(t, n_boot='100'))", text="n_boot")
FT = "run(lambda: A.fit_tradeoff({b}, {s}, n_boot=50).critical_batch()[0], want=64.0)"
for _n, (_b, _s, _e, _t) in {
        "tradeoff_text_with_commas": ("BATCHES", "[f'{v:,.0f}' for v in steps_at(BATCHES)]",
                                      "error", "steps"),
        "tradeoff_text_numbers": ("[str(int(b)) for b in BATCHES]", "list(map(str, "
                                  "steps_at(BATCHES)))", "ok", None),
        "tradeoff_nullable_ints": ("pd.array(BATCHES.astype(int), dtype='Int64')",
                                   "pd.array([3000, None, 1500, 1250, 1125, 1062], "
                                   "dtype='Float64')", "ok", None),
        "tradeoff_text_not_reached": ("BATCHES", "['n/a'] + list(steps_at(BATCHES[1:]))",
                                      "either", "steps"),
        "tradeoff_batch_a_dict": ("dict(enumerate(BATCHES))", "steps_at(BATCHES)", "error",
                                  "batch"),
        "tradeoff_steps_a_frame": ("BATCHES", "pd.DataFrame({'s': steps_at(BATCHES)})",
                                   "error", "1-d"),
        "tradeoff_batch_in_tokens_text": ("[f'{int(b) * 2048} tokens' for b in BATCHES]",
                                          "steps_at(BATCHES)", "error", "batch"),
}.items():
    _py("cbtable", _n, _e, FT.format(b=_b, s=_s), text=_t,
        check=_near(0.05, True) if _e != "error" else None)

# ---- units ----------------------------------------------------------------------------------
BI = "run(lambda: A.bring_in(t{kw}).to_dict('list'))"


def unit(name, prep: str, expect: str, text: str | None = None, kw: str = "", want=None):
    code = prep + "\n" + BI.format(kw=kw)
    if want is not None:
        code = prep + "\n" + f"run(lambda: {want[0]}, want={want[1]})"
    _py("units", name, expect, code, text=text,
        check=_near(1e-6, True) if want is not None else None)


NM = "n = np.array([125, 350, 760, 1300.])\n"
for _h, _scale, _word in (("params (M)", "", "million"), ("params (B)", "/ 1e3", "billion"),
                          ("Params [M]", "", "million"), ("params_M", "", "million"),
                          ("N (millions)", "", "million"), ("N (billions)", "/ 1e3",
                                                             "billion"),
                          ("params (K)", "* 1e3", "thousand")):
    unit("n_header_" + _h.replace("_", "_underscore_").replace(" ", "_").replace("(", "")
         .replace(")", "")
         .replace("[", "").replace("]", ""),
         NM + f"t = paper(N=None, **{{{_h!r}: n {_scale}}}).drop(columns=['N'])", "error",
         _word, kw=f", N={_h!r}")
for _h, _scale, _word in (("tokens (B)", "/ 1e9", "billion"), ("D (T)", "/ 1e12", "trillion"),
                          ("tokens (billions)", "/ 1e9", "billion"),
                          ("tokens_M", "/ 1e6", "million")):
    unit("d_header_" + _h.replace(" ", "_").replace("(", "").replace(")", ""),
         f"t = paper()\nt[{_h!r}] = t.D {_scale}", "error", _word, kw=f", D={_h!r}")
unit("embed_header_in_millions", "t = paper()\nt['embed (M)'] = 25.0", "error", "million",
     kw=", embed='embed (M)'")
unit("flops_header_pf_days", "t = paper()\nt['FLOPs (PF-days)'] = 6 * t.N * t.D / 8.64e19",
     "error", "PF-days", kw=", flops='counted', C='FLOPs (PF-days)'")
unit("flops_header_scale_1e18", "t = paper()\nt['C (1e18)'] = 6 * t.N * t.D / 1e18", "error",
     "1e18", kw=", flops='counted', C='C (1e18)'")
unit("flops_in_pf_days_no_header", "t = paper()\nt['C'] = 6 * t.N * t.D / 8.64e19", "error",
     "'C'", kw=", flops='counted'")
unit("flops_one_row_in_pf_days", "t = paper()\nt['C'] = 6 * t.N * t.D\n"
     "t.loc[2, 'C'] = t.loc[2, 'C'] / 8.64e19", "error", "'C'", kw=", flops='counted'")
unit("flops_counted_with_attention", "t = paper()\nt['C'] = 6 * t.N * t.D * 1.3", "ok",
     kw=", flops='counted'", want=("float(A.bring_in(t, flops='counted').C.iloc[0])",
                                   "6 * 125e6 * 2.5e9 * 1.3"))
unit("batch_header_tokens_read_as_sequences", "t = paper()\nt['batch (tokens)'] = 524288",
     "error", "tokens", kw=", batch_size='batch (tokens)'")
unit("batch_header_tokens_as_tokens", "t = paper()\nt['batch (tokens)'] = 524288", "ok",
     want=("float(A.bring_in(t, batch_size='batch (tokens)', batch='tokens', seq_len=2048)"
           ".batch_size.iloc[0])", 256.0))
unit("batch_header_seqs_as_sequences", "t = paper()\nt['batch size (seqs)'] = 256", "ok",
     want=("float(A.bring_in(t, batch_size='batch size (seqs)').batch_size.iloc[0])", 256.0))
unit("d_header_sequences_read_as_tokens", "t = paper()\nt['D (sequences)'] = t.D / 2048",
     "error", "sequences", kw=", D='D (sequences)'")
unit("d_header_sequences_as_sequences", "t = paper()\nt['D (sequences)'] = t.D / 2048", "ok",
     want=("float(A.bring_in(t, D='D (sequences)', data='sequences', seq_len=2048).D.iloc[0])",
           2.5e9))
unit("n_with_suffix_text", "t = paper(N=['125M', '350M', '760M', '1.3B'])", "error", "'N'")
unit("n_with_thousands_separators", "t = paper(N=['125,000,000'] * 4)", "error", "'N'")
unit("d_with_suffix_text", "t = paper(D=['2.5B', '7B', '15B', '26B'])", "error", "'D'")
unit("steps_with_thousands_separators", "t = paper(steps=['1,000', '2,000', '3,000', '4,000'])",
     "error", "steps")
unit("target_with_unit_text", "t = paper(target=['3.5 nats'] * 4)", "error", "target")
unit("steps_blank_where_not_reached", "t = paper(steps=['', 2000, 3000, 4000])", "ok",
     want=("float(A.bring_in(t).steps.iloc[1])", 2000.0))
unit("n_header_count_symbol", "t = paper()\nt['N (#)'] = t.N", "ok",
     want=("float(A.bring_in(t, N='N (#)').N.iloc[0])", 125e6))
unit("loss_header_nats", "t = paper()\nt['Loss (nats)'] = t.loss", "ok",
     want=("float(A.bring_in(t, loss='Loss (nats)').loss.iloc[0])", 3.2))
unit("d_in_billions_no_header", "t = paper()\nt['D'] = t.D / 1e9", "error", "billions")
unit("sequences_without_seq_len", "t = paper()", "error", "seq_len", kw=", data='sequences'")
unit("seq_len_as_text", "t = paper()", "either", "seq_len",
     kw=", data='sequences', seq_len='2048'")
unit("n_negative", "t = paper(N=[-125e6, 350e6, 760e6, 1.3e9])", "error", "'N'")
unit("embed_above_n", "t = paper()", "error", "embed", kw=", embed=2e8")

# ---- cmpin ----------------------------------------------------------------------------------
CM = "run(lambda: A.compare({a}, {b}, n_boot=200{kw}).multiplier, want=2.0)"
AB = "(LADDER, ladder_losses())", "(LADDER, ladder_losses(2.0, seed=2))"


def cmp(name, expect, a=AB[0], b=AB[1], prep="", kw="", text=None, warn=None):
    _py("cmpin", name, expect, prep + "\n" + CM.format(a=a, b=b, kw=kw), text=text,
        check=_near(0.35, True) if expect == "ok" and not warn else None, warn=warn)


SUMMARY = ("t = pd.DataFrame({'Name': list('abcdef'), 'val/loss': ladder_losses(), "
           "'flops': LADDER})\np = WORK / 'summary.csv'; t.to_csv(p, index=False)\n"
           "t = pd.read_csv(p)")
cmp("pairs_of_arrays", "ok")
cmp("wandb_summary_columns", "error", a="t", prep=SUMMARY, text="val_loss")
cmp("frame_compute_column_named_compute", "error", a="t",
    prep="t = pd.DataFrame({'val_loss': ladder_losses(), 'compute': LADDER})", text="flops")
cmp("frame_only_6nd_asked_counted", "error", a="t",
    prep="t = pd.DataFrame({'val_loss': ladder_losses(), 'flops_6nd': LADDER})", text="flops")
cmp("frame_n_params_tokens_no_flops", "error", a="t",
    prep="t = pd.DataFrame({'val_loss': ladder_losses(), 'n_params': LADDER / 1e11, "
    "'tokens': [1e11] * 6})", text="flops")
cmp("frame_with_a_crashed_run_nan", "error", a="t",
    prep="t = pd.DataFrame({'val_loss': ladder_losses(), 'flops': LADDER})\n"
    "t.loc[5, 'val_loss'] = np.nan", text="row")
cmp("series_with_nan", "error", a="(pd.Series(LADDER, name='flops'), pd.Series(np.r_["
    "ladder_losses()[:5], np.nan], name='val/loss'))", text="val/loss")
cmp("compute_as_text", "ok", a="([f'{c:.3e}' for c in LADDER], ladder_losses())")
cmp("compute_uppercase_exponent_text", "ok", a="([f'{c:.3E}' for c in LADDER], "
    "ladder_losses())")
cmp("compute_with_thousands_separators", "error", a="([f'{c:,.0f}' for c in LADDER], "
    "ladder_losses())", text="compute")
cmp("compute_with_unit_text", "error", a="([f'{c:.0e} FLOPs' for c in LADDER], "
    "ladder_losses())", text="compute")
cmp("a_dict_of_columns", "error", a="{'C': LADDER, 'L': ladder_losses()}", text="dict")
cmp("a_triple", "error", a="(LADDER, ladder_losses(), ladder_losses())", text="pair")
cmp("pair_swapped_loss_compute", "error", a="(ladder_losses(), LADDER)",
    b="(ladder_losses(2.0, seed=2), LADDER)", text="swapped")
cmp("b_in_pf_days", "ok", b="(LADDER / 8.64e19, ladder_losses(2.0, seed=2))",
    prep="import warnings", warn="overlap")
cmp("path_to_a_wandb_csv", "error", a="str(p)", prep=SUMMARY, text="run_id")
cmp("at_with_unit_text", "error", kw=", at='1e19 FLOPs'", text="at")
cmp("at_as_text", "ok", kw=", at='3e19'")
cmp("at_in_pf_days", "ok", kw=", at=0.35", warn="at")
cmp("int_flops_from_csv", "ok", a="(pd.read_csv(p).flops, ladder_losses())",
    prep="p = WORK / 'int.csv'\npd.DataFrame({'flops': [f'{int(c)}' for c in LADDER]})"
    ".to_csv(p, index=False)")
cmp("two_sizes_only", "error", a="(LADDER[:2], ladder_losses()[:2])", text="3")
cmp("seeds_share_a_size", "ok", a="(np.r_[LADDER, LADDER], np.r_[ladder_losses(), "
    "ladder_losses(seed=7)])")
cmp("one_ladder_half_in_pf_days", "error", a="(np.r_[LADDER[:3], LADDER[3:] / 8.64e19], "
    "ladder_losses())", text="compute")
cmp("flops_option_uppercase", "error", a="t", prep="t = pd.DataFrame({'val_loss': "
    "ladder_losses(), 'flops': LADDER})", kw=", flops='6ND'", text="flops")
cmp("n_boot_as_text", "error", kw=", n_boot_='x'".replace("n_boot_", "seed"), text="seed")
cmp("level_as_percent", "error", kw=", level=95", text="level")
cmp("names_of_one", "error", kw=", names=('only',)", text="names")
cmp("results_status_finished_not_done", "error", a="t",
    prep="t = pd.DataFrame({'run_id': list('abcdef'), 'status': 'finished', "
    "'val_loss': ladder_losses(), 'flops': LADDER})", text="status")
cmp("nullable_float_losses", "ok", a="(LADDER, pd.array(ladder_losses(), dtype='Float64'))")
