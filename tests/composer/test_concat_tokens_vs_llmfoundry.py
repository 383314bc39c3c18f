"""convert_text_to_mds --concat-tokens against LLM Foundry's own ConcatTokensDataset (llmfoundry.data.data, what its
scripts/data_prep/convert_text_to_mds.py writes to MDS), on the same documents and tokenizer.json: LLM Foundry
tokenizes through transformers' PreTrainedTokenizerFast over an HF `datasets` Dataset; Tessera's MDS is read back with
mosaicml-streaming. Every sample must be the same int32 tokens in the same order, with and without bos / eos text
and wrapping.
"""
import json
import os
import pathlib
import subprocess

import datasets
import numpy as np
import pytest
from llmfoundry.data.data import ConcatTokensDataset
from streaming import StreamingDataset
from tokenizers import ByteLevelBPETokenizer
from transformers import PreTrainedTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONVERT = os.environ.get("TESSERA_CONVERT_BIN", str(ROOT / "build" / "bin" / "convert_text_to_mds"))
FORTUNES = pathlib.Path("/usr/share/games/fortunes")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("concat")
    docs = [d for d in (FORTUNES / "computers").read_text(errors="replace").split("\n%\n") if d.strip()][:300]
    docs += ["ünïcödé ✓ 漢字 😀", "tabs\tand\nnewlines  "]
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(docs, vocab_size=1024, min_frequency=2, special_tokens=["<|endoftext|>"])
    tok.save(str(root / "tokenizer.json"))
    return root, docs


@pytest.mark.parametrize("bos_text,eos_text,no_wrap", [
    ("", "<|endoftext|>", False),
    ("<|endoftext|>", "", True),
    ("", "", False),
])
def test_samples_equal_llmfoundry(tmp_path, inputs, bos_text, eos_text, no_wrap):
    root, docs = inputs
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(root / "tokenizer.json"))
    foundry = ConcatTokensDataset(hf_dataset=datasets.Dataset.from_list([{"text": d} for d in docs]),
                                  tokenizer=hf_tok, max_length=64, bos_text=bos_text, eos_text=eos_text,
                                  no_wrap=no_wrap)
    want = [s["tokens"] for s in foundry]

    out = tmp_path / "out"
    cmd = [CONVERT, "--input", str(root / "docs.jsonl"), "--format", "jsonl", "--tokenizer",
           str(root / "tokenizer.json"), "--output", str(out), "--concat-tokens", "64"]
    if bos_text:
        cmd += ["--bos-text", bos_text]
    if eos_text:
        cmd += ["--eos-text", eos_text]
    if no_wrap:
        cmd += ["--no-wrap"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ds = StreamingDataset(local=str(out), split="train", shuffle=False, batch_size=1)
    got = [ds[i]["tokens"] for i in range(ds.num_samples)]

    assert len(got) == len(want) > 50
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == np.int32 and w.dtype == np.int32, i
        assert np.array_equal(g, w), f"sample {i}"
