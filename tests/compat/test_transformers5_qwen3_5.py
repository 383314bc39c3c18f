"""Tessera's Qwen3.5 (`model.name: qwen3_5`, its own family folder; model_type qwen3_5_text) against transformers 5's
own Qwen3_5ForCausalLM (the real peer, in its venv: ctest's `compat_tf5` entry; transformers 4.57 does not define
it), on random small configurations: the hybrid stack of Gated DeltaNet linear-attention layers (causal depthwise
convolution, L2-normalised q/k, the gated delta rule's recurrence over chunks of 64, the gated RMSNorm) and gated
full-attention layers (a sigmoid output gate per head from q_proj, zero-centred q/k norms per head, partial rotary),
grouped value heads (more value heads than key heads), sequences longer than one chunk.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5 and every
  gradient within 1e-4 relative; left padding (zeroed before the linear layers, as transformers' recurrent mask).
- Greedy generation with the cache (the linear layers' convolution window and recurrent state carried step to step)
  equals transformers' generate, token for token.
- The chunked rule equals the token-by-token recurrence transformers also ships (torch_recurrent_gated_delta_rule) on
  the same inputs, through Tessera's decode path: logits of a prompt fed one token at a time equal the whole forward.
- Tessera's export of a trained folder loads in transformers 5 as a Qwen3_5ForCausalLM with the same logits.
- What Tessera's Qwen3.5 does not compute is refused by key.
- recipes/qwen3.5-9b.yaml is transformers' Qwen3_5TextConfig default (its docstring's Qwen3.5-9B style), and
  `train --dry-run` prints the parameter count transformers' Qwen3_5ForCausalLM has for it.
- Qwen3.5-MoE (model_type qwen3_5_moe_text, transformers' Qwen3_5MoeForCausalLM): the same checks of logits,
  gradients, padding, generation and export, and in training with output_router_logits the load-balancing loss and
  the total loss's gradients; transformers' default Qwen3_5MoeTextConfig (its Qwen3.5-35B-A3B style) dry-runs with
  transformers' total and active parameter counts.
- Qwen's published folders are the multimodal Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration
  (model_type qwen3_5 / qwen3_5_moe: text_config, model.language_model.*, model.visual.*, and mtp.* heads beside):
  Tessera reads their text model as transformers' AutoModelForCausalLM does, with the same logits, and leaves the
  vision tower and the multi-token-prediction heads aside, saying so.
"""
import json
import os
import subprocess

import pytest
import torch
import transformers
import yaml

if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"needs transformers 5 (this venv has {transformers.__version__}): ctest's compat_tf5 entry runs it "
                "in $TESSERA_HOME/venv-tf5 (tools/setup_tf5.sh)", allow_module_level=True)

from transformers import (AutoModelForCausalLM, Qwen3_5Config, Qwen3_5ForCausalLM,  # noqa: E402
                          Qwen3_5ForConditionalGeneration, Qwen3_5MoeConfig, Qwen3_5MoeForCausalLM,
                          Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeTextConfig, Qwen3_5TextConfig)

from conftest import ROOT  # noqa: E402
from test_hf_export import dataset  # noqa: E402,F401 (the fixture)
from test_llama_hf import (check_greedy_generation, check_left_padding, check_logits_and_gradients,  # noqa: E402
                           run_tessera, save)

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
            linear_value_head_dim=12, linear_conv_kernel_dim=4, vocab_size=101, max_position_embeddings=256,
            rms_norm_eps=1e-6, pad_token_id=0)
