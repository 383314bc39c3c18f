"""Tessera's `eval` command against LLM Foundry's own ICL evaluation: its dataloaders
(llmfoundry.utils.builders.build_icl_evaluators -> llmfoundry/eval/datasets/in_context_learning_evaluation.py) and its
metrics (llmfoundry/eval/metrics/nlp.py: InContextLearningLMAccuracy, ...MultipleChoiceAccuracy,
...GenerationExactMatchAccuracy), run by Composer's Trainer.eval over LLM Foundry's ComposerMPTCausalLM.

A small random MPT is built by LLM Foundry (ComposerMPTCausalLM -> MPTForCausalLM, attn_impl torch) and written with
save_pretrained; a byte-level BPE tokenizer is trained by HF `tokenizers` on the Debian fortunes and wrapped for LLM
Foundry in transformers' PreTrainedTokenizerFast (eos = pad = <|endoftext|>). Both sides read the same task YAML over
subsets of LLM Foundry's task files (tests/data/icl/) covering all four task types, 0 and 1-3 few-shot examples
(seeded draws), prompt strings, delimiters, prelimiters, chain of thought, stop strings, left truncation to
max_seq_len and has_categories.

- Prompts: every row LLM Foundry's dataloaders batch (right-padded LM / multiple-choice / schema rows, cut at their
  `continuation_indices`; left-padded generation prompts) equals the row Tessera dumps (--dump-rows), token for token.
- Scores: for every (task, few-shot, category) LLM Foundry's metric counts equal Tessera's correct/total exactly.
A random model is near chance (0 on lambada), so one LM and one generation task take half their answers from the
model's own greedy output.
"""
import copy
import json
import os
import pathlib
import subprocess

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from composer import Trainer  # noqa: E402
from llmfoundry.models.mpt import ComposerMPTCausalLM  # noqa: E402
from llmfoundry.utils.builders import build_icl_evaluators  # noqa: E402
from tokenizers import ByteLevelBPETokenizer  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

torch.set_num_threads(1)
ROOT = pathlib.Path(__file__).resolve().parents[2]
EVAL = os.environ.get("TESSERA_EVAL_BIN", str(ROOT / "build" / "bin" / "eval"))
DATA = ROOT / "tests" / "data" / "icl"  # first 40 lines of LLM Foundry's task files
FORTUNES = pathlib.Path("/usr/share/games/fortunes")
EOS = "<|endoftext|>"
MAX_SEQ_LEN = 192
TASKS = [
    dict(label="lambada_openai", file="lambada_openai.jsonl", icl_task_type="language_modeling", num_fewshot=[0, 1]),
    dict(label="lambada_own", file="lambada_openai.jsonl", icl_task_type="language_modeling", num_fewshot=[0]),
    dict(label="jeopardy", file="jeopardy_small.jsonl", icl_task_type="language_modeling", num_fewshot=[0, 3],
         continuation_delimiter="\nAnswer: "),
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
    dict(label="triviaqa_own", file="triviaqa_small.jsonl", lines=16, icl_task_type="generation_task_with_answers",
         num_fewshot=[0]),
    # Where LLM Foundry's order is its own: a schema prelimiter goes before the example delimiter; chain of thought is
    # on when the file has the `chain_of_thought` column (add_cot writes one), whatever cot_delimiter is.
    dict(label="winograd_pre", file="winograd_wsc.jsonl", icl_task_type="schema", num_fewshot=[3], prelimiter="P: "),
    dict(label="triviaqa_delim_only", file="triviaqa_small.jsonl", lines=16,
         icl_task_type="generation_task_with_answers", num_fewshot=[2], cot_delimiter="The answer is ",
         early_stopping_criteria=["\n"]),
    dict(label="triviaqa_cot_only", file="triviaqa_small.jsonl", lines=16,
         icl_task_type="generation_task_with_answers", num_fewshot=[2], add_cot="Think about it."),
    dict(label="triviaqa_cot", file="triviaqa_small.jsonl", lines=16, icl_task_type="generation_task_with_answers",
         num_fewshot=[2], add_cot="Think about it.", cot_delimiter=" So: "),
]
OWN = {"lambada_own": "continuation", "triviaqa_own": "answer"}  # every other example: the model's greedy output


def fortunes(limit=4000):
    if not FORTUNES.is_dir():
        pytest.fail(f"{FORTUNES} missing: install the Debian package `fortunes` (tools/setup.sh)")
    docs = []
    for path in sorted(p for p in FORTUNES.iterdir() if p.is_file() and not p.suffix and not p.is_symlink()):
        docs += [d for d in path.read_text(errors="replace").split("\n%\n") if d.strip()]
    return docs[:limit]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("icl")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(fortunes(), vocab_size=1500, min_frequency=2, special_tokens=[EOS], show_progress=False)
    bpe.save(str(tmp / "tokenizer.json"))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tmp / "tokenizer.json"), eos_token=EOS, pad_token=EOS)
    torch.manual_seed(0)
    composer_model = ComposerMPTCausalLM(
        tokenizer=tok, loss_fn="torch_crossentropy", d_model=64, n_heads=4, n_layers=2, max_seq_len=MAX_SEQ_LEN,
        vocab_size=len(tok), attn_config={"attn_impl": "torch"})
    model = composer_model.model.eval()
    with torch.no_grad():  # sharpen the distribution so choices are not near-ties
        model.transformer.wte.weight.mul_(4.0)
    model.save_pretrained(tmp / "hf", safe_serialization=True)

    tasks = []
    for t in TASKS:
        lines = (DATA / t["file"]).read_text().splitlines()[:t.get("lines", 40)]
        if t["label"] in OWN:
            lines = [own_answer(model, tok, json.loads(line), OWN[t["label"]]) if i % 2 == 0 else line
                     for i, line in enumerate(lines)]
        if "add_cot" in t:
            lines = [json.dumps(dict(json.loads(line), chain_of_thought=t["add_cot"])) for line in lines]
        (tmp / f"{t['label']}.jsonl").write_text("\n".join(lines) + "\n")
        cfg = {k: v for k, v in t.items() if k not in ("file", "lines", "add_cot")}
        tasks.append(dict(cfg, dataset_uri=str(tmp / f"{t['label']}.jsonl")))
    (tmp / "tasks.yaml").write_text(yaml.safe_dump({"icl_tasks": tasks}))
    return tmp, composer_model, tok, tasks


