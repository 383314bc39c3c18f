"""The tiny CPU recipes of the families added after the model tree's redesign (recipes/<family>-tiny-cpu.yaml, the
main job with each family's shape): each recipe's model section, with the shared test data's vocabulary and sequence
length, trains 5 steps with Tessera (its loss falls), exports through `convert`, and transformers 4.57 loads the
export as the family's class computing Tessera's logits (1e-5). Qwen3.5's, which transformers 4.57 does not define,
is checked the same way in test_transformers5_qwen3_5.py. Every recipe's dry run is TrainCli's."""
import pytest
import yaml
from transformers import (DeepseekV3ForCausalLM, GraniteForCausalLM,
                          Glm4ForCausalLM, GPTBigCodeForCausalLM, GptOssForCausalLM, NemotronForCausalLM,
                          SmolLM3ForCausalLM, Starcoder2ForCausalLM)

from conftest import ROOT
from test_hf_export import VOCAB, dataset  # noqa: F401 (the fixture)
from test_llama_hf import TRAIN_SEQ, train_export_and_compare

RECIPES = {"starcoder2": Starcoder2ForCausalLM, "starcoder": GPTBigCodeForCausalLM, "nemotron": NemotronForCausalLM,
           "granite": GraniteForCausalLM, "smollm3": SmolLM3ForCausalLM, "glm4": Glm4ForCausalLM,
           "deepseek-v3": DeepseekV3ForCausalLM, "gpt-oss": GptOssForCausalLM}

# The recipes' widths (256) train 5 steps of the shared data at AdamW's 1e-3 (the shared helper's 3e-3 suits its
# width-64 models; at 256 it overshoots and the loss can rise).
TINY_OPTIMIZER = {"optimizer": {"name": "decoupled_adamw", "lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                "weight_decay": 0.0}}


def tiny_section(recipe):
    """The recipe's model section on the test data: its vocabulary and sequence length, the rest as shipped."""
    section = yaml.safe_load((ROOT / "recipes" / f"{recipe}-tiny-cpu.yaml").read_text())["model"]
    section["vocab_size"] = VOCAB
    for key in ("max_position_embeddings", "n_positions"):
        if key in section:
            section[key] = TRAIN_SEQ
    return section


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_tiny_recipe_trains_and_exports_as_its_transformers_class(recipe, driver, tmp_path, dataset):  # noqa: F811
    hf = train_export_and_compare(driver, tmp_path, dataset, tiny_section(recipe), extra=TINY_OPTIMIZER)
    assert type(hf) is RECIPES[recipe]
