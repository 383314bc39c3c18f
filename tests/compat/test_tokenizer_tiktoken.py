"""Tessera's tiktoken encodings against tiktoken itself (the real peer), offline.

OpenAI's ranks files for cl100k_base, p50k_base and o200k_base sit in a tiktoken cache that tools/setup_tests.sh fills from
a PyPI wheel (checked against the sha256 tiktoken expects); both tiktoken and Tessera read them from there
(TIKTOKEN_CACHE_DIR). For each encoding:

- ids equal tiktoken's `encode(text, allowed_special="all")` for every fortunes document, Unicode edge cases and
  texts with special tokens, and for invalid UTF-8 the ids of the text Python's errors="replace" decoding makes;
- decode equals tiktoken's `decode(ids, errors="replace")`, including ids that decode to invalid UTF-8;
- Tessera's tokenizer.json of the encoding loads in Hugging Face `tokenizers` and encodes the corpus as tiktoken does.

And a ranks file the test writes (the first ranks of cl100k_base, with its pattern and other special tokens) encodes
as tiktoken's Encoding over the same ranks; corrupt ranks files and a cached file whose sha256 is not the one
tiktoken expects are refused with the file (and line) named.
"""
import base64
import json
import os
import pathlib
import subprocess

import pytest
import tiktoken
from test_tokenizer_hf import EDGE_CASES, INVALID_UTF8, read_fortunes
from tiktoken.load import load_tiktoken_bpe
from tiktoken_ext import openai_public

