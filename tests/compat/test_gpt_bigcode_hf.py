"""Tessera's GPT-BigCode (`model.name: gpt_bigcode`, its own family folder: StarCoder 1, StarCoderBase, SantaCoder)
against transformers' own GPTBigCodeForCausalLM, on random small configurations: multi-query attention (c_attn's
output [queries | key | value]) and multi-head attention (head-major), learned positions, unscaled scores
(scale_attn_weights false), tied or untied head.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5 and every
  gradient within 1e-4 relative, on the SDPA path and the explicit reference path.
- Left padding, packed documents and greedy generation equal transformers'.
- HF folder -> Tessera -> 5 training steps -> checkpoint -> `convert` -> AutoModelForCausalLM: a GPTBigCodeForCausalLM
  with the same logits; the recipe's model trained from scratch exports the same way.
- recipes/starcoder-15b.yaml is the published bigcode/starcoder config, and `train --dry-run` prints the parameter
  count transformers computes for it, from the recipe and from the config.json in a hub cache.
- Tessera initialises as transformers does: c_proj weights at initializer_range / sqrt(2 n_layer).
- What Tessera's GPT-BigCode does not compute is refused naming the key.
"""
import json

import os
import subprocess

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

from conftest import ROOT
from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (TRAIN_SEQ, check_greedy_generation, check_left_padding, check_logits_and_gradients,
                           check_packed_documents, check_recipe_parameter_count, randomise_norms_and_biases,
                           run_tessera, save, train_export_and_compare)

BASE = dict(n_embd=64, n_layer=2, n_head=4, n_inner=96, vocab_size=101, n_positions=64, attn_pdrop=0.0,
            embd_pdrop=0.0, resid_pdrop=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)

CONFIGS = {
    "multi-query-tied": dict(BASE),
    "multi-head-untied-unscaled": dict(BASE, multi_query=False, tie_word_embeddings=False, scale_attn_weights=False,
                                       activation_function="gelu"),
}


def hf_model(name, seed=0):
    torch.manual_seed(seed)
    return randomise_norms_and_biases(
        GPTBigCodeForCausalLM(GPTBigCodeConfig(**CONFIGS[name], attn_implementation="sdpa")).eval())


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


def test_packed_documents_equal_each_document_alone(driver, tmp_path):
    check_packed_documents(hf_model("multi-query-tied", seed=2), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_generation_matches_transformers_generate(name, driver, tmp_path):
    check_greedy_generation(hf_model(name, seed=5), driver, tmp_path)


def test_configs_tessera_does_not_compute_are_refused_by_key(driver, tmp_path):
    folder = save(hf_model("multi-query-tied"), tmp_path / "bigcode")
    original = json.loads((folder / "config.json").read_text())
    ids = torch.zeros(1, 4, dtype=torch.long)
    for change, message in (({"n_head": 5}, "n_head"),
                            ({"activation_function": "gelu_accurate"}, "activation_function"),
                            ({"add_cross_attention": True}, "add_cross_attention")):
        (folder / "config.json").write_text(json.dumps(dict(original, **change)))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)


@pytest.mark.parametrize("name", CONFIGS)
def test_hf_folder_trained_and_exported_loads_in_transformers_as_the_same_function(name, driver, tmp_path, dataset):
    torch.manual_seed(6)
    start = save(GPTBigCodeForCausalLM(GPTBigCodeConfig(**dict(CONFIGS[name], vocab_size=VOCAB))),
                 tmp_path / "start")
    section = dict(CONFIGS[name], name="gpt_bigcode", vocab_size=VOCAB)  # the recipe takes GPTBigCodeConfig's keys
    hf = train_export_and_compare(driver, tmp_path, dataset, section, start)
    assert type(hf) is GPTBigCodeForCausalLM


def test_the_recipe_trained_from_scratch_exports_as_gpt_bigcode_initialised_as_transformers(driver, tmp_path,
                                                                                           dataset):
    section = yaml.safe_load((ROOT / "recipes" / "starcoder-15b.yaml").read_text())["model"]
    section.update(n_embd=64, n_layer=8, n_head=4, n_inner=96, vocab_size=VOCAB, n_positions=TRAIN_SEQ,
                   attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0, bos_token_id=None, eos_token_id=None,
                   init_device="cpu")
    hf = train_export_and_compare(driver, tmp_path, dataset, section)
    assert type(hf) is GPTBigCodeForCausalLM
    # The run's initial weights (trace/init) have transformers' spreads: c_proj at 0.02 / sqrt(2 x 8) = 0.005.
    init = load_file(tmp_path / "trace" / "init" / "model.safetensors")
    c_proj = torch.cat([init[f"transformer.h.{i}.{m}.c_proj.weight"].flatten()
                        for i in range(8) for m in ("attn", "mlp")])
    c_fc = torch.cat([init[f"transformer.h.{i}.mlp.c_fc.weight"].flatten() for i in range(8)])
    assert abs(c_proj.std().item() - 0.005) < 0.0005, c_proj.std()
    assert abs(c_fc.std().item() - 0.02) < 0.002, c_fc.std()


def test_recipe_is_the_published_starcoder_with_transformers_parameter_count(hub_cache, tmp_path):
    check_recipe_parameter_count("starcoder-15b.yaml", "bigcode/starcoder", GPTBigCodeConfig, GPTBigCodeForCausalLM,
                                 hub_cache, tmp_path)


def test_tensor_parallelism_over_multi_query_attention_is_refused_by_the_plan():
    """The published StarCoder plans under FSDP; asked for TP 2, the dry run says why not (one key/value head)."""
    train = os.environ.get("TESSERA_TRAIN_BIN", str(ROOT / "build" / "bin" / "train"))
    proc = subprocess.run([train, "--recipe", str(ROOT / "recipes" / "starcoder-15b.yaml"), "--dry-run", "--no-preflight",
                           "--world-size", "8", "parallelism={tensor_parallel_degree: 2}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "tensor_parallel_degree 2: GPT-BigCode's multi-query attention has one key/value head" in \
        proc.stdout + proc.stderr, proc.stdout + proc.stderr
