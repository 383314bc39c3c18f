"""Tessera's Nemotron (`model.name: nemotron`, its own family folder) against transformers' own NemotronForCausalLM,
on random small configurations: LayerNorm1P (scaled by 1 + weight), rotary on the first partial_rotary_factor of each
head, an explicit head_dim, grouped-query attention, a squared-ReLU MLP without gate, attention and MLP biases.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5 and every
  gradient within 1e-4 relative, on the SDPA path and the explicit reference path.
- Left padding, packed documents and greedy generation equal transformers'.
- HF folder -> Tessera -> 5 training steps -> checkpoint -> `convert` -> AutoModelForCausalLM: a NemotronForCausalLM
  with the same logits; the recipe's model trained from scratch exports the same way.
- recipes/minitron-4b.yaml is the published nvidia/Minitron-4B-Base config, and `train --dry-run` prints the
  parameter count transformers computes for it, from the recipe and from the config.json in a hub cache.
- What Tessera's Nemotron does not compute is refused naming the key.
"""
import json

import pytest
import torch
import yaml
from transformers import NemotronConfig, NemotronForCausalLM

from conftest import ROOT
from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (TRAIN_SEQ, check_greedy_generation, check_left_padding, check_logits_and_gradients,
                           check_packed_documents, check_recipe_parameter_count, randomise_norms_and_biases,
                           run_tessera, save, train_export_and_compare)

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=101,
            max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)

# NemotronConfig leaves num_key_value_heads None when not given, which its attention cannot run: each config gives it.
CONFIGS = {
    # head_dim 24 with 4 heads (96 wide on a hidden size of 64), rotary on 12 of them.
    "gqa-head-dim": dict(BASE, num_key_value_heads=2, head_dim=24),
    "biases-quarter-rotary-tied": dict(BASE, num_key_value_heads=4, attention_bias=True, mlp_bias=True, partial_rotary_factor=0.25,
                                       tie_word_embeddings=True, rope_theta=3000.0),
}


def hf_model(name, seed=0):
    torch.manual_seed(seed)
    return randomise_norms_and_biases(
        NemotronForCausalLM(NemotronConfig(**CONFIGS[name], attn_implementation="sdpa")).eval())


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


def test_packed_documents_equal_each_document_alone(driver, tmp_path):
    check_packed_documents(hf_model("gqa-head-dim", seed=2), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_generation_matches_transformers_generate(name, driver, tmp_path):
    check_greedy_generation(hf_model(name, seed=5), driver, tmp_path)


def test_configs_tessera_does_not_compute_are_refused_by_key(driver, tmp_path):
    folder = save(hf_model("gqa-head-dim"), tmp_path / "nemotron")
    original = json.loads((folder / "config.json").read_text())
    ids = torch.zeros(1, 4, dtype=torch.long)
    for change, message in (({"partial_rotary_factor": 0.3}, "partial_rotary_factor"),  # int(24 x 0.3) = 7: odd
                            ({"hidden_act": "gelu_accurate"}, "hidden_act"),
                            ({"rope_scaling": dict(rope_type="linear", factor=2.0)}, "rope_scaling")):
        (folder / "config.json").write_text(json.dumps(dict(original, **change)))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)


@pytest.mark.parametrize("name", CONFIGS)
def test_hf_folder_trained_and_exported_loads_in_transformers_as_the_same_function(name, driver, tmp_path, dataset):
    torch.manual_seed(6)
    start = save(NemotronForCausalLM(NemotronConfig(**dict(CONFIGS[name], vocab_size=VOCAB))), tmp_path / "start")
    section = dict(CONFIGS[name], name="nemotron", vocab_size=VOCAB)  # the recipe takes NemotronConfig's keys
    hf = train_export_and_compare(driver, tmp_path, dataset, section, start)
    assert type(hf) is NemotronForCausalLM


def test_the_recipe_trained_from_scratch_exports_as_nemotron_computing_the_same_logits(driver, tmp_path, dataset):
    section = yaml.safe_load((ROOT / "recipes" / "minitron-4b.yaml").read_text())["model"]
    section.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, max_position_embeddings=TRAIN_SEQ,
                   bos_token_id=None, eos_token_id=None, init_device="cpu")
    hf = train_export_and_compare(driver, tmp_path, dataset, section)
    assert type(hf) is NemotronForCausalLM


def test_recipe_is_the_published_minitron_4b_with_transformers_parameter_count(hub_cache, tmp_path):
    check_recipe_parameter_count("minitron-4b.yaml", "nvidia/Minitron-4B-Base", NemotronConfig, NemotronForCausalLM,
                                 hub_cache, tmp_path)
