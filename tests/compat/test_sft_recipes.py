"""LLM Foundry's fine-tuning recipes run with only their paths changed.

recipes/mpt-7b_dolly_sft.yaml (LLM Foundry's scripts/train/yamls/finetune/mpt-7b_dolly_sft.yaml) and
recipes/llama3-8b_finetune.yaml (its mcli/mcli-llama3-finetune.yaml parameters: Lion at 5e-7, 4096 tokens, global
batch 64, microbatch auto, FULL_SHARD with activation checkpointing) are trained as they are, with `variables`
pointing at a small model of the same family saved by transformers (MptForCausalLM / LlamaForCausalLM), a tokenizer
folder saved by transformers, and a folder of prompt/response JSONL files: every other setting is the recipe's own.
Each must finish its epochs, evaluate (the MPT recipe before training too) and report finite losses. With the
published configs in a hub cache, both plan the real models (6.65 B and 8.03 B parameters) with --dry-run.

Two settings besides the paths are overridden. `precision=auto` for the recipes' amp_bf16: on a CPU with native bf16
(AVX512-BF16, AMX) auto is amp_bf16, the recipe's own setting; on one that only emulates bf16 (AVX2), where bf16 runs
about 50x slower than fp32 and the Llama recipe's 64 x 4096-token batches (allow_pad_trimming: false) took over two
minutes each, it is fp32 (docs/training.md#precision). And the recipes' own `variables.max_seq_len` (2048, 4096) is
1024: every sample here fits in it (the longest is 832 tokens), and batches padded to the recipes' lengths made the
two runs take 113 s of the test tier (14 s at 1024) with nothing more to check.
"""
import json
import math
import os
import pathlib
import re
import subprocess

import pytest
import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import LlamaConfig, LlamaForCausalLM, MptConfig, MptForCausalLM, PreTrainedTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("TESSERA_TRAIN_BIN", str(ROOT / "build" / "bin" / "train"))
FORTUNES = pathlib.Path("/usr/share/games/fortunes")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    docs = [d.strip() for d in (FORTUNES / "computers").read_text(errors="replace").split("\n%\n") if d.strip()]
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(docs, vocab_size=512, min_frequency=2, special_tokens=["<|endoftext|>"])
    PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, eos_token="<|endoftext|>").save_pretrained(root / "tok")
    rows = [{"prompt": f"Tell me fortune {i}:\n", "response": d} for i, d in enumerate(docs[:154])]
    (root / "data").mkdir()
    (root / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:130]))
    (root / "data" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[130:]))
    torch.manual_seed(0)
    MptForCausalLM(MptConfig(d_model=64, n_heads=4, n_layers=2, expansion_ratio=4, max_seq_len=2048,
                             vocab_size=512)).save_pretrained(root / "mpt")
    LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=4096,
                                 vocab_size=512)).save_pretrained(root / "llama")
    return root


def run(recipe, *overrides, env=None):
    # --verbose: console lines with every metric by its full name, which the test reads.
    proc = subprocess.run([TRAIN, "--recipe", str(ROOT / "recipes" / recipe), "--verbose", *overrides],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, f"{recipe}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("recipe,model,steps,evals", [
    ("mpt-7b_dolly_sft.yaml", "mpt", 4, 3),     # 130 rows / 48 = 2 batches x 2 epochs; eval first and each epoch
    ("llama3-8b_finetune.yaml", "llama", 2, 1),  # 130 rows / 64 = 2 batches x 1 epoch; eval at the end
])
def test_recipe_runs_with_only_its_paths_changed(workdir, recipe, model, steps, evals):
    log = run(recipe, f"variables.model_path={workdir / model}", f"variables.tokenizer_name={workdir / 'tok'}",
              f"variables.data_local={workdir / 'data'}", "precision=auto", "variables.max_seq_len=1024")
    losses = [float(x) for x in re.findall(r"loss/train/total: ([-+0-9.eE]+|nan|inf)", log)]
    evals_seen = [float(x) for x in re.findall(r"metrics/eval/LanguageCrossEntropy: ([-+0-9.eE]+|nan|inf)", log)]
    assert len(losses) == steps, log[-3000:]
    assert len(evals_seen) == evals, log[-3000:]
    assert all(math.isfinite(x) and 0 < x < 20 for x in losses + evals_seen), (losses, evals_seen)


@pytest.mark.parametrize("recipe,params", [("mpt-7b_dolly_sft.yaml", "6,649,286,656"),
                                           ("llama3-8b_finetune.yaml", "8,030,261,248")])
def test_recipe_plans_the_published_model(hub_cache, recipe, params):
    log = run(recipe, "--dry-run", "--no-preflight", env=dict(os.environ, HF_HUB_CACHE=str(hub_cache)))
    assert params in log, log
