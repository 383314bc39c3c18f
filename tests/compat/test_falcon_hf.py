"""Tessera's Falcon family against transformers' FalconForCausalLM (the real peer), on random small configurations of
each variant: Falcon 7B's multi-query attention with parallel attention/MLP, Falcon 40B's new decoder architecture
(grouped K/V, two LayerNorms, or one), the RW models' ALiBi with biases and sequential blocks, per-head K/V with an
untied head, linear rope scaling and the tanh GELU, and ALiBi over a head count that is not a power of two.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5, and the
  gradient of every parameter within 1e-4 relative, on the SDPA path and the explicit reference path.
- Left padding with an attention mask: the real tokens' logits, the loss and the gradients agree (rotary positions
  count real tokens only, as HF's generate sets them; ALiBi counts them as transformers' build_alibi_tensor does).
- Packed documents with sequence_id: each document's logits equal HF's on the document alone.
- Greedy generation equals HF's generate, for a batch of prompts of different lengths.
- What transformers does not compute (or computes only by failing) is refused by name.
- HF folder -> Tessera (`model.name: falcon`) -> 5 training steps -> checkpoint -> `convert` -> AutoModelForCausalLM
  loads a FalconForCausalLM computing the same logits.
- recipes/falcon-7b.yaml and falcon-40b.yaml are the published configs, and `train --dry-run` prints the parameter
  counts transformers computes for them.
"""
import json
import os
import subprocess

import pytest
import torch
import yaml
from transformers import FalconConfig, FalconForCausalLM

from conftest import ROOT
from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (assert_gradients_match, check_greedy_generation, check_left_padding,
                            check_packed_documents, hf_forward, run_tessera, save, train_export_and_compare)

BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=101, max_position_embeddings=64,
            layer_norm_epsilon=1e-5, bos_token_id=1, eos_token_id=2)

CONFIGS = {
    "7b-multi-query": dict(BASE, multi_query=True, parallel_attn=True),
    "40b-new-architecture": dict(BASE, hidden_size=96, num_attention_heads=6, num_kv_heads=2,
                                 new_decoder_architecture=True, ffn_hidden_size=160),
    "new-architecture-one-norm": dict(BASE, num_kv_heads=1, new_decoder_architecture=True, num_ln_in_parallel_attn=1),
    "rw-alibi-biases-sequential": dict(BASE, alibi=True, bias=True, multi_query=False, parallel_attn=False),
    "per-head-kv-untied-rope-linear": dict(BASE, multi_query=False, tie_word_embeddings=False, rope_theta=500000.0,
                                           rope_scaling={"rope_type": "linear", "factor": 2.0},
                                           activation="gelu_pytorch_tanh"),
    "alibi-six-heads": dict(BASE, hidden_size=96, num_attention_heads=6, alibi=True, activation="gelu_new"),
}
SEQ = 29


