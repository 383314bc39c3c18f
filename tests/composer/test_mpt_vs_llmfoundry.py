"""Tessera's MPT against LLM Foundry's own MPTForCausalLM (llmfoundry.models.mpt), on the architectures the recipes
produce, which HF transformers' MPT class cannot represent: learned positions and biases (LLM Foundry's defaults, as
in recipes/mpt-*.yaml), low-precision LayerNorm, grouped-query attention, GLU feed-forward, qk_ln, RMSNorm, separate
Wq/Wk/Wv projections (fused_qkv: false), ffn_act_fn (the tanh GELU, ReLU), and mixtures of experts (ffn_type
torch_dmoe: top-k routing, GLU experts, normalised expert weights, uniform assignment), whose MegaBlocks
load-balancing loss and router z-loss are checked on LLM Foundry's own routing.

LLM Foundry builds and initialises the model and writes it with save_pretrained (its own config.json and
safetensors); Tessera loads that folder. Same tokens: logits within 1e-5 max-abs in fp32 and every parameter's loss
gradient within 1e-4 of its scale (plus 1e-7 for gradients that are zero up to rounding). (RoPE is not compared here: LLM Foundry's `dail` rotary needs flash-attn, which
has no CPU build; tests/compat/test_mpt_reference.py compares it against a plain-PyTorch reference.)
"""
import json
import os
import pathlib
import subprocess

import pytest
import torch
from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM
from safetensors.torch import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIVER = os.environ.get("TESSERA_COMPAT_DRIVER", str(ROOT / "build" / "bin" / "tessera_compat_driver"))

BASE = dict(d_model=64, n_heads=4, n_layers=2, expansion_ratio=4, max_seq_len=32, vocab_size=101,
            attn_config={"attn_impl": "torch"})
MOE = dict(ffn_type="torch_dmoe", mlp_type="mlp", moe_jitter_eps=None, moe_normalize_expert_weights=None,
           uniform_expert_assignment=False)
CONFIGS = {
    # LLM Foundry's defaults, as the recipes use them: learned positions, biases, low_precision_layernorm.
    "recipe-defaults": {},
    "gqa": dict(attn_config={"attn_impl": "torch", "attn_type": "grouped_query_attention", "kv_n_heads": 2}),
    "glu-no-bias-untied": dict(ffn_config={"ffn_type": "mptglu"}, no_bias=True, tie_word_embeddings=False),
    "qk-ln-rmsnorm": dict(attn_config={"attn_impl": "torch", "qk_ln": True}, norm_type="rmsnorm"),
    "alibi-clip": dict(attn_config={"attn_impl": "torch", "alibi": True, "alibi_bias_max": 4, "clip_qkv": 0.8}),
    # LLM Foundry's separate Wq, Wk, Wv (attn_config.fused_qkv: false), each clipped.
    "unfused-qkv-gqa-clip": dict(attn_config={"attn_impl": "torch", "fused_qkv": False, "clip_qkv": 0.5,
                                              "attn_type": "grouped_query_attention", "kv_n_heads": 2}),
    # ffn_config.ffn_act_fn: torch.nn.functional's tanh GELU in the GLU, and ReLU in the plain MLP.
    "glu-tanh-gelu": dict(ffn_config={"ffn_type": "mptglu", "ffn_act_fn": {"name": "gelu", "approximate": "tanh"}}),
    "relu": dict(ffn_config={"ffn_type": "mptmlp", "ffn_act_fn": {"name": "relu"}}),
    # Mixtures of experts: LLM Foundry's torch_dmoe (every key it requires, as its testing YAMLs give them).
    "torch-dmoe-top2": dict(ffn_config=dict(MOE, moe_num_experts=4, moe_top_k=2)),
    "torch-dmoe-top1-of-8": dict(ffn_config=dict(MOE, moe_num_experts=8, moe_top_k=1)),
    "torch-dmoe-glu-silu-normalized-no-bias": dict(
        ffn_config=dict(MOE, moe_num_experts=4, moe_top_k=3, mlp_type="glu", moe_normalize_expert_weights=1,
                        ffn_act_fn={"name": "silu"}), no_bias=True),
    "torch-dmoe-uniform-assignment-gqa": dict(
        ffn_config=dict(MOE, moe_num_experts=4, moe_top_k=2, uniform_expert_assignment=True, ffn_hidden_size=40),
        attn_config={"attn_impl": "torch", "attn_type": "grouped_query_attention", "kv_n_heads": 2}),
}


