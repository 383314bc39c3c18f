"""An independent Python reference for ICL evaluation, written from LLM Foundry's behaviour as the spec describes it
(llmfoundry/eval/datasets/in_context_learning_evaluation.py, utils.py, metrics/nlp.py) over Hugging Face
`transformers` (MptForCausalLM) and `tokenizers`. LLM Foundry itself pins another torch and is not installed.

Like LLM Foundry, LM / multiple-choice / schema rows are right-padded to the full max_seq_len and scored in batches
(attention_mask = ids != pad); generation uses HF's greedy `generate`.
"""
import json
import random
import re
import string

import torch


def get_fewshot_sample_idxs(dataset_size, num_fewshot, example_idx, rng):
    num_fewshot = min(dataset_size - 1, num_fewshot)
    fewshot_idxs = set(rng.sample(range(dataset_size), num_fewshot))
    if example_idx in fewshot_idxs:
        fewshot_idxs.remove(example_idx)
        if len(fewshot_idxs) >= dataset_size - 1:
            return fewshot_idxs
        replacement_sample = rng.choice(range(dataset_size))
        while replacement_sample in fewshot_idxs or replacement_sample == example_idx:
            replacement_sample = rng.choice(range(dataset_size))
        fewshot_idxs.add(replacement_sample)
    return fewshot_idxs


def normalize_answer(answer):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def handle_punc(text):
        exclude = set(string.punctuation + "".join(["\u2018", "\u2019", "\u00b4", "`"]))
        return "".join(ch if ch not in exclude else " " for ch in text)

    return white_space_fix(remove_articles(handle_punc(answer.replace("_", " ").lower()))).strip()


class Task:
    def __init__(self, cfg, tokenizer, eos_id):
        self.cfg = cfg
        self.type = cfg["icl_task_type"]
        self.tok = tokenizer
        self.eos_id = eos_id
        self.prompt_string = cfg.get("prompt_string", "")
        self.example_delimiter = cfg.get("example_delimiter", "\n")
        self.continuation_delimiter = cfg.get("continuation_delimiter", " ")
        self.prelimiter = cfg.get("question_prelimiter", cfg.get("prelimiter", ""))
        self.seed = cfg.get("fewshot_random_seed", 1234)
        self.strip = cfg.get("strip_dataset", True)
        self.cot_delimiter = cfg.get("cot_delimiter", "")
        self.stops = cfg.get("early_stopping_criteria", []) or []
        self.do_normalization = cfg.get("do_normalization", True)
        with open(cfg["dataset_uri"]) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if self.strip:
            rows = [{k: (v.strip() if isinstance(v, str) else v) for k, v in r.items()} for r in rows]
        self.data = rows
        self.has_cot = any("chain_of_thought" in r for r in rows)
        self.prefix_space = len(self.enc(" a", False)) == 1

    def enc(self, text, special=True):
        return self.tok.encode(text, add_special_tokens=special).ids

    def answer(self, ex, in_context):
        if self.type == "multiple_choice":
            raise AssertionError("unused")
        if self.type == "generation_task_with_answers":
            if in_context and self.has_cot:  # LLM Foundry: the file has the column, whatever cot_delimiter is
                return f"{ex.get('chain_of_thought', '')}{self.cot_delimiter}{ex['answer']}"
            return ex["answer"]
        cont = ex["continuation"]
        if self.prefix_space and not cont.startswith(" ") and not in_context:
            cont = f" {cont}"
        return cont

    def construct_context(self, ex, preceding, add_answer):
        if self.type == "schema":
            ctx = ex["context_options"][ex["gold"]]
        else:
            ctx = ex["query"] if self.type == "multiple_choice" else ex["context"]
        if self.type == "schema":  # the prelimiter goes before the example delimiter
            ctx = f"{self.prelimiter}{self.example_delimiter if preceding else ''}{ctx}"
        else:
            ctx = f"{self.prelimiter}{ctx}"
            if len(preceding) > 0:
                ctx = f"{self.example_delimiter}{ctx}"
        ctx = f"{ctx}{self.continuation_delimiter}"
        if add_answer:
            if self.type == "multiple_choice":
                ctx += ex["choices"][ex["gold"]]
            else:
                ctx += self.answer(ex, True)
        return ctx

    def with_prefix(self, s):
        return f" {s}" if self.prefix_space and not s.startswith(" ") else s

    def prepare(self, num_fewshot, max_seq_len):
        """Yields (rows, gold, answers) per example; rows = [(context_ids, continuation_ids)]."""
        rng = random.Random(self.seed)
        n = len(self.data)
        answer_budget = 0
        if self.type == "generation_task_with_answers":
            for ex in self.data:
                for a in [ex["answer"]] + list(ex.get("aliases", [])):
                    resp = f"{ex.get('chain_of_thought', '')}{self.cot_delimiter}{a}" if self.has_cot else a
                    answer_budget = max(answer_budget, len(self.enc(resp)))
            answer_budget += 10 if self.cot_delimiter else 0
        self.max_answer_length = answer_budget

        def trim(ctx, cont, size):
            if len(ctx) + len(cont) > size:
                ctx = ctx[-(size - len(cont)):]
            return ctx

        out = []
        for idx, ex in enumerate(self.data):
            preamble = self.prompt_string
            if num_fewshot > 0:
                for f in get_fewshot_sample_idxs(n, num_fewshot, idx, rng):
                    preamble += self.construct_context(self.data[f], preamble, True)
            pre_ids = self.enc(preamble)
            if len(pre_ids) > 1 and pre_ids[-1] == self.eos_id:
                pre_ids = pre_ids[:-1]
            if self.type == "schema":
                cont = self.enc(self.with_prefix(ex["continuation"]), False)
                rows = []
                for opt in ex["context_options"]:
                    if len(preamble) > 0:
                        cd = self.continuation_delimiter.rstrip() if self.strip else self.continuation_delimiter
                        c = f"{self.prelimiter}{self.example_delimiter}{opt}{cd}"
                    else:
                        c = f"{self.prelimiter}{opt}"
                    rows.append((trim(pre_ids + self.enc(c, False), cont, max_seq_len), cont))
                out.append((rows, ex["gold"], None))
                continue
            ctx = self.construct_context(ex, preamble, False)
            if self.strip:
                ctx = ctx.rstrip()
            ids = pre_ids + self.enc(ctx, False)
            if self.type == "language_modeling":
                cont = self.enc(self.answer(ex, False), False)
                out.append(([(trim(ids, cont, max_seq_len), cont)], None, None))
            elif self.type == "multiple_choice":
                rows = []
                for ch in ex["choices"]:
                    cont = self.enc(self.with_prefix(ch), False)
                    rows.append((trim(ids, cont, max_seq_len), cont))
                out.append((rows, ex["gold"], None))
            else:
                out.append(([(trim(ids, [], max_seq_len - answer_budget), [])], None,
                            [ex["answer"]] + list(ex.get("aliases", []))))
        return out


