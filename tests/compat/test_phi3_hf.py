"""Tessera's Phi-3 family against transformers' Phi3ForCausalLM (the real peer), on random small configurations:
Phi-3 mini's multi-head attention with a sliding window shorter than the sequence; grouped-query attention with half
of each head rotated and a tied head; longrope scaling (short factors within original_max_position_embeddings, long
ones beyond, cos/sin scaled by the attention factor), on sequences on both sides of the original context.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5, and the
  gradient of every parameter within 1e-4 relative (the pad_token_id embedding row gets none), on the SDPA path and
  the explicit reference path; the fused qkv_proj and gate_up_proj are split as transformers splits them.
- Left padding, packed documents and greedy generation with the KV cache equal transformers' (shared checks).
  Under longrope, generation that crosses the original context recomputes the cache with the long factors and
  equals the model run on the whole sequence at every step (transformers 4.57's own generate does not, see the
  test).
- What Tessera's Phi-3 does not compute, or Phi3Config refuses, is refused by name.
- HF folder -> Tessera (`model.name: phi3`) -> 5 training steps -> checkpoint -> `convert` -> AutoModelForCausalLM
  loads a Phi3ForCausalLM computing the same logits; the recipes' models trained from scratch export the same way.
- recipes/phi-3-mini.yaml is the published microsoft/Phi-3-mini-4k-instruct config, and `train --dry-run` prints the
  parameter count transformers computes for it, from the recipe and from the config.json in a hub cache.
"""
import json

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from transformers import Phi3Config, Phi3ForCausalLM

from conftest import ROOT
from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (TRAIN_SEQ, check_greedy_generation, check_left_padding, check_logits_and_gradients,
                           check_packed_documents, check_recipe_parameter_count, randomise_norms_and_biases,
                           run_tessera, save, train_export_and_compare)

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=101,
            max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
FACTORS = dict(short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
               long_factor=[4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0])

CONFIGS = {
    "mini-sliding": dict(BASE, sliding_window=7),
    "gqa-partial-rotary-tied": dict(BASE, num_key_value_heads=2, partial_rotary_factor=0.5, tie_word_embeddings=True),
    "longrope": dict(BASE, original_max_position_embeddings=16, rope_scaling=dict(type="longrope", **FACTORS)),
}
SEQ = 29  # beyond the longrope config's original context of 16


def hf_model(name, seed=0):
    torch.manual_seed(seed)
    return randomise_norms_and_biases(Phi3ForCausalLM(Phi3Config(**CONFIGS[name], attn_implementation="sdpa")).eval())


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", [SEQ, 12])
def test_logits_and_gradients_match_transformers(name, seq, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path, seq, pad_at=(1, 4))


@pytest.mark.parametrize("name", CONFIGS)
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


def test_packed_documents_equal_each_document_alone(driver, tmp_path):
    check_packed_documents(hf_model("mini-sliding", seed=2), driver, tmp_path)


def test_greedy_generation_matches_transformers_generate(driver, tmp_path):
    check_greedy_generation(hf_model("mini-sliding", seed=5), driver, tmp_path, lowest_id=3)


def test_greedy_generation_across_the_longrope_switch_equals_the_model_run_on_the_whole_sequence(driver, tmp_path):
    """Prompts of 11 tokens, 14 new ones: the rows pass original_max_position_embeddings (16) mid-way, where the long
    factors take over and keys cached with the short ones are stale; Tessera then recomputes the cache. The reference
    is transformers' forward over the whole sequence at every step (what greedy decoding of this model is).
    transformers 4.57's own generate is not: its Phi-3 drops the cache at the switch, but its generic input slicing
    then feeds only the newest token, so from that step it decodes a different function."""
    model = hf_model("longrope", seed=5)
    with torch.no_grad():  # sharpen the distribution so greedy choices are not near-ties
        model.get_output_embeddings().weight.mul_(4.0)
    folder = save(model, tmp_path / "hf")
    ids = torch.randint(3, model.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(4))
    lengths = [11, 4, 8]
    save_file({"input_ids": ids, "lengths": torch.tensor(lengths)}, tmp_path / "in.safetensors")
    driver("generate", folder, tmp_path / "in.safetensors", tmp_path / "out.safetensors", 14)
    ours = load_file(tmp_path / "out.safetensors")["tokens"]
    seq, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        seq[b, 11 - n:] = ids[b, :n]
        mask[b, 11 - n:] = 1
    with torch.no_grad():
        for _ in range(14):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            token = model(seq, attention_mask=mask, position_ids=positions).logits[:, -1].argmax(-1, keepdim=True)
            seq, mask = torch.cat([seq, token], 1), torch.cat([mask, torch.ones_like(token)], 1)
    assert torch.equal(ours, seq[:, 11:])


def test_configs_tessera_does_not_compute_are_refused(driver, tmp_path):
    ids = torch.zeros(1, 4, dtype=torch.long)
    folder = save(hf_model("longrope"), tmp_path / "hf")
    original = json.loads((folder / "config.json").read_text())
    for change, message in (({"rope_scaling": dict(type="dynamic", factor=2.0)}, "type"),
                            ({"rope_scaling": dict(type="longrope", short_factor=[1.0], long_factor=[1.0])},
                             "short_factor"),
                            ({"partial_rotary_factor": 0.2}, "partial_rotary_factor"),  # int(16 x 0.2) = 3: odd
                            ({"hidden_act": "gelu_accurate"}, "hidden_act")):
        (folder / "config.json").write_text(json.dumps(dict(original, **change)))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)


@pytest.mark.parametrize("name", ["mini-sliding", "longrope"])
def test_hf_folder_trained_and_exported_loads_in_transformers_as_the_same_function(name, driver, tmp_path, dataset):
    torch.manual_seed(6)
    start = save(Phi3ForCausalLM(Phi3Config(**dict(CONFIGS[name], vocab_size=VOCAB))), tmp_path / "start")
    section = dict(CONFIGS[name], name="phi3", vocab_size=VOCAB)  # the recipe takes Phi3Config's keys
    hf = train_export_and_compare(driver, tmp_path, dataset, section, start)
    assert type(hf) is Phi3ForCausalLM


@pytest.mark.parametrize("recipe", ["phi-3-tiny-cpu.yaml", "phi-3-mini.yaml"])
def test_the_recipes_phi3_trained_from_scratch_exports_as_phi3_computing_the_same_logits(recipe, driver, tmp_path,
                                                                                       dataset):
    section = yaml.safe_load((ROOT / "recipes" / recipe).read_text())["model"]
    section.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=TRAIN_SEQ,
                   original_max_position_embeddings=TRAIN_SEQ, sliding_window=7, pad_token_id=None, init_device="cpu")
    hf = train_export_and_compare(driver, tmp_path, dataset, section)
    assert type(hf) is Phi3ForCausalLM


def test_recipe_is_the_published_phi_3_mini_with_transformers_parameter_count(hub_cache, tmp_path):
    check_recipe_parameter_count("phi-3-mini.yaml", "microsoft/Phi-3-mini-4k-instruct", Phi3Config, Phi3ForCausalLM,
                                 hub_cache, tmp_path)
