"""A plain-PyTorch MPT written straight from LLM Foundry's architecture (../shared/specs/llm-foundry-mpt-icl.md §1,
the torch attention implementation), independent of Tessera's C++ code. It covers what HF's MptForCausalLM cannot:
learned positions, biases, RoPE, grouped-query and multi-query attention, qk_ln / qk_gn, GLU, RMSNorm, sliding windows,
packed sequences, an untied head, logit_scale, embedding_fraction and any alibi_bias_max.

LLM Foundry's own package pins a different torch (and its attention needs flash-attn or triton for RoPE), so it cannot
run in this venv; this file is the justified substitute the issue allows. Weights are a dict name -> tensor with the
LLM Foundry / HF names, so they can be saved as an HF folder and loaded by Tessera.
"""
import json
import math

import torch
import torch.nn.functional as F


def defaults(cfg):
    c = dict(expansion_ratio=4, no_bias=False, learned_pos_emb=True, norm_type="low_precision_layernorm",
             norm_eps=1e-5, tie_word_embeddings=True, logit_scale=None, embedding_fraction=1.0)
    c.update(cfg)
    a = dict(attn_type="multihead_attention", qk_ln=False, qk_gn=False, clip_qkv=None, softmax_scale=None,
             attn_uses_sequence_id=False, sliding_window_size=-1, alibi=False, alibi_bias_max=8, rope=False,
             rope_theta=10000)
    a.update(cfg.get("attn_config", {}))
    c["attn_config"] = a
    c["ffn_config"] = {"ffn_type": "mptmlp", **cfg.get("ffn_config", {})}
    if a["alibi"] or a["rope"]:
        c["learned_pos_emb"] = False
    if a["attn_type"] == "multihead_attention":
        a["kv_n_heads"] = c["n_heads"]
    elif a["attn_type"] == "multiquery_attention":
        a["kv_n_heads"] = 1
    return c


def make_weights(cfg, seed):
    """Random weights (std 0.08, norms around 1, biases non-zero) so that every tensor matters."""
    c = defaults(cfg)
    g = torch.Generator().manual_seed(seed)
    d, h, L, V, S = c["d_model"], c["n_heads"], c["n_layers"], c["vocab_size"], c["max_seq_len"]
    a = c["attn_config"]
    hd, kv = d // h, a["kv_n_heads"]
    f = int(d * c["expansion_ratio"])
    bias = not c["no_bias"]
    wqkv_bias = c.get("attention_bias", bias)
    norm_bias = bias and "layernorm" in c["norm_type"]
    w = {}

    def rnd(*shape, scale=0.08):
        return torch.randn(*shape, generator=g) * scale

    def norm(name, n, with_bias=None):
        w[name + ".weight"] = 1 + rnd(n, scale=0.1)
        if norm_bias if with_bias is None else with_bias:
            w[name + ".bias"] = rnd(n, scale=0.1)

    def linear(name, n_in, n_out, with_bias):
        w[name + ".weight"] = rnd(n_out, n_in, scale=1 / math.sqrt(n_in))
        if with_bias:
            w[name + ".bias"] = rnd(n_out, scale=0.05)

    w["transformer.wte.weight"] = rnd(V, d, scale=0.25)
    if c["learned_pos_emb"]:
        w["transformer.wpe.weight"] = rnd(S, d, scale=0.25)
    for i in range(L):
        p = f"transformer.blocks.{i}."
        norm(p + "norm_1", d)
        linear(p + "attn.Wqkv", d, (h + 2 * kv) * hd, wqkv_bias)
        # LLM Foundry builds q_ln / k_ln as its default norm (LPLayerNorm, eps 1e-5, with a bias unless no_bias),
        # whatever the model's norm_type: the attention class is not given norm_type.
        if a["qk_ln"]:
            norm(p + "attn.q_ln", h * hd, bias)
            norm(p + "attn.k_ln", kv * hd, bias)
        if a["qk_gn"]:
            norm(p + "attn.q_ln", hd, bias)
            norm(p + "attn.k_ln", hd, bias)
        linear(p + "attn.out_proj", h * hd, d, bias)
        norm(p + "norm_2", d)
        linear(p + "ffn.up_proj", d, f, bias)
        if c["ffn_config"]["ffn_type"] == "mptglu":
            linear(p + "ffn.gate_proj", d, f, bias)
        linear(p + "ffn.down_proj", f, d, bias)
    norm("transformer.norm_f", d)
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = rnd(V, d, scale=1 / math.sqrt(d))
    return w


def gen_slopes(n_heads, alibi_bias_max):
    _n = 2 ** math.ceil(math.log2(n_heads))
    m = torch.arange(1, _n + 1, dtype=torch.float32) * (alibi_bias_max / _n)
    slopes = 1.0 / torch.pow(2, m)
    if _n != n_heads:
        slopes = torch.concat([slopes[1::2], slopes[::2]])[:n_heads]
    return slopes.view(1, n_heads, 1, 1)


def build_alibi_bias(n_heads, seq_len, full, alibi_bias_max):
    bias = torch.arange(1 - seq_len, 1, dtype=torch.int32).view(1, 1, 1, seq_len)
    if full:
        bias = bias - torch.arange(1 - seq_len, 1, dtype=torch.int32).view(1, 1, seq_len, 1)
        bias = bias.abs().mul(-1)
    return bias * gen_slopes(n_heads, alibi_bias_max)


