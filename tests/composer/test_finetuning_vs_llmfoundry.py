"""tessera_compat_driver finetuning-batches against LLM Foundry's own fine-tuning loader
(llmfoundry.data.finetuning.build_finetuning_dataloader: HF `datasets` loading, tokenize_formatted_example with the
tokenizer's chat template or LLM Foundry's ChatML fallback, is_valid_ift_example filtering, Composer's
dist.get_sampler, Seq2SeqFinetuningCollator and BinPackCollator), on the same JSONL / JSON files and the same
tokenizer folder. Every batch of a rank's epoch must hold the same input_ids, labels, attention_mask and sequence_id,
token for token, and the driver must report LLM Foundry's number of valid / dropped examples and its packing ratio
(after `auto` profiling).

Tokenizers are trained here from the fortunes corpus (no downloads): A is byte-level BPE with eos only (LLM Foundry
pads with eos) and no chat template (LLM Foundry's ChatML fallback); B is a SentencePiece-style BPE whose
post-processor adds <s> (LLM Foundry strips it from prompt/response labels) with the Llama 3.1 template (bos_token,
date_string, the tool role as ipython + tojson); C is A with an explicit pad token, padding_side left and Zephyr's
template. Composer's world size and rank are simulated by giving dist.get_sampler num_replicas / rank (and `auto`
packing takes the minimum over ranks, as the all-reduce of a real multi-rank run does).
"""
import copy
import importlib
import json
import os
import pathlib
import random
import subprocess

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import composer.utils.dist as composer_dist  # noqa: E402
import numpy as np  # noqa: E402
import datasets  # noqa: E402
import gzip  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.csv as pacsv  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402
from llmfoundry.data.finetuning import build_finetuning_dataloader  # noqa: E402
from streaming import MDSWriter  # noqa: E402
from streaming.base.util import clean_stale_shared_memory  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

ft_dataloader = importlib.import_module("llmfoundry.data.finetuning.dataloader")
ft_tasks = importlib.import_module("llmfoundry.data.finetuning.tasks")

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIVER = os.environ.get("TESSERA_COMPAT_DRIVER", str(ROOT / "build" / "bin" / "tessera_compat_driver"))
FORTUNES = pathlib.Path("/usr/share/games/fortunes")
TEMPLATES = ROOT / "tests" / "data" / "chat_templates"
DATE = "24 Nov 2026"
KEYS = ("input_ids", "labels", "attention_mask", "sequence_id")
UNICODE = ["ünïcödé ✓ 漢字 😀", "naïve café — «quoted» ½ ∑ π", "Ελληνικά и кириллица",
           "tabs\tand\nnewlines  "]


def fortunes():
    docs = []
    for name in ("computers", "science", "wisdom", "people"):
        text = (FORTUNES / name).read_text(errors="replace")
        docs += [d.strip() for d in text.split("\n%\n") if d.strip()][:250]
    return docs


# ---------------------------------------------------------------------------------------------------------------
# Tokenizers

def _byte_level(docs):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=1000, min_frequency=2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]))
    return tok


def _sentencepiece_style(docs):
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=1000, min_frequency=2,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]))
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    return tok


