"""Hub ids downloaded from the Hugging Face Hub (src/util/hf_hub.cpp) against a loopback Hub that follows the
protocol huggingface.co speaks (tests/compat/hub_server.py), with huggingface_hub as the peer:

- `generate --model org/name` downloads the repository into the cache and generates what the local folder does;
  huggingface_hub (HF_HUB_OFFLINE=1) and transformers then load the same files from that cache, and nothing Tessera
  cannot load (pytorch_model.bin) was fetched;
- what huggingface_hub's snapshot_download put in a cache, Tessera loads offline without a request;
- a private repository needs HF_TOKEN; the error without it says no token was sent, and the token never appears in
  an error or goes to the CDN;
- a file name from the Hub that leaves the cache, and an LFS file whose bytes do not match its SHA-256, are refused
  before anything is written outside the cache or published as a blob.
"""
import json
import os
import subprocess
import sys

import pytest

from test_generate_cli import GENERATE, model_dir  # noqa: F401 (model_dir is a fixture)


@pytest.fixture(scope="module")
def hub():
    from hub_server import HubServer

    server = HubServer()
    yield server
    server.stop()


def files_of(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def online_env(hub, cache, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent / "hf-home"))
    env.update(extra)
    return env


def generate(env, model, out):
    proc = subprocess.run([GENERATE, "--model", str(model), "--prompt", "The meaning of life is", "--max-new-tokens",
                           "8", "--output", str(out)], env=env, capture_output=True, text=True, timeout=300)
    return proc


