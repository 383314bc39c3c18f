"""Tessera's GLM-4 (`model.name: glm4`, its own family folder: GLM-4-0414) against transformers' own Glm4ForCausalLM,
on random small configurations: RMSNorms before and after both the attention and the MLP, rotary on part of each head
in the interleaved layout (pairs 2i, 2i + 1), grouped-query attention with biases on q/k/v only, an explicit head_dim,
a SwiGLU MLP with one fused gate_up_proj, tied or untied head.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5 and every
  gradient within 1e-4 relative, on the SDPA path and the explicit reference path.
- Left padding, packed documents and greedy generation equal transformers'.
- HF folder -> Tessera -> 5 training steps -> checkpoint -> `convert` -> AutoModelForCausalLM: a Glm4ForCausalLM with
  the same logits.
- What Tessera's GLM-4 does not compute is refused naming the key.
"""
import json

import pytest
import torch
from transformers import Glm4Config, Glm4ForCausalLM

from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (check_greedy_generation, check_left_padding, check_logits_and_gradients,
                           check_packed_documents, randomise_norms_and_biases, run_tessera, save,
                           train_export_and_compare)

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=101, max_position_embeddings=64, rms_norm_eps=1e-5, pad_token_id=0,
            bos_token_id=1, eos_token_id=2)

CONFIGS = {
    "half-rotary-biases": dict(BASE, rope_theta=20000.0),
    # head_dim 24 (96 wide on a hidden size of 64), all of each head rotating, no biases, tied head.
    "whole-rotary-tied": dict(BASE, head_dim=24, partial_rotary_factor=1.0, attention_bias=False,
                              tie_word_embeddings=True),
}


def hf_model(name, seed=0):
    torch.manual_seed(seed)
    return randomise_norms_and_biases(Glm4ForCausalLM(Glm4Config(**CONFIGS[name], attn_implementation="sdpa")).eval())


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


def test_packed_documents_equal_each_document_alone(driver, tmp_path):
    check_packed_documents(hf_model("half-rotary-biases", seed=2), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_generation_matches_transformers_generate(name, driver, tmp_path):
    check_greedy_generation(hf_model(name, seed=5), driver, tmp_path)


def test_configs_tessera_does_not_compute_are_refused_by_key(driver, tmp_path):
    folder = save(hf_model("half-rotary-biases"), tmp_path / "glm4")
    original = json.loads((folder / "config.json").read_text())
    ids = torch.zeros(1, 4, dtype=torch.long)
    for change, message in (({"partial_rotary_factor": 0.2}, "partial_rotary_factor"),  # int(16 x 0.2) = 3: odd
                            ({"rope_scaling": dict(rope_type="linear", factor=2.0)}, "rope_scaling")):
        (folder / "config.json").write_text(json.dumps(dict(original, **change)))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)


@pytest.mark.parametrize("name", CONFIGS)
def test_hf_folder_trained_and_exported_loads_in_transformers_as_the_same_function(name, driver, tmp_path, dataset):
    torch.manual_seed(6)
    start = save(Glm4ForCausalLM(Glm4Config(**dict(CONFIGS[name], vocab_size=VOCAB))), tmp_path / "start")
    section = dict(CONFIGS[name], name="glm4", vocab_size=VOCAB)  # the recipe takes Glm4Config's keys
    hf = train_export_and_compare(driver, tmp_path, dataset, section, start)
    assert type(hf) is Glm4ForCausalLM