def score_rows(model, rows, max_seq_len, pad_id, batch_size):
    """Per row: (argmax predictions, mean cross-entropy) over the continuation, from right-padded batches."""
    results = []
    for b in range(0, len(rows), batch_size):
        chunk = rows[b:b + batch_size]
        ids = torch.full((len(chunk), max_seq_len), pad_id, dtype=torch.long)
        for i, (ctx, cont) in enumerate(chunk):
            seq = ctx + cont
            ids[i, :len(seq)] = torch.tensor(seq)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=ids != pad_id).logits
        for i, (ctx, cont) in enumerate(chunk):
            idx = torch.arange(len(ctx), len(ctx) + len(cont))
            rows_logits = logits[i].index_select(0, idx - 1)
            target = torch.tensor(cont)
            ce = torch.nn.functional.cross_entropy(rows_logits, target).item()
            results.append((rows_logits.argmax(-1), target, ce))
    return results


def evaluate(model, task, num_fewshot, max_seq_len, pad_id, batch_size=4):
    examples = task.prepare(num_fewshot, max_seq_len)
    correct = 0
    if task.type == "generation_task_with_answers":
        for rows, _, answers in examples:
            ctx = torch.tensor([rows[0][0]])
            with torch.no_grad():
                gen = model.generate(ctx, attention_mask=torch.ones_like(ctx), max_new_tokens=task.max_answer_length,
                                     do_sample=False, use_cache=True, pad_token_id=pad_id, eos_token_id=task.eos_id)
            text = task.tok.decode(gen[0, ctx.shape[1]:].tolist(), skip_special_tokens=True)
            if task.stops:
                text = re.split("|".join(map(re.escape, task.stops)), text)[0]
            if task.cot_delimiter:
                text = text.split(task.cot_delimiter)[-1]
            if task.do_normalization:
                text = normalize_answer(text)
                labels = {normalize_answer(a) for a in answers}
            else:
                labels = set(answers)
            correct += any(text.startswith(a) for a in labels)
        return correct, len(examples)
    flat = [row for rows, _, _ in examples for row in rows]
    scored = score_rows(model, flat, max_seq_len, pad_id, batch_size)
    pos = 0
    for rows, gold, _ in examples:
        group = scored[pos:pos + len(rows)]
        pos += len(rows)
        if task.type == "language_modeling":
            pred, target, _ = group[0]
            correct += bool(torch.equal(pred, target))
        else:
            ces = [ce for _, _, ce in group]
            correct += ces.index(min(ces)) == gold
    return correct, len(examples)
