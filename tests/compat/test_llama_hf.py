"""Tessera's Llama family against transformers' LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM (the real
peers), on random small configurations: grouped-query and multi-query attention, explicit head_dim, tied embeddings,
attention and MLP biases, linear and Llama 3.1 rope scaling, Mistral's sliding window, Qwen2's q/k/v biases.

- transformers saves a folder -> Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within 1e-5, and the
  gradient of every parameter within 1e-4 relative (max-abs difference over the parameter's max-abs gradient), on the
  SDPA path and the explicit reference path.
- Left padding with an attention mask: the real tokens' logits, the loss and the gradients agree (positions count real
  tokens only, as HF's generate sets them).
- Packed documents with sequence_id: each document's logits equal HF's on the document alone.
- Greedy generation equals HF's generate, also for a batch of prompts of different lengths.
- HF folder -> Tessera -> 5 training steps -> checkpoint -> `convert` -> AutoModelForCausalLM: the same logits.
"""
import json
import os
import subprocess

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

from conftest import ROOT
from test_hf_export import SEQ as TRAIN_SEQ  # the shared dataset (test_hf_export.dataset): sequences of 32
from test_hf_export import VOCAB, convert, dataset, train_and_checkpoint  # noqa: F401 (the fixture)

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=101,
            max_position_embeddings=64, rms_norm_eps=1e-5)

