"""Tessera's `eval` command against an independent Python ICL reference (tests/compat/icl_reference.py, written from
LLM Foundry's behaviour as the spec describes it, over HF transformers' MptForCausalLM and HF tokenizers).

A small random MPT is built with HF's MptConfig and saved with save_pretrained; a byte-level BPE tokenizer is
trained by HF on the fortunes corpus. Both sides evaluate subsets (first 40 lines) of the real LLM Foundry task files
with 0 and several few-shot examples (so Python's seeded few-shot draws, delimiters, prefix spaces and left
truncation all matter), and the correct counts must be identical for every task. A random model is near chance,
so one generation task gets answers taken from the model's own greedy output (half the examples) to make exact match
non-trivial.
"""
import json
import os
import pathlib
import subprocess

import pytest
import torch
import yaml
from tokenizers import ByteLevelBPETokenizer, Tokenizer
from transformers import MptConfig, MptForCausalLM

from conftest import _binary
from icl_reference import Task, evaluate
from test_tokenizer_hf import read_fortunes

os.environ.setdefault("RAYON_NUM_THREADS", "1")
torch.set_num_threads(1)
DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "icl"  # first 40 lines of LLM Foundry's task files
MAX_SEQ_LEN = 192
TASKS = [
    dict(label="lambada_openai", file="lambada_openai.jsonl", icl_task_type="language_modeling", num_fewshot=[0, 1]),
    dict(label="jeopardy", file="jeopardy_small.jsonl", icl_task_type="language_modeling", num_fewshot=[0, 3],
         continuation_delimiter="\nAnswer: "),
    # has_categories: one evaluator per category (sorted), few-shot examples drawn within the category.
    dict(label="jeopardy_cat", file="jeopardy_small.jsonl", icl_task_type="language_modeling", num_fewshot=[0, 3],
         continuation_delimiter="\nAnswer: ", has_categories=True),
    dict(label="piqa", file="piqa.jsonl", icl_task_type="multiple_choice", num_fewshot=[0, 2],
         continuation_delimiter="\nAnswer: "),
    dict(label="copa", file="copa.jsonl", icl_task_type="multiple_choice", num_fewshot=[0, 3]),
    dict(label="arc_easy", file="arc_easy.jsonl", icl_task_type="multiple_choice", num_fewshot=[3],
         continuation_delimiter="\nAnswer: ", prompt_string="Answer the questions.\n"),
    dict(label="winograd", file="winograd_wsc.jsonl", icl_task_type="schema", num_fewshot=[0, 3]),
    dict(label="triviaqa", file="triviaqa_small.jsonl", lines=16, icl_task_type="generation_task_with_answers",
         num_fewshot=[2], early_stopping_criteria=["\n"]),
    dict(label="triviaqa_own", file=None, icl_task_type="generation_task_with_answers", num_fewshot=[0]),
]

GAUNTLET = dict(weighting="EQUAL", subtract_random_baseline=True, rescale_accuracy=True,
                averages=dict(core_average=["commonsense_reasoning", "language_understanding", "world_knowledge"]),
                categories=[
                    dict(name="commonsense_reasoning", benchmarks=[
                        dict(name="copa", num_fewshot=0, random_baseline=0.5),
                        dict(name="piqa", num_fewshot=2, random_baseline=0.5)]),
                    dict(name="language_understanding", benchmarks=[
                        dict(name="lambada_openai", num_fewshot=0, random_baseline=0.0),
                        dict(name="winograd", num_fewshot=3, random_baseline=0.5)]),
                    dict(name="world_knowledge", benchmarks=[  # dropped: mmlu was not evaluated
                        dict(name="arc_easy", num_fewshot=3, random_baseline=0.25),
                        dict(name="mmlu", num_fewshot=5, random_baseline=0.25)])])


