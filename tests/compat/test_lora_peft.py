"""LoRA fine-tuning of Hugging Face models against the `peft` library.

`train` fine-tunes a small Llama and a small MPT (saved by transformers) with the `lora` algorithm on prompt/response
rows (the finetuning loader), writing the adapters in PEFT's layout (`save_path`) and the merged model with
hf_checkpointer. peft's own PeftModel.from_pretrained puts the adapters on transformers' base model: its logits must
equal those of the merged folder loaded by transformers (1e-5), its merge_and_unload weights the merged folder's, the
adapters must have trained (lora_B non-zero, logits away from the base model's), and every base weight outside the
adapted modules must be unchanged.
"""
import json
import os
import pathlib
import subprocess

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from tokenizers import ByteLevelBPETokenizer
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MptConfig, MptForCausalLM,
                          PreTrainedTokenizerFast)

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("TESSERA_TRAIN_BIN", str(ROOT / "build" / "bin" / "train"))
FORTUNES = pathlib.Path("/usr/share/games/fortunes")

MODELS = {
    "llama": (lambda: LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                                   max_position_embeddings=128)),
              ["q_proj", "v_proj", "down_proj"]),
    "mpt": (lambda: MptForCausalLM(MptConfig(d_model=64, n_heads=4, n_layers=2, expansion_ratio=4, max_seq_len=128,
                                             vocab_size=512)),
            ["Wqkv", "out_proj"]),
}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    docs = [d.strip() for d in (FORTUNES / "computers").read_text(errors="replace").split("\n%\n") if d.strip()]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=512, min_frequency=2, special_tokens=["<|endoftext|>"])
    PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>").save_pretrained(root / "tok")
    rows = [{"prompt": f"Fortune {i}:\n", "response": d[:200]} for i, d in enumerate(docs[:64])]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.mark.parametrize("family", sorted(MODELS))
def test_adapters_load_in_peft_with_the_merged_models_logits(shared, tmp_path, family):
    build, targets = MODELS[family]
    torch.manual_seed(0)
    build().save_pretrained(tmp_path / "base")
    recipe = {
        "max_seq_len": 64,
        "model": {"name": "hf_causal_lm", "pretrained": True, "pretrained_model_name_or_path": str(tmp_path / "base")},
        "tokenizer": {"name": str(shared / "tok")},
        "train_loader": {"name": "finetuning", "drop_last": True,
                         "dataset": {"hf_name": "json", "hf_kwargs": {"data_files": {"train": str(shared / "train.jsonl")}},
                                     "split": "train", "max_seq_len": 64, "decoder_only_format": True,
                                     "shuffle": True}},
        "algorithms": {"lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": targets,
                                "save_path": str(tmp_path / "adapter")}},
        "callbacks": {"hf_checkpointer": {"save_folder": str(tmp_path / "hf"), "save_interval": "100ba",
                                          "huggingface_folder_name": "merged", "precision": "float32",
                                          "transformers_version": 4}},
        "optimizer": {"name": "decoupled_adamw", "lr": 0.02, "weight_decay": 0.0},
        "scheduler": {"name": "constant_with_warmup", "t_warmup": "0ba"},
        "max_duration": "3ba", "global_train_batch_size": 4, "device_train_microbatch_size": 2,
        "device_eval_batch_size": 4, "precision": "fp32", "seed": 1, "log_to_console": False,
    }
    (tmp_path / "recipe.yaml").write_text(json.dumps(recipe))
    proc = subprocess.run([TRAIN, "--recipe", str(tmp_path / "recipe.yaml")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    adapters = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in adapters.items()), "adapters untrained"
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
    ids = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        base_logits = base(ids).logits
    peft_model = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "huggingface" / "merged").eval()
    with torch.no_grad():
        peft_logits = peft_model(ids).logits
        merged_logits = merged(ids).logits
    assert (peft_logits - base_logits).abs().max() > 1e-3, "the adapters change nothing"
    torch.testing.assert_close(merged_logits, peft_logits, atol=1e-5, rtol=0)

    unloaded = peft_model.merge_and_unload().state_dict()
    adapted = {k for k in unloaded if any(f".{t}." in k for t in targets)}
    original = AutoModelForCausalLM.from_pretrained(tmp_path / "base").state_dict()
    for k, v in merged.state_dict().items():
        torch.testing.assert_close(v, unloaded[k], atol=1e-6, rtol=0, msg=k)
        if k not in adapted:
            assert torch.equal(v, original[k]), f"{k} changed outside the adapted modules"
