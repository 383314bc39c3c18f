"""Tessera's DeepSeek-V3 (`model.name: deepseek_v3`, its own family folder: DeepSeek-V3/V3.1/R1 and Kimi K2's
architecture) against transformers' own DeepseekV3ForCausalLM, on random small configurations: multi-head latent
attention (low-rank queries or one q_proj, keys and values from a compressed latent, a rotary key shared by the
heads, rotary in the interleaved or rotate-half layout, values narrower than the keys), YaRN rotary scaling with its
softmax and table corrections, dense layers before first_k_dense_replace, then mixture-of-experts layers routed by
sigmoid scores within the best expert groups (with random routing correction biases) beside a shared expert.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5 and every
  gradient within 1e-4 relative, on the SDPA path and the explicit reference path.
- Left padding, packed documents and greedy generation (with the KV cache) equal transformers'.
- HF folder -> Tessera -> 5 training steps -> checkpoint -> `convert` -> AutoModelForCausalLM: a DeepseekV3ForCausalLM
  with the same logits, the correction biases carried through.
- What Tessera's DeepSeek-V3 does not compute is refused naming the key; the published config.json, whose
  quantization_config describes fp8 block-quantized weights, is refused naming that key.
- recipes/deepseek-v3.yaml is the published deepseek-ai/DeepSeek-V3 architecture, and `train --dry-run` prints the
  parameter count transformers' DeepseekV3ForCausalLM has for it (its routing correction biases, buffers there,
  counted: Tessera holds them as frozen parameters).
"""
import json

import pytest
import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (check_greedy_generation, check_left_padding, check_logits_and_gradients,
                           check_packed_documents, check_recipe_parameter_count, randomise_norms_and_biases,
                           run_tessera, save, train_export_and_compare)

BASE = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=2.5,
            kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, v_head_dim=12, qk_nope_head_dim=16, n_group=4,
            topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1, vocab_size=101, max_position_embeddings=64,
            rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2)

CONFIGS = {
    "latent-q-interleaved": dict(BASE),
    # One q_proj, rotate-half rotary, YaRN (its softmax scale from mscale_all_dim and a table factor from mscale),
    # biases on the latent projections and o_proj, unnormalised top-k weights, tied head.
    "q-proj-yarn-tied": dict(BASE, q_lora_rank=None, rope_interleave=False, attention_bias=True, norm_topk_prob=False,
                             tie_word_embeddings=True, rope_theta=5000.0,
                             rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=16,
                                               beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.8)),
}


def hf_model(name, seed=0):
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**CONFIGS[name], attn_implementation="sdpa")).eval()
    randomise_norms_and_biases(model)
    with torch.no_grad():  # the routers' correction biases (zeros in a new model) change which experts are chosen
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.normal_(0.0, 0.05)
    return model


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


def test_packed_documents_equal_each_document_alone(driver, tmp_path):
    check_packed_documents(hf_model("latent-q-interleaved", seed=2), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_generation_matches_transformers_generate(name, driver, tmp_path):
    check_greedy_generation(hf_model(name, seed=5), driver, tmp_path)


def test_configs_tessera_does_not_compute_are_refused_by_key(driver, tmp_path):
    folder = save(hf_model("latent-q-interleaved"), tmp_path / "deepseek")
    original = json.loads((folder / "config.json").read_text())
    ids = torch.zeros(1, 4, dtype=torch.long)
    for change, message in (({"num_key_value_heads": 2}, "num_key_value_heads"),
                            ({"n_group": 8}, "n_group"),  # groups of one expert
                            ({"hidden_act": "gelu"}, "hidden_act"),
                            ({"rope_scaling": dict(rope_type="dynamic", factor=2.0)}, "rope_type"),
                            ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config")):
        (folder / "config.json").write_text(json.dumps(dict(original, **change)))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)


@pytest.mark.parametrize("name", CONFIGS)
def test_hf_folder_trained_and_exported_loads_in_transformers_as_the_same_function(name, driver, tmp_path, dataset):
    torch.manual_seed(6)
    start_model = DeepseekV3ForCausalLM(DeepseekV3Config(**dict(CONFIGS[name], vocab_size=VOCAB)))
    with torch.no_grad():
        for module in start_model.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.normal_(0.0, 0.05)
    start = save(start_model, tmp_path / "start")
    section = dict(CONFIGS[name], name="deepseek_v3", vocab_size=VOCAB)  # the recipe takes DeepseekV3Config's keys
    hf = train_export_and_compare(driver, tmp_path, dataset, section, start)
    assert type(hf) is DeepseekV3ForCausalLM
    # The correction biases do not train: the export carries the folder's.
    exported = {n: b for n, b in hf.named_buffers() if n.endswith("e_score_correction_bias")}
    assert exported
    for n, b in exported.items():
        assert torch.equal(b, dict(start_model.named_buffers())[n]), n


def test_recipe_is_the_published_deepseek_v3_with_transformers_parameter_count(hub_cache, tmp_path):
    # The published folder's config.json is refused: its quantized weights are not what Tessera loads.
    check_recipe_parameter_count("deepseek-v3.yaml", "deepseek-ai/DeepSeek-V3", DeepseekV3Config,
                                 DeepseekV3ForCausalLM, hub_cache, tmp_path, world_size=1024,
                                 counted_buffers="e_score_correction_bias", refused_by="quantization_config")
