"""Untrusted inputs end to end (docs/security.md): a hostile S3-API endpoint, a real moto server on loopback whose
objects the attacker wrote with boto3 (moto stores keys and bodies verbatim), serves a dataset Streaming's MDSWriter
uploaded with its index.json then rewritten, and the real `train` reads it. Each test reproduces one attack of issue 61
and asserts the clear error and that no file outside the run's own folders was created, changed or deleted (a snapshot
of everything under the test's folder, decoys included, before and after).
"""
import json
import os
import subprocess

import numpy as np
import pytest
import yaml
from streaming import MDSWriter

from conftest import _binary

SEQ, VOCAB = 16, 64


def snapshot(root, skip):
    """Every file under `root` but those under the folders `skip` (relative name -> bytes, links as their target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if any(rel_dir == s or rel_dir.startswith(s + os.sep) for s in skip):
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = "-> " + os.readlink(p)
            elif os.path.isfile(p):
                out[rel] = open(p, "rb").read()
    return out


@pytest.fixture
def hostile(s3_server, s3_bucket, tmp_path, monkeypatch):
    """Uploads a small dataset to s3://bucket/ds/train (zstd shards), plants decoys, and returns a helper."""
    for k, v in s3_server.env().items():
        if k.startswith("AWS_") or k == "S3_ENDPOINT_URL":
            monkeypatch.setenv(k, v)
    rng = np.random.default_rng(0)
    with MDSWriter(out=(str(tmp_path / "stage"), f"s3://{s3_bucket}/ds/train"), columns={"tokens": "ndarray:int32"},
                   compression="zstd", size_limit=1 << 20) as w:
        for _ in range(32):
            w.write({"tokens": rng.integers(0, VOCAB, SEQ + 1, dtype=np.int32)})
    for d in (tmp_path / "decoy", tmp_path / "run" / "decoy"):
        d.mkdir(parents=True)
        (d / "outside.mds").write_bytes(b"a user's file")
    client = s3_server.client()

    class Hostile:
        bucket = s3_bucket
        s3 = client

        def index(self):
            return json.loads(client.get_object(Bucket=s3_bucket, Key="ds/train/index.json")["Body"].read())

        def put(self, key, body):
            client.put_object(Bucket=s3_bucket, Key=key, Body=body)

        def train(self):
            recipe = {
                "max_seq_len": SEQ, "seed": 1, "tokenizer": {"name": "unused"},
                "model": {"name": "mpt_causal_lm", "d_model": 16, "n_heads": 2, "n_layers": 1, "expansion_ratio": 2,
                          "max_seq_len": SEQ, "vocab_size": VOCAB, "attn_config": {"attn_impl": "torch"}},
                "train_loader": {"name": "text", "dataset": {"remote": f"s3://{s3_bucket}/ds", "split": "train",
                                                             "local": str(tmp_path / "run" / "cache"),
                                                             "shuffle": False, "max_seq_len": SEQ},
                                 "drop_last": True, "num_workers": 1},
                "optimizer": {"name": "decoupled_adamw", "lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                              "weight_decay": 0.0},
                "scheduler": {"name": "constant_with_warmup", "t_warmup": "0ba"},
                "max_duration": "2ba", "eval_interval": 0, "global_train_batch_size": 4,
                "device_train_microbatch_size": 4, "device_eval_batch_size": 4, "precision": "fp32",
                "save_folder": str(tmp_path / "run" / "ckpt"),
            }
            (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
            before = snapshot(tmp_path, skip=["run/cache", "run/ckpt"])
            proc = subprocess.run([_binary("TESSERA_TRAIN_BIN", "train"), "--recipe", tmp_path / "recipe.yaml"],
                                  env=s3_server.env(), capture_output=True, text=True, timeout=300)
            after = snapshot(tmp_path, skip=["run/cache", "run/ckpt"])
            assert after == before, "files outside the run's folders changed: " + str(
                sorted(set(after.items()) ^ set(before.items()), key=str)[:5])
            return proc

    return Hostile()


def test_the_unmodified_dataset_trains(hostile):
    """The control: the same upload, not rewritten, trains (so the refusals below are about the names alone)."""
    proc = hostile.train()
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", ["../../decoy/outside.mds", "../decoy/outside.mds", "ABSOLUTE",
                                  "sub/../../../decoy/outside.mds"])
@pytest.mark.parametrize("which", ["raw_data", "zip_data"])
def test_shard_names_in_a_hostile_index_never_become_paths_outside_the_cache(hostile, tmp_path, name, which):
    if name == "ABSOLUTE":
        name = str(tmp_path / "decoy" / "outside.mds")
    index = hostile.index()
    shard = index["shards"][0]
    body = hostile.s3.get_object(Bucket=hostile.bucket, Key="ds/train/" + shard["zip_data"]["basename"])["Body"].read()
    # Served under the crafted key too, so that a reader that followed the name would find it and write it.
    hostile.put("ds/train/" + name.lstrip("/"), body)
    shard[which]["basename"] = name
    hostile.put("ds/train/index.json", json.dumps(index))
    proc = hostile.train()
    assert proc.returncode != 0
    where = str(tmp_path / "run" / "cache" / "train" / "index.json")
    assert f'{where}: shard 0: {which}.basename "{name}"' in proc.stderr, proc.stderr
    assert "refusing to use it as a path under the dataset's folder" in proc.stderr
    assert (tmp_path / "decoy" / "outside.mds").read_bytes() == b"a user's file"


def test_a_compressed_shard_that_claims_gigabytes_is_refused_before_any_allocation(hostile, tmp_path):
    index = hostile.index()
    shard = index["shards"][0]
    # A 17-byte zstd frame that declares 8 GiB of content (one RLE block follows).
    bomb = b"\x28\xb5\x2f\xfd\xe0" + (8 << 30).to_bytes(8, "little") + b"\x0b\x00\x00x"
    hostile.put("ds/train/" + shard["zip_data"]["basename"], bomb)
    shard["zip_data"].update(bytes=len(bomb), hashes={})
    hostile.put("ds/train/index.json", json.dumps(index))
    proc = hostile.train()
    assert proc.returncode != 0
    assert (f"{shard['zip_data']['basename']}: decompresses to more than the {shard['raw_data']['bytes']} bytes "
            "index.json gives for the shard") in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "cache" / "train" / shard["raw_data"]["basename"]).exists()
