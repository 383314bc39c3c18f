"""Tessera's SmolLM3 (`model.name: smollm3`, its own family folder) against transformers' own SmolLM3ForCausalLM, on
random small configurations: layers without rotary embeddings (NoPE, every no_rope_layer_interval-th layer or an
explicit no_rope_layers list), windowed attention on the layers layer_types names sliding_attention, grouped-query
attention, attention and MLP biases, tied or untied head.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5 and every
  gradient within 1e-4 relative, on the SDPA path and the explicit reference path.
- Left padding, packed documents and greedy generation equal transformers'.
- HF folder -> Tessera -> 5 training steps -> checkpoint -> `convert` -> AutoModelForCausalLM: a SmolLM3ForCausalLM
  with the same logits, its no_rope_layers and layer_types as given.
- What Tessera's SmolLM3 does not compute is refused naming the key.
"""
import json

import pytest
import torch
from transformers import SmolLM3Config, SmolLM3ForCausalLM

from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (check_greedy_generation, check_left_padding, check_logits_and_gradients,
                           check_packed_documents, randomise_norms_and_biases, run_tessera, save,
                           train_export_and_compare)

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=101, max_position_embeddings=64, rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1,
            eos_token_id=2)

CONFIGS = {
    # Layers 2 and 4 without rotary (interval 2), untied head.
    "nope-interval": dict(BASE, no_rope_layer_interval=2, tie_word_embeddings=False, rope_theta=50000.0),
    # An explicit NoPE list; the NoPE layers windowed (SmolLM3Config's layer_types for use_sliding_window), tied head,
    # biases.
    "nope-sliding-biases": dict(BASE, no_rope_layers=[1, 0, 1, 0], use_sliding_window=True, sliding_window=6,
                                attention_bias=True, mlp_bias=True),
}


def hf_model(name, seed=0):
    torch.manual_seed(seed)
    return randomise_norms_and_biases(
        SmolLM3ForCausalLM(SmolLM3Config(**CONFIGS[name], attn_implementation="sdpa")).eval())


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


def test_packed_documents_equal_each_document_alone(driver, tmp_path):
    check_packed_documents(hf_model("nope-interval", seed=2), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_generation_matches_transformers_generate(name, driver, tmp_path):
    check_greedy_generation(hf_model(name, seed=5), driver, tmp_path)


def test_configs_tessera_does_not_compute_are_refused_by_key(driver, tmp_path):
    folder = save(hf_model("nope-interval"), tmp_path / "smollm3")
    original = json.loads((folder / "config.json").read_text())
    ids = torch.zeros(1, 4, dtype=torch.long)
    for change, message in (({"no_rope_layers": [1, 0, 1]}, "no_rope_layers"),
                            ({"no_rope_layers": [1, 2, 1, 0]}, "no_rope_layers"),
                            ({"layer_types": ["sliding_attention"] * 4}, "layer_types"),
                            ({"rope_scaling": dict(rope_type="yarn", factor=2.0)}, "rope_scaling")):
        (folder / "config.json").write_text(json.dumps(dict(original, **change)))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)


@pytest.mark.parametrize("name", CONFIGS)
def test_hf_folder_trained_and_exported_loads_in_transformers_as_the_same_function(name, driver, tmp_path, dataset):
    torch.manual_seed(6)
    start = save(SmolLM3ForCausalLM(SmolLM3Config(**dict(CONFIGS[name], vocab_size=VOCAB))), tmp_path / "start")
    section = dict(CONFIGS[name], name="smollm3", vocab_size=VOCAB)  # the recipe takes SmolLM3Config's keys
    hf = train_export_and_compare(driver, tmp_path, dataset, section, start)
    assert type(hf) is SmolLM3ForCausalLM
    expected = SmolLM3Config(**dict(CONFIGS[name], vocab_size=VOCAB))
    assert hf.config.no_rope_layers == expected.no_rope_layers
    assert hf.config.layer_types == expected.layer_types