CONFIGS = {
    "mha": (LlamaConfig, LlamaForCausalLM, dict(BASE)),
    "gqa": (LlamaConfig, LlamaForCausalLM,
            dict(BASE, hidden_size=96, num_attention_heads=6, num_key_value_heads=2, intermediate_size=160)),
    "mqa-head-dim": (LlamaConfig, LlamaForCausalLM, dict(BASE, num_key_value_heads=1, head_dim=24)),
    "tied-biases": (LlamaConfig, LlamaForCausalLM,
                    dict(BASE, num_key_value_heads=2, tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
    "rope-linear": (LlamaConfig, LlamaForCausalLM,
                    dict(BASE, rope_theta=500000.0, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "rope-llama3": (LlamaConfig, LlamaForCausalLM,
                    dict(BASE, hidden_size=128, num_key_value_heads=2, rope_theta=500000.0,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "mistral-sliding": (MistralConfig, MistralForCausalLM, dict(BASE, num_key_value_heads=2, sliding_window=7)),
    "qwen2-biases": (Qwen2Config, Qwen2ForCausalLM, dict(BASE, num_key_value_heads=2, tie_word_embeddings=True)),
    # A window in the layers from max_window_layers on (layer 1 of 2; the window shorter than the sequences).
    "qwen2-window-from-layer-1": (Qwen2Config, Qwen2ForCausalLM,
                                  dict(BASE, num_key_value_heads=2, use_sliding_window=True, sliding_window=5,
                                       max_window_layers=1)),
}
SEQ = 29


def hf_model(name, seed=0):
    config_class, model_class, cfg = CONFIGS[name]
    torch.manual_seed(seed)
    return randomise_norms_and_biases(model_class(config_class(**cfg, attn_implementation="sdpa")).eval())


def randomise_norms_and_biases(model):
    """transformers initialises norms to 1 (Gemma's to 0, for 1 + w) and biases to 0: randomise them so that they are
    really compared. Shared with the other families' suites."""
    with torch.no_grad():
        for module in model.modules():
            norm = "Norm" in type(module).__name__
            for name, p in module.named_parameters(recurse=False):
                if norm:
                    p.add_(0.1 * torch.randn_like(p))
                elif name == "bias":
                    p.normal_(0.0, 0.1)
    return model


def save(model, folder):
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def run_tessera(driver, tmp_path, folder, reference=False, **inputs):
    save_file(inputs, tmp_path / "in.safetensors")
    args = ["--reference"] if reference else []
    driver("forward", folder, tmp_path / "in.safetensors", tmp_path / "out.safetensors", *args)
    return load_file(tmp_path / "out.safetensors")


def hf_forward(model, ids, **kwargs):
    model.zero_grad()
    out = model(input_ids=ids, **kwargs)
    out.loss.backward()
    return out.logits.detach(), out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def assert_gradients_match(ours, grads, tied):
    """Each gradient within 1e-4 of its own largest element, plus a floor of 1e-6 of the model's largest gradient:
    a parameter whose gradient is tiny beside the others' (Qwen3.5's A_log, 5e-5 against 0.1) carries rounding of the
    forward at the model's scale, which differs from CPU to CPU (A_log's 6.9e-9 on an Intel Xeon failed the old floor
    of 1e-4 of its own largest + 1e-9)."""
    names = {k[len("grad."):] for k in ours if k.startswith("grad.")}
    assert names == set(grads) - ({"lm_head.weight"} if tied else set())
    scale = max(g.abs().max().item() for g in grads.values() if g is not None)
    for param in names:
        g = grads[param]
        if g is None:  # outside the graph (an expert no token was routed to): Tessera writes zeros
            g = torch.zeros_like(ours["grad." + param])
        diff = (ours["grad." + param] - g).abs().max().item()
        assert diff <= 1e-4 * g.abs().max().item() + 1e-6 * scale, f"{param}: max-abs diff {diff}"


def check_logits_and_gradients(model, driver, tmp_path, seq=SEQ, pad_at=None, rename=lambda ours: ours):
    """transformers saves `model`'s folder and Tessera loads it: logits within 1e-5 max-abs in fp32, the loss within
    1e-5 and every gradient within 1e-4 relative, on the SDPA path and the explicit reference path. `pad_at` (row,
    column) puts the padding token there, whose embedding row gets no gradient in either. `rename` maps Tessera's
    outputs to the model's parameter names (where its folders store them otherwise). Shared with the other families'
    suites."""
    folder = save(model, tmp_path / "hf")
    ids = torch.randint(0, model.config.vocab_size, (2, seq), generator=torch.Generator().manual_seed(1))
    if pad_at is not None:
        ids[pad_at] = model.config.pad_token_id
    logits, loss, grads = hf_forward(model, ids, labels=ids)
    for reference in (False, True):
        ours = rename(run_tessera(driver, tmp_path, folder, reference, input_ids=ids))
        assert (ours["logits"] - logits).abs().max().item() <= 1e-5
        assert abs(ours["loss"].item() - loss.item()) <= 1e-5
        assert_gradients_match(ours, grads, model.config.tie_word_embeddings)


def check_recipe_parameter_count(recipe, hub_id, config_class, model_class, hub_cache, tmp_path, world_size=8,
                                 trained_keys=(), counted_buffers="", refused_by=None):
    """recipes/`recipe` is the published config.json of `hub_id` (tests/data/hub_configs/): every key of its model
    section equals the config's (but `trained_keys`, which the recipe sets for training); and `train --dry-run` prints
    the parameter count transformers' `model_class` has for that config (plus its buffers named `counted_buffers`,
    which Tessera holds as frozen parameters), from the recipe and from the same recipe with the model through
    hf_causal_lm over the config.json in a hub cache, or, with `refused_by`, the latter fails naming that key (a
    published folder of weights Tessera does not load). Shared with the other families' suites."""
    published = json.loads((ROOT / "tests" / "data" / "hub_configs" / f"{hub_id.replace('/', '--')}.json")
                           .read_text())
    recipe_yaml = yaml.safe_load((ROOT / "recipes" / recipe).read_text())
    # A copy of each value: config classes edit dicts in place (rope_scaling gains rope_type).
    config = config_class(**{k: v for k, v in json.loads(json.dumps(published)).items()
                             if k not in ("architectures", "model_type")})
    for key, value in recipe_yaml["model"].items():
        if key in ("name", "init_device", *trained_keys):
            continue
        assert (published[key] if isinstance(value, dict) else getattr(config, key)) == value, key
    with torch.device("meta"):
        model = model_class(config)
    expected = sum(p.numel() for p in model.parameters())
    if counted_buffers:
        expected += sum(b.numel() for n, b in model.named_buffers() if n.endswith(counted_buffers))
    train = os.environ.get("TESSERA_TRAIN_BIN", str(ROOT / "build" / "bin" / "train"))
    recipe_yaml["model"] = {"name": "hf_causal_lm", "pretrained_model_name_or_path": hub_id, "pretrained": False,
                            "init_device": "meta"}
    (tmp_path / "via_hub.yaml").write_text(yaml.safe_dump(recipe_yaml))
    env = dict(os.environ, HF_HUB_CACHE=str(hub_cache))
    for recipe_path in (ROOT / "recipes" / recipe, tmp_path / "via_hub.yaml"):
        proc = subprocess.run([train, "--recipe", str(recipe_path), "--dry-run", "--no-preflight", "--world-size", str(world_size)],
                              capture_output=True, text=True, env=env, timeout=300)
        if refused_by is not None and recipe_path.name == "via_hub.yaml":
            assert proc.returncode != 0 and refused_by in proc.stdout + proc.stderr, proc.stdout + proc.stderr
            continue
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{expected:,}" in proc.stdout + proc.stderr, (expected, proc.stdout[-2000:])


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_gradients_match_transformers(name, driver, tmp_path):
    check_logits_and_gradients(hf_model(name), driver, tmp_path)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_sharded_folders_of_each_dtype_load_as_transformers_loads_them(dtype, driver, tmp_path):
    """A folder transformers wrote in bf16 / fp16 / fp32, in many shards with an index, read tensor by tensor through
    memory maps into fp32: the logits equal transformers' from_pretrained(torch_dtype=float32) of the same folder."""
    folder = tmp_path / "hf"
    hf_model("tied-biases").to(dtype).save_pretrained(folder, max_shard_size="20KB", safe_serialization=True)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    ref = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    ids = torch.randint(0, ref.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(input_ids=ids).logits
    assert (run_tessera(driver, tmp_path, folder, input_ids=ids)["logits"] - want).abs().max().item() <= 1e-5


def check_left_padding(model, driver, tmp_path, rename=lambda ours: ours):
    """Left padding with an attention mask: the real tokens' logits, the loss and the gradients equal transformers'
    (positions count real tokens only, as HF's generate sets them). `rename` as check_logits_and_gradients'. Shared
    with the other families' suites."""
    folder = save(model, tmp_path / "hf")
    ids = torch.randint(0, model.config.vocab_size, (3, SEQ), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(3, SEQ, dtype=torch.long)
    mask[1, :5] = 0
    mask[2, :12] = 0
    # A label counts when it and the token before it are real: a padding position's logits are not compared.
    predicted = torch.cat([torch.zeros(3, 1, dtype=torch.long), mask[:, :-1]], 1)
    labels = ids.masked_fill((mask == 0) | (predicted == 0), -100)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits, loss, grads = hf_forward(model, ids, attention_mask=mask, position_ids=positions, labels=labels)
    ours = rename(run_tessera(driver, tmp_path, folder, input_ids=ids, attention_mask=mask.bool(), labels=labels))
    real = mask.bool()
    assert (ours["logits"][real] - logits[real]).abs().max().item() <= 1e-5
    assert abs(ours["loss"].item() - loss.item()) <= 1e-5
    assert_gradients_match(ours, grads, model.config.tie_word_embeddings)


def check_packed_documents(model, driver, tmp_path):
    """Packed documents with sequence_id: each document's logits equal transformers' on the document alone."""
    folder = save(model, tmp_path / "hf")
    lengths = [5, 9, 3, 12]
    ids = torch.randint(0, model.config.vocab_size, (1, sum(lengths)), generator=torch.Generator().manual_seed(3))
    sequence_id = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)]).unsqueeze(0)
    ours = run_tessera(driver, tmp_path, folder, input_ids=ids, sequence_id=sequence_id)["logits"]
    start = 0
    with torch.no_grad():
        for n in lengths:
            alone = model(ids[:, start:start + n]).logits
            assert (ours[:, start:start + n] - alone).abs().max().item() <= 1e-5
            start += n


def check_greedy_generation(model, driver, tmp_path, lowest_id=1):
    """Greedy generation for prompts of different lengths equals transformers' generate on them left-padded."""
    with torch.no_grad():  # sharpen the distribution so greedy choices are not near-ties
        model.get_output_embeddings().weight.mul_(4.0)
    folder = save(model, tmp_path / "hf")
    vocab = model.config.vocab_size
    ids = torch.randint(lowest_id, vocab, (3, 11), generator=torch.Generator().manual_seed(4))
    lengths = torch.tensor([11, 4, 8])
    save_file({"input_ids": ids, "lengths": lengths}, tmp_path / "in.safetensors")
    driver("generate", folder, tmp_path / "in.safetensors", tmp_path / "out.safetensors", 14)
    ours = load_file(tmp_path / "out.safetensors")["tokens"]
    # HF: the prompts left-padded with an attention mask (generate derives positions from it).
    padded = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths.tolist()):
        padded[b, 11 - n:] = ids[b, :n]
        mask[b, 11 - n:] = 1
    with torch.no_grad():
        theirs = model.generate(padded, attention_mask=mask, max_new_tokens=14, min_new_tokens=14, do_sample=False,
                                use_cache=True, pad_token_id=0, eos_token_id=None)[:, 11:]
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("name", ["gqa", "mistral-sliding", "qwen2-biases", "qwen2-window-from-layer-1"])
def test_left_padding_matches_transformers(name, driver, tmp_path):
    check_left_padding(hf_model(name, seed=1), driver, tmp_path)


@pytest.mark.parametrize("name", ["gqa", "mistral-sliding"])
def test_packed_documents_equal_each_document_alone(name, driver, tmp_path):
    check_packed_documents(hf_model(name, seed=2), driver, tmp_path)


@pytest.mark.parametrize("name", ["gqa", "rope-llama3", "mistral-sliding", "qwen2-biases",
                                  "qwen2-window-from-layer-1"])
def test_greedy_generation_matches_transformers_generate(name, driver, tmp_path):
    check_greedy_generation(hf_model(name, seed=5), driver, tmp_path)


def test_configs_transformers_computes_differently_are_refused(driver, tmp_path):
    # Qwen2 with a layer type Tessera's Llama family does not compute (Llama 4's chunked attention): refused, not loaded
    # as a full layer.
    cfg = dict(CONFIGS["qwen2-window-from-layer-1"][2])
    folder = save(Qwen2ForCausalLM(Qwen2Config(**cfg)), tmp_path / "qwen")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, layer_types=["full_attention", "chunked_attention"])))
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(AssertionError, match='layer_types: each entry is sliding_attention or full_attention, got '
                                             '"chunked_attention"'):
        run_tessera(driver, tmp_path, folder, input_ids=ids)
    # Other activations and rope types.
    for key, value, message in (("hidden_act", "gelu", "hidden_act"),
                                ("rope_scaling", {"rope_type": "yarn", "factor": 2.0}, "rope_type")):
        folder = save(hf_model("mha"), tmp_path / key)
        config = json.loads((folder / "config.json").read_text())
        config[key] = value
        (folder / "config.json").write_text(json.dumps(config))
        with pytest.raises(AssertionError, match=message):
            run_tessera(driver, tmp_path, folder, input_ids=ids)


# ---- Round trip: HF folder -> Tessera -> train -> checkpoint -> convert -> transformers --------------------------



def train_export_and_compare(driver, tmp_path, dataset, section, start=None, extra=None):
    """Trains `section` 5 steps with Tessera (from the HF folder `start` when given; recipe keys `extra` added),
    checkpoints, exports with `convert`, and checks AutoModelForCausalLM computes Tessera's logits on the export.
    Returns transformers' model."""
    extra = dict(extra or {})
    if start is not None:
        extra["load_path"] = str(start)
    checkpoint = train_and_checkpoint(driver, tmp_path, dataset, section, extra=extra)
    trace = tmp_path / "trace"
    init = load_file(trace / "init" / "model.safetensors")
    if start is not None:  # the run started from the HF folder's weights
        started = load_file(start / "model.safetensors")
        assert set(init) == set(started) and all(torch.equal(init[k], started[k]) for k in init)
    losses = json.loads((trace / "trace.json").read_text())["losses"]
    assert losses[-1] < losses[0]

    proc = convert(checkpoint, tmp_path / "hf")
    assert proc.returncode == 0, proc.stderr
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32).eval()
    trained = load_file(tmp_path / "hf" / "model.safetensors")
    assert set(trained) == set(init) and not all(torch.equal(trained[k], init[k]) for k in trained)
    ids = torch.randint(0, VOCAB, (3, TRAIN_SEQ), generator=torch.Generator().manual_seed(7))
    ours = run_tessera(driver, tmp_path, tmp_path / "hf", input_ids=ids)["logits"]
    with torch.no_grad():
        assert (ours - hf(ids).logits).abs().max().item() <= 1e-5
    return hf


