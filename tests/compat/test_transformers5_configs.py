"""Folders saved by transformers 5 (the real peer, in its own venv: tools/setup_tf5.sh, ctest's `compat_tf5` entry):
every family Tessera reads, on a small random configuration whose rotary settings differ from the defaults.

transformers 5 writes config.json in another form than transformers 4: the rotary settings as one `rope_parameters`
object (rope_theta, rope_type, partial_rotary_factor and the scaling's keys; Gemma 3 one per layer type), `dtype` for
`torch_dtype`, Qwen3-MoE's expert count as num_local_experts. Each folder's config.json is checked to be in that form
(so that the comparison tests it), then Tessera loads the folder: logits within 1e-5 max-abs of transformers 5's in
fp32. Before Tessera read this form, it took the default rope base for these configs (a Llama 3 folder's logits
differed by 5e-3) without a word.

Tessera's exports go the other way: config.json in transformers 5's form by default (the rotary settings in
rope_parameters, dtype), or in transformers 4's (`transformers4`: rope_theta, rope_scaling, ...); transformers 5
loads either as the family's class with the same logits.

The main venv's transformers 4 cannot run this file; there it skips (compat_a..d leave it out).
"""
import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"needs transformers 5 (this venv has {transformers.__version__}): ctest's compat_tf5 entry runs it "
                "in $TESSERA_HOME/venv-tf5 (tools/setup_tf5.sh)", allow_module_level=True)

import transformers as T  # noqa: E402

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=101, max_position_embeddings=64)
LONGROPE = dict(short_factor=[1.0, 1.2, 1.5, 2.0], long_factor=[1.5, 2.0, 3.0, 4.0])
EXPERTS = dict(num_experts_per_tok=2, moe_intermediate_size=32)

