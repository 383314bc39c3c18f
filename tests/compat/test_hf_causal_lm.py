"""LLM Foundry's `model.name: hf_causal_lm` in Tessera, against transformers' own offline resolution of hub ids.

A hub id is laid out in a Hugging Face cache as huggingface_hub does it (models--org--name/refs/main naming the
snapshot); HF_HUB_CACHE points there for Tessera, and transformers gets the same folder as cache_dir (it reads the
variable once, at import). transformers' from_pretrained(id, local_files_only=True) and Tessera's recipe
(`pretrained_model_name_or_path: id`) must resolve the same snapshot and compute the same loss on the same first
batch; config_overrides act as LLM Foundry's do (checked against transformers' from_pretrained(id, **overrides));
`pretrained: false` initialises instead; a missing id or a bad override is an error naming what was searched or the
key.
"""
import json
import os
import subprocess

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from conftest import _binary
from test_llama_hf import TRAIN_SEQ, VOCAB, dataset  # noqa: F401 (the fixture)

HUB_ID = "tessera-test/tiny-llama"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A cache holding two snapshots of HUB_ID; refs/main names the second."""
    cache = tmp_path_factory.mktemp("hf_cache")
    repo = cache / "models--tessera-test--tiny-llama"
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, rms_norm_eps=1e-5)
    for seed, commit in ((1, "a" * 40), (2, "b" * 40)):
        torch.manual_seed(seed)
        LlamaForCausalLM(cfg).save_pretrained(repo / "snapshots" / commit, safe_serialization=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("b" * 40)
    return cache


def run_recipe(driver, tmp_path, dataset, model, env):
    recipe = {
        "max_seq_len": TRAIN_SEQ, "seed": 3, "model": model, "tokenizer": {"name": "unused"},
        "train_loader": {"name": "text", "dataset": {"local": str(dataset), "split": "train", "shuffle": True,
                                                     "max_seq_len": TRAIN_SEQ}, "drop_last": True},
        "optimizer": {"name": "decoupled_adamw", "lr": 1e-3}, "scheduler": {"name": "constant_with_warmup",
                                                                           "t_warmup": "0ba"},
        "max_duration": "1ba", "eval_interval": 0, "global_train_batch_size": 4, "device_train_microbatch_size": 4,
        "device_eval_batch_size": 4,
        "precision": "fp32", "log_to_console": False,
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    path = _binary("TESSERA_COMPAT_DRIVER", "tessera_compat_driver")
    proc = subprocess.run([path, "train-trace", str(tmp_path / "recipe.yaml"), str(tmp_path / "trace")],
                          capture_output=True, text=True, env=env)
    return proc


def first_loss_of(model, trace_dir):
    trace = json.loads((trace_dir / "trace.json").read_text())
    ids = torch.tensor(trace["batches"][0]).reshape(-1, TRAIN_SEQ)
    with torch.no_grad():
        return model(input_ids=ids, labels=ids).loss.item(), trace["losses"][0]


def test_a_cached_hub_id_loads_the_snapshot_transformers_loads(driver, tmp_path, dataset, hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    env = dict(os.environ)
    hf = AutoModelForCausalLM.from_pretrained(HUB_ID, local_files_only=True, cache_dir=hub_cache,
                                              dtype=torch.float32).eval()
    model = {"name": "hf_causal_lm", "pretrained_model_name_or_path": HUB_ID, "pretrained": True,
             "use_auth_token": True, "trust_remote_code": True, "init_device": "cpu"}
    proc = run_recipe(driver, tmp_path, dataset, model, env)
    assert proc.returncode == 0, proc.stderr
    # The run started from refs/main's snapshot (not the other one), and computes transformers' loss on it.
    init = load_file(tmp_path / "trace" / "init" / "model.safetensors")
    snapshot = load_file(hub_cache / "models--tessera-test--tiny-llama" / "snapshots" / ("b" * 40) /
                         "model.safetensors")
    assert set(init) == set(snapshot) and all(torch.equal(init[k], snapshot[k]) for k in init)
    theirs, ours = first_loss_of(hf, tmp_path / "trace")
    assert abs(theirs - ours) <= 1e-5

    # config_overrides as LLM Foundry applies them; transformers' from_pretrained(**overrides) is the reference.
    overrides = {"rms_norm_eps": 1e-2, "rope_theta": 500.0}
    model["config_overrides"] = overrides
    (tmp_path / "o").mkdir()
    proc = run_recipe(driver, tmp_path / "o", dataset, model, env)
    assert proc.returncode == 0, proc.stderr
    hf_over = AutoModelForCausalLM.from_pretrained(HUB_ID, local_files_only=True, cache_dir=hub_cache,
                                                   dtype=torch.float32,
                                                   **overrides).eval()
    theirs, ours = first_loss_of(hf_over, tmp_path / "o" / "trace")
    assert abs(theirs - ours) <= 1e-5
    assert abs(theirs - first_loss_of(hf, tmp_path / "trace")[0]) > 1e-4  # the overrides changed the function

    # pretrained: false builds the same architecture from the family's initialisation.
    (tmp_path / "fresh").mkdir()
    proc = run_recipe(driver, tmp_path / "fresh", dataset, dict(model, pretrained=False), env)
    assert proc.returncode == 0, proc.stderr
    fresh = load_file(tmp_path / "fresh" / "trace" / "init" / "model.safetensors")
    assert set(fresh) == set(snapshot) and not torch.equal(fresh["lm_head.weight"], snapshot["lm_head.weight"])


def test_a_missing_id_or_a_bad_override_names_what_is_wrong(driver, tmp_path, dataset, hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    env = dict(os.environ)
    proc = run_recipe(driver, tmp_path, dataset, {"name": "hf_causal_lm",
                                                  "pretrained_model_name_or_path": "nobody/missing"}, env)
    assert proc.returncode == 2
    assert "model.pretrained_model_name_or_path" in proc.stderr
    assert str(hub_cache / "models--nobody--missing" / "refs" / "main") in proc.stderr
    (tmp_path / "b").mkdir()
    proc = run_recipe(driver, tmp_path / "b", dataset, {"name": "hf_causal_lm", "pretrained_model_name_or_path": HUB_ID,
                                                        "config_overrides": {"rms_norm_epsilon": 1e-3}}, env)
    assert proc.returncode == 2
    assert "model.config_overrides" in proc.stderr and 'config does not have attribute "rms_norm_epsilon"' in proc.stderr