CONFIGS = {
    # Three linear layers then a full one (transformers' default pattern), partial rotary of a quarter.
    "default-pattern": dict(BASE, rope_parameters={"rope_type": "default", "rope_theta": 5000.0,
                                                   "partial_rotary_factor": 0.25}),
    # A full layer first, tied head, half the head rotated, biases on the attention.
    "full-first-tied": dict(BASE, layer_types=["full_attention", "linear_attention", "linear_attention",
                                               "full_attention"], tie_word_embeddings=True, attention_bias=True,
                            rope_parameters={"rope_type": "default", "rope_theta": 9000.0,
                                             "partial_rotary_factor": 0.5}),
}
MOE = {k: v for k, v in BASE.items() if k != "intermediate_size"}
MOE_CONFIGS = {
    # Top-2 of 4 experts and the gated shared expert in every layer.
    "moe-top2": dict(MOE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                     shared_expert_intermediate_size=40,
                     rope_parameters={"rope_type": "default", "rope_theta": 7000.0, "partial_rotary_factor": 0.25}),
    # Top-1 of 3, a full layer first, tied head.
    "moe-top1-tied": dict(MOE, num_experts=3, num_experts_per_tok=1, moe_intermediate_size=16,
                          shared_expert_intermediate_size=24, tie_word_embeddings=True,
                          layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
                          rope_parameters={"rope_type": "default", "rope_theta": 8000.0, "partial_rotary_factor": 0.5}),
}
SEQ = 80  # past one chunk of 64


def randomise(model):
    with torch.no_grad():  # norms start at 0 (1 + w) or 1, biases at 0: randomised, so that they are compared
        for module in model.modules():
            norm = "Norm" in type(module).__name__
            for pname, p in module.named_parameters(recurse=False):
                if norm or pname == "bias":
                    p.add_(0.1 * torch.randn_like(p))
                elif pname in ("dt_bias",):
                    p.add_(0.3 * torch.randn_like(p))
    return model


def fuse_experts(ours):
    """Tessera's outputs under transformers 5's parameter names: its experts are per-expert modules, as transformers'
    folders store them (mlp.experts.{e}.{gate,up,down}_proj.weight), where Qwen3_5MoeExperts holds them stacked
    (gate_up_proj (E, 2 I, d), down_proj (E, d, I))."""
    out, stacks = {}, {}
    for key, value in ours.items():
        head, sep, tail = key.partition(".mlp.experts.")
        if not sep:
            out[key] = value
            continue
        expert, proj = tail.split(".")[:2]
        stacks.setdefault(head + sep, {}).setdefault(proj, {})[int(expert)] = value
    for prefix, projs in stacks.items():
        def stacked(proj):
            return torch.stack([projs[proj][e] for e in sorted(projs[proj])])
        out[prefix + "gate_up_proj"] = torch.cat([stacked("gate_proj"), stacked("up_proj")], 1)
        out[prefix + "down_proj"] = stacked("down_proj")
    return out


def names_of(name):
    return fuse_experts if name in MOE_CONFIGS else lambda ours: ours


def hf_moe_model(name, seed=0, **changes):
    torch.manual_seed(seed)
    return randomise(Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**dict(MOE_CONFIGS[name], **changes))).eval())


def hf_model(name, seed=0, **changes):
    if name in MOE_CONFIGS:
        return hf_moe_model(name, seed, **changes)
    torch.manual_seed(seed)
    return randomise(Qwen3_5ForCausalLM(Qwen3_5TextConfig(**dict(CONFIGS[name], **changes))).eval())


@pytest.mark.parametrize("name", [*CONFIGS, *MOE_CONFIGS])
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path, seq=SEQ, rename=names_of(name))


@pytest.mark.parametrize("name", [*CONFIGS, *MOE_CONFIGS])
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path, rename=names_of(name))


@pytest.mark.parametrize("name", [*CONFIGS, "moe-top2"])
def test_greedy_generation_with_the_recurrent_cache_matches_transformers_generate(name, driver, tmp_path):
    check_greedy_generation(hf_model(name, seed=5), driver, tmp_path)


def test_configs_tessera_does_not_compute_are_refused_by_key(driver, tmp_path):
    folder = save(hf_model("default-pattern"), tmp_path / "qwen3_5")
    original = json.loads((folder / "config.json").read_text())
    ids = torch.zeros(1, 4, dtype=torch.long)
    for change, message in (({"layer_types": ["linear_attention"] * 3 + ["sliding_attention"]}, "layer_types"),
                            ({"rope_parameters": dict(original["rope_parameters"], rope_type="yarn", factor=2.0)},
                             "rope"),
                            ({"linear_num_value_heads": 3}, "linear_num_value_heads")):
        (folder / "config.json").write_text(json.dumps(dict(original, **change)))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)
    (folder / "config.json").write_text(json.dumps(original))
    sequence_id = torch.tensor([[0, 0, 1, 1]])
    with pytest.raises(AssertionError, match="packed documents"):
        run_tessera(driver, tmp_path, folder, input_ids=ids, sequence_id=sequence_id)


