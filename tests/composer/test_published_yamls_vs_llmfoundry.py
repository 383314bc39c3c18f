"""LLM Foundry's published train YAMLs (scripts/train/yamls/{pretrain,finetune}, copied verbatim into
tests/data/foundry/ with their source commit on the first line; tests/data/foundry/published/INDEX.md lists them)
read by Tessera as LLM Foundry 0.22 itself reads them.

For every YAML: LLM Foundry's own train-config validation (make_dataclass_and_log_config, what its train.py runs
first) must accept it, so the set is the one this Foundry version runs. Then `train --dry-run`, with a Hugging Face
cache holding the published config.json of each model the YAMLs name (tests/data/hub_configs/), must
- plan it, with the parameter count LLM Foundry's MPTForCausalLM or transformers' model class has for the same config
  (built on the meta device), for the families Tessera builds (MPT, Llama);
- refuse it as LLM Foundry does where LLM Foundry's own code refuses it: `config_overrides.attn_config` on a Llama
  config (set_config_overrides raises) and the unused top-level `dataset` anchor (its validation raises);
- refuse the DBRX fine-tuning YAMLs' autoresume without a save_folder (as Composer's Trainer does) and dbrx-lora-ft's
  peft_config, naming the key, and plan them with those keys changed (CHANGED: with DBRX's published 132 B
  parameters); their tokenizer, LLM Foundry's TiktokenTokenizerWrapper under trust_remote_code, is read natively;
MPT's MegaBlocks layers (testing-moe.yaml's mb_dmoe) are counted with LLM Foundry's torch_dmoe layer of the same
experts (MegaBlocks needs CUDA to install), plus the d_model output bias per layer that MegaBlocks adds with biases.
Each one that plans also trains when shrunk: two steps of a 2-layer model of the same configuration (for hf_causal_lm,
a folder transformers wrote: the published config.json shrunk, with weights) on local MDS tokens, or prompt/response
samples for the finetuning loader, every other key as published (precision, FSDP, optimizer, scheduler, callbacks).
"""
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from llmfoundry.utils.config_utils import TRAIN_CONFIG_KEYS, TrainConfig, make_dataclass_and_log_config
from omegaconf import OmegaConf as om
from streaming import MDSWriter

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "compat"))
from hub_cache import make_hub_cache, snapshot  # noqa: E402  (the compat suite's hub cache builder)

TRAIN = os.environ.get("TESSERA_TRAIN_BIN", str(ROOT / "build" / "bin" / "train"))
FOUNDRY = ROOT / "tests" / "data" / "foundry"
YAMLS = sorted(str(p.relative_to(FOUNDRY)) for p in FOUNDRY.glob("published/*/*.yaml")) + [
    "mpt-125m.yaml", "mpt-small-cpu.yaml"]

NOT_BUILT = {}  # YAML -> what the refusal must name (none left)
# The DBRX fine-tuning YAMLs: Tessera refuses dbrx-lora-ft's model.peft_config (LoRA is the `lora` algorithm here)
# and, as Composer's Trainer itself does after LLM Foundry's validation, autoresume without a save_folder
# (composer/trainer/trainer.py: "The `save_folder` must be specified when autoresume is enabled."). Their tokenizer
# kwarg trust_remote_code is read (Tessera implements DBRX's tiktoken tokenizer natively and runs no code). With
# those keys changed (the overrides below) they plan DBRX with transformers' count, and train shrunk
# (test_dbrx_finetuning_trains_when_shrunk).
CHANGED = {
    "published/finetune/dbrx-full-ft.yaml": ("autoresume", ["save_folder=./checkpoints"]),
    "published/finetune/dbrx-lora-ft.yaml": ("peft_config", ["save_folder=./checkpoints", "model.peft_config=null"]),
}
FOUNDRY_REFUSES = {  # YAML -> what both refusals say (each names the first override Llama's config lacks: LLM
    # Foundry in the YAML's order, max_seq_len; Tessera in key order, attn_config)
    "published/finetune/llama-2-7b_dolly_sft.yaml": 'config does not have attribute "',
    "published/finetune/llama-2-7b_domain_adapt.yaml": 'config does not have attribute "',
    "published/finetune/llama-3-8b_dolly_sft.yaml": 'config does not have attribute "',
    "published/finetune/llama-3-8b_domain_adapt.yaml": 'config does not have attribute "',
}
FOUNDRY_VALIDATION_REFUSES = {"published/finetune/1b_local_data_sft.yaml": "dataset"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    return make_hub_cache(tmp_path_factory.mktemp("hub"))


def resolved(name):
    return om.to_container(om.load(FOUNDRY / name), resolve=True)


def dry_run(name, hub, *overrides):
    return subprocess.run([TRAIN, "--recipe", str(FOUNDRY / name), "--dry-run", "--no-preflight", *overrides], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, HF_HUB_CACHE=str(hub)))


