"""Helpers for the tests that train from remote data (s3://, gs://, azure://, dbfs:/Volumes, oci://, hf://) against the
same run on local data, and checkpoint there."""
import json
import subprocess

import numpy as np
from streaming import MDSWriter

from conftest import _binary

SEQ, VOCAB = 32, 128


def train_trace(env, tmp_path, name, dataset):
    """The batches and losses of one epoch of a tiny MPT on `dataset` (a train_loader dataset: local, or remote with a
    local cache), through the compat driver's train-trace."""
    rec = {
        "max_seq_len": SEQ, "seed": 3, "tokenizer": {"name": "unused"},
        "model": {"name": "mpt_causal_lm", "d_model": 32, "n_heads": 2, "n_layers": 2, "expansion_ratio": 2,
                  "max_seq_len": SEQ, "vocab_size": VOCAB, "attn_config": {"attn_impl": "torch"}},
        "train_loader": {"name": "text", "dataset": {"split": "train", "shuffle": True, "max_seq_len": SEQ,
                                                     **dataset}, "drop_last": True, "num_workers": 2},
        "optimizer": {"name": "decoupled_adamw", "lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0},
        "scheduler": {"name": "constant_with_warmup", "t_warmup": "0ba"},
        "max_duration": "1ep", "eval_interval": 0, "global_train_batch_size": 8,
        "device_train_microbatch_size": 8, "device_eval_batch_size": 8, "precision": "fp32", "log_to_console": False,
    }
    (tmp_path / f"{name}.yaml").write_text(json.dumps(rec))
    (tmp_path / name).mkdir()
    proc = subprocess.run([_binary("TESSERA_COMPAT_DRIVER", "tessera_compat_driver"), "train-trace",
                           tmp_path / f"{name}.yaml", tmp_path / name], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp_path / name / "trace.json").read_text())


def write_mds(folder, samples=200):
    """`samples` token sequences in zstd MDS shards of ~2 kB, written by Streaming's MDSWriter to `folder` (or to
    a (local, remote) pair, which Streaming uploads)."""
    rng = np.random.default_rng(0)
    out = folder if isinstance(folder, tuple) else str(folder)
    with MDSWriter(out=out, columns={"tokens": "ndarray:int32"}, compression="zstd", size_limit=2000) as w:
        for _ in range(samples):
            start, stride = rng.integers(0, VOCAB), rng.integers(1, 6)
            w.write({"tokens": ((start + stride * np.arange(SEQ + 1)) % VOCAB).astype(np.int32)})


