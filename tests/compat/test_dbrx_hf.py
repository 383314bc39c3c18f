"""Tessera's DBRX (an MPT read from transformers' DBRX config: grouped-query attention with clip_qkv and rotary
positions, LayerNorms without biases, GLU experts under DbrxRouter's routing) against transformers' DbrxForCausalLM,
the real peer, on random small configurations.

- transformers saves a folder -> Tessera loads it: logits within 1e-5, the loss within 1e-5 and every gradient within
  1e-4 relative (evaluation mode), on the SDPA and the explicit attention path; left padding; greedy generation.
- Training mode with output_router_logits: transformers adds moe_loss_weight * load_balancing_loss_func over the
  routers' outputs; Tessera's auxiliary loss has the same value and the total the same gradients.
- Tessera writes the folder back (transformers' layout): DbrxForCausalLM loads it with the same logits.
"""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, DbrxConfig, DbrxForCausalLM

import test_llama_hf
from test_hf_export import dataset  # noqa: F401 (the fixture)
from test_moe_hf import check_fine_tuned_export, check_router_aux_loss
from test_llama_hf import (SEQ, assert_gradients_match, check_greedy_generation, check_left_padding,
                           check_logits_and_gradients, randomise_norms_and_biases, run_tessera, save)


def dbrx_names(ours):
    """Tessera's gradients under DBRX's names: the attention and its norms sit inside norm_attn_norm there."""
    out = {}
    for key, value in ours.items():
        for inner in (".norm_1.", ".attn.", ".norm_2."):
            if key.startswith("grad.transformer.blocks.") and inner in key:
                key = key.replace(inner, ".norm_attn_norm" + inner, 1)
                break
        out[key] = value
    return out


@pytest.fixture(autouse=True)
def with_dbrx_names(monkeypatch):
    """The shared checks of test_llama_hf read Tessera's outputs under DBRX's parameter names."""
    monkeypatch.setattr(test_llama_hf, "run_tessera", lambda *a, **k: dbrx_names(run_tessera(*a, **k)))

BASE = dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=64, vocab_size=101)
CONFIGS = {
    "gqa-clip-top2": dict(BASE, attn_config=dict(kv_n_heads=2, clip_qkv=0.8, rope_theta=10000.0),
                          ffn_config=dict(ffn_hidden_size=48, moe_num_experts=4, moe_top_k=2,
                                          moe_normalize_expert_weights=1.0, ffn_act_fn={"name": "silu"})),
    "mqa-top1-unnormalised": dict(BASE, attn_config=dict(kv_n_heads=1, rope_theta=500000.0),
                                  ffn_config=dict(ffn_hidden_size=40, moe_num_experts=3, moe_top_k=1,
                                                  moe_normalize_expert_weights=None, ffn_act_fn={"name": "silu"})),
}


def hf_model(name, seed=0, **changes):
    torch.manual_seed(seed)
    model = DbrxForCausalLM(DbrxConfig(**dict(CONFIGS[name], **changes), attn_implementation="sdpa"))
    with torch.no_grad():  # transformers leaves the experts at torch.empty until _init_weights runs on them
        for n, p in model.named_parameters():
            if ".experts.mlp." in n:
                p.normal_(0.0, 0.05)
    return randomise_norms_and_biases(model).eval()


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path)


def test_left_padding_matches_transformers(driver, tmp_path):
    check_left_padding(hf_model("gqa-clip-top2", seed=1), driver, tmp_path)


def test_greedy_generation_matches_transformers_generate(driver, tmp_path):
    check_greedy_generation(hf_model("gqa-clip-top2", seed=5), driver, tmp_path)


@pytest.mark.parametrize("padded", [False, True])
def test_router_aux_loss_matches_transformers_in_training(padded, driver, tmp_path):
    """output_router_logits: DbrxForCausalLM adds moe_loss_weight * its load_balancing_loss_func (over the routers'
    softmax probabilities, padding excluded) to the loss; Tessera reports the same auxiliary loss and its total has
    the same gradients."""
    cfg = CONFIGS["gqa-clip-top2"]
    model = hf_model("gqa-clip-top2", seed=3, output_router_logits=True,
                     ffn_config=dict(cfg["ffn_config"], moe_loss_weight=0.05)).train()
    check_router_aux_loss(model, 0.05, "transformer.blocks.0.ffn.router.layer.weight", padded, driver, tmp_path,
                          rename=dbrx_names)