def test_tessera_downloads_into_the_cache_that_huggingface_hub_reads_offline(hub, model_dir, tmp_path):
    files = files_of(model_dir)
    commit = hub.add("org/tiny-llama", {**files, "pytorch_model.bin": b"a pickle Tessera never loads"})
    cache = tmp_path / "cache"
    local = generate(online_env(hub, cache, HF_HUB_OFFLINE="1"), model_dir, tmp_path / "local.jsonl")
    assert local.returncode == 0, local.stderr
    before = len(hub.seen)
    remote = generate(online_env(hub, cache), "org/tiny-llama", tmp_path / "remote.jsonl")
    assert remote.returncode == 0, remote.stderr
    assert (tmp_path / "remote.jsonl").read_text() == (tmp_path / "local.jsonl").read_text()
    fetched = {path for method, path, _ in hub.seen[before:] if method == "GET"}
    assert not any("pytorch_model.bin" in p for p in fetched)
    assert any(p.startswith("/cdn/") for p in fetched)  # the weights came through the LFS redirect

    snapshot = cache / "models--org--tiny-llama" / "snapshots" / commit
    assert (cache / "models--org--tiny-llama" / "refs" / "main").read_text() == commit
    assert files_of(snapshot) == files
    assert all((snapshot / n).is_symlink() for n in files)
    # huggingface_hub and transformers, offline, find every file in the cache Tessera filled.
    check = f"""
import json, sys
from huggingface_hub import hf_hub_download, snapshot_download
from transformers import AutoConfig
path = snapshot_download("org/tiny-llama", local_files_only=True)
one = hf_hub_download("org/tiny-llama", "model.safetensors", local_files_only=True)
print(json.dumps([path, one, AutoConfig.from_pretrained("org/tiny-llama").model_type]))
"""
    proc = subprocess.run([sys.executable, "-c", check], env=online_env(hub, cache, HF_HUB_OFFLINE="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path, one, model_type = json.loads(proc.stdout.strip().splitlines()[-1])
    assert path == str(snapshot) and one == str(snapshot / "model.safetensors") and model_type == "llama"
    # Asked again, the cached snapshot is used without a request.
    seen = len(hub.seen)
    again = generate(online_env(hub, cache), "org/tiny-llama", tmp_path / "again.jsonl")
    assert again.returncode == 0, again.stderr
    assert len(hub.seen) == seen


def test_tessera_loads_offline_what_huggingface_hub_downloaded(hub, model_dir, tmp_path):
    hub.add("org/from-hub-client", files_of(model_dir))
    cache = tmp_path / "cache"
    fetch = 'from huggingface_hub import snapshot_download; print(snapshot_download("org/from-hub-client"))'
    proc = subprocess.run([sys.executable, "-c", fetch], env=online_env(hub, cache), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = len(hub.seen)
    offline = generate(online_env(hub, cache, HF_HUB_OFFLINE="1"), "org/from-hub-client", tmp_path / "o.jsonl")
    assert offline.returncode == 0, offline.stderr
    local = generate(online_env(hub, cache, HF_HUB_OFFLINE="1"), model_dir, tmp_path / "l.jsonl")
    assert (tmp_path / "o.jsonl").read_text() == (tmp_path / "l.jsonl").read_text()
    assert len(hub.seen) == seen


def test_a_private_repo_needs_the_token_which_no_error_shows(hub, model_dir, tmp_path):
    hub.add("org/private-llama", files_of(model_dir), private=True)
    none = generate(online_env(hub, tmp_path / "c1"), "org/private-llama", tmp_path / "a.jsonl")
    assert none.returncode != 0
    assert "org/private-llama" in none.stderr and "HTTP 401" in none.stderr and "no token was sent" in none.stderr
    wrong = generate(online_env(hub, tmp_path / "c2", HF_TOKEN="hf_wrong_token_1234"), "org/private-llama",
                     tmp_path / "b.jsonl")
    assert wrong.returncode != 0 and "the token (HF_TOKEN or the saved login) was sent" in wrong.stderr
    assert "hf_wrong_token_1234" not in wrong.stderr + wrong.stdout
    before = len(hub.seen)
    right = generate(online_env(hub, tmp_path / "c3", HF_TOKEN=hub.token), "org/private-llama", tmp_path / "c.jsonl")
    assert right.returncode == 0, right.stderr
    sent = hub.seen[before:]
    assert all(with_token for _, path, with_token in sent if not path.startswith("/cdn/"))
    assert not any(with_token for _, path, with_token in sent if path.startswith("/cdn/"))  # not to the CDN


def test_hostile_names_and_damaged_weights_are_refused(hub, model_dir, tmp_path):
    files = files_of(model_dir)
    hub.add("org/escape", files, extra_siblings=["../../../escaped.txt"])
    proc = generate(online_env(hub, tmp_path / "cache" / "hub"), "org/escape", tmp_path / "x.jsonl")
    assert proc.returncode != 0 and '"../../../escaped.txt"' in proc.stderr, proc.stderr
    assert not list(tmp_path.rglob("escaped.txt"))

    import hashlib

    sha = hashlib.sha256(files["model.safetensors"]).hexdigest()
    damaged = bytearray(files["model.safetensors"])
    damaged[-1] ^= 1
    hub.add("org/damaged", files, lfs_body={sha: bytes(damaged)})
    cache = tmp_path / "cache2"
    proc = generate(online_env(hub, cache), "org/damaged", tmp_path / "y.jsonl")
    assert proc.returncode != 0 and "model.safetensors arrived with SHA-256" in proc.stderr, proc.stderr
    assert not (cache / "models--org--damaged" / "blobs" / sha).exists()
    assert not (cache / "models--org--damaged" / "refs" / "main").exists()


def test_training_streams_mds_shards_from_a_hub_dataset_repo(hub, tmp_path):
    # Streaming's `remote: hf://datasets/<org>/<name>/...`: index.json and the shards come from the repository's
    # files (the listing paged three entries at a time), and the run equals the run on the local copy.
    from remote_training import train_trace, write_mds

    local = tmp_path / "data"
    write_mds(local / "train")
    files = {f"mds/train/{p.name}": p.read_bytes() for p in sorted((local / "train").iterdir())}
    hub.add("datasets/org/mds-data", {**files, "README.md": b"# a dataset card"})
    env = online_env(hub, tmp_path / "hub-cache")
    from_local = train_trace(env, tmp_path, "local", {"local": str(local)})
    from_hub = train_trace(env, tmp_path, "hub", {"remote": "hf://datasets/org/mds-data/mds",
                                                  "local": str(tmp_path / "cache"), "predownload": 16})
    assert len(from_local["losses"]) == 200 // 8
    assert from_hub["batches"] == from_local["batches"] and from_hub["losses"] == from_local["losses"]

    from test_s3_storage import run_batch

    hub.page_size = 3
    try:
        out = run_batch(env, [{"op": "get", "uri": "hf://datasets/org/mds-data/README.md"},
                              {"op": "range", "uri": "hf://datasets/org/mds-data/README.md", "offset": 2, "length": 9},
                              {"op": "stat", "uri": "hf://datasets/org/mds-data/mds/train/index.json"},
                              {"op": "stat", "uri": "hf://datasets/org/mds-data/missing"},
                              {"op": "list", "uri": "hf://datasets/org/mds-data/mds/train/"},
                              {"op": "list", "uri": "hf://datasets/org/mds-data@main/REA"},
                              {"op": "put", "uri": "hf://datasets/org/mds-data/new.txt", "data": "x"}], tmp_path)
    finally:
        hub.page_size = 1000
    r = out["results"]
    assert r[0]["data"] == "# a dataset card" and r[1]["data"] == "a dataset"
    assert r[2]["size"] == len(files["mds/train/index.json"]) and r[3]["size"] is None
    assert [o[0] for o in r[4]["objects"]] == [f"hf://datasets/org/mds-data/{n}" for n in sorted(files)]
    assert [o[1] for o in r[4]["objects"]] == [len(files[n]) for n in sorted(files)]
    assert [o[0] for o in r[5]["objects"]] == ["hf://datasets/org/mds-data@main/README.md"]
    assert "refused the preupload (HTTP 401" in r[6]["error"] and "no token was sent" in r[6]["error"]
