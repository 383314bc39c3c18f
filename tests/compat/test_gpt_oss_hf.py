"""Tessera's gpt-oss (`model.name: gpt_oss`, its own family folder: OpenAI's gpt-oss-20b and -120b) against
transformers' own GptOssForCausalLM (eager attention, the only one it supports besides flex), on random small
configurations: grouped-query attention with biases and a learned sink logit per head, sliding-window and full layers,
YaRN rotary (its table factor) or plain rotary, and in every layer a mixture of stacked experts with biases, a router
with a bias (softmax over each token's top-k logits), the interleaved gate/up columns and the clamped SwiGLU (expert
weights scaled up so that the clamps bind), and transformers' load-balancing loss in training.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5 and every
  gradient within 1e-4 relative, on both attention paths; in training with output_router_logits, the same
  load-balancing loss, total and gradients.
- Left padding, packed documents and greedy generation (sliding windows over the KV cache) equal transformers'.
- HF folder -> Tessera -> 5 training steps -> checkpoint -> `convert` -> AutoModelForCausalLM: a GptOssForCausalLM
  with the same logits.
- The published folders' MXFP4 quantization_config, and what else Tessera's gpt-oss does not compute, are refused
  naming the key.
- recipes/gpt-oss-20b.yaml is the published openai/gpt-oss-20b architecture, and `train --dry-run` prints the
  parameter count transformers' GptOssForCausalLM has for it.
"""
import json

import pytest
import torch
from transformers import GptOssConfig, GptOssForCausalLM

from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (check_greedy_generation, check_left_padding, check_logits_and_gradients,
                           check_packed_documents, check_recipe_parameter_count, randomise_norms_and_biases,
                           run_tessera, save, train_export_and_compare)
from test_moe_hf import check_router_aux_loss

BASE = dict(hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=5, vocab_size=101,
            max_position_embeddings=64, rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2)

CONFIGS = {
    "yarn-sliding-then-full": dict(BASE, rope_theta=5000.0,
                                   rope_scaling=dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                                     truncate=False, original_max_position_embeddings=16)),
    # Plain rotary, a full layer before a sliding one, one expert per token, tied head.
    "plain-rope-top1-tied": dict(BASE, rope_scaling=None, layer_types=["full_attention", "sliding_attention"],
                                 num_experts_per_tok=1, tie_word_embeddings=True),
}


def hf_model(name, seed=0, **changes):
    torch.manual_seed(seed)
    model = GptOssForCausalLM(GptOssConfig(**dict(CONFIGS[name], **changes), attn_implementation="eager")).eval()
    randomise_norms_and_biases(model)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith(("sinks", "gate_up_proj_bias", "down_proj_bias")):
                p.normal_(0.0, 0.5)
            elif pname.endswith("gate_up_proj"):
                p.mul_(150.0)  # gate and up values past the clamps at +-7
    return model


def test_the_clamps_bind_in_the_compared_models():
    model = hf_model("yarn-sliding-then-full")
    experts = model.model.layers[0].mlp.experts
    x = torch.randn(64, 64)
    gate_up = x @ experts.gate_up_proj[0] + experts.gate_up_proj_bias[0]
    assert (gate_up.abs() > 7.0).float().mean() > 0.05


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


def test_packed_documents_equal_each_document_alone(driver, tmp_path):
    check_packed_documents(hf_model("yarn-sliding-then-full", seed=2), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_generation_matches_transformers_generate(name, driver, tmp_path):
    check_greedy_generation(hf_model(name, seed=5), driver, tmp_path)


@pytest.mark.parametrize("padded", [False, True])
def test_router_aux_loss_matches_transformers_in_training(padded, driver, tmp_path):
    """output_router_logits: transformers adds router_aux_loss_coef * load_balancing_loss_func over the softmax of the
    routers' scores (the softmaxed top-k logits, zero elsewhere) to the loss; Tessera's auxiliary loss, total and
    gradients are the same."""
    model = hf_model("yarn-sliding-then-full", seed=3, output_router_logits=True, router_aux_loss_coef=0.5).train()
    check_router_aux_loss(model, 0.5, "model.layers.0.mlp.router.weight", padded, driver, tmp_path)


def test_configs_tessera_does_not_compute_are_refused_by_key(driver, tmp_path):
    folder = save(hf_model("yarn-sliding-then-full"), tmp_path / "gpt_oss")
    original = json.loads((folder / "config.json").read_text())
    ids = torch.zeros(1, 4, dtype=torch.long)
    for change, message in (({"quantization_config": {"quant_method": "mxfp4"}}, "quantization_config"),
                            ({"layer_types": ["sliding_attention"]}, "layer_types"),
                            ({"rope_scaling": dict(rope_type="dynamic", factor=2.0)}, "rope_type")):
        (folder / "config.json").write_text(json.dumps(dict(original, **change)))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)


@pytest.mark.parametrize("name", CONFIGS)
def test_hf_folder_trained_and_exported_loads_in_transformers_as_the_same_function(name, driver, tmp_path, dataset):
    torch.manual_seed(6)
    start = save(GptOssForCausalLM(GptOssConfig(**dict(CONFIGS[name], vocab_size=VOCAB))), tmp_path / "start")
    section = dict(CONFIGS[name], name="gpt_oss", vocab_size=VOCAB)  # the recipe takes GptOssConfig's keys
    hf = train_export_and_compare(driver, tmp_path, dataset, section, start)
    assert type(hf) is GptOssForCausalLM


def test_recipe_is_the_published_gpt_oss_20b_with_transformers_parameter_count(hub_cache, tmp_path):
    # The published folder's config.json is refused: its quantized weights are not what Tessera loads.
    check_recipe_parameter_count("gpt-oss-20b.yaml", "openai/gpt-oss-20b", GptOssConfig, GptOssForCausalLM,
                                 hub_cache, tmp_path, world_size=64, trained_keys=("output_router_logits",),
                                 refused_by="quantization_config")
