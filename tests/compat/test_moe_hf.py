"""Tessera's mixture-of-experts families against transformers' MixtralForCausalLM, Qwen2MoeForCausalLM and
Qwen3MoeForCausalLM (the real peers), on random small configurations: top-1 and top-k routing, grouped-query
attention, Qwen2-MoE's shared expert and its gate, Qwen3-MoE's per-head q/k norms, norm_topk_prob on and off, dense
layers between sparse ones (decoder_sparse_step, mlp_only_layers).

- transformers saves a folder -> Tessera loads it: logits within 1e-5, the loss within 1e-5 and every gradient within
  1e-4 relative (evaluation mode), on the SDPA and the explicit attention path; left padding; greedy generation.
- Training mode with output_router_logits: transformers' loss adds router_aux_loss_coef * load_balancing_loss_func
  (over every sparse layer, padding excluded); Tessera's auxiliary loss has the same value and the total the same
  gradients, with and without padding.
- HF folder -> Tessera -> 5 training steps -> checkpoint -> `convert` -> AutoModelForCausalLM: the same class and
  logits.
"""
import json

import pytest
import torch
from transformers import (MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (SEQ, assert_gradients_match, check_greedy_generation, check_left_padding,
                           check_logits_and_gradients, randomise_norms_and_biases, run_tessera, save)

BASE = dict(hidden_size=64, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=101, max_position_embeddings=64, rms_norm_eps=1e-5)
CONFIGS = {
    "mixtral-top2-of-4": (MixtralConfig, MixtralForCausalLM, dict(BASE, num_local_experts=4, num_experts_per_tok=2)),
    "mixtral-top1-of-3-mha": (MixtralConfig, MixtralForCausalLM,
                              dict(BASE, num_key_value_heads=4, num_local_experts=3, num_experts_per_tok=1,
                                   tie_word_embeddings=True)),
    "qwen2-moe-shared": (Qwen2MoeConfig, Qwen2MoeForCausalLM,
                         dict(BASE, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                              shared_expert_intermediate_size=40)),
    "qwen2-moe-normalised-sparse-step": (Qwen2MoeConfig, Qwen2MoeForCausalLM,
                                         dict(BASE, num_hidden_layers=4, num_experts=4, num_experts_per_tok=3,
                                              moe_intermediate_size=32, shared_expert_intermediate_size=24,
                                              norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[3])),
    # Qwen3-MoE: per-head q/k RMSNorms, no shared expert; attention biases, an explicit head_dim.
    "qwen3-moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM,
                  dict(BASE, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)),
    "qwen3-moe-normalised-biases-head-dim": (Qwen3MoeConfig, Qwen3MoeForCausalLM,
                                             dict(BASE, num_experts=4, num_experts_per_tok=3, moe_intermediate_size=24,
                                                  norm_topk_prob=True, attention_bias=True, head_dim=24,
                                                  decoder_sparse_step=2)),
}


def hf_model(name, seed=0, **changes):
    config_class, model_class, cfg = CONFIGS[name]
    torch.manual_seed(seed)
    return randomise_norms_and_biases(model_class(config_class(**dict(cfg, **changes), attn_implementation="sdpa"))
                                      .eval())


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path)


@pytest.mark.parametrize("name", ["mixtral-top2-of-4", "qwen2-moe-shared", "qwen3-moe"])
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


@pytest.mark.parametrize("name", ["mixtral-top2-of-4", "qwen2-moe-normalised-sparse-step", "qwen3-moe"])
def test_greedy_generation_matches_transformers_generate(name, driver, tmp_path):
    check_greedy_generation(hf_model(name, seed=5), driver, tmp_path)