def peer_parameters(cfg, hub):
    """The parameter count of the model the YAML describes, as LLM Foundry / transformers build it (meta device)."""
    model = dict(cfg["model"])
    with torch.device("meta"):
        if model["name"] == "mpt_causal_lm":
            from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM

            for key in ("name", "pretrained", "loss_fn"):
                model.pop(key, None)
            model["init_device"] = "meta"  # LLM Foundry's own switch (its init otherwise allocates on the CPU)
            ffn = dict(model.get("ffn_config", {}))
            megablocks_bias = 0
            if ffn.get("ffn_type") in ("mb_moe", "mb_dmoe"):
                keep = ("moe_num_experts", "moe_top_k", "mlp_type", "moe_jitter_eps", "moe_normalize_expert_weights",
                        "uniform_expert_assignment", "ffn_hidden_size", "ffn_act_fn")
                model["ffn_config"] = dict({"mlp_type": "mlp", "moe_jitter_eps": None,
                                            "moe_normalize_expert_weights": None, "uniform_expert_assignment": False},
                                           **{k: v for k, v in ffn.items() if k in keep}, ffn_type="torch_dmoe")
                if not model.get("no_bias", False):
                    megablocks_bias = model["n_layers"] * model["d_model"]
            model.setdefault("attn_config", {})["attn_impl"] = "torch"  # flash-attn is not installed; same weights
            net = MPTForCausalLM(MPTConfig(**model))
            return sum(p.numel() for p in net.parameters()) + megablocks_bias
        else:
            from transformers import AutoConfig, AutoModelForCausalLM

            config = AutoConfig.from_pretrained(snapshot(hub, model["pretrained_model_name_or_path"]))
            net = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in net.parameters())


@pytest.mark.parametrize("name", YAMLS)
def test_read_as_llm_foundry_reads_it(name, hub):
    cfg = om.load(FOUNDRY / name)
    if name in FOUNDRY_VALIDATION_REFUSES:
        with pytest.raises(ValueError, match=FOUNDRY_VALIDATION_REFUSES[name]):
            make_dataclass_and_log_config(cfg, TrainConfig, TRAIN_CONFIG_KEYS, transforms="all")
    else:
        make_dataclass_and_log_config(cfg, TrainConfig, TRAIN_CONFIG_KEYS, transforms="all")
    out = dry_run(name, hub)
    text = out.stdout + out.stderr
    if name in NOT_BUILT:
        assert out.returncode == 2 and NOT_BUILT[name] in text, text
        return
    if name in CHANGED:
        refused, changes = CHANGED[name]
        assert out.returncode == 2 and (refused in text or "autoresume: needs save_folder" in text), text
        out = dry_run(name, hub, *changes)
        text = out.stdout + out.stderr
    if name in FOUNDRY_VALIDATION_REFUSES:
        assert out.returncode == 2 and f"{FOUNDRY_VALIDATION_REFUSES[name]}: unknown key" in text, text
        return
    if name in FOUNDRY_REFUSES:
        from llmfoundry.utils.config_utils import set_config_overrides
        from transformers import AutoConfig

        model = resolved(name)["model"]
        with pytest.raises(ValueError, match=re.escape(FOUNDRY_REFUSES[name])):
            set_config_overrides(AutoConfig.from_pretrained(snapshot(hub, model["pretrained_model_name_or_path"])),
                                 model["config_overrides"])
        assert out.returncode == 2 and FOUNDRY_REFUSES[name] in text, text
        return
    assert out.returncode == 0, text
    count = int(re.search(r"parameters\s+([\d,]+)", out.stdout).group(1).replace(",", ""))
    assert count == peer_parameters(resolved(name), hub)


PLANNED = [n for n in YAMLS if n not in NOT_BUILT and n not in FOUNDRY_REFUSES and n not in FOUNDRY_VALIDATION_REFUSES
           and n not in CHANGED]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A tokenizer folder; for each model the YAMLs name, a tiny folder transformers wrote from its published
    config.json (2 layers of 64, vocabulary 512, every other key as published: Llama 3.1's rope scaling, GPT-2's
    gelu_new); MDS token splits of 64 + 1 tokens, and prompt/response splits for the finetuning loader."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("small")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([f"sample {i} of the published recipes" for i in range(200)], vocab_size=300,
                            special_tokens=["<|endoftext|>"])
    PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, eos_token="<|endoftext|>").save_pretrained(root / "tok")
    for hub_id, changes in SHRUNK.items():
        config = json.loads((ROOT / "tests" / "data" / "hub_configs" / f"{hub_id.replace('/', '--')}.json").read_text())
        config.update(changes, vocab_size=512)
        (root / "config.json").write_text(json.dumps(config))
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(root)).save_pretrained(root / "models" / hub_id)
    (root / "config.json").unlink()
    rng = np.random.default_rng(0)
    for split in ("train", "val", "train_small", "val_small"):
        with MDSWriter(out=str(root / "data" / split), columns={"tokens": "ndarray:int32"}) as w:
            for _ in range(32):
                start, stride = rng.integers(0, 512), rng.integers(1, 6)
                w.write({"tokens": ((start + stride * np.arange(65)) % 512).astype(np.int32)})
        with MDSWriter(out=str(root / "finetuning" / split), columns={"prompt": "str", "response": "str"}) as w:
            for i in range(32):
                w.write({"prompt": f"sample {i} of the", "response": f" published recipes {i}"})
    return root


