"""lm-evaluation-harness: the `cgpt` model agrees with lm-eval's own `hf` model."""
import json
import sys

import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lm_eval.api.instance import Instance  # noqa: E402

from cgpt.cli import main  # noqa: E402

TEXT = ("The cat sat on the mat. A dog ran in the park. Birds sing in the morning. "
        "Rain falls on the hills and the rivers run to the sea. ") * 20
QUESTIONS = [
    ("Where did the cat sit?", ["on the mat", "in the sea", "under a hill"], 0),
    ("What do birds do?", ["run in the park", "sing in the morning", "fall"], 1),
    ("Where do rivers run?", ["to the mat", "to the park", "to the sea"], 2),
    ("What falls on the hills?", ["rain", "the cat", "a dog"], 0),
    ("Who ran in the park?", ["the sea", "a dog", "the morning"], 1),
    ("What does the dog do?", ["sings", "falls", "runs"], 2),
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A random GPT-2 (exact GELU, as Cerebras-GPT) with a small byte-level BPE tokenizer,
    saved by transformers so both harness models read the same directory."""
    from cgpt.data.tokenizer import train_tokenizer

    tok = train_tokenizer([[TEXT]], 320)  # byte-level BPE with <|endoftext|>, as GPT-2's
    d = tmp_path_factory.mktemp("gpt2") / "ckpt"
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                                bos_token="<|endoftext|>")
    fast.save_pretrained(d)
    eot = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64,
                                  vocab_size=tok.get_vocab_size(), activation_function="gelu",
                                  resid_pdrop=0.0, attn_pdrop=0.0, embd_pdrop=0.0,
                                  initializer_range=0.3, bos_token_id=eot, eos_token_id=eot)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def models(ckpt):
    from lm_eval.models.huggingface import HFLM

    from cgpt.eval.harness import CgptLM

    hf = HFLM(pretrained=str(ckpt), dtype="float32", batch_size=1, device="cpu")
    return hf, CgptLM(pretrained=str(ckpt), batch_size=4)


def _req(kind, args, i):
    return Instance(request_type=kind, doc={}, arguments=args, idx=i)


def test_loglikelihood_matches_hf(models):
    hf, ours = models
    args = [(q, " " + c) for q, cs, _ in QUESTIONS for c in cs]
    args += [("", "The cat sat"), ("Rain falls on the", " hills"), (TEXT[:400], " sea.")]
    reqs = [_req("loglikelihood", a, i) for i, a in enumerate(args)]
    ref, got = hf.loglikelihood(reqs), ours.loglikelihood(reqs)
    np.testing.assert_allclose([g[0] for g in got], [r[0] for r in ref], atol=1e-4)
    assert [g[1] for g in got] == [r[1] for r in ref]


def test_rolling_and_generation_match_hf(models):
    hf, ours = models
    texts = [TEXT[:60], TEXT[:700], "x"]  # 700 characters span several 64-token windows
    reqs = [_req("loglikelihood_rolling", (t,), i) for i, t in enumerate(texts)]
    np.testing.assert_allclose(ours.loglikelihood_rolling(reqs), hf.loglikelihood_rolling(reqs),
                               atol=1e-4)
    gen = [("The cat", {"until": ["."], "max_gen_toks": 12, "do_sample": False}),
           ("Birds sing in", {"until": ["\n"], "max_gen_toks": 8}),
           ("A dog", {"until": ["park"], "max_gen_toks": 12, "do_sample": False})]
    reqs = [_req("generate_until", a, i) for i, a in enumerate(gen)]
    assert ours.generate_until(reqs) == hf.generate_until(reqs)


@pytest.mark.slow(reason="test_rolling_and_generation_match_hf")
def test_generation_of_many_prompt_lengths_matches_hf_in_few_compilations(models):
    """20 prompts of at least 18 token lengths (the longest truncated to 58 of the 64-token
    context, as `hf` truncates): the same texts as lm-eval's `hf` model, from one compiled program per bucket
    length (16, 32, 64) rather than one per prompt length."""
    from cgpt.eval.harness import _bucket
    from cgpt.eval.lm import _generate

    hf, ours = models
    words = TEXT.split(" ")
    gen = [(" ".join(words[:k]), {"until": ["\n\n"], "max_gen_toks": 6, "do_sample": False})
           for k in range(1, 60, 3)]
    lengths = [len(ours.tok_encode(c)) for c, _ in gen]
    assert len(set(lengths)) >= 18 and max(lengths) > 64  # the longest are truncated
    reqs = [_req("generate_until", a, i) for i, a in enumerate(gen)]
    _generate.clear_cache()
    got = ours.generate_until(reqs)
    buckets = {_bucket(min(n, 64 - 6), 64) for n in lengths}
    assert 2 <= _generate._cache_size() <= len(buckets) == 3
    assert got == hf.generate_until(reqs)
    assert len({g for g in got}) > 3  # non-degenerate continuations


def _task(tmp_path):
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n"
                            for q, c, a in QUESTIONS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "local_mc.yaml").write_text(f"""\
task: cgpt_local_mc
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: {data}
  cache_dir: {tmp_path / "hf_datasets"}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
""")
    return tasks


@pytest.mark.slow(reason="lm-eval scoring equal to hf: test_loglikelihood_matches_hf")
def test_local_task_same_accuracy_as_hf(models, ckpt, tmp_path, monkeypatch):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    manager = TaskManager(include_path=str(_task(tmp_path)))
    runs = {name: simple_evaluate(model=m, tasks=["cgpt_local_mc"], task_manager=manager,
                                  bootstrap_iters=0, log_samples=True)
            for name, m in zip(("hf", "cgpt"), models)}
    res = {k: r["results"]["cgpt_local_mc"]["acc,none"] for k, r in runs.items()}
    assert res["cgpt"] == res["hf"]
    ll = {k: [[x[0] for x in s["filtered_resps"]] for s in r["samples"]["cgpt_local_mc"]]
          for k, r in runs.items()}
    np.testing.assert_allclose(ll["cgpt"], ll["hf"], atol=1e-4)
    assert len(ll["cgpt"]) == len(QUESTIONS)
    # the registered name and model_args, as `lm_eval --model cgpt --model_args ...` uses them
    by_name = simple_evaluate(model="cgpt", model_args=f"pretrained={ckpt},batch_size=3",
                              tasks=["cgpt_local_mc"], task_manager=manager, bootstrap_iters=0)
    assert by_name["results"]["cgpt_local_mc"]["acc,none"] == res["hf"]


@pytest.mark.slow  # the CLI twin of test_local_task_same_accuracy_as_hf
def test_cli_eval_tasks_writes_results_beside_the_run(ckpt, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tasks = _task(tmp_path)
    rc = main(["eval", str(ckpt), "--tasks", "cgpt_local_mc", "--include-path", str(tasks),
               "--batch-size", "4", "--bootstrap-iters", "0"])
    assert rc == 0, capsys.readouterr().err
    (out,) = (ckpt / "lm_eval").glob("results_*.json")
    res = json.loads(out.read_text())
    assert 0 <= res["results"]["cgpt_local_mc"]["acc,none"] <= 1
    assert main(["eval", str(ckpt), "--tasks", "no_such_task", "--include-path",
                 str(tasks)]) == 2
    assert "unknown lm-eval task(s) ['no_such_task']" in capsys.readouterr().err


def test_missing_lm_eval_is_a_clear_error(ckpt, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    monkeypatch.delitem(sys.modules, "cgpt.eval.harness", raising=False)
    assert main(["eval", str(ckpt), "--tasks", "hellaswag"]) == 2
    assert "pip install lm-eval==0.4.13" in capsys.readouterr().err
