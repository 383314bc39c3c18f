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

import pytest
import torch
from transformers import FalconConfig, FalconForCausalLM

from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (check_greedy_generation, check_left_padding, check_logits_and_gradients,
                           check_packed_documents, check_recipe_parameter_count, randomise_norms_and_biases, run_tessera, save,
                           train_export_and_compare)

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
    return randomise_norms_and_biases(FalconForCausalLM(FalconConfig(**CONFIGS[name], attn_implementation="sdpa")).eval())


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path)


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
    check_recipe_parameter_count(f"falcon-{size}.yaml", f"tiiuae/falcon-{size}", FalconConfig, FalconForCausalLM, hub_cache,
                                 tmp_path, world_size=64)