SHRUNK = {  # hub id -> the published config's keys changed for the shrunk model
    "meta-llama/Meta-Llama-3.1-8B": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2),
    "gpt2": dict(n_embd=64, n_head=4, n_layer=2),
    "EleutherAI/gpt-neo-125M": dict(hidden_size=64, num_heads=4, num_layers=2, attention_types=[[["global", "local"], 1]],
                                    attention_layers=["global", "local"]),
    "facebook/opt-2.7b": dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                              word_embed_proj_dim=64),
}


@pytest.mark.parametrize("name", PLANNED)
def test_trains_when_shrunk(name, small, tmp_path):
    cfg = resolved(name)
    shrink = [f"variables.data_local={small / 'data'}", "variables.data_remote=null", "max_seq_len=64",
              f"tokenizer.name={small / 'tok'}", "global_train_batch_size=4", "device_train_microbatch_size=2",
              "device_eval_batch_size=2", "max_duration=2ba", "eval_interval=1ba", "eval_subset_num_batches=1",
              "train_loader.dataset.max_seq_len=64", "train_loader.num_workers=0", "save_folder=null",
              f"loggers={{jsonl: {{filename: {tmp_path}/metrics.jsonl}}}}"]
    if "eval_loader" in cfg:
        shrink += ["eval_loader.dataset.max_seq_len=64", "eval_loader.num_workers=0"]
    if "tokenizer" in cfg and "kwargs" in cfg["tokenizer"]:
        shrink.append("tokenizer.kwargs.model_max_length=64")
    if cfg["model"]["name"] == "mpt_causal_lm":
        shrink += ["model.d_model=64", "model.n_heads=4", "model.n_layers=2", "model.max_seq_len=64",
                   "model.vocab_size=512"]
    else:
        shrink.append(f"model.pretrained_model_name_or_path={small / 'models' / cfg['model']['pretrained_model_name_or_path']}")
    if cfg["train_loader"]["name"] == "finetuning":
        shrink[0] = f"variables.data_local={small / 'finetuning'}"
    out = subprocess.run([TRAIN, "--recipe", str(FOUNDRY / name), *shrink], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss/train/total"] for r in rows if "loss/train/total" in r]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), rows


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_dbrx_finetuning_trains_when_shrunk(name, tmp_path):
    """As published but for CHANGED's keys and the size: DBRX shrunk to 2 layers of 64 (every other key of the
    published config.json, its 100,352-token vocabulary included, as published), written by transformers; the
    tokenizer a folder LLM Foundry's TiktokenTokenizerWrapper saves (model_name gpt-4, DBRX's ChatML tokens), read
    through tiktoken's cache that tools/setup_tests.sh fills; mosaicml/dolly_hhrlhf's prompt/response rows from a local
    folder in place of the hub dataset."""
    from llmfoundry.tokenizers import TiktokenTokenizerWrapper
    from transformers import AutoConfig, AutoModelForCausalLM

    cache = pathlib.Path(os.environ.get("TESSERA_HOME", pathlib.Path.home() / ".cache" / "tessera")) / "tiktoken"
    assert cache.is_dir(), f"{cache} is missing: run tools/setup_tests.sh"
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(cache))
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    tok = TiktokenTokenizerWrapper(model_name="gpt-4")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "pad_token": "<|pad|>"})
    tok.save_pretrained(tmp_path / "tokenizer")
    config = json.loads((ROOT / "tests" / "data" / "hub_configs" / "databricks--dbrx-instruct.json").read_text())
    config.update(d_model=64, n_heads=4, n_layers=2)
    config["attn_config"]["kv_n_heads"] = 2
    config["ffn_config"].update(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path)).save_pretrained(tmp_path / "model")
    (tmp_path / "dolly").mkdir()
    for split in ("train", "test"):
        rows = [{"prompt": f"Question {i}: what follows {i}?", "response": f" {i + 1}, said the model."}
                for i in range(24)]
        (tmp_path / "dolly" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, changes = CHANGED[name]
    shrink = [*changes, f"model.pretrained_model_name_or_path={tmp_path / 'model'}", "model.init_device=cpu",
              f"tokenizer.name={tmp_path / 'tokenizer'}", "max_seq_len=64", "global_train_batch_size=4",
              "device_train_microbatch_size=2", "device_eval_batch_size=2", "max_duration=2ba", "eval_interval=1ba",
              "eval_subset_num_batches=1", "save_folder=null", "autoresume=false",
              f"train_loader.dataset.hf_name={tmp_path / 'dolly'}", f"eval_loader.dataset.hf_name={tmp_path / 'dolly'}",
              "train_loader.num_workers=0", "eval_loader.num_workers=0",
              f"loggers={{jsonl: {{filename: {tmp_path}/metrics.jsonl}}}}"]
    out = subprocess.run([TRAIN, "--recipe", str(FOUNDRY / name), *shrink], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss/train/total"] for r in rows if "loss/train/total" in r]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), rows