# name: (config class, model class, config arguments, attention implementation). Every rotary family gets a
# rope_theta other than its default, so that a reader taking the default would be caught.
CASES = {
    "llama": (T.LlamaConfig, T.LlamaForCausalLM,
              dict(BASE, rope_parameters={"rope_type": "default", "rope_theta": 2345.0}), "sdpa"),
    # Llama 3.1's scaling with a base of 500000: the configuration of the finding (5.3e-3 apart before).
    "llama3-rope": (T.LlamaConfig, T.LlamaForCausalLM,
                    dict(BASE, hidden_size=128, rope_parameters={
                        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}), "sdpa"),
    "llama-linear": (T.LlamaConfig, T.LlamaForCausalLM,
                     dict(BASE, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 20000.0}), "sdpa"),
    "mistral": (T.MistralConfig, T.MistralForCausalLM,
                dict(BASE, sliding_window=7, rope_parameters={"rope_type": "default", "rope_theta": 3000.0}), "sdpa"),
    "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM,
              dict(BASE, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 4000.0}),
              "sdpa"),
    "mixtral": (T.MixtralConfig, T.MixtralForCausalLM,
                dict(BASE, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                     rope_parameters={"rope_type": "default", "rope_theta": 5000.0}), "sdpa"),
    "qwen2_moe": (T.Qwen2MoeConfig, T.Qwen2MoeForCausalLM,
                  dict(BASE, num_experts=4, shared_expert_intermediate_size=40, **EXPERTS,
                       rope_parameters={"rope_type": "default", "rope_theta": 6000.0}), "sdpa"),
    "qwen3_moe": (T.Qwen3MoeConfig, T.Qwen3MoeForCausalLM,
                  dict(BASE, num_experts=4, **EXPERTS, rope_parameters={"rope_type": "default", "rope_theta": 7000.0}),
                  "sdpa"),
    "olmo2": (T.Olmo2Config, T.Olmo2ForCausalLM,
              dict(BASE, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 9000.0}), "sdpa"),
    "granite": (T.GraniteConfig, T.GraniteForCausalLM,
                dict(BASE, embedding_multiplier=3.0, attention_multiplier=0.2, residual_multiplier=0.5,
                     logits_scaling=4.0, rope_parameters={"rope_type": "default", "rope_theta": 9500.0}), "sdpa"),
    "starcoder2": (T.Starcoder2Config, T.Starcoder2ForCausalLM,
                   dict(BASE, sliding_window=7, rope_parameters={"rope_type": "default", "rope_theta": 9900.0}),
                   "sdpa"),
    "nemotron": (T.NemotronConfig, T.NemotronForCausalLM,
                 dict(BASE, rope_parameters={"rope_type": "default", "rope_theta": 9800.0,
                                             "partial_rotary_factor": 0.25}), "sdpa"),
    "smollm3": (T.SmolLM3Config, T.SmolLM3ForCausalLM,
                dict(BASE, no_rope_layer_interval=2, pad_token_id=0,
                     rope_parameters={"rope_type": "default", "rope_theta": 9700.0}), "sdpa"),
    "glm4": (T.Glm4Config, T.Glm4ForCausalLM,
             dict(BASE, head_dim=16, pad_token_id=0, eos_token_id=0,
                  rope_parameters={"rope_type": "default", "rope_theta": 9600.0, "partial_rotary_factor": 0.5}),
             "sdpa"),
    # DeepSeek-V3: YaRN, its softmax scale from mscale_all_dim and its tables' factor from mscale.
    "deepseek_v3": (T.DeepseekV3Config, T.DeepseekV3ForCausalLM,
                    dict(BASE, num_key_value_heads=4, moe_intermediate_size=24, n_routed_experts=8, n_group=4,
                         topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
                         qk_rope_head_dim=8, v_head_dim=12, qk_nope_head_dim=16,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 9400.0, "factor": 4.0,
                                          "original_max_position_embeddings": 16, "mscale": 1.0,
                                          "mscale_all_dim": 0.8}), "sdpa"),
    # gpt-oss: YaRN without truncation, attention sinks, stacked experts (eager: its only attention besides flex).
    "gpt_oss": (T.GptOssConfig, T.GptOssForCausalLM,
                dict(BASE, head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                     sliding_window=7,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 9300.0, "factor": 4.0, "beta_fast": 32.0,
                                      "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16}),
                "eager"),
    "falcon": (T.FalconConfig, T.FalconForCausalLM,
               dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2, vocab_size=101,
                    max_position_embeddings=64, new_decoder_architecture=True, bias=True,
                    rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 8000.0}), "sdpa"),
    "gemma2": (T.Gemma2Config, T.Gemma2ForCausalLM,
               dict(BASE, head_dim=16, sliding_window=7, query_pre_attn_scalar=16,
                    rope_parameters={"rope_type": "default", "rope_theta": 9000.0}), "eager"),
    # Gemma 3: parameters per layer type, the full layers' scaled.
    "gemma3_text": (T.Gemma3TextConfig, T.Gemma3ForCausalLM,
                    dict(BASE, head_dim=16, sliding_window=7, query_pre_attn_scalar=16,
                         layer_types=["sliding_attention", "full_attention"],
                         rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                             "rope_theta": 200000.0},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}}),
                    "eager"),
    # GPT-NeoX: transformers 4's rotary_pct and rotary_emb_base are rope_parameters' partial_rotary_factor, rope_theta.
    "gpt_neox": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM,
                 dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=101,
                      max_position_embeddings=64,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}),
                 "sdpa"),
    # Phi-3: partial rotary and longrope beyond an original context of 16 (the sequence is longer).
    "phi3": (T.Phi3Config, T.Phi3ForCausalLM,
             dict(BASE, num_key_value_heads=4, original_max_position_embeddings=16, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2,
                  rope_parameters=dict(LONGROPE, rope_type="longrope", rope_theta=11000.0, partial_rotary_factor=0.5)),
             "sdpa"),
    "dbrx": (T.DbrxConfig, T.DbrxForCausalLM,
             dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=64, vocab_size=101,
                  # transformers 5.25's DbrxAttention still reads attn_config.rope_theta when it is built (its rotary
                  # table takes rope_parameters') and clamps q/k/v whether clip_qkv is set or not.
                  attn_config=dict(kv_n_heads=2, rope_theta=12000.0, clip_qkv=8.0),
                  ffn_config=dict(ffn_hidden_size=48, moe_num_experts=4, moe_top_k=2),
                  rope_parameters={"rope_type": "default", "rope_theta": 12000.0}), "sdpa"),
    # The families without rotary embeddings: their config.json differs only in dtype.
    "gpt_neo": (T.GPTNeoConfig, T.GPTNeoForCausalLM,
                dict(hidden_size=64, num_layers=2, num_heads=4, vocab_size=101, max_position_embeddings=64,
                     window_size=7, attention_types=[[["global", "local"], 1]], bos_token_id=0, eos_token_id=0),
                "eager"),
    "opt": (T.OPTConfig, T.OPTForCausalLM,
            dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=96, vocab_size=101,
                 max_position_embeddings=64, word_embed_proj_dim=64, dropout=0.0), "sdpa"),
    "gpt2": (T.GPT2Config, T.GPT2LMHeadModel,
             dict(n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0, bos_token_id=0, eos_token_id=0), "sdpa"),
    "mpt": (T.MptConfig, T.MptForCausalLM,
            dict(d_model=64, n_heads=4, n_layers=2, vocab_size=101, max_seq_len=64), "eager"),
    "gpt_bigcode": (T.GPTBigCodeConfig, T.GPTBigCodeForCausalLM,
                    dict(n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=64, resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0), "sdpa"),
}
ROTARY = {"llama", "llama3-rope", "llama-linear", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3_moe", "falcon",
          "gemma2", "gemma3_text", "gpt_neox", "phi3", "dbrx", "olmo2",
          "granite", "starcoder2", "nemotron", "smollm3", "glm4", "deepseek_v3", "gpt_oss"}