def test_tessera_export_loads_in_transformers5_with_the_same_logits(driver, tmp_path):
    model = hf_model("full-first-tied", seed=7)
    folder = save(model, tmp_path / "hf")
    out = tmp_path / "export"
    driver("export", folder, out)
    exported = Qwen3_5ForCausalLM.from_pretrained(out).eval()
    assert type(exported) is Qwen3_5ForCausalLM
    ids = torch.randint(0, 101, (2, SEQ), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        assert (exported(input_ids=ids).logits - model(input_ids=ids).logits).abs().max().item() <= 1e-5


def test_recipe_is_transformers_default_config_with_its_parameter_count(hub_cache, tmp_path):
    recipe = yaml.safe_load((ROOT / "recipes" / "qwen3.5-9b.yaml").read_text())
    config = Qwen3_5TextConfig()
    for key, value in recipe["model"].items():
        if key in ("name", "init_device"):
            continue
        if key in ("rope_theta", "partial_rotary_factor"):
            assert config.rope_parameters[key] == value, key
        else:
            assert getattr(config, key) == value, key
    with torch.device("meta"):
        expected = sum(p.numel() for p in Qwen3_5ForCausalLM(config).parameters())
    train = os.environ.get("TESSERA_TRAIN_BIN", str(ROOT / "build" / "bin" / "train"))
    proc = subprocess.run([train, "--recipe", str(ROOT / "recipes" / "qwen3.5-9b.yaml"), "--dry-run", "--no-preflight"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{expected:,}" in proc.stdout + proc.stderr, (expected, proc.stdout[-2000:])


@pytest.mark.parametrize("padded", [False, True])
def test_moe_load_balancing_loss_matches_transformers_in_training(padded, driver, tmp_path):
    """output_router_logits: transformers adds router_aux_loss_coef * load_balancing_loss_func over every layer's
    router (padding excluded) to the loss; Tessera reports the same auxiliary loss, and its total has the same
    gradients."""
    from test_moe_hf import check_router_aux_loss
    model = hf_moe_model("moe-top2", seed=3, output_router_logits=True, router_aux_loss_coef=0.05).train()
    check_router_aux_loss(model, 0.05, "model.layers.0.mlp.gate.weight", padded, driver, tmp_path, fuse_experts)


def test_moe_export_loads_in_transformers5_with_the_same_logits(driver, tmp_path):
    model = hf_moe_model("moe-top1-tied", seed=7)
    out = tmp_path / "export"
    driver("export", save(model, tmp_path / "hf"), out)
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(exported) is Qwen3_5MoeForCausalLM
    ids = torch.randint(0, 101, (2, SEQ), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        assert (exported(input_ids=ids).logits - model(input_ids=ids).logits).abs().max().item() <= 1e-5


def test_moe_default_config_dry_runs_with_transformers_total_and_active_counts(tmp_path):
    """transformers' Qwen3_5MoeTextConfig defaults (its docstring's Qwen3.5-35B-A3B style) as a recipe's model
    section: the dry run prints Qwen3_5MoeForCausalLM's parameter count and the active one (all but the 248 experts
    per layer a token does not use)."""
    config = Qwen3_5MoeTextConfig()
    with torch.device("meta"):
        model = Qwen3_5MoeForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())
    unused = config.num_hidden_layers * (config.num_experts - config.num_experts_per_tok) * \
        3 * config.hidden_size * config.moe_intermediate_size
    recipe = yaml.safe_load((ROOT / "recipes" / "qwen3.5-9b.yaml").read_text())
    recipe["model"] = {"name": "qwen3_5", "model_type": "qwen3_5_moe_text", "init_device": "meta"}
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    train = os.environ.get("TESSERA_TRAIN_BIN", str(ROOT / "build" / "bin" / "train"))
    proc = subprocess.run([train, "--recipe", str(path), "--dry-run", "--no-preflight"], capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"{total:,}" in out and f"{total - unused:,}" in out, (total, total - unused, out[-2000:])


# A published Qwen3.5 config.json's text_config carries keys transformers does not define (its modeling reads none
# of them): the output gates' kind, the recurrent state's dtype, the layer pattern's interval and the
# multi-token-prediction heads' shape. Values as Qwen's released folders write them.
PUBLISHED_TEXT_KEYS = dict(attn_output_gate=True, output_gate_type="swish", mamba_ssm_dtype="float32",
                           full_attention_interval=4, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False)
VISION = dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)


def published_folder(tmp_path, moe, tied):
    """A multimodal folder as Qwen publishes them, small: transformers 5 saves its ForConditionalGeneration model,
    and multi-token-prediction heads are added beside (transformers defines no module for them)."""
    from safetensors.torch import load_file, save_file
    text = dict(MOE_CONFIGS["moe-top2"] if moe else CONFIGS["default-pattern"], tie_word_embeddings=tied)
    config_class, model_class = ((Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration) if moe else
                                 (Qwen3_5Config, Qwen3_5ForConditionalGeneration))
    torch.manual_seed(11)
    model = randomise(model_class(config_class(text_config=text, vision_config=VISION, tie_word_embeddings=tied)))
    folder = tmp_path / ("published-moe" if moe else "published")
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == ("qwen3_5_moe" if moe else "qwen3_5") and "text_config" in config
    config["text_config"].update(PUBLISHED_TEXT_KEYS)
    (folder / "config.json").write_text(json.dumps(config))
    weights = load_file(folder / "model.safetensors")
    assert any(k.startswith("model.language_model.layers.") for k in weights)
    assert any(k.startswith("model.visual.") for k in weights)
    h = text["hidden_size"]
    weights.update({"mtp.fc.weight": torch.randn(h, 2 * h), "mtp.norm.weight": torch.zeros(h),
                    "mtp.layers.0.self_attn.q_proj.weight": torch.randn(8, h)})
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("moe,tied", [(False, False), (True, True)])
def test_published_multimodal_folders_load_as_their_text_model(moe, tied, driver, tmp_path):
    folder = published_folder(tmp_path, moe, tied)
    # transformers' own reading of the folder as a causal LM (its "VLM compatibility" mapping).
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(hf) is (Qwen3_5MoeForCausalLM if moe else Qwen3_5ForCausalLM)
    ids = torch.randint(0, 101, (2, SEQ), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
    ours = run_tessera(driver, tmp_path, folder, input_ids=ids)
    assert (ours["logits"] - expected).abs().max().item() <= 1e-5
    # Its export is the text model, which transformers loads with the same logits.
    out = tmp_path / "export"
    driver("export", folder, out)
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(exported) is type(hf)
    with torch.no_grad():
        assert (exported(input_ids=ids).logits - expected).abs().max().item() <= 1e-5


def test_published_folders_keys_outside_the_text_model_are_refused_by_name(driver, tmp_path):
    folder = published_folder(tmp_path, moe=False, tied=False)
    original = json.loads((folder / "config.json").read_text())
    ids = torch.zeros(1, 4, dtype=torch.long)
    for change, message in (({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
                            ({"text_config": dict(original["text_config"], attn_output_gate=False)},
                             "attn_output_gate"),
                            ({"text_config": dict(original["text_config"], model_type="qwen3_5_moe_text")},
                             "text_config.model_type"),
                            ({"tie_word_embeddings": True}, "tie_word_embeddings")):
        (folder / "config.json").write_text(json.dumps(dict(original, **change)))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)


def test_the_tiny_recipe_trains_and_exports_as_qwen3_5(driver, tmp_path, dataset):  # noqa: F811
    """recipes/qwen3.5-tiny-cpu.yaml's model on the shared test data trains 5 steps (its loss falls), exports through
    `convert` in transformers 5's form, and transformers 5 loads it as Qwen3_5ForCausalLM with Tessera's logits (the
    other families' tiny recipes: test_tiny_recipes.py)."""
    from test_llama_hf import train_export_and_compare
    from test_tiny_recipes import TINY_OPTIMIZER, tiny_section
    hf = train_export_and_compare(driver, tmp_path, dataset, tiny_section("qwen3.5"), extra=TINY_OPTIMIZER)
    assert type(hf) is Qwen3_5ForCausalLM