@pytest.mark.parametrize("name", ["gqa", "tied-biases", "rope-llama3", "mistral-sliding", "qwen2-biases",
                                  "qwen2-window-from-layer-1"])
def test_hf_folder_trained_and_exported_loads_in_transformers_as_the_same_function(name, driver, tmp_path, dataset):
    config_class, model_class, cfg = CONFIGS[name]
    torch.manual_seed(6)
    start = save(model_class(config_class(**dict(cfg, vocab_size=VOCAB))), tmp_path / "start")
    hf_config = json.loads((start / "config.json").read_text())
    section = {k: hf_config[k] for k in ("model_type", "vocab_size", "hidden_size", "intermediate_size",
                                         "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                         "max_position_embeddings", "rms_norm_eps", "rope_theta",
                                         "tie_word_embeddings") if k in hf_config}
    for k in ("rope_scaling", "attention_bias", "mlp_bias", "sliding_window", "head_dim", "layer_types"):
        if hf_config.get(k) is not None:
            section[k] = hf_config[k]
    section["name"] = "llama"
    hf = train_export_and_compare(driver, tmp_path, dataset, section, start)
    assert type(hf) is model_class


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "recipes").glob("llama*.yaml")  # not fine-tuning
                                           if yaml.safe_load(p.read_text())["model"]["name"] == "llama"))
