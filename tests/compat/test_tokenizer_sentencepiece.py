"""SentencePiece-style BPE tokenizers (Llama-2, Mistral) against Hugging Face `tokenizers` and transformers.

A real SentencePiece BPE model (the `sentencepiece` trainer, byte_fallback, split_digits, as Llama-2's was made) is
trained here on the fortunes corpus, and transformers' own converter (LlamaTokenizerFast from the .model file, the code
that made the tokenizer.json of Llama-2 and Mistral) writes the folders Tessera loads:

- legacy (Llama-2, Mistral-7B-v0.1 files): Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer, decoder
  Replace + ByteFallback + Fuse + Strip;
- non-legacy: a Metaspace pre-tokenizer with prepend_scheme "first", and add_eos_token / pad_token in
  tokenizer_config.json, which transformers' AutoTokenizer honours;
- as files alone: Metaspace with split and prepend_scheme "always" and the Metaspace decoder; the legacy file with
  byte_fallback off (unknown characters become <unk>, fused and not fused).

For each: ids equal the peer's (AutoTokenizer for folders, `tokenizers` for files) on every fortunes document, edge
cases and every code point of planes 0-3 and 14, with and without special tokens; decode equals the peer's; the
special tokens' ids equal transformers'.
"""
import io
import json
import os
import random
import shutil

import pytest
from tokenizers import Tokenizer

from test_tokenizer_hf import EDGE_CASES, codepoint_texts, corpus, first_mismatch, run_tessera  # noqa: F401 (fixture)

SP_EDGE_CASES = EDGE_CASES + ["<s>", "</s>", "a<s>b", " <s> x</s>", "<unk>", "▁", "▁▁x", " ▁ y ▁", "<0x41>", "  x",
                              "x  ", " ", "\n\n", "12345 678", "a\u00a0b"]


def train_sentencepiece(docs, path):
    import sentencepiece as spm
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(docs), model_writer=buf, model_type="bpe", vocab_size=3000, byte_fallback=True,
        character_coverage=0.9995, split_digits=True, allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", num_threads=1, minloglevel=2, max_sentence_length=100000)
    path.write_bytes(buf.getvalue())


@pytest.fixture(scope="module")
def sp_tokenizers(corpus, tmp_path_factory):
    from transformers import AutoTokenizer, LlamaTokenizerFast
    root = tmp_path_factory.mktemp("sp")
    model = root / "sp.model"
    train_sentencepiece(corpus[::3], model)
    out = {}
    for name, kwargs in (("legacy", {"legacy": True}),
                         ("first", {"legacy": False, "add_eos_token": True, "pad_token": "</s>"})):
        LlamaTokenizerFast(vocab_file=str(model), add_prefix_space=True, from_slow=True,
                           **kwargs).save_pretrained(root / name)
        out[name] = (AutoTokenizer.from_pretrained(root / name), root / name)
    legacy = json.loads((root / "legacy" / "tokenizer.json").read_text())
    assert legacy["normalizer"]["normalizers"][0]["type"] == "Prepend" and legacy["pre_tokenizer"] is None
    assert legacy["model"]["byte_fallback"] and legacy["decoder"]["decoders"][-1]["type"] == "Strip"
    first = json.loads((root / "first" / "tokenizer.json").read_text())
    assert first["pre_tokenizer"] == {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                                      "split": False}
    variants = {
        "split_always": dict(first, pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                                                   "split": True},
                             decoder={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                                      "split": True}),
        "unk_fused": dict(legacy, model=dict(legacy["model"], byte_fallback=False)),
        "unk_unfused": dict(legacy, model=dict(legacy["model"], byte_fallback=False, fuse_unk=False)),
    }
    for name, doc in variants.items():
        path = root / f"{name}.json"
        path.write_text(json.dumps(doc, ensure_ascii=False))
        out[name] = (Tokenizer.from_file(str(path)), path)
    return out


def peer_ids(hf, texts, add):
    if isinstance(hf, Tokenizer):
        return [e.ids for e in hf.encode_batch(texts, add_special_tokens=add)]
    return hf(texts, add_special_tokens=add)["input_ids"]


def peer_decode(hf, ids, skip):
    backend = hf if isinstance(hf, Tokenizer) else hf.backend_tokenizer
    return backend.decode(ids, skip_special_tokens=skip)


NAMES = ["legacy", "first", "split_always", "unk_fused", "unk_unfused"]


