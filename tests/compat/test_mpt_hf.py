"""Tessera's MPT against Hugging Face transformers' MptForCausalLM (the real peer), on configurations HF supports:
ALiBi, no biases, multi-head attention, exact GELU, tied embeddings.

- Same weights, same tokens: logits agree within 1e-5 max-abs in fp32, and the loss gradient of every parameter
  within 1e-4 relative (max-abs difference over the parameter's max-abs gradient).
- HF saves -> Tessera loads (the above); Tessera exports -> HF loads -> the same logits.
- Greedy generation with the KV cache gives HF's tokens.

HF's class ignores attn_config.alibi_bias_max (it always builds slopes with 8), so other values are compared against
the plain-PyTorch reference in test_mpt_reference.py instead.
"""
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import MptConfig, MptForCausalLM

CONFIGS = {
    "tiny": dict(d_model=64, n_heads=4, n_layers=2, vocab_size=101, max_seq_len=32),
    "odd-heads": dict(d_model=60, n_heads=5, n_layers=2, vocab_size=97, max_seq_len=48),
    "six-heads-clip-scale": dict(d_model=96, n_heads=6, n_layers=3, vocab_size=128, max_seq_len=64,
                                 attn_config=dict(clip_qkv=0.5, softmax_scale=0.2)),
    "wider": dict(d_model=256, n_heads=8, n_layers=4, vocab_size=512, max_seq_len=128),
}


def hf_model(cfg, seed=0):
    torch.manual_seed(seed)
    model = MptForCausalLM(MptConfig(**cfg)).eval()
    with torch.no_grad():  # HF's init leaves norms at 1/0; randomise them too so they are really compared
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def hf_forward(model, ids):
    model.zero_grad()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return out.logits.detach(), out.loss.detach(), grads


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_hf(name, driver, tmp_path):
    cfg = CONFIGS[name]
    model = hf_model(cfg)
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    ids = torch.randint(0, cfg["vocab_size"], (2, cfg["max_seq_len"] - 3), generator=torch.Generator().manual_seed(1))
    save_file({"input_ids": ids}, tmp_path / "in.safetensors")
    for reference in (False, True):  # SDPA path and the explicit reference path
        args = ["--reference"] if reference else []
        driver("forward", tmp_path / "hf", tmp_path / "in.safetensors", tmp_path / "out.safetensors", *args)
        ours = load_file(tmp_path / "out.safetensors")
        logits, loss, grads = hf_forward(model, ids)
        assert (ours["logits"] - logits).abs().max().item() <= 1e-5
        assert abs(ours["loss"].item() - loss.item()) <= 1e-5
        hf_names = set(grads)
        our_names = {k[len("grad."):] for k in ours if k.startswith("grad.")}
        assert our_names == hf_names - {"lm_head.weight"}  # tied: HF lists the head separately, same tensor as wte
        for param, g in grads.items():
            if param == "lm_head.weight":
                continue
            ref_scale = g.abs().max().item()
            diff = (ours["grad." + param] - g).abs().max().item()
            assert diff <= 1e-4 * ref_scale + 1e-9, f"{param}: max-abs diff {diff}, scale {ref_scale}"


@pytest.mark.parametrize("name", ["tiny", "odd-heads"])
def test_tessera_export_loads_in_hf(name, driver, tmp_path):
    cfg = CONFIGS[name]
    model = hf_model(cfg, seed=3)
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    driver("export", tmp_path / "hf", tmp_path / "exported")
    reloaded = MptForCausalLM.from_pretrained(tmp_path / "exported").eval()
    ids = torch.randint(0, cfg["vocab_size"], (3, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (reloaded(ids).logits - model(ids).logits).abs().max().item() <= 1e-6
    exported = load_file(tmp_path / "exported" / "model.safetensors")
    assert "lm_head.weight" not in exported and "transformer.wte.weight" in exported


def test_greedy_generation_matches_hf(driver, tmp_path):
    cfg = CONFIGS["wider"]
    model = hf_model(cfg, seed=5)
    with torch.no_grad():  # sharpen the distribution so greedy choices are not near-ties
        model.transformer.wte.weight.mul_(4.0)
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    ids = torch.randint(0, cfg["vocab_size"], (3, 9), generator=torch.Generator().manual_seed(4))
    save_file({"input_ids": ids}, tmp_path / "in.safetensors")
    driver("generate", tmp_path / "hf", tmp_path / "in.safetensors", tmp_path / "out.safetensors", 12)
    ours = load_file(tmp_path / "out.safetensors")["tokens"]
    with torch.no_grad():
        theirs = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, use_cache=True,
                                pad_token_id=0, eos_token_id=None)[:, ids.shape[1]:]
    assert torch.equal(ours, theirs)