def reference_gauntlet(results):
    """eval_gauntlet_callback.py: rescaled scores, equal-weight category means, averages of categories present."""
    cats = {}
    for cat in GAUNTLET["categories"]:
        keys = [(b["name"], b["num_fewshot"]) for b in cat["benchmarks"]]
        if any(k not in results for k in keys):
            continue
        scores = []
        for b in cat["benchmarks"]:
            correct, total = results[(b["name"], b["num_fewshot"])]
            scores.append((correct / total - b["random_baseline"]) / (1 - b["random_baseline"]))
        cats[cat["name"]] = sum(scores) / len(scores)
    for name, members in GAUNTLET["averages"].items():
        present = [cats[c] for c in members if c in cats]
        cats[name] = sum(present) / len(present) if present else 0
    return cats


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("icl")
    docs = read_fortunes()[:4000]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=1500, min_frequency=2, special_tokens=["<|endoftext|>"],
                            show_progress=False)
    bpe.save(str(tmp / "tokenizer.json"))
    tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
    torch.manual_seed(0)
    model = MptForCausalLM(MptConfig(d_model=64, n_heads=4, n_layers=2, vocab_size=tok.get_vocab_size(),
                                     max_seq_len=MAX_SEQ_LEN)).eval()
    with torch.no_grad():  # sharpen the distribution so choices are not near-ties
        model.transformer.wte.weight.mul_(4.0)
    model.save_pretrained(tmp / "hf", safe_serialization=True)
    eos = tok.token_to_id("<|endoftext|>")
    tasks = []
    for t in TASKS:
        cfg = {k: v for k, v in t.items() if k not in ("file", "lines")}
        if t["file"] is not None:
            lines = (DATA / t["file"]).read_text().splitlines()[:t.get("lines", 40)]
            cfg["dataset_uri"] = str(tmp / t["file"])
            (tmp / t["file"]).write_text("\n".join(lines) + "\n")
        tasks.append(cfg)
    # triviaqa_own: the answer of every other example is the start of the reference model's own greedy output.
    own = tasks[-1]
    own["dataset_uri"] = str(tmp / "triviaqa_own.jsonl")
    (tmp / "triviaqa_own.jsonl").write_text((tmp / "triviaqa_small.jsonl").read_text())
    ref = Task(own, tok, eos)
    prepared = ref.prepare(0, MAX_SEQ_LEN)
    rows = []
    for i, (ex, (r, _, _)) in enumerate(zip(ref.data, prepared)):
        if i % 2 == 0:
            ctx = torch.tensor([r[0][0]])
            with torch.no_grad():
                gen = model.generate(ctx, attention_mask=torch.ones_like(ctx), max_new_tokens=3, do_sample=False,
                                     pad_token_id=eos, eos_token_id=eos)
            ans = tok.decode(gen[0, ctx.shape[1]:].tolist(), skip_special_tokens=True).strip()
            ex = dict(ex, answer=ans, aliases=[ans])
        rows.append(json.dumps(ex))
    (tmp / "triviaqa_own.jsonl").write_text("\n".join(rows) + "\n")
    (tmp / "tasks.yaml").write_text(yaml.safe_dump({"icl_tasks": tasks}))
    (tmp / "gauntlet.yaml").write_text(yaml.safe_dump({"eval_gauntlet": GAUNTLET}))
    return tmp, model, tok, eos, tasks


