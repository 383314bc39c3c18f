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

from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402

from conftest import ROOT  # noqa: E402
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
SEQ = 80  # past one chunk of 64


def hf_model(name, seed=0, **changes):
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**dict(CONFIGS[name], **changes))).eval()
    with torch.no_grad():  # norms start at 0 (1 + w) or 1, biases at 0: randomised, so that they are compared
        for module in model.modules():
            norm = "Norm" in type(module).__name__
            for pname, p in module.named_parameters(recurse=False):
                if norm or pname == "bias":
                    p.add_(0.1 * torch.randn_like(p))
                elif pname in ("dt_bias",):
                    p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path, seq=SEQ)


@pytest.mark.parametrize("name", CONFIGS)
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


@pytest.mark.parametrize("name", CONFIGS)
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
    proc = subprocess.run([train, "--recipe", str(ROOT / "recipes" / "qwen3.5-9b.yaml"), "--dry-run"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{expected:,}" in proc.stdout + proc.stderr, (expected, proc.stdout[-2000:])
