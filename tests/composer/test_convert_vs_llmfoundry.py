"""convert_text_to_mds against LLM Foundry's own converters, byte for byte: its convert_dataset_json() (what
scripts/data_prep/convert_dataset_json.py runs) on JSONL and gzip-compressed JSONL, and convert_dataset_hf's
build_hf_dataset() + generate_samples() + MDSWriter (what scripts/data_prep/convert_dataset_hf.py runs, without its
C4/Pile constants) on a folder of Parquet files, tokenized (concat_tokens, bos/eos text, wrapping or not) and as raw
text. Every shard file and index.json must be identical.
"""
import gzip
import json
import os
import pathlib
import subprocess

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from llmfoundry.command_utils.data_prep.convert_dataset_hf import (ConcatMode, build_dataloader, build_hf_dataset,
                                                                   generate_samples)
from llmfoundry.command_utils.data_prep.convert_dataset_json import convert_dataset_json
from streaming import MDSWriter
from tokenizers import ByteLevelBPETokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONVERT = os.environ.get("TESSERA_CONVERT_BIN", str(ROOT / "build" / "bin" / "convert_text_to_mds"))
FORTUNES = pathlib.Path("/usr/share/games/fortunes")


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert_foundry")
    docs = []
    for name in ("computers", "science", "wisdom"):
        docs += [d for d in (FORTUNES / name).read_text(errors="replace").split("\n%\n") if d.strip()]
    docs = docs[:1500] + ["ünïcödé ✓ 漢字 😀", "", "tabs\tand\nnewlines  "]
    rows = [{"text": d, "id": i} for i, d in enumerate(docs)]
    (root / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(root / "docs.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    (root / "parquet").mkdir()
    half = len(rows) // 2
    pq.write_table(pa.Table.from_pylist(rows[:half]), root / "parquet" / "train-00000-of-00002.parquet",
                   row_group_size=100)
    pq.write_table(pa.Table.from_pylist(rows[half:]), root / "parquet" / "train-00001-of-00002.parquet",
                   row_group_size=100)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(docs, vocab_size=2048, min_frequency=2, special_tokens=["<|endoftext|>"])
    tok.save(str(root / "tokenizer.json"))
    PreTrainedTokenizerFast(tokenizer_file=str(root / "tokenizer.json"),
                            eos_token="<|endoftext|>").save_pretrained(root / "tok")
    return root


def files_of(folder):
    folder = pathlib.Path(folder)
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def tessera(root, src, out, *args):
    cmd = [CONVERT, "--input", str(src), "--output", str(out), "--progress", "off", *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out / "train"


def concat_args(root, concat, bos, eos, no_wrap):
    args = []
    if concat:
        args += ["--tokenizer", root / "tok", "--concat-tokens", concat]
    if bos:
        args += ["--bos-text", bos]
    if eos:
        args += ["--eos-text", eos]
    if no_wrap:
        args += ["--no-wrap"]
    return args


SETTINGS = {
    "eos-wrap": (64, "", "<|endoftext|>", False),
    "bos-nowrap": (48, "<|endoftext|>", "", True),
    "raw-text": (None, "", "", False),
}


@pytest.mark.parametrize("source", ["docs.jsonl", "docs.jsonl.gz"])
@pytest.mark.parametrize("setting", SETTINGS)
def test_json_bytes_equal_llmfoundry_convert_dataset_json(tmp_path, inputs, source, setting):
    concat, bos, eos, no_wrap = SETTINGS[setting]
    want = tmp_path / "foundry"
    convert_dataset_json(path=str(inputs / source), out_root=str(want), compression="zstd", concat_tokens=concat,
                         split="train", tokenizer=str(inputs / "tok") if concat else None, bos_text=bos,
                         eos_text=eos, no_wrap=no_wrap)
    got = tessera(inputs, inputs / source, tmp_path / "tessera", *concat_args(inputs, concat, bos, eos, no_wrap))
    want_files, got_files = files_of(want), files_of(got)
    assert len(want_files) >= 2
    assert sorted(got_files) == sorted(want_files)
    for name in want_files:
        assert got_files[name] == want_files[name], name


@pytest.mark.parametrize("setting", SETTINGS)
def test_parquet_bytes_equal_llmfoundry_convert_dataset_hf(tmp_path, inputs, setting):
    concat, bos, eos, no_wrap = SETTINGS[setting]
    tokenizer = None
    if concat:
        tokenizer = AutoTokenizer.from_pretrained(str(inputs / "tok"))
        tokenizer.model_max_length = int(1e30)  # as convert_dataset_hf does
    dataset = build_hf_dataset(dataset_name=str(inputs / "parquet"), split="train",
                               mode=ConcatMode.CONCAT_TOKENS if concat else ConcatMode.NO_CONCAT, max_length=concat,
                               bos_text=bos, eos_text=eos, no_wrap=no_wrap, tokenizer=tokenizer)
    # One loader worker (0 trips its prefetch_factor on this torch): with several, the order of an iterable
    # dataset's samples depends on the workers.
    loader = build_dataloader(dataset=dataset, batch_size=512, num_workers=1)
    want = tmp_path / "foundry" / "train"
    columns = {"tokens": "ndarray:int32"} if concat else {"text": "str"}
    with MDSWriter(columns=columns, out=str(want), compression="zstd") as out:
        for sample in generate_samples(loader):
            out.write(sample)
    got = tessera(inputs, inputs / "parquet", tmp_path / "tessera",
                  *concat_args(inputs, concat, bos, eos, no_wrap), "--workers", 2)
    want_files, got_files = files_of(want), files_of(got)
    assert sorted(got_files) == sorted(want_files)
    for name in want_files:
        assert got_files[name] == want_files[name], name


def test_a_shard_larger_than_one_zstd_job_is_byte_identical(tmp_path, inputs):
    # Streaming's `zstd` module compresses with worker threads, which frame data above one job (8 MiB at level 3)
    # differently from single-threaded zstd; a 12 MB raw-text shard crosses that.
    rows = [json.loads(line) for line in (inputs / "docs.jsonl").read_text().splitlines()]
    with open(tmp_path / "big.jsonl", "w") as f:
        for k in range(40):
            f.writelines(json.dumps({"text": f"{k}: {r['text']}"}) + "\n" for r in rows)
    want = tmp_path / "foundry"
    convert_dataset_json(path=str(tmp_path / "big.jsonl"), out_root=str(want), compression="zstd", concat_tokens=None,
                         split="train")
    got = tessera(inputs, tmp_path / "big.jsonl", tmp_path / "tessera")
    index = json.loads((want / "index.json").read_text())
    assert len(index["shards"]) == 1 and index["shards"][0]["raw_data"]["bytes"] > 9 << 20
    assert files_of(got) == files_of(want)