def test_accuracies_equal_reference(setup):
    tmp, model, tok, eos, tasks = setup
    theirs = {}
    their_rows = []
    for cfg in tasks:
        # LLM Foundry's partition_dataset_by_category: a file per category (sorted), each its own dataset.
        parts = [(None, cfg)]
        if cfg.get("has_categories"):
            lines = [json.loads(line) for line in pathlib.Path(cfg["dataset_uri"]).read_text().splitlines()]
            parts = []
            for cat in sorted({r["category"] for r in lines}):
                path = tmp / f"{cat}_{pathlib.Path(cfg['dataset_uri']).name}"
                path.write_text("".join(json.dumps(r) + "\n" for r in lines if r["category"] == cat))
                parts.append((cat, dict(cfg, dataset_uri=str(path))))
        for k in cfg["num_fewshot"]:
            for cat, part in parts:
                task = Task(part, tok, eos)
                key = (cfg["label"], k) if cat is None else (cfg["label"], k, cat)
                theirs[key] = evaluate(model, task, k, MAX_SEQ_LEN, eos)
                extra = {} if cat is None else dict(category=cat)
                for i, (rows, _, _) in enumerate(task.prepare(k, MAX_SEQ_LEN)):
                    their_rows += [dict(label=cfg["label"], num_fewshot=k, **extra, example=i, context=c,
                                        continuation=n) for c, n in rows]
    print(json.dumps({"/".join([key[0], f"{key[1]}-shot", *key[2:]]): v for key, v in theirs.items()}))
    binary = _binary("TESSERA_EVAL_BIN", "eval")
    proc = subprocess.run([binary, "--model", tmp / "hf", "--tokenizer", tmp / "tokenizer.json", "--tasks",
                           tmp / "tasks.yaml", "--gauntlet", tmp / "gauntlet.yaml", "--output", tmp / "results.json",
                           "--dump-rows", tmp / "rows.jsonl", "--precision", "fp32"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp / "results.json").read_text())
    ours = {(r["label"], r["num_fewshot"], r["category"]) if "category" in r else (r["label"], r["num_fewshot"]):
            (r["correct"], r["total"]) for r in doc["results"]}
    assert {k[2] for k in ours if len(k) == 3} == {"word_origins", "world_history"}
    # The same prompts token for token (few-shot draws, delimiters, prefix spaces, truncation), then the same counts.
    our_rows = [json.loads(line) for line in (tmp / "rows.jsonl").read_text().splitlines()]
    assert len(our_rows) == len(their_rows)
    for a, b in zip(our_rows, their_rows):
        assert a == b
    assert any(len(r["context"]) + len(r["continuation"]) == MAX_SEQ_LEN for r in our_rows)  # truncation happened
    assert ours == theirs
    # One row per forward pass, and split over 3 ranks (the eval launcher) in batches of 3 that do not divide the
    # rows evenly: the same counts and gauntlet scores as batches of 8 (the default) in one process.
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in doc["results"]]
    for name, extra in (("results1.json", ["--batch-size", "1"]),
                        ("results3.json", ["--nproc-per-node", "3", "--master-port", "0", "--batch-size", "3"])):
        proc = subprocess.run([binary, "--model", tmp / "hf", "--tokenizer", tmp / "tokenizer.json", "--tasks",
                               tmp / "tasks.yaml", "--gauntlet", tmp / "gauntlet.yaml", "--output", tmp / name,
                               "--precision", "fp32", *extra], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        other = json.loads((tmp / name).read_text())
        assert [{k: v for k, v in r.items() if k != "seconds"} for r in other["results"]] == strip, name
        assert other["eval_gauntlet"] == doc["eval_gauntlet"], name
    expected = reference_gauntlet(theirs)
    assert list(doc["eval_gauntlet"]) == list(expected)  # world_knowledge dropped
    assert doc["eval_gauntlet"] == pytest.approx(expected, abs=1e-12)
    # Not all trivially zero: the multiple-choice tasks and the model's own answers score.
    assert theirs[("triviaqa_own", 0)][0] >= 6
    assert sum(v[0] for key, v in theirs.items() if key[0] in ("piqa", "copa", "winograd")) > 20


def test_malformed_line_names_file_and_line(setup, tmp_path):
    tmp = setup[0]
    (tmp_path / "bad.jsonl").write_text('{"query": "q", "choices": ["a", "b"], "gold": 0}\n{"query": "q", "gold": 0}\n')
    (tmp_path / "tasks.yaml").write_text(yaml.safe_dump({"icl_tasks": [
        dict(label="bad", dataset_uri=str(tmp_path / "bad.jsonl"), icl_task_type="multiple_choice",
             num_fewshot=[0])]}))
    proc = subprocess.run([_binary("TESSERA_EVAL_BIN", "eval"), "--model", tmp / "hf", "--tokenizer",
                           tmp / "tokenizer.json", "--tasks", tmp_path / "tasks.yaml"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"{tmp_path / 'bad.jsonl'}:2: `choices`: expected a list of strings" in proc.stderr


def test_task_files_in_object_storage_score_as_the_local_ones(setup, tmp_path):
    # dataset_uri may name an object store, as in LLM Foundry: the tasks read from a loopback Azure Blob service
    # give the counts the same files give locally; a scheme the storage layer lacks is refused naming the key.
    from azure_server import AzureBlobServer

    tmp, tasks = setup[0], setup[4]
    picked = [t for t in tasks if t["label"] in ("copa", "triviaqa_own")]
    server = AzureBlobServer()
    try:
        server.client().create_container("icl")
        for t in picked:
            server.client().get_blob_client("icl", pathlib.Path(t["dataset_uri"]).name).upload_blob(
                pathlib.Path(t["dataset_uri"]).read_bytes())
        remote = [dict(t, dataset_uri=f"azure://icl/{pathlib.Path(t['dataset_uri']).name}") for t in picked]
        counts = {}
        for name, chosen in (("local", picked), ("remote", remote)):
            (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({"icl_tasks": chosen}))
            proc = subprocess.run([_binary("TESSERA_EVAL_BIN", "eval"), "--model", tmp / "hf", "--tokenizer",
                                   tmp / "tokenizer.json", "--tasks", tmp_path / f"{name}.yaml", "--output",
                                   tmp_path / f"{name}.json", "--precision", "fp32"], capture_output=True, text=True,
                                  env=server.env())
            assert proc.returncode == 0, proc.stderr
            counts[name] = [(r["label"], r["num_fewshot"], r["correct"], r["total"])
                            for r in json.loads((tmp_path / f"{name}.json").read_text())["results"]]
        assert counts["remote"] == counts["local"] and len(counts["local"]) == 3
        assert any(s[0] == "GET" and s[1].endswith("/icl/copa.jsonl") for s in server.seen)
    finally:
        server.stop()
    (tmp_path / "ftp.yaml").write_text(yaml.safe_dump({"icl_tasks": [dict(picked[0], dataset_uri="ftp://b/x.jsonl")]}))
    proc = subprocess.run([_binary("TESSERA_EVAL_BIN", "eval"), "--model", tmp / "hf", "--tokenizer",
                           tmp / "tokenizer.json", "--tasks", tmp_path / "ftp.yaml"], capture_output=True, text=True)
    assert proc.returncode != 0 and "dataset_uri" in proc.stderr and "unsupported scheme" in proc.stderr, proc.stderr


def test_precision_bf16_on_the_cpu_and_fp16_refused(setup):
    # --precision amp_bf16 autocasts the forward passes on the CPU (what `auto` picks where bf16 is native): every
    # task is scored, and a multiple-choice task's pick moves only where the random model's choices are near ties.
    tmp, _, _, _, _ = setup
    binary = _binary("TESSERA_EVAL_BIN", "eval")
    common = [binary, "--model", tmp / "hf", "--tokenizer", tmp / "tokenizer.json", "--tasks", tmp / "tasks.yaml"]
    runs = {}
    for precision in ("fp32", "amp_bf16"):
        out = tmp / f"results_{precision}.json"
        proc = subprocess.run([*common, "--precision", precision, "--output", out], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert f"on cpu in {precision}" in proc.stderr, proc.stderr
        runs[precision] = {(r["label"], r["num_fewshot"], r.get("category")): (r["correct"], r["total"])
                           for r in json.loads(out.read_text())["results"]}
    assert runs["amp_bf16"].keys() == runs["fp32"].keys()
    for key, (correct, total) in runs["fp32"].items():
        assert runs["amp_bf16"][key][1] == total, key
    agree = sum(min(runs["amp_bf16"][k][0], c) for k, (c, _) in runs["fp32"].items())
    print({k: (runs["fp32"][k][0], runs["amp_bf16"][k][0]) for k in runs["fp32"]})
    assert agree >= 0.8 * sum(c for c, _ in runs["fp32"].values()), runs
    proc = subprocess.run([*common, "--precision", "amp_fp16"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "--precision amp_fp16 needs a GPU" in proc.stderr, proc.stderr


def test_the_tokenizer_defaults_to_the_model_folders(setup, tmp_path):
    # Without --tokenizer, eval reads the model folder's tokenizer (an HF folder or an hf_checkpointer export has
    # one); a folder without one is a usage error that says what to give.
    import shutil
    tmp, _, _, _, tasks = setup
    binary = _binary("TESSERA_EVAL_BIN", "eval")
    # One task is enough to tell which tokenizer was read.
    (tmp_path / "piqa.yaml").write_text(yaml.safe_dump({"icl_tasks": [t for t in tasks if t["label"] == "piqa"]}))
    args = ["--tasks", tmp_path / "piqa.yaml", "--precision", "fp32", "--batch-size", "4"]
    proc = subprocess.run([binary, "--model", tmp / "hf", *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "give --tokenizer" in proc.stderr and str(tmp / "hf") in proc.stderr, proc.stderr
    shutil.copytree(tmp / "hf", tmp_path / "hf")
    shutil.copy(tmp / "tokenizer.json", tmp_path / "hf" / "tokenizer.json")
    runs = []
    for extra in ([], ["--tokenizer", tmp / "tokenizer.json"]):
        proc = subprocess.run([binary, "--model", tmp_path / "hf", *extra, *args], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        runs.append(proc.stdout)
    assert runs[0] == runs[1] and "metrics/piqa/0-shot/InContextLearningMultipleChoiceAccuracy" in runs[0]
