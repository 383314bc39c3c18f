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
import os
import subprocess

import pytest
import torch
import yaml
from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

from conftest import ROOT
from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (TRAIN_SEQ, assert_gradients_match, check_greedy_generation, check_left_padding,
                            check_packed_documents, hf_forward, run_tessera, save, train_export_and_compare)

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
    model = model_class(config_class(**dict(cfg, **changes), attn_implementation="eager")).eval()
    with torch.no_grad():  # HF initialises norms to 0 (1 + w) and biases to 0: randomise them so they are compared
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.normal_(0.0, 0.1)
    return model


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    model = hf_model(name)
    folder = save(model, tmp_path / "hf")
    ids = torch.randint(0, model.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    ids[1, 4] = model.config.pad_token_id  # the padding row's gradient is zero in both
    logits, loss, grads = hf_forward(model, ids, labels=ids)
    for reference in (False, True):
        ours = run_tessera(driver, tmp_path, folder, reference, input_ids=ids)
        assert (ours["logits"] - logits).abs().max().item() <= 1e-5
        assert abs(ours["loss"].item() - loss.item()) <= 1e-5
        assert_gradients_match(ours, grads, model.config.tie_word_embeddings)


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
    published = json.loads((ROOT / "tests" / "data" / "hub_configs" / "google--gemma-2-2b.json").read_text())
    recipe = yaml.safe_load((ROOT / "recipes" / "gemma-2-2b.yaml").read_text())["model"]
    config = Gemma2Config(**{k: v for k, v in published.items() if k not in ("architectures", "model_type")})
    for key, value in recipe.items():
        if key not in ("name", "init_device"):
            assert getattr(config, key) == value, key
    with torch.device("meta"):
        expected = sum(p.numel() for p in Gemma2ForCausalLM(config).parameters())
    train = os.environ.get("TESSERA_TRAIN_BIN", str(ROOT / "build" / "bin" / "train"))
    via_hub = yaml.safe_load((ROOT / "recipes" / "gemma-2-2b.yaml").read_text())
    via_hub["model"] = {"name": "hf_causal_lm", "pretrained_model_name_or_path": "google/gemma-2-2b",
                        "pretrained": False, "init_device": "meta"}
    (tmp_path / "via_hub.yaml").write_text(yaml.safe_dump(via_hub))
    env = dict(os.environ, HF_HUB_CACHE=str(hub_cache))
    for recipe_path in (ROOT / "recipes" / "gemma-2-2b.yaml", tmp_path / "via_hub.yaml"):
        proc = subprocess.run([train, "--recipe", str(recipe_path), "--dry-run", "--world-size", "8"],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{expected:,}" in proc.stdout + proc.stderr, (expected, proc.stdout[-2000:])