def test_tessera_writes_a_folder_transformers_loads_as_dbrx(driver, tmp_path):
    model = hf_model("gqa-clip-top2", seed=4)
    save(model, tmp_path / "hf")
    driver("export", tmp_path / "hf", tmp_path / "back")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == "dbrx" and config["architectures"] == ["DbrxForCausalLM"]
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "back", torch_dtype=torch.float32).eval()
    assert type(back) is DbrxForCausalLM
    assert set(dict(back.named_parameters())) == set(dict(model.named_parameters()))
    ids = torch.randint(0, 101, (2, SEQ), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert (back(ids).logits - model(ids).logits).abs().max().item() <= 1e-6
    assert (run_tessera(driver, tmp_path, tmp_path / "back", input_ids=ids)["logits"] - model(ids).logits.detach()) \
        .abs().max().item() <= 1e-5


def test_a_dbrx_folder_fine_tuned_and_exported_loads_in_transformers_as_the_same_function(driver, tmp_path,
                                                                                          dataset):
    """A DBRX folder (with output_router_logits: the load-balancing loss in training) fine-tuned 5 steps through
    hf_causal_lm, checkpointed and exported with `convert`: DbrxForCausalLM, the same logits."""
    from test_hf_export import VOCAB
    torch.manual_seed(6)
    start = tmp_path / "start"
    hf_model("gqa-clip-top2", vocab_size=VOCAB, output_router_logits=True).save_pretrained(start,
                                                                                         safe_serialization=True)
    check_fine_tuned_export(start, DbrxForCausalLM, driver, tmp_path, dataset)


def test_dbrx_recipe_plans_the_published_total_and_active_parameters(hub_cache, tmp_path):
    """recipes/dbrx.yaml is Databricks' published config.json of dbrx-instruct (every model key equal, but
    output_router_logits, on for training); its dry run, and the same run through hf_causal_lm over the config in a
    hub cache, print DbrxForCausalLM's parameter count and the active count (4 of 16 experts per layer): the
    published 132 B and 36 B."""
    import os
    import subprocess

    import yaml
    from conftest import ROOT
    published = json.loads((ROOT / "tests" / "data" / "hub_configs" / "databricks--dbrx-instruct.json").read_text())
    config = DbrxConfig(**{k: v for k, v in published.items() if k not in ("architectures", "model_type")})
    recipe = yaml.safe_load((ROOT / "recipes" / "dbrx.yaml").read_text())
    for key, value in recipe["model"].items():
        if key in ("attn_config", "ffn_config"):
            for sub, v in value.items():
                assert getattr(getattr(config, key), sub) == v, f"{key}.{sub}"
        elif key not in ("name", "init_device", "output_router_logits"):
            assert getattr(config, key) == value, key
    with torch.device("meta"):
        model = DbrxForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for p in model.transformer.blocks[0].ffn.experts.parameters())
    active = total - config.n_layers * experts * (16 - 4) // 16
    assert (total, active) == (131_596_523_520, 36_469_708_800)
    recipe["model"] = {"name": "hf_causal_lm", "pretrained_model_name_or_path": "databricks/dbrx-instruct",
                       "pretrained": False, "init_device": "meta"}
    (tmp_path / "via_hub.yaml").write_text(yaml.safe_dump(recipe))
    train = os.environ.get("TESSERA_TRAIN_BIN", str(ROOT / "build" / "bin" / "train"))
    for path in (ROOT / "recipes" / "dbrx.yaml", tmp_path / "via_hub.yaml"):
        proc = subprocess.run([train, "--recipe", str(path), "--dry-run", "--no-preflight", "--world-size", "256"], capture_output=True,
                              text=True, env=dict(os.environ, HF_HUB_CACHE=str(hub_cache)), timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"parameters                {total:,}" in proc.stdout, proc.stdout
        assert f"active parameters         {active:,}" in proc.stdout, proc.stdout
