"""Tessera's Qwen3 (`model_type: qwen3` in the Llama family) against transformers' own Qwen3ForCausalLM, on random
small configurations: per-head q/k RMSNorms before rotary, grouped-query attention with Qwen3's explicit head_dim
(which need not be hidden_size / heads), attention biases, tied embeddings, a sliding window on every layer.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5 and every
  gradient within 1e-4 relative, on the SDPA path and the explicit reference path.
- Left padding and greedy generation equal transformers'.
- HF folder -> Tessera -> 5 training steps -> checkpoint -> `convert` -> AutoModelForCausalLM: a Qwen3ForCausalLM with
  the same logits; a recipe of `model_type: qwen3` trained from scratch exports the same way.
- A sliding window on some layers only (max_window_layers, or an explicit layer_types) equals transformers' too.
- recipes/qwen3-8b.yaml is the published Qwen/Qwen3-8B config, and `train --dry-run` prints transformers' parameter
  count for it (8,190,735,360), from the recipe and through hf_causal_lm over the config.json in a hub cache.
"""
import json

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (check_greedy_generation, check_left_padding, check_logits_and_gradients,
                           check_recipe_parameter_count, randomise_norms_and_biases, run_tessera, save,
                           train_export_and_compare)

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=24, vocab_size=101, max_position_embeddings=64, rms_norm_eps=1e-5)

CONFIGS = {
    # head_dim 24 with 4 heads: the attention is 96 wide on a hidden size of 64.
    "gqa-head-dim": dict(BASE),
    "tied-biases-sliding": dict(BASE, head_dim=16, tie_word_embeddings=True, attention_bias=True,
                                use_sliding_window=True, sliding_window=7, max_window_layers=0),
    # The window in some layers only: from max_window_layers on, or as layer_types lists them.
    "window-from-layer-1": dict(BASE, use_sliding_window=True, sliding_window=5, max_window_layers=1),
    "window-layer-list": dict(BASE, num_hidden_layers=3, use_sliding_window=True, sliding_window=4,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
}


def hf_model(name, seed=0):
    torch.manual_seed(seed)
    return randomise_norms_and_biases(
        Qwen3ForCausalLM(Qwen3Config(**CONFIGS[name], attn_implementation="sdpa")).eval())


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_generation_matches_transformers_generate(name, driver, tmp_path):
    check_greedy_generation(hf_model(name, seed=5), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_hf_folder_trained_and_exported_loads_in_transformers_as_qwen3(name, driver, tmp_path, dataset):
    torch.manual_seed(6)
    start = save(Qwen3ForCausalLM(Qwen3Config(**dict(CONFIGS[name], vocab_size=VOCAB))), tmp_path / "start")
    section = {k: v for k, v in json.loads((start / "config.json").read_text()).items()
               if k in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                        "rms_norm_eps", "rope_theta", "tie_word_embeddings", "attention_bias", "sliding_window",
                        "layer_types")
               and v is not None}
    section["name"] = "llama"
    hf = train_export_and_compare(driver, tmp_path, dataset, section, start)
    assert type(hf) is Qwen3ForCausalLM
    assert hf.config.use_sliding_window == ("sliding_window" in section)
    assert hf.config.layer_types == Qwen3Config(**CONFIGS[name]).layer_types


def test_a_recipe_trained_from_scratch_exports_as_qwen3(driver, tmp_path, dataset):
    section = dict(name="llama", model_type="qwen3", vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                   init_device="cpu")  # head_dim: Qwen3Config's default, 128
    hf = train_export_and_compare(driver, tmp_path, dataset, section)
    assert type(hf) is Qwen3ForCausalLM and hf.config.head_dim == 128


def test_a_layer_list_of_the_wrong_length_is_refused_naming_the_key(driver, tmp_path):
    folder = save(Qwen3ForCausalLM(Qwen3Config(**CONFIGS["window-from-layer-1"])), tmp_path / "qwen3")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, layer_types=["sliding_attention"] * 3)))
    with pytest.raises(AssertionError, match=r"layer_types: has 3 entries for 2 layers"):
        run_tessera(driver, tmp_path, folder, input_ids=torch.zeros(1, 4, dtype=torch.long))


def test_recipe_is_the_published_qwen3_8b_with_transformers_parameter_count(hub_cache, tmp_path):
    check_recipe_parameter_count("qwen3-8b.yaml", "Qwen/Qwen3-8B", Qwen3Config, Qwen3ForCausalLM, hub_cache, tmp_path,
                                 world_size=64)