def own_answer(model, tok, example, field):
    """The example with `field` (and aliases) replaced by the start of the model's greedy output for its context."""
    ids = torch.tensor([tok(example["context"].strip(), add_special_tokens=False)["input_ids"][-(MAX_SEQ_LEN - 3):]])
    with torch.no_grad():
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                             pad_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    answer = tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True).strip()
    return json.dumps(dict(example, **{field: answer}, **({"aliases": [answer]} if "aliases" in example else {})))


def key_of(label):
    """LLM Foundry's evaluator label `{label}/{k}-shot[/{category}]` -> (label, k[, category])."""
    name, shots, *cat = label.split("/")
    return (name, int(shots.removesuffix("-shot")), *cat)


def foundry_rows(evaluator, pad_id):
    """Every row of an evaluator's batches, unpadded: (example index, context ids, continuation ids)."""
    rows, example = [], 0
    for batch in evaluator.dataloader.dataloader:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        if batch["mode"] == "generate":  # left-padded prompt, nothing to score
            for i in range(ids.shape[0]):
                start = int((~mask[i]).sum())
                assert not mask[i, :start].any() and mask[i, start:].all()
                rows.append((example, ids[i, start:].tolist(), []))
                example += 1
            continue
        groups = batch.get("choice_groupings") or [(i, i + 1) for i in range(ids.shape[0])]
        for start, end in groups:  # one group of rows (choices) per example
            for i in range(start, end):
                span = batch["continuation_indices"][i]
                first, last = int(span[0]), int(span[-1]) + 1
                assert span.tolist() == list(range(first, last)) and (ids[i, last:] == pad_id).all()
                rows.append((example, ids[i, :first].tolist(), ids[i, first:last].tolist()))
            example += 1
    return rows


def test_prompts_and_accuracies_equal_llm_foundry(setup):
    tmp, composer_model, tok, tasks = setup
    (tmp / "foundry").mkdir()  # where LLM Foundry copies (and partitions) the task files
    evaluators, _ = build_icl_evaluators(copy.deepcopy(tasks), tok, default_max_seq_len=MAX_SEQ_LEN,
                                         default_batch_size=4, destination_dir=str(tmp / "foundry"))
    their_rows = []
    for ev in evaluators:
        key = key_of(ev.label)
        extra = dict(category=key[2]) if len(key) == 3 else {}
        their_rows += [dict(label=key[0], num_fewshot=key[1], **extra, example=e, context=c, continuation=n)
                       for e, c, n in foundry_rows(ev, tok.pad_token_id)]

    trainer = Trainer(model=composer_model, eval_dataloader=evaluators, device="cpu", progress_bar=False,
                      log_to_console=False, loggers=[])
    trainer.eval()
    theirs = {}
    for ev in evaluators:
        (metric,) = trainer.state.eval_metrics[ev.label].values()
        theirs[key_of(ev.label)] = (metric.correct.item(), metric.total.item(), metric.compute().item())
    print(json.dumps({"/".join(map(str, k)): v[:2] for k, v in theirs.items()}))

    proc = subprocess.run([EVAL, "--model", tmp / "hf", "--tokenizer", tmp / "tokenizer.json", "--tasks",
                           tmp / "tasks.yaml", "--output", tmp / "results.json", "--dump-rows", tmp / "rows.jsonl",
                           "--precision", "fp32"],  # as Composer evaluates on the CPU
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp / "results.json").read_text())["results"]
    ours = {(r["label"], r["num_fewshot"], *([r["category"]] if "category" in r else [])):
            (r["correct"], r["total"], r["accuracy"]) for r in results}
    our_rows = [json.loads(line) for line in (tmp / "rows.jsonl").read_text().splitlines()]

    # The same prompts token for token: few-shot draws, delimiters, prefix spaces, stripping, left truncation.
    assert len(our_rows) == len(their_rows)
    for a, b in zip(our_rows, their_rows):
        assert a == b
    assert any(len(r["context"]) + len(r["continuation"]) == MAX_SEQ_LEN for r in our_rows)  # truncation happened
    # The same predictions: LLM Foundry's metric states (float32 tensors holding exact integers) equal Tessera's counts;
    # its compute() (correct / total in float32) equals Tessera's accuracy up to float32 rounding.
    assert list(ours) == list(theirs)
    for key, (correct, total, accuracy) in ours.items():
        their_correct, their_total, their_accuracy = theirs[key]
        assert (their_correct, their_total) == (correct, total), key
        assert their_accuracy == pytest.approx(accuracy, abs=1e-7), key
    assert {k[2] for k in ours if len(k) == 3} == {"word_origins", "world_history"}
    # Not vacuous: multiple choice and the model's own answers score.
    assert ours[("lambada_own", 0)][0] >= 4 and ours[("triviaqa_own", 0)][0] >= 4
    assert sum(v[0] for k, v in ours.items() if k[0] in ("piqa", "copa", "winograd")) > 20