CACHE = pathlib.Path(os.environ.get("TESSERA_HOME", pathlib.Path.home() / ".cache" / "tessera")) / "tiktoken"
ENCODINGS = ["cl100k_base", "p50k_base", "o200k_base"]
SPECIAL_TEXTS = ["<|endoftext|>", "a<|endoftext|>b", "x <|fim_prefix|>y<|fim_suffix|>z<|fim_middle|>",
                 "<|endofprompt|> tail", "<|endoftext", "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture(scope="module", autouse=True)
def tiktoken_cache():
    assert CACHE.is_dir(), f"{CACHE} is missing: run tools/setup_tests.sh (it fills tiktoken's cache from PyPI)"
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(CACHE)  # the peer and the driver (a subprocess) both read it
    yield
    if old is None:
        os.environ.pop("TIKTOKEN_CACHE_DIR")
    else:
        os.environ["TIKTOKEN_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def texts():
    return read_fortunes()[:400] + EDGE_CASES + SPECIAL_TEXTS


def run(driver, tmp_path, tokenizer, texts, decode=(), as_json=False):
    inp, out = tmp_path / "in.json", tmp_path / "out.json"
    inp.write_text(json.dumps({"texts": [t.encode("utf-8", "surrogatepass").hex() if isinstance(t, str) else t.hex()
                                         for t in texts],
                               "add_special_tokens": False, "decode": [list(d) for d in decode], "json": as_json}))
    driver("tokenize", tokenizer, inp, out)
    return json.loads(out.read_text())


def first_mismatch(texts, got, want):
    for text, g, w in zip(texts, got, want):
        if g != w:
            return f"{text!r}: tessera {g[:40]} tiktoken {w[:40]}"
    return None


@pytest.mark.parametrize("name", ENCODINGS)
def test_ids_and_decode_equal_tiktoken(driver, tmp_path, texts, name):
    enc = tiktoken.get_encoding(name)
    want = [enc.encode(t, allowed_special="all") for t in texts]
    invalid_want = [enc.encode(b.decode("utf-8", errors="replace"), allowed_special="all") for b in INVALID_UTF8]
    byte = enc.encode_single_token
    seqs = want[:50] + [[byte(b"\xe2"), byte(b"\x82")], [byte(b"\xe2"), 100, 0], [byte(b"\xff")]]
    got = run(driver, tmp_path, f"tiktoken:{name}", texts + INVALID_UTF8, decode=seqs)
    # Distinct tokens, as Hugging Face counts them (tiktoken's n_vocab is the largest id + 1; cl100k_base has gaps).
    assert got["vocab_size"] == len(enc._mergeable_ranks) + len(enc.special_tokens_set)
    mismatch = first_mismatch(texts + INVALID_UTF8, got["ids"], want + invalid_want)
    assert mismatch is None, mismatch
    decoded = [bytes.fromhex(h).decode("utf-8") for h in got["decoded"]]
    assert decoded == [enc.decode(s, errors="replace") for s in seqs]


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_tokenizer_json_loads_in_hf_tokenizers_and_encodes_as_tiktoken(driver, tmp_path, texts, name):
    from tokenizers import Tokenizer

    enc = tiktoken.get_encoding(name)
    hf = Tokenizer.from_str(run(driver, tmp_path, f"tiktoken:{name}", [], as_json=True)["json"])
    got = [hf.encode(t, add_special_tokens=False).ids for t in texts]
    mismatch = first_mismatch(texts, got, [enc.encode(t, allowed_special="all") for t in texts])
    assert mismatch is None, mismatch


def write_ranks(path, ranks):
    path.write_bytes(b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in ranks.items()))


def test_a_ranks_file_the_test_writes_encodes_as_tiktoken_over_it(driver, tmp_path, texts):
    cl100k = openai_public.cl100k_base()  # from the cache, its hash checked
    ranks = {t: r for t, r in cl100k["mergeable_ranks"].items() if r < 3000}  # a prefix of BPE ranks is BPE ranks
    path = tmp_path / "small.tiktoken"
    write_ranks(path, ranks)
    enc = tiktoken.Encoding("small", pat_str=cl100k["pat_str"], mergeable_ranks=load_tiktoken_bpe(str(path)),
                            special_tokens=cl100k["special_tokens"])
    got = run(driver, tmp_path, f"tiktoken:cl100k_base:{path}", texts)
    mismatch = first_mismatch(texts, got["ids"], [enc.encode(t, allowed_special="all") for t in texts])
    assert mismatch is None, mismatch


def test_corrupt_ranks_files_and_a_cache_file_of_another_hash_are_refused_by_name(tmp_path):
    driver_bin = os.environ.get("TESSERA_COMPAT_DRIVER",
                                str(pathlib.Path(__file__).resolve().parents[2] / "build" / "bin" /
                                    "tessera_compat_driver"))
    inp = tmp_path / "in.json"
    inp.write_text(json.dumps({"texts": ["6869"]}))
    byte_ranks = {bytes([b]): b for b in range(256)}
    cases = {
        "bad base64": (b"!!!! 5\n", ":1: the token is not base64"),
        "repeated rank": (b"YQ== 1\nYg== 1\n", ":2: rank 1 is given twice"),
        "rank too large": (b"YQ== 99999999999\n", ":1: the rank must be below"),
        "missing byte": (b"YQ== 0\n", "has no rank"),
    }
    for what, (content, message) in cases.items():
        path = tmp_path / f"{what.replace(' ', '_')}.tiktoken"
        if what == "missing byte":
            write_ranks(path, {t: r for t, r in byte_ranks.items() if t != b"\x07"})
        else:
            path.write_bytes(content)
        out = subprocess.run([driver_bin, "tokenize", f"tiktoken:cl100k_base:{path}", str(inp), str(tmp_path / "o")],
                             capture_output=True, text=True)
        assert out.returncode != 0 and str(path) in out.stderr and message in out.stderr, (what, out.stderr)
    # A cache holding another file under cl100k_base's name: refused, as tiktoken refuses (and would download again).
    cache = tmp_path / "cache"
    cache.mkdir()
    write_ranks(cache / "9b5ad71b2ce5302211f9c61530b329a4922fc6a4", byte_ranks)
    out = subprocess.run([driver_bin, "tokenize", "tiktoken:cl100k_base", str(inp), str(tmp_path / "o")],
                         capture_output=True, text=True, env=dict(os.environ, TIKTOKEN_CACHE_DIR=str(cache)))
    assert out.returncode != 0 and "9b5ad71b2ce5302211f9c61530b329a4922fc6a4" in out.stderr, out.stderr
    assert "is not the cl100k_base ranks file's" in out.stderr, out.stderr
    out = subprocess.run([driver_bin, "tokenize", "tiktoken:o200k_base", str(inp), str(tmp_path / "o")],
                         capture_output=True, text=True, env=dict(os.environ, TIKTOKEN_CACHE_DIR=str(cache)))
    assert out.returncode != 0 and "not in tiktoken's cache" in out.stderr and "o200k_base.tiktoken" in out.stderr