def check_router_aux_loss(model, coef, router, padded, driver, tmp_path, rename=lambda ours: ours):
    """`model` (training mode, output_router_logits on, the auxiliary loss weighted by `coef`) and Tessera on its folder
    in training mode: the same auxiliary loss (1e-6), loss (1e-5) and gradients (1e-4 relative), left-padded when
    `padded`; the `router` weight's gradient differs from transformers' without the auxiliary loss, so it is there.
    `rename` maps Tessera's outputs to the family's parameter names. Shared with test_dbrx_hf."""
    from safetensors.torch import load_file, save_file
    folder = save(model, tmp_path / "hf")
    ids = torch.randint(0, model.config.vocab_size, (3, SEQ), generator=torch.Generator().manual_seed(2))
    labels, kwargs, inputs = ids.clone(), {}, {}
    if padded:
        mask = torch.ones(3, SEQ, dtype=torch.long)
        mask[1, :5] = 0
        mask[2, :12] = 0
        predicted = torch.cat([torch.zeros(3, 1, dtype=torch.long), mask[:, :-1]], 1)
        labels = ids.masked_fill((mask == 0) | (predicted == 0), -100)
        kwargs = dict(attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
        inputs = dict(attention_mask=mask.bool())
    model.zero_grad()
    out = model(input_ids=ids, labels=labels, **kwargs)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    save_file(dict(input_ids=ids, labels=labels, **inputs), tmp_path / "in.safetensors")
    driver("forward", folder, tmp_path / "in.safetensors", tmp_path / "out.safetensors", "--train")
    ours = rename(load_file(tmp_path / "out.safetensors"))
    aux = coef * out.aux_loss.item()
    assert aux > 0
    assert abs(ours["aux.aux_loss"].item() - aux) <= 1e-6
    assert abs(ours["loss"].item() - out.loss.item()) <= 1e-5
    assert_gradients_match(ours, grads, model.config.tie_word_embeddings)
    model.config.output_router_logits = False
    model.zero_grad()
    model(input_ids=ids, labels=labels, output_router_logits=False, **kwargs).loss.backward()
    plain = dict(model.named_parameters())[router].grad
    assert (ours["grad." + router] - plain).abs().max().item() > 1e-6


def check_fine_tuned_export(start, model_class, driver, tmp_path, dataset):
    """The HF folder `start` fine-tuned 5 steps through hf_causal_lm (training losses fall), checkpointed and exported
    with `convert`: transformers loads `model_class` computing Tessera's logits. Shared with test_dbrx_hf."""
    from test_hf_export import convert, train_and_checkpoint
    section = {"name": "hf_causal_lm", "pretrained_model_name_or_path": str(start), "pretrained": True}
    checkpoint = train_and_checkpoint(driver, tmp_path, dataset, section)
    losses = json.loads((tmp_path / "trace" / "trace.json").read_text())["losses"]
    assert losses[-1] < losses[0]
    assert convert(checkpoint, tmp_path / "hf").returncode == 0
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32).eval()
    assert type(hf) is model_class
    ids = torch.randint(0, VOCAB, (3, 32), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert (run_tessera(driver, tmp_path, tmp_path / "hf", input_ids=ids)["logits"] - hf(ids).logits) \
            .abs().max().item() <= 1e-5


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name", ["mixtral-top2-of-4", "qwen2-moe-normalised-sparse-step", "qwen3-moe"])
def test_router_aux_loss_matches_transformers_in_training(name, padded, driver, tmp_path):
    """output_router_logits: transformers adds router_aux_loss_coef * load_balancing_loss_func(router logits of every
    sparse layer, attention_mask) to the loss in training; Tessera reports the same auxiliary loss and its total has
    the same gradients (the loss couples the layers: each expert's share of the slots over all of them)."""
    model = hf_model(name, seed=3, output_router_logits=True, router_aux_loss_coef=0.05).train()
    router = next(n for n, _ in model.named_parameters() if n.endswith("gate.weight") and "shared" not in n)
    check_router_aux_loss(model, 0.05, router, padded, driver, tmp_path)


@pytest.mark.parametrize("name", ["mixtral-top2-of-4", "qwen2-moe-shared", "qwen3-moe-normalised-biases-head-dim"])
def test_hf_folder_trained_and_exported_loads_in_transformers_as_the_same_function(name, driver, tmp_path, dataset):
    config_class, model_class, cfg = CONFIGS[name]
    torch.manual_seed(6)
    start = save(model_class(config_class(**dict(cfg, vocab_size=VOCAB, output_router_logits=True))),
                 tmp_path / "start")
    check_fine_tuned_export(start, model_class, driver, tmp_path, dataset)


def test_mixtral_recipe_plans_the_published_total_and_active_parameters(hub_cache, tmp_path):
    """recipes/mixtral-8x7b.yaml is Mistral AI's published config.json of Mixtral-8x7B-v0.1 (every model key equal,
    but output_router_logits, on for training); the dry run prints MixtralForCausalLM's parameter count for it and
    the active count (embeddings, attention, norms, routers and 2 of 8 experts per layer), from the recipe and through
    hf_causal_lm over the config in a hub cache."""
    import os
    import subprocess

    import yaml
    from conftest import ROOT
    published = json.loads((ROOT / "tests" / "data" / "hub_configs" / "mistralai--Mixtral-8x7B-v0.1.json").read_text())
    config = MixtralConfig(**{k: v for k, v in published.items() if k not in ("architectures", "model_type")})
    recipe = yaml.safe_load((ROOT / "recipes" / "mixtral-8x7b.yaml").read_text())
    for key, value in recipe["model"].items():
        if key not in ("name", "init_device", "output_router_logits"):
            assert getattr(config, key) == value, key
    with torch.device("meta"):
        model = MixtralForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for p in model.model.layers[0].block_sparse_moe.experts[0].parameters())
    active = total - config.num_hidden_layers * (config.num_local_experts - config.num_experts_per_tok) * expert
    assert (total, active) == (46_702_792_704, 12_879_925_248)  # Mistral AI's published 46.7 B and 12.9 B
    recipe["model"] = {"name": "hf_causal_lm", "pretrained_model_name_or_path": "mistralai/Mixtral-8x7B-v0.1",
                       "pretrained": False, "init_device": "meta", "config_overrides": {"output_router_logits": True}}
    (tmp_path / "via_hub.yaml").write_text(yaml.safe_dump(recipe))
    train = os.environ.get("TESSERA_TRAIN_BIN", str(ROOT / "build" / "bin" / "train"))
    for path in (ROOT / "recipes" / "mixtral-8x7b.yaml", tmp_path / "via_hub.yaml"):
        proc = subprocess.run([train, "--recipe", str(path), "--dry-run", "--no-preflight", "--world-size", "64"], capture_output=True,
                              text=True, env=dict(os.environ, HF_HUB_CACHE=str(hub_cache)), timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"parameters                {total:,}" in proc.stdout, proc.stdout
        assert f"active parameters         {active:,}" in proc.stdout, proc.stdout
