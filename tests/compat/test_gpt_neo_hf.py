"""Tessera's GPT-Neo family against transformers' GPTNeoForCausalLM (the real peer), on random small configurations:
the published pattern of global and local layers (a window shorter than the sequence, so the local layers' band
matters), local layers first with another activation and an intermediate size, and global layers only.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5, and the
  gradient of every parameter within 1e-4 relative, on the SDPA path and the explicit reference path.
- Left padding (the local band counts positions in the row, padding included, as transformers' banded mask), packed
  documents and greedy generation with the KV cache equal transformers' (shared checks of test_llama_hf).
- What Tessera's GPT-Neo does not compute, or transformers refuses, is refused by name.
- HF folder -> Tessera (`model.name: gpt_neo`) -> 5 training steps -> checkpoint -> `convert` -> AutoModelForCausalLM
  loads a GPTNeoForCausalLM computing the same logits.
"""
import json

import pytest
import torch
import yaml
from transformers import GPTNeoConfig, GPTNeoForCausalLM

from conftest import ROOT
from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import (TRAIN_SEQ, check_greedy_generation, check_left_padding, check_logits_and_gradients,
                           check_packed_documents, randomise_norms_and_biases, run_tessera, save,
                           train_export_and_compare)

BASE = dict(hidden_size=64, num_layers=2, num_heads=4, vocab_size=101, max_position_embeddings=64, window_size=7,
            bos_token_id=1, eos_token_id=2)

CONFIGS = {
    "125m-pattern": dict(BASE, attention_types=[[["global", "local"], 1]]),
    "local-first-relu-inner": dict(BASE, hidden_size=96, num_heads=6, num_layers=3, intermediate_size=160,
                                   attention_types=[[["local"], 1], [["global", "local"], 1]],
                                   activation_function="relu"),
    "global-only": dict(BASE, attention_types=[[["global"], 2]], window_size=256),
}
SEQ = 29


def hf_model(name, seed=0):
    torch.manual_seed(seed)
    return randomise_norms_and_biases(GPTNeoForCausalLM(GPTNeoConfig(**CONFIGS[name], attn_implementation="eager")).eval())


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path)


@pytest.mark.parametrize("name", ["125m-pattern", "local-first-relu-inner"])
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


def test_packed_documents_equal_each_document_alone(driver, tmp_path):
    check_packed_documents(hf_model("125m-pattern", seed=2), driver, tmp_path)


@pytest.mark.parametrize("name", ["125m-pattern", "local-first-relu-inner"])
def test_greedy_generation_matches_transformers_generate(name, driver, tmp_path):
    check_greedy_generation(hf_model(name, seed=5), driver, tmp_path, lowest_id=3)


def test_configs_tessera_does_not_compute_are_refused(driver, tmp_path):
    ids = torch.zeros(1, 4, dtype=torch.long)
    folder = save(hf_model("125m-pattern"), tmp_path / "hf")
    original = json.loads((folder / "config.json").read_text())
    for change, message in (({"attention_types": [[["global", "local"], 2]], "attention_layers": None},
                             "expands to 4 layers"),
                            ({"attention_layers": ["global", "sparse"]}, "attention_layers"),
                            ({"tie_word_embeddings": False}, "tie_word_embeddings"),
                            ({"activation_function": "gelu_accurate"}, "activation_function")):
        (folder / "config.json").write_text(json.dumps(dict(original, **change)))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)


@pytest.mark.parametrize("name", ["125m-pattern"])
def test_hf_folder_trained_and_exported_loads_in_transformers_as_the_same_function(name, driver, tmp_path, dataset):
    torch.manual_seed(6)
    start = save(GPTNeoForCausalLM(GPTNeoConfig(**dict(CONFIGS[name], vocab_size=VOCAB))), tmp_path / "start")
    section = dict(CONFIGS[name], name="gpt_neo", vocab_size=VOCAB)  # the recipe takes GPTNeoConfig's keys
    hf = train_export_and_compare(driver, tmp_path, dataset, section, start)
    assert type(hf) is GPTNeoForCausalLM


def test_the_recipes_gpt_neo_trained_from_scratch_exports_as_gpt_neo_computing_the_same_logits(driver, tmp_path,
                                                                                             dataset):
    section = yaml.safe_load((ROOT / "recipes" / "gpt-neo-tiny-cpu.yaml").read_text())["model"]
    section.update(hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=7,
                   vocab_size=VOCAB, max_position_embeddings=TRAIN_SEQ, init_device="cpu")
    hf = train_export_and_compare(driver, tmp_path, dataset, section)
    assert type(hf) is GPTNeoForCausalLM