def hf_model(name, seed=0):
    torch.manual_seed(seed)
    model = FalconForCausalLM(FalconConfig(**CONFIGS[name], attn_implementation="sdpa")).eval()
    with torch.no_grad():  # HF initialises norms to 1 and biases to 0: randomise them so they are really compared
        for n, p in model.named_parameters():
            if "ln" in n.split(".")[-2] or "layernorm" in n:
                p.add_(0.1 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.normal_(0.0, 0.1)
    return model


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    model = hf_model(name)
    folder = save(model, tmp_path / "hf")
    ids = torch.randint(0, model.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    logits, loss, grads = hf_forward(model, ids, labels=ids)
    for reference in (False, True):
        ours = run_tessera(driver, tmp_path, folder, reference, input_ids=ids)
        assert (ours["logits"] - logits).abs().max().item() <= 1e-5
        assert abs(ours["loss"].item() - loss.item()) <= 1e-5
        assert_gradients_match(ours, grads, model.config.tie_word_embeddings)


@pytest.mark.parametrize("name", ["7b-multi-query", "40b-new-architecture", "rw-alibi-biases-sequential"])
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


@pytest.mark.parametrize("name", ["40b-new-architecture", "alibi-six-heads"])
def test_packed_documents_equal_each_document_alone(name, driver, tmp_path):
    check_packed_documents(hf_model(name, seed=2), driver, tmp_path)


@pytest.mark.parametrize("name", ["7b-multi-query", "40b-new-architecture", "rw-alibi-biases-sequential"])
def test_greedy_generation_matches_transformers_generate(name, driver, tmp_path):
    check_greedy_generation(hf_model(name, seed=5), driver, tmp_path, lowest_id=3)


def test_configs_transformers_does_not_compute_are_refused(driver, tmp_path):
    ids = torch.zeros(1, 4, dtype=torch.long)
    folder = save(hf_model("7b-multi-query"), tmp_path / "hf")
    original = json.loads((folder / "config.json").read_text())
    cases = [
        # transformers' FalconDecoderLayer fails on these (a sequential new-architecture block; two norms in the old
        # parallel block); per-head K/V counts other than the head count do not reshape.
        ({"new_decoder_architecture": True, "parallel_attn": False, "num_kv_heads": 2}, "parallel_attn"),
        ({"num_ln_in_parallel_attn": 2}, "num_ln_in_parallel_attn"),
        ({"multi_query": False, "num_kv_heads": 2}, "num_kv_heads"),
        # What Tessera's Falcon does not compute.
        ({"activation": "gelu_fast"}, "activation"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type"),
        ({"hidden_size": 66}, "num_attention_heads"),
    ]
    for change, message in cases:
        (folder / "config.json").write_text(json.dumps(dict(original, **change)))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)


# ---- Round trip: HF folder -> Tessera -> train -> checkpoint -> convert -> transformers --------------------------

@pytest.mark.parametrize("name", ["40b-new-architecture", "rw-alibi-biases-sequential"])
def test_hf_folder_trained_and_exported_loads_in_transformers_as_the_same_function(name, driver, tmp_path, dataset):
    torch.manual_seed(6)
    start = save(FalconForCausalLM(FalconConfig(**dict(CONFIGS[name], vocab_size=VOCAB))), tmp_path / "start")
    section = dict(CONFIGS[name], name="falcon", vocab_size=VOCAB)  # the recipe takes FalconConfig's keys
    hf = train_export_and_compare(driver, tmp_path, dataset, section, start)
    assert type(hf) is FalconForCausalLM


# ---- The published models -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", ["7b", "40b"])
def test_recipes_are_the_published_models_with_transformers_parameter_counts(size, hub_cache, tmp_path):
    published = json.loads((ROOT / "tests" / "data" / "hub_configs" / f"tiiuae--falcon-{size}.json").read_text())
    recipe = yaml.safe_load((ROOT / "recipes" / f"falcon-{size}.yaml").read_text())["model"]
    config = FalconConfig(**{k: v for k, v in published.items() if k not in ("architectures", "model_type")})
    for key, value in recipe.items():
        if key not in ("name", "init_device"):
            assert getattr(config, key) == value, key
    with torch.device("meta"):
        expected = sum(p.numel() for p in FalconForCausalLM(config).parameters())
    train = os.environ.get("TESSERA_TRAIN_BIN", str(ROOT / "build" / "bin" / "train"))
    # The recipe, and the same recipe with the model through hf_causal_lm from the published config.json in a hub cache.
    via_hub = yaml.safe_load((ROOT / "recipes" / f"falcon-{size}.yaml").read_text())
    via_hub["model"] = {"name": "hf_causal_lm", "pretrained_model_name_or_path": f"tiiuae/falcon-{size}",
                        "pretrained": False, "init_device": "meta"}
    (tmp_path / "via_hub.yaml").write_text(yaml.safe_dump(via_hub))
    env = dict(os.environ, HF_HUB_CACHE=str(hub_cache))
    for recipe_path in (ROOT / "recipes" / f"falcon-{size}.yaml", tmp_path / "via_hub.yaml"):
        proc = subprocess.run([train, "--recipe", str(recipe_path), "--dry-run", "--world-size", "64"],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{expected:,}" in proc.stdout + proc.stderr, (expected, proc.stdout[-2000:])
