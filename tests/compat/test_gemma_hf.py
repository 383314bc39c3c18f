"""Tessera's Gemma 2 and Gemma 3 (text) families against transformers' Gemma2ForCausalLM and Gemma3ForCausalLM (the
real peers), on random small configurations: Gemma 2's alternating sliding-window and full layers with attention and
final-logit soft-capping (caps small enough to bite) and a query_pre_attn_scalar other than head_dim; Gemma 3's q/k
norms, separate rope bases for sliding and full layers, linear rope scaling on the full ones; an untied Gemma 2 with
attention biases and no soft-capping.

transformers computes Gemma 2's attention soft-capping only with attn_implementation eager (its SDPA path drops it,
and its docs ask for eager when training Gemma 2); Tessera computes the eager function, so the peer runs eager.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5, and the
  gradient of every parameter within 1e-4 relative (the pad_token_id embedding row gets none, as in
  nn.Embedding(padding_idx)), on the SDPA path and the explicit reference path.
- Left padding, packed documents and greedy generation with the KV cache equal transformers' (shared checks).
- What Tessera's Gemma does not compute is refused by name.
- HF folder -> Tessera -> 5 training steps -> checkpoint -> `convert` -> transformers loads the same class computing
  the same logits; the recipes' models trained from scratch export the same way.
- recipes/gemma-2-2b.yaml is the published google/gemma-2-2b config, and `train --dry-run` prints the parameter count
  transformers computes for it, from the recipe and from the config.json in a hub cache.
"""
import json

import pytest
import torch
import yaml
from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

from conftest import ROOT
from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (TRAIN_SEQ, check_greedy_generation, check_left_padding, check_logits_and_gradients,
                           check_packed_documents, check_recipe_parameter_count, randomise_norms_and_biases,
                           run_tessera, save, train_export_and_compare)

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=101, max_position_embeddings=64, sliding_window=7, pad_token_id=0,
            bos_token_id=2, eos_token_id=1)

CONFIGS = {
    "gemma2-softcaps": (Gemma2Config, Gemma2ForCausalLM,
                        dict(BASE, query_pre_attn_scalar=24, attn_logit_softcapping=1.5, final_logit_softcapping=2.0)),
    "gemma3-qk-norms-local-rope": (Gemma3TextConfig, Gemma3ForCausalLM,
                                   dict(BASE, query_pre_attn_scalar=16, rope_theta=10000.0, rope_local_base_freq=50.0,
                                        rope_scaling={"rope_type": "linear", "factor": 2.0},
                                        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    "gemma2-untied-biases-no-caps": (Gemma2Config, Gemma2ForCausalLM,
                                     dict(BASE, num_key_value_heads=4, tie_word_embeddings=False, attention_bias=True,
                                          attn_logit_softcapping=None, final_logit_softcapping=None,
                                          hidden_activation="gelu")),
}
SEQ = 29


def hf_model(name, seed=0, **changes):
    config_class, model_class, cfg = CONFIGS[name]
    torch.manual_seed(seed)
    return randomise_norms_and_biases(model_class(config_class(**dict(cfg, **changes), attn_implementation="eager")).eval())


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path, pad_at=(1, 4))


@pytest.mark.parametrize("name", ["gemma2-softcaps", "gemma3-qk-norms-local-rope"])
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


@pytest.mark.parametrize("name", ["gemma2-softcaps", "gemma3-qk-norms-local-rope"])
def test_packed_documents_equal_each_document_alone(name, driver, tmp_path):
    check_packed_documents(hf_model(name, seed=2), driver, tmp_path)


@pytest.mark.parametrize("name", ["gemma2-softcaps", "gemma3-qk-norms-local-rope"])
def test_greedy_generation_matches_transformers_generate(name, driver, tmp_path):
    # Without the final cap: check_greedy_generation sharpens the head, and a cap of 2 would flatten it into ties.
    check_greedy_generation(hf_model(name, seed=5, final_logit_softcapping=None), driver, tmp_path, lowest_id=3)


def test_configs_tessera_does_not_compute_are_refused(driver, tmp_path):
    ids = torch.zeros(1, 4, dtype=torch.long)
    folder = save(hf_model("gemma3-qk-norms-local-rope"), tmp_path / "hf")
    original = json.loads((folder / "config.json").read_text())
    for change, message in (({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
                            ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope_type"),
                            ({"hidden_activation": "gelu_accurate"}, "hidden_activation"),
                            ({"layer_types": ["full_attention"]}, "layer_types"),
                            ({"model_type": "gemma3"}, 'model_type is "gemma3"')):
        (folder / "config.json").write_text(json.dumps(dict(original, **change)))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)


@pytest.mark.parametrize("name", ["gemma3-qk-norms-local-rope", "gemma2-untied-biases-no-caps"])
def test_hf_folder_trained_and_exported_loads_in_transformers_as_the_same_function(name, driver, tmp_path, dataset):
    config_class, model_class, cfg = CONFIGS[name]
    torch.manual_seed(6)
    start = save(model_class(config_class(**dict(cfg, vocab_size=VOCAB))), tmp_path / "start")
    section = dict(cfg, name=config_class.model_type, vocab_size=VOCAB)  # the recipe takes the config class's keys
    hf = train_export_and_compare(driver, tmp_path, dataset, section, start)
    assert type(hf) is model_class


@pytest.mark.parametrize("recipe", ["gemma-tiny-cpu.yaml", "gemma-2-2b.yaml"])
def test_the_recipes_gemma_trained_from_scratch_exports_as_gemma_computing_the_same_logits(recipe, driver, tmp_path,
                                                                                         dataset):
    section = yaml.safe_load((ROOT / "recipes" / recipe).read_text())["model"]
    # The attention cap off: transformers' default (SDPA) path, which the export loads with, does not apply it.
    section.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=7, vocab_size=VOCAB,
                   max_position_embeddings=TRAIN_SEQ, init_device="cpu", attn_logit_softcapping=None)
    hf = train_export_and_compare(driver, tmp_path, dataset, section)
    assert type(hf) is Gemma2ForCausalLM


def test_recipe_is_the_published_gemma_2_2b_with_transformers_parameter_count(hub_cache, tmp_path):
    check_recipe_parameter_count("gemma-2-2b.yaml", "google/gemma-2-2b", Gemma2Config, Gemma2ForCausalLM, hub_cache, tmp_path)
