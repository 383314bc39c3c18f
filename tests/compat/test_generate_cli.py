"""`generate` (the command) against transformers' own generate on the same Llama folder and tokenizer: greedy decoding
of plain prompts (tokenized with special tokens) and of chat prompts (the tokenizer's Zephyr-style chat template with
add_generation_prompt, tokenized without special tokens, as apply_chat_template does), several prompts in one batch
(left-padded inside `generate`), must give exactly the tokens transformers generates for each prompt alone; so must
greedy decoding with a repetition penalty, in batches of 2 and of 1. Sampling with a seed is reproducible, min_p = 1
keeps only the likeliest token (greedy), --stream prints what the batch run prints, and a malformed prompt file is an
error naming its line."""
import json
import os
import pathlib
import subprocess

import pytest
import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parents[2]
GENERATE = os.environ.get("TESSERA_GENERATE_BIN", str(ROOT / "build" / "bin" / "generate"))
FORTUNES = pathlib.Path("/usr/share/games/fortunes")
PROMPTS = ["Tell me a fortune about computers.", "The meaning of life is", "ünïcödé ✓ and a much longer prompt " * 3]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen") / "llama"
    docs = [d for d in (FORTUNES / "computers").read_text(errors="replace").split("\n%\n") if d.strip()]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=512, min_frequency=2,
                            special_tokens=["<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")
    tok.chat_template = (ROOT / "tests" / "data" / "chat_templates" / "zephyr.jinja").read_text()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                         max_position_embeddings=256))
    model.save_pretrained(root)
    tok.save_pretrained(root)
    return root


def run(*args, stdin=None):
    proc = subprocess.run([GENERATE, *map(str, args)], capture_output=True, text=True, input=stdin)
    return proc


def hf_greedy(model_dir, prompt, chat, max_new, **extra):
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir).eval()
    if chat:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      return_tensors="pt")
    else:
        ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.eos_token_id, attention_mask=torch.ones_like(ids), **extra)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
def test_greedy_tokens_equal_transformers(model_dir, tmp_path, chat):
    args = ["--model", model_dir, "--max-new-tokens", 16, "--output", tmp_path / "out.jsonl"]
    for p in PROMPTS:
        args += ["--prompt", p]
    proc = run(*args, *(["--chat"] if chat else []))
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == len(PROMPTS)
    for p, row in zip(PROMPTS, rows):
        assert row["tokens"] == hf_greedy(model_dir, p, chat, 16), p


def test_sampling_is_seeded_and_prompt_files_are_checked(model_dir, tmp_path):
    common = ["--model", model_dir, "--max-new-tokens", 12, "--sample", "--temperature", 0.9, "--top-p", 0.95]
    a = run(*common, "--seed", 7, stdin="Once upon a time")
    b = run(*common, "--seed", 7, stdin="Once upon a time")
    assert a.returncode == 0 and a.stdout == b.stdout, a.stderr
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    bad = run("--model", model_dir, "--prompt-file", tmp_path / "p.jsonl")
    assert bad.returncode == 1 and "p.jsonl:2: malformed JSON line" in bad.stderr, bad.stderr


def test_repetition_penalty_in_batches_equals_transformers(model_dir, tmp_path):
    # HF's RepetitionPenaltyLogitsProcessor over the prompt and the tokens generated so far; the 3 prompts in batches of
    # 2 (longest first, so the two short ones share one) and of 1 give the tokens of each prompt alone in transformers.
    outs = []
    for batch in (2, 1):
        args = ["--model", model_dir, "--max-new-tokens", 16, "--repetition-penalty", 1.5, "--batch-size", batch,
                "--output", tmp_path / f"out{batch}.jsonl"]
        for p in PROMPTS:
            args += ["--prompt", p]
        proc = run(*args)
        assert proc.returncode == 0, proc.stderr
        outs.append([json.loads(line) for line in (tmp_path / f"out{batch}.jsonl").read_text().splitlines()])
    assert outs[0] == outs[1]
    plain = [hf_greedy(model_dir, p, False, 16) for p in PROMPTS]
    for p, row in zip(PROMPTS, outs[0]):
        assert row["tokens"] == hf_greedy(model_dir, p, False, 16, repetition_penalty=1.5), p
    assert [r["tokens"] for r in outs[0]] != plain  # the penalty changed something


def test_min_p_one_is_greedy_and_stream_prints_the_same(model_dir):
    prompts = ["--prompt", PROMPTS[0], "--prompt", PROMPTS[1]]
    greedy = run("--model", model_dir, "--max-new-tokens", 12, *prompts)
    assert greedy.returncode == 0, greedy.stderr
    # min_p = 1 removes every token less likely than the likeliest: sampling is greedy decoding, whatever the seed.
    sampled = run("--model", model_dir, "--max-new-tokens", 12, "--sample", "--min-p", 1, "--seed", 11, *prompts)
    assert sampled.returncode == 0 and sampled.stdout == greedy.stdout, sampled.stderr
    streamed = run("--model", model_dir, "--max-new-tokens", 12, "--stream", *prompts)
    assert streamed.returncode == 0 and streamed.stdout == greedy.stdout, streamed.stderr
    bad = run("--model", model_dir, "--stream", "--output", "x.jsonl", *prompts)
    assert bad.returncode == 2 and "--stream prints to the terminal" in bad.stderr, bad.stderr
