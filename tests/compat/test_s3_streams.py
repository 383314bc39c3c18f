"""Remote MDS streams through a real S3-API server (moto, signatures checked), with mosaicml-streaming as the peer:

- shards Streaming's MDSWriter uploads (zstd-compressed and raw) are read by Tessera with `remote: s3://...` in the
  same order as Streaming's own StreamingDataset(remote=...) reads them, with compressed copies dropped (or kept with
  keep_zip);
- a dataset convert_text_to_mds writes straight to s3:// is read by Streaming's StreamingDataset(remote=...) with the
  same samples as the same conversion written locally;
- with a cache_limit smaller than the dataset, a full shuffled epoch completes, evicts, stays under the limit, and
  reads the same samples;
- training from s3:// data equals training from the same local data, loss for loss, bit for bit.
"""
import json
import os
import subprocess

import numpy as np
import pytest
from streaming import MDSWriter, Stream, StreamingDataset
from streaming.base.util import clean_stale_shared_memory

from conftest import _binary
from remote_training import train_trace

SEQ, VOCAB = 32, 128


@pytest.fixture
def streaming_env(s3_server, monkeypatch):
    """Points this process's boto3 (Streaming's downloader and uploader) at the test server."""
    for k, v in s3_server.env().items():
        if k.startswith("AWS_") or k == "S3_ENDPOINT_URL":
            monkeypatch.setenv(k, v)
    return s3_server


def write_remote(tmp_path, bucket, prefix, n, compression, seed):
    rng = np.random.default_rng(seed)
    with MDSWriter(out=(str(tmp_path / f"stage-{prefix}"), f"s3://{bucket}/{prefix}"),
                   columns={"id": "int", "tokens": "ndarray:int32"}, compression=compression,
                   hashes=["sha1", "xxh64"], size_limit=700) as w:
        for i in range(n):
            w.write({"id": seed * 10000 + i,
                     "tokens": rng.integers(0, 100, size=int(rng.integers(1, 40)), dtype=np.int32)})


def tessera_epoch(env, tmp_path, spec, name="spec"):
    spec = {"batch_size": 4, "shuffle": True, "seed": 17, "algo": "py1e", "block": 64, "ncn": 1,
            "partition": "relaxed", "epoch_size": None, "nodes": 1, "ranks": 1, "workers": 1, "epoch": 0,
            "sample_in_epoch": 0, "initial_p": 0, **spec}
    (tmp_path / f"{name}.json").write_text(json.dumps(spec))
    proc = subprocess.run([_binary("TESSERA_COMPAT_DRIVER", "tessera_compat_driver"), "streaming-epoch",
                           tmp_path / f"{name}.json", tmp_path / f"{name}.out.json"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp_path / f"{name}.out.json").read_text())


def test_tessera_reads_what_streaming_uploaded_in_streamings_order(streaming_env, s3_bucket, tmp_path):
    write_remote(tmp_path, s3_bucket, "zipped", 180, "zstd", 1)
    write_remote(tmp_path, s3_bucket, "raw", 90, None, 2)
    remotes = [f"s3://{s3_bucket}/zipped", f"s3://{s3_bucket}/raw"]
    clean_stale_shared_memory()
    theirs = StreamingDataset(streams=[Stream(remote=r, local=str(tmp_path / f"py{i}")) for i, r in enumerate(remotes)],
                              batch_size=4, shuffle=True, shuffle_seed=17, shuffle_algo="py1e",
                              shuffle_block_size=64, num_canonical_nodes=1)
    expected = [int(s["id"]) for s in theirs]
    for keep_zip in (False, True):
        local = [tmp_path / f"tess{keep_zip}{i}" for i in range(2)]
        ours = tessera_epoch(streaming_env.env(), tmp_path, {"streams": [
            {"remote": r, "local": str(d), "keep_zip": keep_zip} for r, d in zip(remotes, local)]})
        assert [v for v in ours["ids_field"] if v != -1] == expected, keep_zip
        zipped = sorted(p.name for p in local[0].iterdir() if p.name.startswith("shard."))
        assert any(n.endswith(".mds") for n in zipped)
        assert any(n.endswith(".mds.zstd") for n in zipped) == keep_zip
        # Every shard was read once: everything is here, and nothing else (no temporary files).
        assert sorted(p.name for p in local[1].iterdir() if not p.name.startswith(".")) == sorted(
            p.name for p in (tmp_path / "py1").iterdir() if not p.name.startswith("."))