@pytest.mark.parametrize("name", NAMES)
def test_ids_equal_the_peer(driver, tmp_path, corpus, sp_tokenizers, name):
    hf, path = sp_tokenizers[name]
    texts = corpus + SP_EDGE_CASES
    for add in (True, False):
        got = run_tessera(driver, tmp_path, path, texts, add_special_tokens=add)
        want = peer_ids(hf, texts, add)
        assert got["ids"] == want, first_mismatch(texts, got["ids"], want)
    if name == "first":  # tokenizer_config.json: <s> ... </s>, and the pad token, as transformers reads them
        assert got["bos"] == hf.bos_token_id == 1 and got["eos"] == hf.eos_token_id == 2
        assert got["pad"] == hf.pad_token_id == 2
        assert run_tessera(driver, tmp_path, path, ["hi"])["ids"][0][-1] == hf.eos_token_id
    if name == "legacy":
        assert got["eos"] == hf.eos_token_id and got["pad"] is None and hf.pad_token_id is None


@pytest.mark.parametrize("name", ["legacy", "first", "split_always", "unk_fused"])
def test_ids_equal_the_peer_for_every_code_point(driver, tmp_path, sp_tokenizers, name):
    hf, path = sp_tokenizers[name]
    texts = codepoint_texts()
    got = run_tessera(driver, tmp_path, path, texts, add_special_tokens=False)
    want = peer_ids(hf, texts, False)
    for t, g, w in zip(texts, got["ids"], want):
        if g != w:
            i = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            pytest.fail(f"ids differ at {i}: tessera {g[i - 3:i + 3]} hf {w[i - 3:i + 3]} (text {t[:40]!r}...)")


@pytest.mark.parametrize("name", NAMES)
def test_decode_equals_the_peer(driver, tmp_path, corpus, sp_tokenizers, name):
    hf, path = sp_tokenizers[name]
    rng = random.Random(0)
    n = 3000
    seqs = peer_ids(hf, corpus[:300] + SP_EDGE_CASES, True)
    seqs += [[rng.randrange(n) for _ in range(rng.randrange(1, 40))] for _ in range(300)]  # split UTF-8 byte tokens
    seqs += [[3 + 0xE2, 3 + 0x82, 3 + 0xAC, 100], [3 + 0xE2, 3 + 0x82, 100, 3 + 0xFF], [0, 1, 2, n + 5], []]
    got = run_tessera(driver, tmp_path, path, [], decode=seqs)
    for flag, key in ((False, "decoded"), (True, "decoded_skip")):
        want = [peer_decode(hf, s, flag) for s in seqs]
        mine = [bytes.fromhex(h).decode("utf-8") for h in got[key]]
        assert mine == want, first_mismatch(seqs, mine, want)


def test_convert_text_to_mds_with_a_hub_id_uses_its_tokenizer_config(tmp_path, corpus, sp_tokenizers):
    """`--tokenizer org/name` resolves to the snapshot folder in the HF cache, so the folder's tokenizer_config.json
    (bos + text + eos here) shapes the samples exactly as LLM Foundry's ConcatTokensDataset with AutoTokenizer."""
    import subprocess
    from types import SimpleNamespace
    from conftest import _binary
    from test_convert_text_to_mds import foundry_concat, read_tokens
    hf, folder = sp_tokenizers["first"]
    repo = tmp_path / "hub" / "models--org--sp"
    shutil.copytree(folder, repo / "snapshots" / "abc")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    docs = corpus[:200]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    out = tmp_path / "out"
    proc = subprocess.run([_binary("TESSERA_CONVERT_BIN", "convert_text_to_mds"), "--input", str(tmp_path / "docs.jsonl"),
                           "--format", "jsonl", "--tokenizer", "org/sp", "--output", str(out), "--concat-tokens", "64",
                           "--bos-text", "<s>"], capture_output=True, text=True,
                          env=dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub")))
    assert proc.returncode == 0, proc.stderr

    class Peer:  # the tokenizers-style encode() foundry_concat calls, over transformers' AutoTokenizer
        def encode(self, text, add_special_tokens=True):
            return SimpleNamespace(ids=hf(text, add_special_tokens=add_special_tokens)["input_ids"])

    want = foundry_concat(Peer(), docs, 64, bos_text="<s>")
    got = [t.tolist() for t in read_tokens(out)]
    assert len(got) == len(want) > 50 and got == want
    assert want[0][:2] == [1, 1] and sum(s.count(2) for s in want) > 100  # --bos-text, then <s> ... </s> per doc