def test_the_recipes_llama_trained_from_scratch_exports_as_llama_computing_the_same_logits(recipe, driver, tmp_path,
                                                                                           dataset):
    section = yaml.safe_load((ROOT / "recipes" / recipe).read_text())["model"]
    section.pop("head_dim", None)
    section.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=TRAIN_SEQ, init_device="cpu")
    if "rope_scaling" in section:
        section["rope_scaling"]["original_max_position_embeddings"] = 16  # every regime of the llama3 ramp
    hf = train_export_and_compare(driver, tmp_path, dataset, section)
    assert type(hf) is LlamaForCausalLM


def test_export_copies_the_tokenizer_and_writes_generation_config(driver, tmp_path, dataset):
    """The recipe's tokenizer folder (Llama-2 style: a real SentencePiece model through transformers' converter) is
    copied into the export, so AutoTokenizer loads the same tokenizer there, and generation_config.json carries its
    bos/eos/pad ids, which transformers' generate uses. `--tokenizer` takes a lone tokenizer.json instead (loaded as
    PreTrainedTokenizerFast), or none."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, GenerationConfig, LlamaTokenizerFast, PreTrainedTokenizerFast
    from test_tokenizer_hf import read_fortunes
    from test_tokenizer_sentencepiece import train_sentencepiece
    docs = read_fortunes()[::3]
    train_sentencepiece(docs, tmp_path / "sp.model")
    tok_dir = tmp_path / "tok"
    LlamaTokenizerFast(vocab_file=str(tmp_path / "sp.model"), legacy=False, add_prefix_space=True, from_slow=True,
                       add_eos_token=True, pad_token="</s>").save_pretrained(tok_dir)
    # The model's embedding holds the tokenizer's 3000 tokens (pre-flight refuses a tokenizer larger than it).
    section = dict(name="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=3000, max_position_embeddings=TRAIN_SEQ)
    checkpoint = train_and_checkpoint(driver, tmp_path, dataset, section, extra={"tokenizer": {"name": str(tok_dir)}})

    out = tmp_path / "hf"
    proc = convert(checkpoint, out)
    assert proc.returncode == 0, proc.stderr
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (out / name).read_bytes() == (tok_dir / name).read_bytes(), name
    texts = docs[:100] + ["", " x", "<s>a</s>"]
    assert AutoTokenizer.from_pretrained(out)(texts)["input_ids"] == AutoTokenizer.from_pretrained(tok_dir)(texts)[
        "input_ids"]
    gen = GenerationConfig.from_pretrained(out)
    assert (gen.bos_token_id, gen.eos_token_id, gen.pad_token_id) == (1, 2, 2)
    assert AutoModelForCausalLM.from_pretrained(out).generation_config.eos_token_id == 2

    lone = tmp_path / "lone"
    assert convert(checkpoint, lone, "--tokenizer", str(tok_dir / "tokenizer.json")).returncode == 0
    hf_tok = AutoTokenizer.from_pretrained(lone)
    assert type(hf_tok) is PreTrainedTokenizerFast
    peer = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    assert hf_tok(texts)["input_ids"] == [e.ids for e in peer.encode_batch(texts)]
    ids = peer.encode(" Hello  world\n").ids
    for skip in (False, True):
        assert hf_tok.decode(ids, skip_special_tokens=skip) == peer.decode(ids, skip_special_tokens=skip)
    assert GenerationConfig.from_pretrained(lone).eos_token_id is None  # a lone tokenizer.json names no eos

    none = tmp_path / "none"
    assert convert(checkpoint, none, "--tokenizer", "none").returncode == 0
    assert sorted(p.name for p in none.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    proc = convert(checkpoint, tmp_path / "bad", "--tokenizer", "org/not-cached")
    assert proc.returncode != 0 and "org/not-cached" in proc.stderr and not (tmp_path / "bad" / "config.json").exists()
