"""Tessera's MPT against a plain-PyTorch reference written from LLM Foundry's architecture (mpt_reference.py), on the
configurations Hugging Face's class does not cover. Same weights and tokens: logits within 1e-5 max-abs (fp32) and
every parameter's loss gradient within 1e-4 relative."""
import pytest
import torch
from safetensors.torch import load_file, save_file

import mpt_reference as ref

BASE = dict(d_model=64, n_heads=4, n_layers=2, vocab_size=96, max_seq_len=40)
CONFIGS = {
    # LLM Foundry's pretraining recipes: learned positions, biases everywhere, LayerNorm, tied embeddings.
    "recipe-default": dict(BASE, norm_type="low_precision_layernorm"),
    "rope-gqa-glu-rmsnorm-nobias": dict(BASE, d_model=96, n_heads=6, no_bias=True, norm_type="rmsnorm",
                                        attn_config=dict(rope=True, rope_theta=500.0,
                                                         attn_type="grouped_query_attention", kv_n_heads=2),
                                        ffn_config=dict(ffn_type="mptglu")),
    "mqa-qkln-untied-logitscale-clip": dict(BASE, tie_word_embeddings=False, logit_scale=0.7,
                                            attn_config=dict(attn_type="multiquery_attention", qk_ln=True,
                                                             clip_qkv=1.5)),
    "qkgn-alibi4-window-seqid": dict(BASE, n_layers=3,
                                     attn_config=dict(qk_gn=True, alibi=True, alibi_bias_max=4,
                                                      sliding_window_size=6, attn_uses_sequence_id=True)),
    "alibi-attnbias-scale-embfrac-expansion": dict(BASE, no_bias=True, attention_bias=True, expansion_ratio=2.5,
                                                   embedding_fraction=0.25,
                                                   attn_config=dict(alibi=True, softmax_scale=0.3)),
    "rope-lprmsnorm-window": dict(BASE, norm_type="low_precision_rmsnorm",
                                  attn_config=dict(rope=True, sliding_window_size=3)),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_reference(name, driver, tmp_path):
    cfg = CONFIGS[name]
    weights = ref.make_weights(cfg, seed=7)
    ref.save_folder(cfg, weights, tmp_path / "model")
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, cfg["vocab_size"], (2, cfg["max_seq_len"] - 5), generator=gen)
    inputs = {"input_ids": ids}
    seq = None
    if cfg.get("attn_config", {}).get("attn_uses_sequence_id"):
        seq = torch.tensor([[0] * 12 + [1] * 10 + [2] * 13, [0] * 20 + [1] * 15])
        inputs["sequence_id"] = seq
    save_file(inputs, tmp_path / "in.safetensors")

    params = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    logits = ref.forward(cfg, params, ids, seq)
    loss = ref.loss_fn(logits, ids)
    loss.backward()
    for reference in (False, True):
        driver("forward", tmp_path / "model", tmp_path / "in.safetensors", tmp_path / "out.safetensors",
               *(["--reference"] if reference else []))
        ours = load_file(tmp_path / "out.safetensors")
        assert (ours["logits"] - logits.detach()).abs().max().item() <= 1e-5
        assert abs(ours["loss"].item() - loss.item()) <= 1e-5
        assert {k[5:] for k in ours if k.startswith("grad.")} == set(params)
        for param, p in params.items():
            # 1e-4 relative; the 1e-7 floor is for gradients that are zero in exact arithmetic and so only float
            # noise on both sides (k_ln.bias: a constant added to every key shifts each query's scores by a
            # constant, which softmax ignores).
            scale = p.grad.abs().max().item()
            diff = (ours["grad." + param] - p.grad).abs().max().item()
            assert diff <= 1e-4 * scale + 1e-7, f"{param}: max-abs diff {diff}, scale {scale}"
