"""Tessera's GPT-NeoX family (GPT-NeoX-20B, the Pythia suite) against transformers' GPTNeoXForCausalLM (the real
peer), on random small configurations of each variant: Pythia's parallel residual with a quarter of each head rotated
and an untied head; a sequential residual with full rotary, a tied head and no attention biases; linear rope scaling
with another activation.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5, and the
  gradient of every parameter within 1e-4 relative, on the SDPA path and the explicit reference path.
- Left padding, packed documents and greedy generation equal transformers' (shared checks of test_llama_hf).
- What Tessera's GPT-NeoX does not compute is refused by name.
- HF folder -> Tessera (`model.name: gpt_neox`) -> 5 training steps -> checkpoint -> `convert` -> AutoModelForCausalLM
  loads a GPTNeoXForCausalLM computing the same logits.
- recipes/pythia-1b.yaml is the published EleutherAI/pythia-1b config, and `train --dry-run` prints the parameter
  count transformers computes for it, from the recipe and from the config.json in a hub cache.
"""
import json

import pytest
import torch
import yaml
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from conftest import ROOT
from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (TRAIN_SEQ, check_greedy_generation, check_left_padding, check_logits_and_gradients,
                           check_packed_documents, check_recipe_parameter_count, randomise_norms_and_biases,
                           run_tessera, save, train_export_and_compare)

BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=101,
            max_position_embeddings=64, layer_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)

CONFIGS = {
    "pythia": dict(BASE, rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False),
    "sequential-full-rotary-tied-no-bias": dict(BASE, rotary_pct=1.0, use_parallel_residual=False,
                                                tie_word_embeddings=True, attention_bias=False),
    "rope-linear-gelu-new": dict(BASE, hidden_size=96, num_attention_heads=6, rotary_pct=0.5, rotary_emb_base=500.0,
                                 rope_scaling={"rope_type": "linear", "factor": 2.0}, hidden_act="gelu_new"),
}
SEQ = 29


def hf_model(name, seed=0):
    torch.manual_seed(seed)
    return randomise_norms_and_biases(GPTNeoXForCausalLM(GPTNeoXConfig(**CONFIGS[name], attn_implementation="sdpa")).eval())


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path)


@pytest.mark.parametrize("name", ["pythia", "sequential-full-rotary-tied-no-bias"])
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


def test_packed_documents_equal_each_document_alone(driver, tmp_path):
    check_packed_documents(hf_model("pythia", seed=2), driver, tmp_path)


@pytest.mark.parametrize("name", ["pythia", "rope-linear-gelu-new"])
def test_greedy_generation_matches_transformers_generate(name, driver, tmp_path):
    check_greedy_generation(hf_model(name, seed=5), driver, tmp_path, lowest_id=3)


def test_configs_tessera_does_not_compute_are_refused(driver, tmp_path):
    ids = torch.zeros(1, 4, dtype=torch.long)
    folder = save(hf_model("pythia"), tmp_path / "hf")
    original = json.loads((folder / "config.json").read_text())
    cases = [
        ({"hidden_act": "gelu_accurate"}, "hidden_act"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type"),
        ({"rotary_pct": 0.2}, "rotary_pct"),  # int(16 x 0.2) = 3 rotary dimensions: odd
        ({"hidden_size": 66}, "num_attention_heads"),
    ]
    for change, message in cases:
        (folder / "config.json").write_text(json.dumps(dict(original, **change)))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)


@pytest.mark.parametrize("name", ["pythia", "sequential-full-rotary-tied-no-bias"])
def test_hf_folder_trained_and_exported_loads_in_transformers_as_the_same_function(name, driver, tmp_path, dataset):
    torch.manual_seed(6)
    start = save(GPTNeoXForCausalLM(GPTNeoXConfig(**dict(CONFIGS[name], vocab_size=VOCAB))), tmp_path / "start")
    section = dict(CONFIGS[name], name="gpt_neox", vocab_size=VOCAB)  # the recipe takes GPTNeoXConfig's keys
    hf = train_export_and_compare(driver, tmp_path, dataset, section, start)
    assert type(hf) is GPTNeoXForCausalLM


def test_recipe_is_the_published_pythia_1b_with_transformers_parameter_count(hub_cache, tmp_path):
    check_recipe_parameter_count("pythia-1b.yaml", "EleutherAI/pythia-1b", GPTNeoXConfig, GPTNeoXForCausalLM, hub_cache, tmp_path)


@pytest.mark.parametrize("recipe", ["gpt-neox-tiny-cpu.yaml", "pythia-1b.yaml"])
def test_the_recipes_gpt_neox_trained_from_scratch_exports_as_gpt_neox_computing_the_same_logits(recipe, driver,
                                                                                               tmp_path, dataset):
    section = yaml.safe_load((ROOT / "recipes" / recipe).read_text())["model"]
    section.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB,
                   max_position_embeddings=TRAIN_SEQ, init_device="cpu")
    hf = train_export_and_compare(driver, tmp_path, dataset, section)
    assert type(hf) is GPTNeoXForCausalLM
