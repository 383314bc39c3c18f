"""convert_text_to_mds's readers against files the peers write: pyarrow writes Parquet (several row groups,
dictionary-encoded and plain pages, large strings), Arrow IPC in the file and the stream format (what `datasets`
caches and save_to_disk writes), CSV (quoted newlines and commas) and zstd-compressed JSONL; Python's gzip writes
.jsonl.gz. Every format must give the documents pyarrow reads, in order (mosaicml-streaming reads the MDS back), and
the same MDS bytes. A real SIGKILL in the middle of a conversion and a rerun of the same command must give the bytes
of an uninterrupted run.
"""
import gzip
import json
import os
import pathlib
import signal
import subprocess
import time

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from streaming import StreamingDataset
from tokenizers import ByteLevelBPETokenizer

from conftest import _binary

FORTUNES = pathlib.Path("/usr/share/games/fortunes")


def convert_bin():
    return _binary("TESSERA_CONVERT_BIN", "convert_text_to_mds")


@pytest.fixture(scope="module")
def docs():
    out = []
    for name in ("computers", "science", "literature"):
        out += [d for d in (FORTUNES / name).read_text(errors="replace").split("\n%\n") if d.strip()]
    return out[:800] + ['quotes " and, commas', "ünïcödé ✓ 漢字 😀", "line\r\nbreaks\n"]


def write_all_formats(root, docs):
    table = pa.table({"id": list(range(len(docs))), "text": docs, "score": [i / 7 for i in range(len(docs))]})
    pq.write_table(table, root / "plain.parquet", row_group_size=97, use_dictionary=False)
    pq.write_table(table.cast(pa.schema([("id", pa.int64()), ("text", pa.large_string()), ("score", pa.float64())])),
                   root / "dict.parquet", row_group_size=250, use_dictionary=True, compression="zstd")
    with pa.ipc.new_file(root / "file.arrow", table.schema) as w:
        for batch in table.to_batches(max_chunksize=128):
            w.write_batch(batch)
    with pa.ipc.new_stream(root / "stream.arrow", table.schema) as w:
        for batch in table.to_batches(max_chunksize=100):
            w.write_batch(batch)
    pacsv.write_csv(table, root / "table.csv")
    lines = "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()
    with pa.CompressedOutputStream(str(root / "docs.jsonl.zst"), "zstd") as f:
        f.write(lines)
    with gzip.open(root / "docs.jsonl.gz", "wb") as f:
        f.write(lines)
    return ["plain.parquet", "dict.parquet", "file.arrow", "stream.arrow", "table.csv", "docs.jsonl.zst",
            "docs.jsonl.gz"]


def run_convert(src, out, *args, check=True):
    proc = subprocess.run([convert_bin(), "--input", str(src), "--output", str(out), "--progress", "off",
                           *map(str, args)], capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def files_of(folder):
    folder = pathlib.Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_format_gives_pyarrows_documents_and_the_same_bytes(tmp_path, docs):
    names = write_all_formats(tmp_path, docs)
    reference = None
    for name in names:
        out = tmp_path / ("out_" + name.replace(".", "_"))
        run_convert(tmp_path / name, out)
        ds = StreamingDataset(local=str(out), split="train", shuffle=False, batch_size=1)
        got = [ds[i]["text"] for i in range(ds.num_samples)]
        want = pq.read_table(tmp_path / "plain.parquet").column("text").to_pylist()
        if name.endswith(".csv"):
            want = pacsv.read_csv(tmp_path / name, parse_options=pacsv.ParseOptions(newlines_in_values=True)) \
                .column("text").to_pylist()
        assert got == want, name
        files = files_of(out)
        if reference is None:
            reference = files
        assert files == reference, f"{name}: MDS bytes differ from plain.parquet's"


def test_a_column_other_than_text_and_errors_name_the_file(tmp_path, docs):
    pq.write_table(pa.table({"body": docs[:50], "n": list(range(50))}), tmp_path / "b.parquet")
    out = tmp_path / "out"
    run_convert(tmp_path / "b.parquet", out, "--text-column", "body")
    ds = StreamingDataset(local=str(out), split="train", shuffle=False, batch_size=1)
    assert [ds[i]["text"] for i in range(ds.num_samples)] == docs[:50]
    proc = run_convert(tmp_path / "b.parquet", tmp_path / "out2", check=False)
    assert proc.returncode != 0 and "b.parquet" in proc.stderr and "no column 'text'" in proc.stderr, proc.stderr
    proc = run_convert(tmp_path / "b.parquet", tmp_path / "out3", "--text-column", "n", check=False)
    assert proc.returncode != 0 and "b.parquet[0]" in proc.stderr and "not a string" in proc.stderr, proc.stderr
    (tmp_path / "broken.parquet").write_bytes(pq.read_table(tmp_path / "b.parquet").to_string().encode())
    proc = run_convert(tmp_path / "broken.parquet", tmp_path / "out4", check=False)
    assert proc.returncode != 0 and "broken.parquet" in proc.stderr, proc.stderr


def test_sigkill_mid_conversion_then_rerun_equals_an_uninterrupted_run(tmp_path, docs):
    # ~40 MB of zstd-compressed JSONL in three files; small shards so that many finish before the kill.
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(docs, vocab_size=1024, min_frequency=2, special_tokens=["<|endoftext|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "in").mkdir()
    for f in range(3):
        rows = "".join(json.dumps({"text": docs[(i * 7 + f) % len(docs)] * (1 + i % 5)}) + "\n" for i in range(30000))
        with pa.CompressedOutputStream(str(tmp_path / "in" / f"part{f}.jsonl.zst"), "zstd") as out:
            out.write(rows.encode())
    args = ["--tokenizer", tmp_path / "tokenizer.json", "--concat-tokens", 128, "--eos-text", "<|endoftext|>",
            "--val-fraction", 0.05, "--size-limit", 1 << 18, "--workers", 2]
    whole = tmp_path / "whole"
    started = time.monotonic()
    run_convert(tmp_path / "in", whole, *args)
    uninterrupted = time.monotonic() - started

    resumed = tmp_path / "resumed"
    cmd = [convert_bin(), "--input", str(tmp_path / "in"), "--output", str(resumed), "--progress", "off",
           *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    progress = resumed / ".tessera-convert.json"
    # Kill once a fifth of the train shards are finished (the uninterrupted run tells how many there are).
    target = len(list((whole / "train").glob("shard.*"))) // 5
    deadline = time.monotonic() + 20 * uninterrupted + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if json.loads(progress.read_text())["splits"]["train"]["shards"] >= target:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    assert proc.poll() is None, "the conversion ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert progress.exists()
    assert files_of(resumed) != files_of(whole)
    rerun = run_convert(tmp_path / "in", resumed, *args)
    assert "resumed at document" in rerun.stdout, rerun.stdout
    assert not progress.exists()
    assert files_of(resumed) == files_of(whole)