SEQ = 29


def hf_model(name):
    config_class, model_class, cfg, attention = CASES[name]
    torch.manual_seed(0)
    model = model_class(config_class(**cfg, attn_implementation=attention))
    with torch.no_grad():
        # Norms start at 1 (Gemma's at 0) and biases at 0: randomised, so that they are compared too. Parameters
        # transformers leaves to a later init (DBRX's experts) are drawn here.
        for module in model.modules():
            norm = "Norm" in type(module).__name__
            for pname, p in module.named_parameters(recurse=False):
                if norm or pname in ("bias", "sinks", "gate_up_proj_bias", "down_proj_bias"):
                    p.add_(0.1 * torch.randn_like(p))
        for pname, p in model.named_parameters():
            if ".experts." in pname and "dbrx" in name:
                p.normal_(0.0, 0.05)
    return model.eval()


@pytest.mark.parametrize("name", CASES)
def test_a_transformers5_folder_loads_with_its_logits(name, driver, tmp_path):
    model = hf_model(name)
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    # transformers 5's form, which transformers 4 never writes.
    assert "dtype" in config and "torch_dtype" not in config
    if name in ROTARY:
        assert "rope_parameters" in config
        assert not {"rope_theta", "rope_scaling", "rotary_emb_base", "rotary_pct", "rope_local_base_freq"} & set(config)
    if name == "qwen3_moe":
        assert "num_local_experts" in config and "num_experts" not in config
    ids = torch.randint(0, model.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    save_file({"input_ids": ids}, tmp_path / "in.safetensors")
    driver("forward", folder, tmp_path / "in.safetensors", tmp_path / "out.safetensors")
    ours = load_file(tmp_path / "out.safetensors")["logits"]
    assert (ours - logits).abs().max().item() <= 1e-5


V4_ROPE_KEYS = {"rope_theta", "rope_scaling", "rotary_emb_base", "rotary_pct", "rope_local_base_freq"}


@pytest.mark.parametrize("name", CASES)
def test_tessera_exports_in_either_form_load_in_transformers5_with_the_logits(name, driver, tmp_path):
    model = hf_model(name)
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    ids = torch.randint(0, model.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    for form in ("default", "transformers4"):
        out = tmp_path / form
        driver("export", folder, out, *([form] if form != "default" else []))
        config = json.loads((out / "config.json").read_text())
        if name in ROTARY and name != "dbrx":  # DBRX keeps attn_config.rope_theta in both forms (transformers reads it)
            assert ("rope_parameters" in config) == (form == "default"), config
            assert bool(V4_ROPE_KEYS & set(config)) == (form != "default"), config
        assert ("dtype" in config) == (form == "default") and ("torch_dtype" in config) != (form == "default")
        exported = T.AutoModelForCausalLM.from_pretrained(out, attn_implementation=CASES[name][3]).eval()
        assert type(exported) is type(model), form
        with torch.no_grad():
            assert (exported(input_ids=ids).logits - logits).abs().max().item() <= 1e-5, form


def test_the_default_configs_the_unit_tests_read_are_what_transformers5_writes():
    """tests/unit/models/hf_config_forms_test.cpp reads each family's default config.json as this transformers writes
    it (tests/data/hf_default_configs/): the checked-in file is still what it writes."""
    from hf_default_configs import default_configs, path_for

    path = path_for(transformers.__version__)
    assert path.exists(), f"{path} is missing: write it with tests/compat/hf_default_configs.py in this venv"
    assert json.loads(path.read_text()) == default_configs()
