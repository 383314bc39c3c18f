"""convert_text_to_mds against LLM Foundry's semantics (ConcatTokensDataset in llmfoundry/data/data.py, as used by
scripts/data_prep/convert_text_to_mds.py), evaluated with the peers: HF `tokenizers` encodes (tokenizer(text) with
its post-processor, bos/eos texts without), the concatenation loop is Foundry's, and mosaicml-streaming reads
Tessera's output. LLM Foundry itself pins another torch, so its 15-line loop is restated here.
"""
import json
import pathlib
import subprocess

import numpy as np
import pytest
from streaming import StreamingDataset
from tokenizers import ByteLevelBPETokenizer

from conftest import _binary

FORTUNES = pathlib.Path("/usr/share/games/fortunes")


def foundry_concat(tok, texts, max_length, bos_text="", eos_text="", wrap=True):
    bos = tok.encode(bos_text, add_special_tokens=False).ids if bos_text else []
    eos = tok.encode(eos_text, add_special_tokens=False).ids if eos_text else []
    buffer, out = [], []
    for text in texts:
        buffer = buffer + bos + tok.encode(text).ids + eos
        while len(buffer) >= max_length:
            out.append(buffer[:max_length])
            buffer = buffer[max_length:] if wrap else []
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert")
    docs = []
    for line in (FORTUNES / "computers").read_text(errors="replace").split("\n%\n"):
        if line.strip():
            docs.append(line)
    docs = docs[:300] + ["", "ünïcödé ✓ 漢字 😀"]
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(docs, vocab_size=1024, min_frequency=2, special_tokens=["<|endoftext|>"])
    tok.save(str(root / "tokenizer.json"))
    return root, docs, tok  # the empty document counts: Foundry adds its bos/eos tokens too


def convert(root, out, *args):
    cmd = [_binary("TESSERA_CONVERT_BIN", "convert_text_to_mds"), "--input", str(root / "docs.jsonl"), "--format",
           "jsonl", "--tokenizer", str(root / "tokenizer.json"), "--output", str(out), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def read_tokens(out, split="train"):
    ds = StreamingDataset(local=str(out), split=split, shuffle=False, batch_size=1)
    return [ds[i]["tokens"] for i in range(ds.num_samples)]


@pytest.mark.parametrize("extra", [
    dict(eos_text="<|endoftext|>"),
    dict(bos_text="<|endoftext|>", wrap=False),
    dict(),
])
def test_samples_equal_foundry_concat(tmp_path, inputs, extra):
    root, docs, tok = inputs
    args = ["--concat-tokens", 64]
    if extra.get("eos_text"):
        args += ["--eos-text", extra["eos_text"]]
    if extra.get("bos_text"):
        args += ["--bos-text", extra["bos_text"]]
    if extra.get("wrap") is False:
        args += ["--no-wrap"]
    out = convert(root, tmp_path / "out", *args)
    got = read_tokens(out)
    want = foundry_concat(tok, docs, 64, **extra)
    assert len(got) == len(want) > 50
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == np.int32, i
        assert g.tolist() == w, f"sample {i}"
    index = json.loads((out / "train" / "index.json").read_text())
    assert index["shards"][0]["column_encodings"] == ["ndarray:int32"]
    assert index["shards"][0]["compression"] == "zstd"


def test_split_is_deterministic_and_independent_of_workers(tmp_path, inputs):
    root, docs, tok = inputs
    a = convert(root, tmp_path / "a", "--concat-tokens", 32, "--val-fraction", 0.1, "--workers", 1)
    b = convert(root, tmp_path / "b", "--concat-tokens", 32, "--val-fraction", 0.1, "--workers", 2)
    for split in ("train", "val"):
        files = sorted(p.name for p in (a / split).iterdir())
        assert files == sorted(p.name for p in (b / split).iterdir())
        for name in files:
            assert (a / split / name).read_bytes() == (b / split / name).read_bytes(), f"{split}/{name}"
    total = sum(len(t) for t in read_tokens(a, "train")) + sum(len(t) for t in read_tokens(a, "val"))
    assert 0 < len(read_tokens(a, "val")) < len(read_tokens(a, "train"))
    assert total <= sum(len(tok.encode(d).ids) for d in docs)


def test_raw_text_samples_and_errors(tmp_path, inputs):
    root, docs, _ = inputs
    out = convert(root, tmp_path / "text")
    ds = StreamingDataset(local=str(out), split="train", shuffle=False, batch_size=1)
    assert [ds[i]["text"] for i in range(ds.num_samples)] == docs
    # A non-empty output directory is refused (nothing is overwritten), naming it.
    proc = subprocess.run([_binary("TESSERA_CONVERT_BIN", "convert_text_to_mds"), "--input", str(root / "docs.jsonl"),
                           "--format", "jsonl", "--output", str(out)], capture_output=True, text=True)
    assert proc.returncode == 2 and "not empty" in proc.stderr and str(out / "train") in proc.stderr
    proc = subprocess.run([_binary("TESSERA_CONVERT_BIN", "convert_text_to_mds"), "--input", str(tmp_path / "nope"),
                           "--format", "jsonl", "--output", str(tmp_path / "x")], capture_output=True, text=True)
    assert proc.returncode != 0 and "nope" in proc.stderr