def apply_norm(c, w, name, x):
    weight, b = w[name + ".weight"], w.get(name + ".bias")
    if "rmsnorm" in c["norm_type"]:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["norm_eps"]) * weight
    return F.layer_norm(x, (x.shape[-1],), weight, b, c["norm_eps"])


def rotary(x, theta):
    """flash-attn's non-interleaved ("dail" original) rotary embedding on x: (b, s, heads, hd)."""
    s, hd = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(s, dtype=torch.float32), inv_freq)
    cos, sin = freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def forward(cfg, w, ids, sequence_id=None):
    c = defaults(cfg)
    a = c["attn_config"]
    d, h = c["d_model"], c["n_heads"]
    hd, kv = d // h, a["kv_n_heads"]
    b, s = ids.shape
    x = F.embedding(ids, w["transformer.wte.weight"])
    if c["learned_pos_emb"]:
        x = x + F.embedding(torch.arange(s).unsqueeze(0), w["transformer.wpe.weight"])
    frac = c["embedding_fraction"]
    if frac != 1:
        x = x * frac + x.detach() * (1 - frac)
    min_val = torch.finfo(x.dtype).min
    use_seq = a["attn_uses_sequence_id"] and sequence_id is not None
    for i in range(c["n_layers"]):
        p = f"transformer.blocks.{i}."
        y = apply_norm(c, w, p + "norm_1", x)
        qkv = F.linear(y, w[p + "attn.Wqkv.weight"], w.get(p + "attn.Wqkv.bias"))
        if a["clip_qkv"]:
            qkv = qkv.clamp(-a["clip_qkv"], a["clip_qkv"])
        q, k, v = qkv.split([d, kv * hd, kv * hd], dim=2)
        qk = dict(c, norm_type="layernorm", norm_eps=1e-5)
        if a["qk_ln"]:
            q = apply_norm(qk, w, p + "attn.q_ln", q)
            k = apply_norm(qk, w, p + "attn.k_ln", k)
        if a["qk_gn"]:
            q = apply_norm(qk, w, p + "attn.q_ln", q.view(b, s, h, hd)).view(b, s, h * hd)
            k = apply_norm(qk, w, p + "attn.k_ln", k.view(b, s, kv, hd)).view(b, s, kv * hd)
        if a["rope"]:
            q = rotary(q.view(b, s, h, hd), a["rope_theta"]).view(b, s, h * hd)
            k = rotary(k.view(b, s, kv, hd), a["rope_theta"]).view(b, s, kv * hd)
        q = q.view(b, s, h, hd).permute(0, 2, 1, 3)             # b h s d
        k = k.view(b, s, kv, hd).permute(0, 2, 3, 1)            # b kv d s
        v = v.view(b, s, kv, hd).permute(0, 2, 1, 3)            # b kv s d
        if kv != h:  # repeat_kv_for_gqa: each kv head serves n_rep consecutive query heads
            k = k.repeat_interleave(h // kv, dim=1)
            v = v.repeat_interleave(h // kv, dim=1)
        scale = a["softmax_scale"] or 1 / math.sqrt(d / h)
        scores = q.matmul(k) * scale                             # b h s s
        if a["alibi"]:
            scores = scores + build_alibi_bias(h, s, full=use_seq, alibi_bias_max=a["alibi_bias_max"])
        if use_seq:
            same = sequence_id.view(b, s, 1) == sequence_id.view(b, 1, s)
            scores = scores.masked_fill(~same.view(b, 1, s, s), min_val)
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal.view(1, 1, s, s), min_val)
        if a["sliding_window_size"] != -1:
            win = torch.ones(s, s, dtype=torch.bool)
            win = torch.tril(win, diagonal=a["sliding_window_size"])
            win = torch.triu(win, diagonal=-a["sliding_window_size"])
            scores = scores.masked_fill(~win.view(1, 1, s, s), min_val)
        attn = torch.softmax(scores.float(), dim=-1)
        ctx = attn.matmul(v).permute(0, 2, 1, 3).reshape(b, s, h * hd)
        x = x + F.linear(ctx, w[p + "attn.out_proj.weight"], w.get(p + "attn.out_proj.bias"))
        y = apply_norm(c, w, p + "norm_2", x)
        up = F.linear(y, w[p + "ffn.up_proj.weight"], w.get(p + "ffn.up_proj.bias"))
        if c["ffn_config"]["ffn_type"] == "mptglu":
            gate = F.linear(y, w[p + "ffn.gate_proj.weight"], w.get(p + "ffn.gate_proj.bias"))
            hidden = F.gelu(gate) * up
        else:
            hidden = F.gelu(up)
        x = x + F.linear(hidden, w[p + "ffn.down_proj.weight"], w.get(p + "ffn.down_proj.bias"))
    x = apply_norm(c, w, "transformer.norm_f", x)
    head = w["lm_head.weight"] if not c["tie_word_embeddings"] else w["transformer.wte.weight"]
    logits = F.linear(x, head)
    if c["logit_scale"] is not None:
        logits = logits * c["logit_scale"]
    return logits


def loss_fn(logits, labels):
    """LLM Foundry: targets = roll(labels, -1) with the last position ignored; token mean."""
    targets = torch.roll(labels, -1, dims=1)
    targets[:, -1] = -100
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def save_folder(cfg, weights, path):
    """An HF-style MPT folder in LLM Foundry's config names, as its HF export writes them."""
    path.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in weights.items()}, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps({"model_type": "mpt", "architectures": ["MPTForCausalLM"], **cfg}))