def foundry_model(overrides, seed=0):
    cfg = {**BASE, **overrides}
    torch.manual_seed(seed)
    model = MPTForCausalLM(MPTConfig(**cfg)).eval()
    with torch.no_grad():  # LLM Foundry's init leaves norms at 1 and biases at 0: randomise them so they count
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def tessera_forward(folder, inputs, out):
    proc = subprocess.run([DRIVER, "forward", str(folder), str(inputs), str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return load_file(out)


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_llm_foundry(name, tmp_path):
    model = foundry_model(CONFIGS[name])
    model.save_pretrained(tmp_path / "foundry", safe_serialization=True)
    ids = torch.randint(0, BASE["vocab_size"], (2, BASE["max_seq_len"] - 3), generator=torch.Generator().manual_seed(1))
    save_file({"input_ids": ids}, tmp_path / "in.safetensors")
    ours = tessera_forward(tmp_path / "foundry", tmp_path / "in.safetensors", tmp_path / "out.safetensors")

    model.zero_grad()
    logits = model(input_ids=ids).logits
    # Next-token cross-entropy, as LLM Foundry's ComposerMPTCausalLM computes it (targets shifted, last ignored).
    targets = torch.cat([ids[:, 1:], torch.full((ids.size(0), 1), -100)], dim=1)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                                             ignore_index=-100)
    loss.backward()
    assert (ours["logits"] - logits.detach()).abs().max().item() <= 1e-5
    assert abs(ours["loss"].item() - loss.item()) <= 1e-5
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    ours_grads = {k[len("grad."):]: v for k, v in ours.items() if k.startswith("grad.")}
    assert set(ours_grads) == set(grads)
    for param, g in grads.items():
        diff = (ours_grads[param] - g).abs().max().item()
        # k_ln's bias shifts every score of a query equally: its true gradient is 0 and both sides hold fp32 noise.
        assert diff <= 1e-4 * g.abs().max().item() + 1e-7, f"{param}: max-abs diff {diff}"


@pytest.mark.parametrize("top_k,glu", [(2, False), (1, True)])
def test_moe_auxiliary_losses_follow_megablocks_on_llm_foundrys_routing(top_k, glu, tmp_path):
    """In training, a mixture of experts adds MegaBlocks' load-balancing loss, moe_loss_weight * E / (L T k) *
    sum over layers of dot(tokens per expert, mean router score) (megablocks.layers.moe.batched_load_balancing_loss),
    and its router z-loss, moe_zloss_weight * sum over layers of mean(logsumexp(router logits)^2)
    (megablocks.layers.router.batched_router_zloss), to the loss. MegaBlocks needs CUDA to install, so the formulas
    are applied here to the routing of LLM Foundry's own torch_dmoe layers, captured with hooks; Tessera's values and
    the gradients of the total must agree."""
    ffn = dict(MOE, moe_num_experts=4, moe_top_k=top_k, mlp_type="glu" if glu else "mlp")
    model = foundry_model(dict(ffn_config=ffn)).train()
    model.save_pretrained(tmp_path / "foundry", safe_serialization=True)
    config = json.loads((tmp_path / "foundry" / "config.json").read_text())
    config["ffn_config"].update(moe_loss_weight=0.1, moe_zloss_weight=0.01)  # keys LLM Foundry passes to MegaBlocks
    (tmp_path / "foundry" / "config.json").write_text(json.dumps(config))
    ids = torch.randint(0, BASE["vocab_size"], (2, BASE["max_seq_len"] - 3), generator=torch.Generator().manual_seed(2))
    save_file({"input_ids": ids}, tmp_path / "in.safetensors")
    proc = subprocess.run([DRIVER, "forward", str(tmp_path / "foundry"), str(tmp_path / "in.safetensors"),
                           str(tmp_path / "out.safetensors"), "--train"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ours = load_file(tmp_path / "out.safetensors")

    routed, logits_seen = [], []
    hooks = []
    for block in model.transformer.blocks:
        hooks.append(block.ffn.router.register_forward_hook(lambda m, i, out: routed.append(out)))
        hooks.append(block.ffn.router.layer.register_forward_hook(lambda m, i, out: logits_seen.append(out)))
    model.zero_grad()
    logits = model(input_ids=ids).logits
    for h in hooks:
        h.remove()
    targets = torch.cat([ids[:, 1:], torch.full((ids.size(0), 1), -100)], dim=1)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
    layers, experts, tokens = len(routed), ffn["moe_num_experts"], ids.numel()
    scale = 0.1 * experts / (layers * tokens * top_k)
    lbl = scale * sum(torch.dot(torch.bincount(top.flatten(), minlength=experts).to(scores.dtype), scores.mean(0))
                      for scores, _, top in routed)
    zloss = 0.01 * sum(torch.logsumexp(l, dim=1).square().mean() for l in logits_seen)
    (ce + lbl + zloss).backward()
    assert abs(ours["aux.lbl"].item() - lbl.item()) <= 1e-6
    assert abs(ours["aux.z_loss"].item() - zloss.item()) <= 1e-6
    assert abs(ours["loss"].item() - (ce + lbl + zloss).item()) <= 1e-5
    for i, (_, _, top) in enumerate(routed):
        assert torch.equal(ours[f"tokens_per_expert.layer_{i}"], torch.bincount(top.flatten(), minlength=experts))
    for name, p in model.named_parameters():
        diff = (ours["grad." + name] - p.grad).abs().max().item()
        assert diff <= 1e-4 * p.grad.abs().max().item() + 1e-7, f"{name}: max-abs diff {diff}"
    # The router's gradient includes the auxiliary losses': without them it differs.
    router = "transformer.blocks.0.ffn.router.layer.weight"
    model.zero_grad()
    logits = model(input_ids=ids).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                                      ignore_index=-100).backward()
    assert (ours["grad." + router] - dict(model.named_parameters())[router].grad).abs().max().item() > 1e-5


def test_a_moe_model_exported_in_llm_foundrys_layout_loads_in_llm_foundry_as_the_same_function(tmp_path):
    """Tessera loads LLM Foundry's torch_dmoe MPT and writes it back in the family layout (what `convert --layout
    llm-foundry` writes): LLM Foundry's MPTForCausalLM loads that folder and computes the same logits; the
    transformers layout is refused naming the mixture of experts."""
    model = foundry_model(dict(ffn_config=dict(MOE, moe_num_experts=4, moe_top_k=2, mlp_type="glu",
                                               moe_normalize_expert_weights=1)))
    model.save_pretrained(tmp_path / "foundry", safe_serialization=True)
    proc = subprocess.run([DRIVER, "export", str(tmp_path / "foundry"), str(tmp_path / "out"), "family"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    back = MPTForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert back.config.ffn_config["ffn_type"] == "torch_dmoe"
    ids = torch.randint(0, BASE["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (back(input_ids=ids).logits - model(input_ids=ids).logits).abs().max().item() <= 1e-6
    refused = subprocess.run([DRIVER, "export", str(tmp_path / "foundry"), str(tmp_path / "hf")], capture_output=True,
                             text=True)
    assert refused.returncode != 0 and "ffn_config.ffn_type torch_dmoe (a mixture of experts)" in refused.stderr