@pytest.fixture(scope="module")
def tokenizers_(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    docs = fortunes() + UNICODE * 3
    byte_level = _byte_level(docs)
    sp = _sentencepiece_style(docs)
    out = {}
    # A: eos only, no pad (LLM Foundry pads with eos), no chat template (LLM Foundry's ChatML fallback).
    hf = PreTrainedTokenizerFast(tokenizer_object=byte_level, eos_token="<|endoftext|>")
    hf.save_pretrained(root / "A")
    out["A"] = root / "A"
    # B: <s> added by the post-processor, Llama 3.1's template (bos_token, date_string, tool -> ipython).
    hf = PreTrainedTokenizerFast(tokenizer_object=sp, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                 unk_token="<unk>")
    hf.chat_template = (TEMPLATES / "llama3.1_tools.jinja").read_text()
    hf.save_pretrained(root / "B")
    out["B"] = root / "B"
    # C: A's model with its own pad token, left padding and Zephyr's template (eos_token inside the template).
    hf = PreTrainedTokenizerFast(tokenizer_object=byte_level, eos_token="<|endoftext|>", pad_token="<pad>",
                                 padding_side="left")
    hf.chat_template = (TEMPLATES / "zephyr.jinja").read_text()
    hf.save_pretrained(root / "C")
    out["C"] = root / "C"
    return out


# ---------------------------------------------------------------------------------------------------------------
# Data

def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


class Texts:
    """Fortunes by length: short (<= 80 characters, ~23 tokens), medium (<= 200), long (the rest)."""

    def __init__(self, docs, seed):
        self.rng = random.Random(seed)
        self.short = [d for d in docs if len(d) <= 80]
        self.medium = [d for d in docs if 80 < len(d) <= 200]
        self.long = [d for d in docs if len(d) > 200]

    def text(self):
        return self.rng.choice(self.short if self.rng.random() < 0.6 else self.medium)

    def huge(self, n):
        return "\n\n".join(self.rng.sample(self.long, n))


def _prompt_response_rows(t, n, response_key="response"):
    rows = []
    for i in range(n):
        prompt, response = t.text(), t.text()
        if i % 7 == 3:  # prompts long enough to leave no response within max_seq_len (dropped with prompts none)
            prompt = t.huge(2)
        if i % 9 == 5:  # long responses: truncated, but keep loss tokens
            response = t.huge(2)
        if i % 11 == 2:
            prompt = t.rng.choice(UNICODE) + " " + prompt
        rows.append({"prompt": prompt, response_key: response})
    return rows


def _chat_rows(t, n):
    short = lambda: t.rng.choice(t.short)  # noqa: E731
    rows = []
    for i in range(n):
        kind = i % 9
        if kind == 0:
            msgs = [("user", t.text()), ("assistant", t.text())]
        elif kind == 1:
            msgs = [("system", "You are a fortune cookie. " + short()), ("user", short()), ("assistant", t.text())]
        elif kind == 2:
            msgs = [("user", short()), ("assistant", short()), ("user", short()), ("assistant", t.text())]
        elif kind == 3:
            msgs = [("system", "Be brief."), ("user", short()), ("assistant", short()), ("user", short()),
                    ("assistant", short()), ("user", short()), ("assistant", short())]
        elif kind == 4:  # the tool role
            msgs = [("user", short()), ("assistant", "Let me look that up."), ("tool", short()),
                    ("assistant", t.text())]
        elif kind == 5:  # unicode, and content with surrounding whitespace (Llama 3.1 trims it)
            msgs = [("user", "  " + t.rng.choice(UNICODE) + " " + short() + "\n"),
                    ("assistant", t.rng.choice(UNICODE) + " " + t.text())]
        elif kind == 6:  # a first prompt far past max_seq_len: no loss token left unless prompts are targets
            msgs = [("user", t.huge(3)), ("assistant", t.text())]
        elif kind == 7:  # long turns: the last response starts past max_seq_len
            msgs = [("user", short()), ("assistant", t.huge(2)), ("user", short()), ("assistant", short())]
        else:  # short exchanges, an empty assistant message in the middle
            msgs = [("user", "Hi."), ("assistant", ""), ("user", "Well?"), ("assistant", short())]
        rows.append({"messages": [{"role": r, "content": c} for r, c in msgs]})
    return rows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetuning_data")
    t = Texts(fortunes(), 1234)
    pr = _prompt_response_rows(t, 61)
    pr[10]["response"] = ""  # empty response: no labels, dropped
    pr[20]["prompt"] = ""    # empty prompt: dropped without a bos, kept when the tokenizer adds one
    _write_jsonl(root / "pr.jsonl", pr)
    _write_jsonl(root / "completion.jsonl", _prompt_response_rows(t, 23, response_key="completion"))
    _write_jsonl(root / "columns.jsonl", [
        {"id": i, "question": r["prompt"], "answer": r["response"], "source": "fortunes"}
        for i, r in enumerate(_prompt_response_rows(t, 29))])
    _write_jsonl(root / "chat.jsonl", _chat_rows(t, 47))
    (root / "folder").mkdir()
    _write_jsonl(root / "folder" / "train.jsonl", _prompt_response_rows(t, 20))
    _write_jsonl(root / "folder" / "validation.jsonl", _prompt_response_rows(t, 17))
    (root / "array.json").write_text(json.dumps(_prompt_response_rows(t, 15), ensure_ascii=False, indent=1),
                                     encoding="utf-8")
    _write_jsonl(root / "extra.jsonl", _prompt_response_rows(t, 12))
    # The same kinds of rows as Parquet (several row groups, nested chat messages), Arrow IPC stream files (as
    # `datasets` caches them), CSV (pandas-style: no nested values) and gzip-compressed JSONL.
    pq.write_table(pa.Table.from_pylist(pr), root / "pr.parquet", row_group_size=16)
    pq.write_table(pa.Table.from_pylist(_chat_rows(t, 41)), root / "chat.parquet", row_group_size=10)
    columns = [{"id": i, "question": r["prompt"], "answer": r["response"], "source": "fortunes"}
               for i, r in enumerate(_prompt_response_rows(t, 31))]
    pacsv.write_csv(pa.Table.from_pylist(columns), root / "columns.csv")
    table = pa.Table.from_pylist(_chat_rows(t, 37))
    with pa.ipc.new_stream(root / "chat.arrow", table.schema) as w:
        for batch in table.to_batches(max_chunksize=9):
            w.write_batch(batch)
    with gzip.open(root / "pr.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in _prompt_response_rows(t, 27))
    # Rows in the layouts of the hub datasets LLM Foundry registers preprocessing functions for (tasks.py).
    pr = _prompt_response_rows(t, 30)
    _write_jsonl(root / "alpaca.jsonl", [{"instruction": "x", "text": f"{r['prompt']}\n\n### Response:{r['response']}"}
                                         for r in pr])
    _write_jsonl(root / "dolly.jsonl", [{"instruction": r["prompt"], "input": "" if i % 3 else t.text(),
                                         "output": r["response"], "category": "qa"} for i, r in enumerate(pr)])
    _write_jsonl(root / "p3.jsonl", [{"inputs": r["prompt"] + (" " if i % 4 == 0 else ""),
                                      "targets": ("\n" if i % 5 == 0 else "") + r["response"]}
                                     for i, r in enumerate(pr)])
    _write_jsonl(root / "hermes.jsonl", [{"conversations": ([{"from": "system", "value": "Be brief."}] if i % 2 else [])
                                          + [{"from": "human", "value": r["prompt"]}, {"from": "gpt",
                                                                                      "value": r["response"]}]}
                                         for i, r in enumerate(pr)])
    _write_jsonl(root / "qa.jsonl", [{"Q": r["prompt"], "A": r["response"], "meta": {"n": i}} for i, r in enumerate(pr)])
    (root / "pq_folder").mkdir()
    pq.write_table(pa.Table.from_pylist(_prompt_response_rows(t, 21)), root / "pq_folder" / "train-00000.parquet")
    pq.write_table(pa.Table.from_pylist(_prompt_response_rows(t, 13)), root / "pq_folder" / "validation-00000.parquet")
    return root


def _rows(path):
    path = pathlib.Path(path)
    if path.suffix == ".parquet":
        return pq.read_metadata(path).num_rows
    if path.suffix == ".arrow":
        with pa.ipc.open_stream(path) as r:
            return r.read_all().num_rows
    if path.suffix == ".csv":
        return pacsv.read_csv(path).num_rows
    if path.suffix == ".gz":
        return sum(1 for line in gzip.open(path, "rt", encoding="utf-8") if line.strip())
    if path.suffix == ".json":
        return len(json.loads(path.read_text(encoding="utf-8")))
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def resolve(dataset, root):
    """The case's dataset config with file names made absolute under the corpus folder; and the files it reads."""
    ds = copy.deepcopy(dataset)
    files = []
    if ds["hf_name"] not in ("json", "parquet", "csv", "arrow"):
        ds["hf_name"] = str(root / ds["hf_name"])
        base = pathlib.Path(ds["hf_name"]) / ds.get("hf_kwargs", {}).get("data_dir", "")
        files = sorted(base.glob(f"{ds['split']}*"))
    data_files = ds.get("hf_kwargs", {}).get("data_files")
    if data_files is not None:
        def fix(v):
            return str(root / v) if isinstance(v, str) else [str(root / x) for x in v]
        if isinstance(data_files, dict):
            ds["hf_kwargs"]["data_files"] = {k: fix(v) for k, v in data_files.items()}
            selected = ds["hf_kwargs"]["data_files"][ds["split"]]
        else:
            ds["hf_kwargs"]["data_files"] = selected = fix(data_files)
        files = [selected] if isinstance(selected, str) else selected
    return ds, files


# ---------------------------------------------------------------------------------------------------------------
# The two sides

def foundry_epoch(tmp_path, monkeypatch, tokenizer_dir, dataset, batch_size, drop_last, world_size, rank, epoch):
    """LLM Foundry's batches for one rank's epoch, its filtered dataset size and the packing ratio it used."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(ft_tasks, "get_date_string", lambda: DATE)

    current_rank = [rank]
    get_sampler = composer_dist.get_sampler

    def sampler(dataset, **kwargs):  # what dist.get_sampler builds on `world_size` ranks
        kwargs["num_replicas"], kwargs["rank"] = world_size, current_rank[0]
        return get_sampler(dataset, **kwargs)

    monkeypatch.setattr(composer_dist, "get_sampler", sampler)

    chosen = {}
    auto_packing_ratio = ft_dataloader.auto_packing_ratio

    def auto(**kwargs):  # each rank profiles its own share; a multi-rank run all-reduces the ratio with MIN
        ratios = []
        for r in range(world_size):
            current_rank[0] = r
            ratios.append(auto_packing_ratio(**kwargs))  # profile_packing copies the config itself
        current_rank[0] = rank
        chosen["ratio"] = min(ratios)
        return chosen["ratio"]

    monkeypatch.setattr(ft_dataloader, "auto_packing_ratio", auto)

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    spec = build_finetuning_dataloader(tokenizer=tokenizer, device_batch_size=batch_size,
                                       dataset=copy.deepcopy(dataset), num_workers=0, drop_last=drop_last,
                                       pin_memory=False, prefetch_factor=None, persistent_workers=False)
    dl = spec.dataloader
    dl.sampler.set_epoch(epoch)  # what Composer's trainer does at the start of each epoch
    batches = []
    for batch in dl:
        assert set(batch) <= set(KEYS) | {"total_tokens", "loss_generating_tokens"}, set(batch)
        batches.append({k: batch[k].tolist() for k in KEYS})
    ratio = dataset.get("packing_ratio")
    ratio = 1.0 if ratio is None else float(chosen["ratio"] if ratio == "auto" else ratio)
    return batches, len(dl.dataset), ratio


def tessera_epoch(tmp_path, tokenizer_dir, dataset, batch_size, drop_last, world_size, rank, epoch, check=True):
    config = {"tokenizer": str(tokenizer_dir), "device_batch_size": batch_size, "drop_last": drop_last,
              "world_size": world_size, "rank": rank, "epoch": epoch, "date_string": DATE, "dataset": dataset}
    (tmp_path / "config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    proc = subprocess.run([DRIVER, "finetuning-batches", str(tmp_path / "config.json"), str(tmp_path / "out.json")],
                          capture_output=True, text=True)
    if not check:
        return proc
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp_path / "out.json").read_text())


def first_difference(got, want):
    if len(got) != len(want):
        return f"{len(got)} batches, LLM Foundry has {len(want)}"
    for b, (g, w) in enumerate(zip(got, want)):
        for key in KEYS:
            if key not in g:
                return f"batch {b}: no {key}"
            gk, wk = g[key], w[key]
            if gk == wk:
                continue
            if len(gk) != len(wk):
                return f"batch {b} {key}: {len(gk)} rows, LLM Foundry has {len(wk)}"
            for r, (gr, wr) in enumerate(zip(gk, wk)):
                if gr == wr:
                    continue
                if len(gr) != len(wr):
                    return f"batch {b} {key} row {r}: length {len(gr)}, LLM Foundry has {len(wr)}"
                p = next(i for i, (x, y) in enumerate(zip(gr, wr)) if x != y)
                lo, hi = max(0, p - 6), p + 6
                return (f"batch {b} {key} row {r} position {p}: tessera {gr[lo:hi]} vs LLM Foundry {wr[lo:hi]} "
                        f"(from position {lo}); input_ids there: tessera {g['input_ids'][r][lo:hi]} vs "
                        f"LLM Foundry {w['input_ids'][r][lo:hi]}")
    return None


# ---------------------------------------------------------------------------------------------------------------
# Cases

def ds(data_files, builder="json", **kw):
    """A train_loader.dataset reading `data_files` (names under the corpus folder) through hf_name: `builder`."""
    base = {"hf_name": builder, "hf_kwargs": {"data_files": data_files}, "split": "train", "max_seq_len": 128,
            "decoder_only_format": True, "shuffle": False}
    base.update(kw)
    return base


def folder(split, **kw):
    """A train_loader.dataset reading the corpus folder `folder` ({split}.jsonl files) as hf_name."""
    base = {"hf_name": "folder", "split": split, "max_seq_len": 64, "decoder_only_format": True, "shuffle": False}
    base.update(kw)
    return base


def case(tok, dataset, batch=4, drop_last=False, world=1, rank=0, epoch=0):
    return dict(tok=tok, dataset=dataset, batch_size=batch, drop_last=drop_last, world_size=world, rank=rank,
                epoch=epoch)


PR64 = dict(max_seq_len=64)
CASES = {
    # chat rows, every target_prompts x target_responses, with LLM Foundry's ChatML fallback
    "chat-A-none-last": case("A", ds("chat.jsonl")),
    "chat-A-none-all": case("A", ds("chat.jsonl", target_responses="all")),
    "chat-A-all-last": case("A", ds("chat.jsonl", target_prompts="all")),
    "chat-A-all-all": case("A", ds("chat.jsonl", target_prompts="all", target_responses="all")),
    "chat-A-len20-last": case("A", ds("chat.jsonl", target_prompts="length>=20")),
    "chat-A-len20-all": case("A", ds("chat.jsonl", target_prompts="length>=20", target_responses="all")),
    # Llama 3.1's template (bos_token, date_string, tool -> ipython); Zephyr's with left padding
    "chat-B-none-last": case("B", ds("chat.jsonl")),
    "chat-B-all-all": case("B", ds("chat.jsonl", target_prompts="all", target_responses="all")),
    "chat-B-len20-last-256": case("B", ds("chat.jsonl", target_prompts="length>=20", max_seq_len=256), batch=3),
    "chat-C-none-all-left": case("C", ds("chat.jsonl", target_responses="all")),
    # prompt/response rows (B: <s> on both, stripped from the labels; an empty prompt kept as <s>)
    "pr-A-64": case("A", ds("pr.jsonl", **PR64)),
    "pr-A-64-prompts-all": case("A", ds("pr.jsonl", target_prompts="all", **PR64)),
    "pr-B-64-bos": case("B", ds("pr.jsonl", **PR64)),
    "pr-B-128-len20-all": case("B", ds("pr.jsonl", target_prompts="length>=20", target_responses="all"), batch=5),
    "pr-C-64-left": case("C", ds("pr.jsonl", **PR64)),
    "completion-A": case("A", ds("completion.jsonl", **PR64)),
    "preprocessing-fn-columns-B": case("B", ds("columns.jsonl", preprocessing_fn={"prompt": "question",
                                                                                   "response": "answer"})),
    # where the rows come from
    "folder-validation-safe-load-B": case("B", folder("validation", safe_load=True)),
    "folder-train-shuffle-A": case("A", folder("train", shuffle=True, shuffle_seed=3)),
    "data-files-dict-json-array-B": case("B", ds({"train": ["array.json", "extra.jsonl"], "test": "pr.jsonl"}, **PR64)),
    "data-files-list-A": case("A", ds(["extra.jsonl", "folder/train.jsonl"], **PR64)),
    # the sampler: shuffle and seed, drop_last, ranks (DistributedSampler pads by repeating), epochs
    "shuffle-seed17-drop-last": case("A", ds("pr.jsonl", shuffle=True, shuffle_seed=17, **PR64), drop_last=True),
    "shuffle-default-seed": case("B", ds("chat.jsonl", shuffle=True)),
    "world2-rank0-shuffle": case("A", ds("pr.jsonl", shuffle=True, shuffle_seed=5, **PR64), world=2, rank=0),
    "world2-rank1-shuffle": case("A", ds("pr.jsonl", shuffle=True, shuffle_seed=5, **PR64), world=2, rank=1),
    "world2-rank1-drop-last": case("A", ds("pr.jsonl", **PR64), drop_last=True, world=2, rank=1),
    "world3-rank2": case("B", ds("chat.jsonl"), batch=2, world=3, rank=2),
    "epoch1-shuffle": case("A", ds("chat.jsonl", shuffle=True, shuffle_seed=9), epoch=1),
    "epoch1-world2-rank1": case("B", ds("pr.jsonl", shuffle=True, **PR64), drop_last=True, world=2, rank=1, epoch=1),
    # pad trimming: never on the first batch, then to a multiple of 8 (at most max_seq_len), on the padding side
    "trim-A": case("A", ds("pr.jsonl", allow_pad_trimming=True)),
    "trim-C-left-60": case("C", ds("chat.jsonl", max_seq_len=60, allow_pad_trimming=True, target_prompts="all")),
    # packing
    "pack2-A-chat-256": case("A", ds("chat.jsonl", max_seq_len=256, packing_ratio=2.0)),
    "pack1.5-B-pr": case("B", ds("pr.jsonl", packing_ratio=1.5), batch=3),
    "pack2-keep0": case("A", ds("pr.jsonl", packing_ratio=2.0, max_leftover_bins_to_keep=0)),
    "pack2.5-keep2-shuffle": case("B", ds("chat.jsonl", max_seq_len=256, packing_ratio=2.5, max_leftover_bins_to_keep=2,
                                          shuffle=True, shuffle_seed=11)),
    "pack2-C-left-trim": case("C", ds("pr.jsonl", packing_ratio=2.0, allow_pad_trimming=True)),
    "pack3-drop-last-world2-rank1": case("A", ds("chat.jsonl", max_seq_len=256, packing_ratio=3.0, shuffle=True),
                                         batch=2, drop_last=True, world=2, rank=1),
    "pack2-epoch1-all-all": case("B", ds("chat.jsonl", max_seq_len=256, packing_ratio=2.0, target_prompts="all",
                                         target_responses="all", shuffle=True), epoch=1),
    "auto-A-256": case("A", ds("pr.jsonl", max_seq_len=256, packing_ratio="auto")),
    "auto-A-256-keep1": case("A", ds("pr.jsonl", max_seq_len=256, packing_ratio="auto", max_leftover_bins_to_keep=1,
                                     shuffle=True)),
    "auto-B-64-is-1": case("B", ds("pr.jsonl", max_seq_len=64, packing_ratio="auto")),
    # other file formats, through `datasets`' builders and folder inference
    "parquet-pr-A-64": case("A", ds("pr.parquet", builder="parquet", **PR64)),
    "parquet-chat-B-shuffle": case("B", ds("chat.parquet", builder="parquet", shuffle=True, shuffle_seed=3)),
    "arrow-chat-C": case("C", ds("chat.arrow", builder="arrow", max_seq_len=256)),
    "csv-columns-B": case("B", ds("columns.csv", builder="csv", preprocessing_fn={"prompt": "question",
                                                                                   "response": "answer"}, **PR64)),
    "jsonl-gz-A": case("A", ds("pr.jsonl.gz", **PR64)),
    # LLM Foundry's registered preprocessing functions, by name
    "registered-alpaca-A": case("A", ds("alpaca.jsonl", preprocessing_fn="tatsu-lab/alpaca", **PR64)),
    "registered-dolly-B": case("B", ds("dolly.jsonl", preprocessing_fn="HuggingFaceH4/databricks_dolly_15k")),
    "registered-p3-A": case("A", ds("p3.jsonl", preprocessing_fn="bigscience/P3", **PR64)),
    "registered-muennighoff-flan-B": case("B", ds("p3.jsonl", preprocessing_fn="Muennighoff/flan", **PR64)),
    "registered-openhermes-A": case("A", ds("hermes.jsonl", preprocessing_fn="teknium/OpenHermes-2.5")),
    "registered-stackmathqa-C": case("C", ds("qa.jsonl", preprocessing_fn="math-ai/StackMathQA")),
    "registered-numinamath-B": case("B", ds("chat.jsonl", preprocessing_fn="AI-MO/NuminaMath-CoT")),
    "data-dir-parquet-train-B": case("B", {"hf_name": ".", "hf_kwargs": {"data_dir": "pq_folder"}, "split": "train",
                                           "max_seq_len": 64, "decoder_only_format": True, "shuffle": False}),
    "folder-parquet-validation-A": case("A", {"hf_name": "pq_folder", "split": "validation", "max_seq_len": 64,
                                              "decoder_only_format": True, "shuffle": False}, batch=3),
    "auto-C-chat-512-world2-rank1": case("C", ds("chat.jsonl", max_seq_len=512, packing_ratio="auto", shuffle=True,
                                                 shuffle_seed=2), batch=2, world=2, rank=1),
}


@pytest.mark.parametrize("name", CASES)
def test_batches_equal_llmfoundry(name, tmp_path, monkeypatch, tokenizers_, corpus):
    c = CASES[name]
    dataset, files = resolve(c["dataset"], corpus)
    args = (tokenizers_[c["tok"]], dataset, c["batch_size"], c["drop_last"], c["world_size"], c["rank"], c["epoch"])
    want, valid, ratio = foundry_epoch(tmp_path, monkeypatch, *args)
    assert len(want) >= 2, "the case should span several batches"
    got = tessera_epoch(tmp_path, *args)
    rows = sum(_rows(f) for f in files)
    assert (got["examples"], got["dropped"]) == (valid, rows - valid), "valid / dropped examples"
    assert got["packing_ratio"] == pytest.approx(ratio, abs=1e-9), "packing ratio"
    diff = first_difference(got["batches"], want)
    assert diff is None, diff


def test_a_hub_id_that_datasets_cached_reads_as_load_dataset_does_offline(tmp_path, monkeypatch, tokenizers_, corpus):
    """hf_name: tatsu-lab/alpaca with nothing local but `datasets`' own cache of it (what an earlier online
    load_dataset left; made here by datasets from Parquet files, its folder named as the hub id's): LLM Foundry loads
    it offline and applies the preprocessing function it registers for that name; Tessera finds the same split."""
    source = tmp_path / "src" / "alpaca" / "data"  # the folder's name is the files' name, as the id's would be
    source.mkdir(parents=True)
    rows = [json.loads(line) for line in (corpus / "alpaca.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows[:20]), source / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(rows[20:]), source / "test-00000-of-00001.parquet")
    cache = tmp_path / "hf_datasets"  # where foundry_epoch points datasets
    datasets.load_dataset(str(source.parent), split="train", cache_dir=str(cache))
    (cache / "alpaca").rename(cache / "tatsu-lab___alpaca")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    dataset = {"hf_name": "tatsu-lab/alpaca", "split": "test", "max_seq_len": 64, "decoder_only_format": True,
               "shuffle": False}
    args = (tokenizers_["A"], dataset, 3, False, 1, 0, 0)
    want, valid, _ = foundry_epoch(tmp_path, monkeypatch, *args)
    got = tessera_epoch(tmp_path, *args)
    assert (got["examples"], got["dropped"]) == (valid, len(rows) - 20 - valid) and valid > 0
    diff = first_difference(got["batches"], want)
    assert diff is None, diff


# ---------------------------------------------------------------------------------------------------------------
# Bad input (Tessera only): the error names the file and line

def chat(*turns):
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


GOOD = chat(("user", "x"), ("assistant", "y"))
BAD = {  # rows, the line the error must name, words it must say
    "malformed-line": ([{"prompt": "a", "response": "b"}, {"prompt": "c", "response": "d"}, '{"prompt": "e", "resp'],
                       3, []),
    "last-message-from-user": ([GOOD, chat(("user", "x"), ("assistant", "y"), ("user", "z"))],
                               2, ["last", "assistant"]),
    "consecutive-user-messages": ([GOOD, GOOD, chat(("user", "x"), ("user", "again"), ("assistant", "y"))],
                                  3, ["user"]),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_rows_name_file_and_line(name, tmp_path, tokenizers_):
    rows, line, words = BAD[name]
    (tmp_path / "train.jsonl").write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    proc = tessera_epoch(tmp_path, tokenizers_["A"], ds(str(tmp_path / "train.jsonl")), 2, False, 1, 0, 0, check=False)
    assert proc.returncode != 0, "a bad row must fail the run"
    assert f"train.jsonl:{line}" in proc.stderr, proc.stderr
    for word in words:
        assert word in proc.stderr.lower(), proc.stderr


# ---------------------------------------------------------------------------------------------------------------
# MDS fine-tuning data: LLM Foundry's StreamingFinetuningDataset over the layouts its convert_finetuning_dataset
# writes (tokenized `turns`, untokenized prompt/response str or messages json) and the legacy input_ids/labels
# columns (bytes of int64, or ndarrays), in Streaming's order (one rank).

def _mds_samples(layout, tokenizer_dir, n):
    docs = fortunes()
    rows = [{"prompt": f"Q{i}: {docs[i][:60]}", "response": docs[i + 300][:300]} for i in range(n)]
    if layout == "prompt_response":
        return {"prompt": "str", "response": "str"}, rows
    if layout == "messages":
        return {"messages": "json"}, [{"messages": [{"role": "user", "content": r["prompt"]},
                                                    {"role": "assistant", "content": r["response"]}]} for r in rows]
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    turns = [ft_tasks.tokenize_formatted_example(r, tokenizer)["turns"] for r in rows]
    if layout == "turns":
        return {"turns": "json"}, [{"turns": [{"input_ids": list(t["input_ids"]), "labels": list(t["labels"])}
                                              for t in ts]} for ts in turns]
    if layout == "legacy_bytes":
        return {"input_ids": "bytes", "labels": "bytes"}, [
            {"input_ids": np.asarray(ts[0]["input_ids"], np.int64).tobytes(),
             "labels": np.asarray(ts[0]["labels"], np.int64).tobytes()} for ts in turns]
    return {"input_ids": "ndarray:uint32", "labels": "ndarray:uint32"}, [
        {"input_ids": np.asarray(ts[0]["input_ids"], np.uint32), "labels": np.asarray(ts[0]["labels"], np.uint32)}
        for ts in turns]


MDS_CASES = {
    "turns-A": ("turns", "A", {}),
    "prompt-response-B-shuffle": ("prompt_response", "B", {"shuffle": True, "shuffle_seed": 11}),
    "messages-A-targets-all": ("messages", "A", {"target_prompts": "all", "target_responses": "all"}),
    "legacy-bytes-A-shuffle": ("legacy_bytes", "A", {"shuffle": True}),
    "ndarray-A-pack2": ("ndarray", "A", {"packing_ratio": 2.0}),
    "turns-C-left-trim-shuffle": ("turns", "C", {"shuffle": True, "allow_pad_trimming": True}),
}


@pytest.mark.parametrize("name", MDS_CASES)
def test_mds_batches_equal_llmfoundry(name, tmp_path, monkeypatch, tokenizers_):
    layout, tok, extra = MDS_CASES[name]
    tokenizer_dir = tokenizers_[tok]
    columns, samples = _mds_samples(layout, tokenizer_dir, 45)
    with MDSWriter(out=str(tmp_path / "mds"), columns=columns, size_limit=1 << 14) as writer:
        for s in samples:
            writer.write(s)
    # `streams` with a local-only stream (LLM Foundry treats a top-level `local` without `remote` as hf_name data).
    dataset = {"streams": {"main": {"local": str(tmp_path / "mds")}}, "max_seq_len": 128,
               "decoder_only_format": True, **extra}
    monkeypatch.setattr(ft_tasks, "get_date_string", lambda: DATE)
    clean_stale_shared_memory()
    spec = build_finetuning_dataloader(tokenizer=AutoTokenizer.from_pretrained(str(tokenizer_dir)),
                                       device_batch_size=4, dataset=copy.deepcopy(dataset), num_workers=0,
                                       drop_last=True, pin_memory=False, prefetch_factor=None,
                                       persistent_workers=False)
    want = [{k: batch[k].tolist() for k in KEYS} for batch in spec.dataloader]
    del spec
    clean_stale_shared_memory()
    assert len(want) >= 2
    got = tessera_epoch(tmp_path, tokenizer_dir, dataset, 4, True, 1, 0, 0)
    assert got["batches_in_epoch"] == len(want)
    diff = first_difference(got["batches"], want)
    assert diff is None, diff