def checkpoints_autoresume_in_a_store(env, tmp_path, data, base, list_keys, read, write):
    """The checkpoint story every object store must pass, through train: saves to `base`/run/ckpt every 2 batches
    keeping 2, with hf_checkpointer's export beside them; then the newest checkpoint corrupted in place and an
    interrupted save of a later one that `latest` already names; autoresume must skip both (naming why), resume from
    ep0-ba4 and end bitwise equal to the uninterrupted run. `list_keys(prefix)`, `read(key)` and `write(key, bytes)`
    reach the store through its own SDK (keys relative to `base`)."""
    import xxhash

    from test_s3_checkpoints import recipe, train

    runs = tmp_path / "runs"
    rec = recipe(tmp_path, data, runs)
    folder = f"{base}/run/ckpt"
    train(env, rec, "run_name=ref", "max_duration=8ba")
    train(env, rec, "run_name=first", f"save_folder={folder}", "max_duration=6ba", "save_interval=2ba",
          "save_num_checkpoints_to_keep=2", f"callbacks.hf_checkpointer.save_folder={base}/hf/{{run_name}}",
          "callbacks.hf_checkpointer.save_interval=6ba")
    assert sorted(k[len("run/ckpt/"):] for k in list_keys("run/ckpt/")) == [
        "ep0-ba4/metadata.json", "ep0-ba4/rank0.safetensors", "ep0-ba6/metadata.json", "ep0-ba6/rank0.safetensors",
        "latest"]  # ep0-ba2 rotated away
    meta = json.loads(read("run/ckpt/ep0-ba6/metadata.json"))
    assert meta["files"][0]["xxh64"] == xxhash.xxh64(read("run/ckpt/ep0-ba6/rank0.safetensors")).hexdigest()
    exported = list_keys("hf/first/huggingface/ba6/")
    assert {"hf/first/huggingface/ba6/model.safetensors", "hf/first/huggingface/ba6/config.json"} <= set(exported)
    body = bytearray(read("run/ckpt/ep0-ba6/rank0.safetensors"))
    body[-5] ^= 0x40
    write("run/ckpt/ep0-ba6/rank0.safetensors", bytes(body))
    write("run/ckpt/ep0-ba8/rank0.safetensors", b"half an upload")
    write("run/ckpt/latest", b"ep0-ba8")

    proc = train(env, rec, "run_name=resumed", f"save_folder={folder}", "max_duration=8ba", "save_interval=2ba",
                 "autoresume=true")
    log = proc.stdout + proc.stderr
    assert f"{folder}/ep0-ba6/rank0.safetensors: xxh64 checksum" in log, log[-3000:]
    assert f"{folder}/ep0-ba8: no metadata.json" in log, log[-3000:]
    losses = [json.loads(line) for line in (runs / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert [m["batch"] for m in losses if "loss/train/total" in m] == [4, 5, 6, 7]  # resumed from ep0-ba4
    want = (runs / "ref" / "huggingface" / "ba8" / "model.safetensors").read_bytes()
    assert (runs / "resumed" / "huggingface" / "ba8" / "model.safetensors").read_bytes() == want
    assert read("run/ckpt/latest").decode() == "ep0-ba8"


def training_through_faults(clean_env, faulty_env, proxy, tmp_path, data, base, list_keys, read):
    """The fault story every object store must pass: the dataset in the store (written by Tessera through
    `clean_env`), then a run that streams it and saves checkpoints there every 2 batches through `proxy`, which fails
    10% of the requests (`faulty_env` reaches the store through it) with its faults (500, 503, resets, answers cut
    halfway, stalls past the client's timeout). The run must end bitwise equal to a clean run on the local copy, and
    every checkpoint it left must be whole: `latest` names one, and each file its metadata.json lists is there with
    its checksum. `list_keys(prefix)` and `read(key)` reach the store without the proxy (keys relative to `base`)."""
    import xxhash

    from test_s3_checkpoints import recipe, train
    from test_s3_storage import run_batch

    out = run_batch(clean_env, [{"op": "put_tree", "path": str(data / "train"), "uri": f"{base}/ds/train"}],
                    tmp_path, "dataset")
    assert out["results"][0].get("error") is None, out
    runs = tmp_path / "runs"
    rec = recipe(tmp_path, data, runs)
    train(clean_env, rec, "run_name=clean", "max_duration=8ba", "callbacks.hf_checkpointer.save_interval=8ba")
    seen = len(proxy.seen)
    proxy.rate = 0.1
    try:
        train(faulty_env, rec, "run_name=faulty", f"train_loader.dataset.remote={base}/ds",
              f"train_loader.dataset.local={tmp_path / 'cache'}", f"save_folder={base}/faulty/ckpt",
              "save_interval=2ba", "max_duration=8ba", "callbacks.hf_checkpointer.save_interval=8ba")
    finally:
        proxy.rate = 0.0
    actions = [a for _, _, a in proxy.seen[seen:]]
    assert len(actions) >= 20 and sum(a != "ok" for a in actions) >= 2, actions
    want = (runs / "clean" / "huggingface" / "ba8" / "model.safetensors").read_bytes()
    assert (runs / "faulty" / "huggingface" / "ba8" / "model.safetensors").read_bytes() == want
    keys = list_keys("faulty/ckpt/")
    assert read("faulty/ckpt/latest") == b"ep0-ba8", keys
    folders = {k[len("faulty/ckpt/"):].split("/")[0] for k in keys if k.count("/") > 2}
    assert "ep0-ba8" in folders, keys
    for folder in folders:
        meta = json.loads(read(f"faulty/ckpt/{folder}/metadata.json"))
        for f in meta["files"]:
            assert xxhash.xxh64(read(f"faulty/ckpt/{folder}/{f['name']}")).hexdigest() == f["xxh64"], (folder, f)
    return actions


def round_trip_through_a_store(env, tmp_path, base, upload, read, missing, get_base=None, list_base=None,
                               put_base=None):
    """The byte-for-byte story every object store with an SDK must pass, through the compat driver's storage ops:
    the SDK's `upload(key, bytes)` writes small and 37 MiB objects that Tessera reads (whole, a range, a parallel
    download, stat, a prefix listing that excludes a sibling), Tessera writes small, 37 MiB, empty and several-buffer
    objects that the SDK's `read(key)` returns identically, deletes (a missing one is no error), and a missing object
    read or downloaded is an error containing `missing` that leaves no file. Keys are relative to `base`;
    `get_base`, `list_base` and `put_base` spell the same location another way for one op each (another scheme or
    form). Returns the results for the store's own checks."""
    import os

    get_base, list_base, put_base = get_base or base, list_base or base, put_base or base
    big = os.urandom(37 * 1024 * 1024 + 123)
    (tmp_path / "big.bin").write_bytes(big)
    (tmp_path / "empty.bin").write_bytes(b"")
    text = b"written by the SDK"
    upload("from-sdk/a b+c.txt", text)
    upload("from-sdk/big.bin", big)
    upload("from-sdk-other", b"x")
    upload("fromage", b"not under the prefix")
    down = tmp_path / "down"
    from test_s3_storage import run_batch

    out = run_batch(env, [
        {"op": "put", "uri": f"{base}/from-tessera/small.txt", "data": "written by tessera"},
        {"op": "put_file", "path": str(tmp_path / "big.bin"), "uri": f"{put_base}/from-tessera/big.bin"},
        {"op": "put_file", "path": str(tmp_path / "empty.bin"), "uri": f"{base}/from-tessera/empty"},
        {"op": "put_parts", "path": str(tmp_path / "big.bin"), "cuts": [5, 9 << 20, 20 << 20],
         "uri": f"{base}/from-tessera/parts.bin"},
        {"op": "get", "uri": f"{get_base}/from-sdk/a b+c.txt"},
        {"op": "range", "uri": f"{base}/from-sdk/a b+c.txt", "offset": 3, "length": 7},
        {"op": "download", "uri": f"{base}/from-sdk/big.bin", "path": str(down / "big.bin")},
        {"op": "stat", "uri": f"{base}/from-sdk/big.bin"},
        {"op": "stat", "uri": f"{base}/missing"},
        {"op": "list", "uri": f"{list_base}/from-"},
        {"op": "remove", "uri": f"{base}/from-sdk/a b+c.txt"},
        {"op": "remove", "uri": f"{base}/never-existed"},
        {"op": "get", "uri": f"{base}/from-sdk/a b+c.txt"},
        {"op": "range", "uri": f"{base}/from-sdk-other", "offset": 0, "length": 2},
        {"op": "download", "uri": f"{base}/absent", "path": str(down / "absent")},
        {"op": "download", "uri": f"{base}/from-tessera/empty", "path": str(down / "empty")},
    ], tmp_path)
    r = out["results"]
    assert [x.get("error") for x in r[:12]] == [None] * 12, r
    assert read("from-tessera/small.txt") == b"written by tessera"
    assert read("from-tessera/big.bin") == big and read("from-tessera/parts.bin") == big
    assert read("from-tessera/empty") == b""
    assert r[4]["data"] == text.decode() and r[5]["data"] == text[3:10].decode()
    assert (down / "big.bin").read_bytes() == big
    assert r[7]["size"] == len(big) and r[8]["size"] is None
    listed = {o[0]: o[1] for o in r[9]["objects"]}
    assert listed == {f"{list_base}/from-sdk/a b+c.txt": len(text), f"{list_base}/from-sdk/big.bin": len(big),
                      f"{list_base}/from-sdk-other": 1, f"{list_base}/from-tessera/big.bin": len(big),
                      f"{list_base}/from-tessera/empty": 0, f"{list_base}/from-tessera/parts.bin": len(big),
                      f"{list_base}/from-tessera/small.txt": 18}
    assert [o[0] for o in r[9]["objects"]] == sorted(listed)
    assert f"{base}/from-sdk/a b+c.txt: GET HTTP 404 {missing}" in r[12]["error"], r[12]
    assert "asked for 2 bytes at 0, got 1" in r[13]["error"], r[13]
    assert missing in r[14]["error"] and not (down / "absent").exists()
    assert r[15].get("error") is None and (down / "empty").read_bytes() == b""
    assert sorted(p.name for p in down.iterdir()) == ["big.bin", "empty"]  # no temporary file left
    return r


def conditional_writes(env, tmp_path, base):
    """storage::write_if on a store that checks the condition in the write (S3, Azure, OCI, GCS, the Hub): a first
    write needs the object absent, each later one the ETag the writer last got; a stale ETag is refused and leaves the
    object as it was; a write that finds its own bytes already there (a retried PUT that had succeeded) counts as
    done."""
    from test_s3_storage import run_batch

    uri = f"{base}/cond/latest"
    first = run_batch(env, [{"op": "put_if", "uri": uri, "data": "ep0-ba2", "expected": None},
                            {"op": "put_if", "uri": uri, "data": "ep0-ba4", "expected": None}], tmp_path, "cond1")
    e1 = first["results"][0]["etag"]
    assert e1 and first["results"][1] == {"etag": None}, first
    out = run_batch(env, [{"op": "put_if", "uri": uri, "data": "ep0-ba4", "expected": e1},
                          {"op": "put_if", "uri": uri, "data": "ep0-ba6", "expected": e1},
                          {"op": "get", "uri": uri},
                          {"op": "put_if", "uri": uri, "data": "ep0-ba4", "expected": e1}], tmp_path, "cond2")
    r = out["results"]
    assert r[0]["etag"] and r[0]["etag"] != e1 and r[1] == {"etag": None} and r[2]["data"] == "ep0-ba4", r
    assert r[3]["etag"] == r[0]["etag"], r  # its own bytes: the ETag they have