def test_streaming_reads_what_tessera_converted_to_s3(streaming_env, s3_bucket, tmp_path):
    docs = [f"document {i}: " + " ".join(f"w{(i * 7 + j) % 50}" for j in range(i % 40 + 1)) for i in range(400)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(docs, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    tok.save(str(tmp_path / "tokenizer.json"))

    def convert(out):
        proc = subprocess.run([_binary("TESSERA_CONVERT_BIN", "convert_text_to_mds"), "--input",
                               tmp_path / "docs.jsonl", "--format", "jsonl", "--tokenizer", tmp_path / "tokenizer.json",
                               "--output", out, "--concat-tokens", "16", "--eos-text", "<|endoftext|>",
                               "--compression", "zstd", "--size-limit", "2000"], env=streaming_env.env(),
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc

    convert(tmp_path / "local-out")
    convert(f"s3://{s3_bucket}/converted")
    keys = [o["Key"] for o in streaming_env.client().list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert f"converted/train/index.json" in keys and sum(k.endswith(".mds.zstd") for k in keys) > 3
    clean_stale_shared_memory()
    remote = StreamingDataset(remote=f"s3://{s3_bucket}/converted", local=str(tmp_path / "cache"), split="train",
                              shuffle=False, batch_size=1)
    local = StreamingDataset(local=str(tmp_path / "local-out"), split="train", shuffle=False, batch_size=1)
    assert remote.num_samples == local.num_samples > 100
    assert all(np.array_equal(remote[i]["tokens"], local[i]["tokens"]) for i in range(local.num_samples))
    # A second conversion to the same place is refused without --overwrite, naming it.
    proc = subprocess.run([_binary("TESSERA_CONVERT_BIN", "convert_text_to_mds"), "--input", tmp_path / "docs.jsonl",
                           "--format", "jsonl", "--output", f"s3://{s3_bucket}/converted"], env=streaming_env.env(),
                          capture_output=True, text=True)
    assert proc.returncode != 0 and f"s3://{s3_bucket}/converted/train" in proc.stderr


def test_converting_from_s3_inputs_equals_converting_the_local_files(streaming_env, s3_bucket, tmp_path):
    """convert_text_to_mds --input s3://bucket/prefix/ (boto3 uploaded .jsonl.zst and Parquet files, listed and fetched
    one at a time) writes the same bytes as the same files converted from a local folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [f"document {i}: " + " ".join(f"w{(i * 3 + j) % 70}" for j in range(i % 50 + 1)) for i in range(600)]
    folder = tmp_path / "corpus"
    folder.mkdir()
    with pa.CompressedOutputStream(str(folder / "a.jsonl.zst"), "zstd") as f:
        f.write("".join(json.dumps({"text": d}) + "\n" for d in docs[:300]).encode())
    pq.write_table(pa.table({"text": docs[300:]}), folder / "b.parquet", row_group_size=64)
    client = streaming_env.client()
    for p in sorted(folder.iterdir()):
        client.upload_file(str(p), s3_bucket, f"raw/{p.name}")

    def convert(src, out):
        proc = subprocess.run([_binary("TESSERA_CONVERT_BIN", "convert_text_to_mds"), "--input", src, "--output", out,
                               "--size-limit", "4000", "--progress", "off"], env=streaming_env.env(),
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr

    convert(folder, tmp_path / "from-local")
    convert(f"s3://{s3_bucket}/raw/", tmp_path / "from-s3")
    local = {p.name: p.read_bytes() for p in (tmp_path / "from-local" / "train").iterdir()}
    remote = {p.name: p.read_bytes() for p in (tmp_path / "from-s3" / "train").iterdir()}
    assert len(local) > 3 and remote == local
    proc = subprocess.run([_binary("TESSERA_CONVERT_BIN", "convert_text_to_mds"), "--input",
                           f"s3://{s3_bucket}/missing/", "--output", tmp_path / "x"], env=streaming_env.env(),
                          capture_output=True, text=True)
    assert proc.returncode != 0 and f"s3://{s3_bucket}/missing/" in proc.stderr, proc.stderr


def test_a_cache_smaller_than_the_dataset_evicts_and_reads_the_same(streaming_env, s3_bucket, tmp_path):
    write_remote(tmp_path, s3_bucket, "big", 1500, "zstd", 3)
    remote = f"s3://{s3_bucket}/big"
    full = tessera_epoch(streaming_env.env(), tmp_path, {"streams": [{"remote": remote, "local": str(tmp_path / "a")}]},
                         "full")
    index = json.loads((tmp_path / "a" / "index.json").read_text())
    sizes = [s["raw_data"]["bytes"] + s["zip_data"]["bytes"] for s in index["shards"]]
    total = sum(sizes) + (tmp_path / "a" / "index.json").stat().st_size
    limit = 5 * max(sizes) + (tmp_path / "a" / "index.json").stat().st_size
    assert limit < total / 2
    small = tessera_epoch(streaming_env.env(), tmp_path, {"streams": [{"remote": remote, "local": str(tmp_path / "b")}],
                                                         "cache_limit": str(limit)}, "small")
    assert small["ids_field"] == full["ids_field"]
    assert small["cache_usage"][0] <= limit
    on_disk = sum(p.stat().st_size for p in (tmp_path / "b").iterdir() if p.is_file())
    assert on_disk <= limit and len(list((tmp_path / "b").glob("shard.*"))) < len(sizes)
    # Streaming's rules: a limit that does not leave room for the index (or for four of the largest shards) is
    # refused, naming the dataset.
    (tmp_path / "spec.json").write_text(json.dumps({"streams": [{"remote": remote, "local": str(tmp_path / "c")}],
                                                    "cache_limit": str(3 * max(sizes)), "batch_size": 4,
                                                    "shuffle": False, "seed": 0, "algo": "py1e", "block": 64,
                                                    "ncn": 1, "partition": "relaxed", "epoch_size": None, "nodes": 1,
                                                    "ranks": 1, "workers": 1, "epoch": 0, "sample_in_epoch": 0,
                                                    "initial_p": 0}))
    proc = subprocess.run([_binary("TESSERA_COMPAT_DRIVER", "tessera_compat_driver"), "streaming-epoch",
                           tmp_path / "spec.json", tmp_path / "o.json"], env=streaming_env.env(), capture_output=True,
                          text=True)
    assert proc.returncode != 0 and "is not larger than index.json" in proc.stderr and str(tmp_path / "c") in proc.stderr


def test_training_from_s3_equals_training_from_local_data(streaming_env, s3_bucket, tmp_path):
    rng = np.random.default_rng(0)
    local = tmp_path / "data"
    with MDSWriter(out=(str(local / "train"), f"s3://{s3_bucket}/ds/train"), columns={"tokens": "ndarray:int32"},
                   compression="zstd", size_limit=2000, keep_local=True) as w:
        for _ in range(200):
            start, stride = rng.integers(0, VOCAB), rng.integers(1, 6)
            w.write({"tokens": ((start + stride * np.arange(SEQ + 1)) % VOCAB).astype(np.int32)})

    from_local = train_trace(streaming_env.env(), tmp_path, "local", {"local": str(local)})
    from_s3 = train_trace(streaming_env.env(), tmp_path, "s3", {"remote": f"s3://{s3_bucket}/ds",
                                                               "local": str(tmp_path / "cache"),
                                                               "cache_limit": "40kb", "predownload": 16})
    assert len(from_local["losses"]) == 200 // 8
    assert from_s3["batches"] == from_local["batches"]
    assert from_s3["losses"] == from_local["losses"]  # bitwise: the same floats


def test_ranks_sharing_a_local_folder_fetch_each_shard_once(streaming_env, s3_bucket, tmp_path):
    from s3_server import FaultProxy

    write_remote(tmp_path, s3_bucket, "shared", 400, "zstd", 4)
    proxy = FaultProxy(streaming_env.url)
    try:
        env = streaming_env.env(S3_ENDPOINT_URL=proxy.url)
        spec = {"streams": [{"remote": f"s3://{s3_bucket}/shared", "local": str(tmp_path / "node")}],
                "batch_size": 4, "shuffle": True, "seed": 5, "algo": "py1e", "block": 64, "ncn": 1,
                "partition": "relaxed", "epoch_size": None, "nodes": 1, "ranks": 1, "workers": 1, "epoch": 0,
                "sample_in_epoch": 0, "initial_p": 0}
        procs = []
        for r in range(3):  # three processes of one node, started together, reading every shard
            (tmp_path / f"r{r}.json").write_text(json.dumps({**spec, "seed": 5 + r}))
            procs.append(subprocess.Popen([_binary("TESSERA_COMPAT_DRIVER", "tessera_compat_driver"),
                                           "streaming-epoch", tmp_path / f"r{r}.json", tmp_path / f"r{r}.out"],
                                          env=env, stderr=subprocess.PIPE, text=True))
        for p in procs:
            assert p.wait(timeout=300) == 0, p.stderr.read()
    finally:
        proxy.stop()
    gets = {}
    for method, path, _ in proxy.seen:
        if method == "GET":
            gets[path] = gets.get(path, 0) + 1
    shard_gets = {p: n for p, n in gets.items() if ".mds" in p}
    index = json.loads((tmp_path / "node" / "index.json").read_text())
    assert len(shard_gets) == len(index["shards"]) and set(shard_gets.values()) == {1}
    assert sum(1 for p in gets if p.endswith("index.json")) == 1 and gets[f"/{s3_bucket}/shared/index.json"] == 1
