"""Checkpoints in object storage, through a real S3-API server (moto, signatures checked), with boto3 as the peer:

- a run with `save_folder: s3://...` uploads each checkpoint's rank files (multipart above 16 MB), metadata.json
  listing every file with the size and xxh64 that boto3 reads back, and the `latest` object last; rotation deletes the
  old checkpoints' objects; the files are byte for byte the ones a local save_folder gets, and hf_checkpointer's
  folder in S3 is byte for byte the local one;
- autoresume from S3 skips what must never be loaded (a `latest` pointing at an upload without metadata.json, a
  checkpoint whose file was corrupted) and resumes from the newest good one, ending with the uninterrupted run's
  weights; the interrupted upload's objects are removed;
- `convert --checkpoint s3://... --hf-out s3://...` gives the bytes a local conversion gives, and `load_path` takes
  that folder from S3 as it takes the local one;
- a 2-rank job saving to S3, killed with SIGKILL at random moments under --max-restarts, resumes from S3 with final
  weights bitwise equal to an uninterrupted run's (tests/fault_injection/kill_random_rank.sh);
- a bucket that does not exist fails the run with an error naming it;
- a run streaming its data from S3 and saving checkpoints there through a proxy that fails 10% of the requests
  (500, 503, resets, answers cut halfway, stalls) ends bitwise equal to the clean run, every checkpoint it left whole.
"""
import json
import os
import subprocess

import numpy as np
import pytest
import xxhash
import yaml
from streaming import MDSWriter

from conftest import ROOT, _binary

SEQ, VOCAB = 32, 128


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt-data")
    rng = np.random.default_rng(0)
    with MDSWriter(out=str(root / "train"), columns={"tokens": "ndarray:int32"}, size_limit=4000) as w:
        for _ in range(256):
            start, stride = rng.integers(0, VOCAB), rng.integers(1, 6)
            w.write({"tokens": ((start + stride * np.arange(SEQ + 1)) % VOCAB).astype(np.int32)})
    return root


def recipe(tmp_path, data, runs, d_model=32, **extra):
    r = {
        "max_seq_len": SEQ, "seed": 3, "tokenizer": {"name": "unused"},
        "model": {"name": "mpt_causal_lm", "d_model": d_model, "n_heads": 2, "n_layers": 2, "expansion_ratio": 2,
                  "max_seq_len": SEQ, "vocab_size": VOCAB, "attn_config": {"attn_impl": "torch"}},
        "train_loader": {"name": "text", "dataset": {"local": str(data), "split": "train", "shuffle": True,
                                                     "max_seq_len": SEQ}, "drop_last": True},
        "optimizer": {"name": "decoupled_adamw", "lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                      "weight_decay": 0.0},
        "scheduler": {"name": "cosine_with_warmup", "t_warmup": "2ba"},
        "max_duration": "20ba", "eval_interval": 0, "global_train_batch_size": 8,
        "device_train_microbatch_size": 4, "device_eval_batch_size": 8, "precision": "fp32", "device": "cpu",
        "deterministic_mode": True, "log_to_console": False,
        "loggers": {"jsonl": {"filename": f"{runs}/{{run_name}}/metrics.jsonl"}},
        "callbacks": {"hf_checkpointer": {"save_folder": f"{runs}/{{run_name}}", "save_interval": "1000ba"}},
        **extra,
    }
    path = tmp_path / f"recipe-{d_model}.yaml"
    path.write_text(yaml.safe_dump(r))
    return path


def train(env, recipe_path, *overrides, check=True):
    proc = subprocess.run([_binary("TESSERA_TRAIN_BIN", "train"), "--recipe", recipe_path, *overrides], env=env,
                          capture_output=True, text=True, timeout=900)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def objects(client, bucket, prefix):
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix):]] = o["Size"]
    return out


