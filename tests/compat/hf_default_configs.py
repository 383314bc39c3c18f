"""The config.json that the installed transformers' save_pretrained writes for the default configuration of every
model_type Tessera reads, as one JSON object {model_type: config.json} in
tests/data/hf_default_configs/transformers-<version>.json. The unit tests (tests/unit/models/hf_config_forms_test.cpp)
read transformers 4.57.6's and 5.25.0's: no key either writes may be refused, and both forms read as the same model.

    ~/.cache/tessera/venv/bin/python tests/compat/hf_default_configs.py       # transformers 4
    ~/.cache/tessera/venv-tf5/bin/python tests/compat/hf_default_configs.py   # transformers 5
"""
import json
import pathlib
import sys
import tempfile

MODEL_TYPES = ["llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3_moe", "falcon", "gemma2", "gemma3_text",
               "gpt_neo", "gpt_neox", "opt", "phi3", "mpt", "dbrx", "gpt2"]
OUT = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf_default_configs"


def default_configs():
    from transformers import AutoConfig

    out = {}
    for model_type in MODEL_TYPES:
        with tempfile.TemporaryDirectory() as folder:
            AutoConfig.for_model(model_type).save_pretrained(folder)
            out[model_type] = json.loads((pathlib.Path(folder) / "config.json").read_text())
    return out


def path_for(version):
    return OUT / f"transformers-{version}.json"


if __name__ == "__main__":
    import transformers

    path = path_for(transformers.__version__)
    path.write_text(json.dumps(default_configs(), indent=1, sort_keys=True) + "\n")
    print(path, file=sys.stderr)
