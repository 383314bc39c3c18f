"""Shared helpers for the compatibility tests: paths to Tessera's binaries, a runner for the model driver, and a
Hugging Face hub cache holding the config.json of the models LLM Foundry's fine-tuning recipes name."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _binary(env, name):
    path = os.environ.get(env, str(ROOT / "build" / "bin" / name))
    if not pathlib.Path(path).exists():
        pytest.fail(f"{path} does not exist: build the project first (cmake --workflow --preset default)")
    return path


@pytest.fixture(scope="session")
def driver():
    path = _binary("TESSERA_COMPAT_DRIVER", "tessera_compat_driver")

    def run(*args):
        proc = subprocess.run([path, *map(str, args)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise AssertionError(f"tessera_compat_driver {' '.join(map(str, args))} failed:\n{proc.stderr}")
        return proc

    return run


# config.json of the hub models the recipes in recipes/ start from (as published), so that recipes naming them
# resolve and plan (--print-config, --dry-run) without the weights.
HUB_CONFIGS = {
    "mosaicml/mpt-7b": {
        "architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32,
        "expansion_ratio": 4, "max_seq_len": 2048, "vocab_size": 50432, "learned_pos_emb": True, "no_bias": True,
        "norm_type": "low_precision_layernorm", "emb_pdrop": 0, "resid_pdrop": 0, "embedding_fraction": 1.0,
        "logit_scale": None, "init_device": "cpu", "use_cache": False, "verbose": 0, "torch_dtype": "bfloat16",
        "tokenizer_name": "EleutherAI/gpt-neox-20b", "transformers_version": "4.28.1",
        "auto_map": {"AutoConfig": "configuration_mpt.MPTConfig",
                     "AutoModelForCausalLM": "modeling_mpt.MPTForCausalLM"},
        "attn_config": {"alibi": True, "alibi_bias_max": 8, "attn_impl": "torch", "attn_pdrop": 0,
                        "attn_type": "multihead_attention", "attn_uses_sequence_id": False, "clip_qkv": None,
                        "prefix_lm": False, "qk_ln": False, "softmax_scale": None},
        "init_config": {"emb_init_std": None, "emb_init_uniform_lim": None, "fan_mode": "fan_in",
                        "init_div_is_residual": True, "init_gain": 0, "init_nonlinearity": "relu", "init_std": 0.02,
                        "name": "kaiming_normal_", "verbose": 0}},
    "meta-llama/Meta-Llama-3-8B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0", "use_cache": True, "vocab_size": 128256},
}


# config.json of the main job's export (runs/mpt-tiny-cpu/hf/huggingface/final), which recipes/sft-tiny-cpu.yaml
# fine-tunes: a GPT-2 layout, since that MPT has learned positions (n_positions 1024 instead of 128, so that the
# recipe tests' override of max_seq_len to 512 fits).
MAIN_JOB_EXPORT_CONFIG = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 8192, "n_positions": 1024, "n_embd": 256,
    "n_layer": 4, "n_head": 4, "n_inner": 1024, "activation_function": "gelu", "resid_pdrop": 0.0, "embd_pdrop": 0.0,
    "attn_pdrop": 0.0, "layer_norm_epsilon": 1e-05, "initializer_range": 0.02, "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "tie_word_embeddings": True,
    "bos_token_id": None, "eos_token_id": None, "use_cache": True, "torch_dtype": "float32"}


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory):
    """A hub cache (HF_HUB_CACHE layout: models--org--name/refs/main -> snapshots/REV/) with HUB_CONFIGS, and a
    folder main-job-export/ holding MAIN_JOB_EXPORT_CONFIG."""
    root = tmp_path_factory.mktemp("hub")
    (root / "main-job-export").mkdir()
    (root / "main-job-export" / "config.json").write_text(json.dumps(MAIN_JOB_EXPORT_CONFIG))
    for repo, config in HUB_CONFIGS.items():
        folder = root / ("models--" + repo.replace("/", "--"))
        (folder / "refs").mkdir(parents=True)
        (folder / "refs" / "main").write_text("0" * 40)
        (folder / "snapshots" / ("0" * 40)).mkdir(parents=True)
        (folder / "snapshots" / ("0" * 40) / "config.json").write_text(json.dumps(config))
    return root