def get(client, bucket, key):
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def test_saving_to_s3_resuming_and_rotating(s3_server, s3_bucket, data, tmp_path):
    env, s3 = s3_server.env(), s3_server.client()
    runs = tmp_path / "runs"
    # d_model 320: each rank file (weights and Adam state) is ~20 MB, so it goes up as a multipart upload.
    big = recipe(tmp_path, data, runs, d_model=320)
    base = ["max_duration=6ba", "save_interval=2ba", "save_num_checkpoints_to_keep=2"]
    train(env, big, "run_name=s3", f"save_folder=s3://{s3_bucket}/s3/ckpt", *base,
          f"callbacks.hf_checkpointer.save_folder=s3://{s3_bucket}/runs/{{run_name}}")
    train(env, big, "run_name=local", f"save_folder={tmp_path / 'ckpt-local'}", *base)

    listed = objects(s3, s3_bucket, "s3/ckpt/")
    # ep0-ba2 rotated away; no receipts or other leftovers; `latest` names the newest.
    assert sorted(listed) == ["ep0-ba4/metadata.json", "ep0-ba4/rank0.safetensors", "ep0-ba6/metadata.json",
                              "ep0-ba6/rank0.safetensors", "latest"]
    assert get(s3, s3_bucket, "s3/ckpt/latest").decode() == "ep0-ba6"
    assert listed["ep0-ba6/rank0.safetensors"] > 16 << 20
    for name in ("ep0-ba4", "ep0-ba6"):
        meta = json.loads(get(s3, s3_bucket, f"s3/ckpt/{name}/metadata.json"))
        assert [f["name"] for f in meta["files"]] == ["rank0.safetensors"]
        body = get(s3, s3_bucket, f"s3/ckpt/{name}/rank0.safetensors")
        assert meta["files"][0]["bytes"] == len(body)
        assert meta["files"][0]["xxh64"] == xxhash.xxh64(body).hexdigest()
        # The same bytes a local save folder gets.
        assert body == (tmp_path / "ckpt-local" / name / "rank0.safetensors").read_bytes(), name
    hf = objects(s3, s3_bucket, "runs/s3/huggingface/ba6/")
    local_hf = runs / "local" / "huggingface" / "ba6"
    assert sorted(hf) == sorted(p.name for p in local_hf.iterdir())
    for name in hf:
        assert get(s3, s3_bucket, f"runs/s3/huggingface/ba6/{name}") == (local_hf / name).read_bytes(), name


def test_autoresume_from_s3_skips_incomplete_and_corrupt_checkpoints(s3_server, s3_bucket, data, tmp_path):
    env, s3 = s3_server.env(), s3_server.client()
    runs = tmp_path / "runs"
    rec = recipe(tmp_path, data, runs)
    folder = f"s3://{s3_bucket}/run/ckpt"
    train(env, rec, "run_name=ref", "max_duration=8ba")
    train(env, rec, "run_name=first", f"save_folder={folder}", "max_duration=6ba", "save_interval=2ba")
    # The newest checkpoint corrupted in place (same size), and an interrupted save of a later one that `latest`
    # already names: neither may be loaded.
    key = "run/ckpt/ep0-ba6/rank0.safetensors"
    body = bytearray(get(s3, s3_bucket, key))
    body[-5] ^= 0x40
    s3.put_object(Bucket=s3_bucket, Key=key, Body=bytes(body))
    s3.put_object(Bucket=s3_bucket, Key="run/ckpt/ep0-ba8/rank0.safetensors", Body=b"half an upload")
    s3.put_object(Bucket=s3_bucket, Key="run/ckpt/latest", Body=b"ep0-ba8")

    proc = train(env, rec, "run_name=resumed", f"save_folder={folder}", "max_duration=8ba", "save_interval=2ba",
                 "autoresume=true")
    log = proc.stdout + proc.stderr
    assert f"{folder}/ep0-ba6/rank0.safetensors: xxh64 checksum" in log, log[-3000:]
    assert f"{folder}/ep0-ba8: no metadata.json" in log, log[-3000:]
    losses = [json.loads(l) for l in (runs / "resumed" / "metrics.jsonl").read_text().splitlines()]
    # Resumed from ep0-ba4: the steps of batches 5 to 8 (logged at the batch count before each step).
    assert [m["batch"] for m in losses if "loss/train/total" in m] == [4, 5, 6, 7]
    want = (runs / "ref" / "huggingface" / "ba8" / "model.safetensors").read_bytes()
    assert (runs / "resumed" / "huggingface" / "ba8" / "model.safetensors").read_bytes() == want
    # The re-saved ep0-ba6 and ep0-ba8 are complete and `latest` names the newest.
    assert get(s3, s3_bucket, "run/ckpt/latest").decode() == "ep0-ba8"
    meta = json.loads(get(s3, s3_bucket, "run/ckpt/ep0-ba8/metadata.json"))
    assert meta["files"][0]["xxh64"] == xxhash.xxh64(get(s3, s3_bucket, "run/ckpt/ep0-ba8/rank0.safetensors")).hexdigest()


def test_convert_reads_and_writes_s3(s3_server, s3_bucket, data, tmp_path):
    env, s3 = s3_server.env(), s3_server.client()
    rec = recipe(tmp_path, data, tmp_path / "runs")
    train(env, rec, "run_name=c", f"save_folder=s3://{s3_bucket}/c/ckpt", "max_duration=4ba", "save_interval=2ba")
    convert = _binary("TESSERA_CONVERT_TOOL", "convert")
    proc = subprocess.run([convert, "--checkpoint", f"s3://{s3_bucket}/c/ckpt", "--hf-out", f"s3://{s3_bucket}/c/hf",
                           "--tokenizer", "none"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    # The same checkpoint downloaded with boto3 and converted locally.
    local = tmp_path / "ep0-ba4"
    local.mkdir()
    for name in objects(s3, s3_bucket, "c/ckpt/ep0-ba4/"):
        s3.download_file(s3_bucket, f"c/ckpt/ep0-ba4/{name}", str(local / name))
    proc = subprocess.run([convert, "--checkpoint", local, "--hf-out", tmp_path / "hf", "--tokenizer", "none"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    exported = objects(s3, s3_bucket, "c/hf/")
    assert sorted(exported) == sorted(p.name for p in (tmp_path / "hf").iterdir())
    for name in exported:
        assert get(s3, s3_bucket, f"c/hf/{name}") == (tmp_path / "hf" / name).read_bytes(), name
    # load_path takes the HF folder in S3 as it takes the local one: the same first losses.
    losses = {}
    for name, path in (("from-s3", f"s3://{s3_bucket}/c/hf"), ("from-local", tmp_path / "hf")):
        train(env, rec, f"run_name={name}", f"load_path={path}", "max_duration=2ba")
        lines = (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()
        losses[name] = [json.loads(l)["loss/train/total"] for l in lines if "loss/train/total" in l]
    assert len(losses["from-s3"]) == 2 and losses["from-s3"] == losses["from-local"]


def test_killed_two_rank_job_resumes_from_s3_bitwise(s3_server, s3_bucket, data, tmp_path):
    runs = tmp_path / "runs"
    rec = recipe(tmp_path, data, runs)
    env = {**s3_server.env(), "RUNS_DIR": str(runs), "SAVE_ROOT": f"s3://{s3_bucket}/kill"}
    trials = int(os.environ.get("TESSERA_FAULT_TRIALS", "2"))
    proc = subprocess.run([ROOT / "tests" / "fault_injection" / "kill_random_rank.sh",
                           _binary("TESSERA_TRAIN_BIN", "train"), rec, tmp_path / "fault", str(trials)], env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0 and f"{trials}/{trials} trials passed" in proc.stdout, proc.stdout + proc.stderr
    # Both ranks' files went to S3.
    names = objects(s3_server.client(), s3_bucket, "kill/fi_reference/ep0-ba20/")
    assert sorted(names) == ["metadata.json", "rank0.safetensors", "rank1.safetensors"]


def test_a_second_writer_of_latest_fails_the_run_instead_of_crossing_pointers(s3_server, s3_bucket, data, tmp_path):
    # Two runs saving into one folder would each point `latest` at the other's checkpoints. A run writes `latest` only
    # over the version it wrote last (If-Match): here another writer replaces it while the run is stopped (SIGSTOP),
    # and the run's next save fails naming the object, leaving the other writer's `latest` in place.
    import signal
    import time

    from botocore.exceptions import ClientError

    env, s3 = s3_server.env(), s3_server.client()
    rec = recipe(tmp_path, data, tmp_path / "runs")
    proc = subprocess.Popen([_binary("TESSERA_TRAIN_BIN", "train"), "--recipe", rec, "run_name=a",
                             f"save_folder=s3://{s3_bucket}/shared/ckpt", "max_duration=400ba", "save_interval=1ba",
                             "save_num_checkpoints_to_keep=2"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        while True:  # until the run's first `latest` is up
            try:
                s3.head_object(Bucket=s3_bucket, Key="shared/ckpt/latest")
                break
            except ClientError:
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.05)
        proc.send_signal(signal.SIGSTOP)
        s3.put_object(Bucket=s3_bucket, Key="shared/ckpt/latest", Body=b"ep9-ba999")
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, out[-2000:] + err[-2000:]
    assert f"s3://{s3_bucket}/shared/ckpt/latest: was changed by another writer" in err, err[-3000:]
    assert 'now names "ep9-ba999"' in err and "give each run its own save_folder" in err, err[-3000:]
    assert get(s3, s3_bucket, "shared/ckpt/latest") == b"ep9-ba999"


def test_a_missing_bucket_fails_the_run_naming_it(s3_server, data, tmp_path):
    rec = recipe(tmp_path, data, tmp_path / "runs")
    proc = train(s3_server.env(), rec, "run_name=nb", "save_folder=s3://no-such-bucket-here/ckpt", "max_duration=2ba",
                 "save_interval=1ba", check=False)
    assert proc.returncode != 0
    assert "s3://no-such-bucket-here/ckpt" in proc.stderr and "NoSuchBucket" in proc.stderr, proc.stderr[-3000:]


def test_training_through_a_failing_store_equals_the_clean_run(s3_server, s3_bucket, data, tmp_path):
    from remote_training import training_through_faults
    from s3_server import FaultProxy

    s3 = s3_server.client()
    proxy = FaultProxy(s3_server.url, stall_s=3)
    try:
        training_through_faults(
            s3_server.env(), s3_server.env(S3_ENDPOINT_URL=proxy.url, TESSERA_S3_STALL_TIMEOUT_S="1"), proxy,
            tmp_path, data, f"s3://{s3_bucket}",
            list_keys=lambda prefix: [prefix + k for k in objects(s3, s3_bucket, prefix)],
            read=lambda key: get(s3, s3_bucket, key))
    finally:
        proxy.stop()
