"""Writes to Hugging Face Hub repositories (hf://, src/storage/hf_store.cpp) against a loopback Hub that follows the
protocol huggingface.co speaks (tests/compat/hub_server.py), with huggingface_hub as the peer:

- huggingface_hub's upload_folder commits to the loopback Hub (regular files, LFS basic and multipart uploads) and
  Tessera reads its files byte for byte; Tessera's writes (a folder, a file, a checkpoint's buffers, a removal) are
  commits huggingface_hub's snapshot_download reads byte for byte; a folder is one commit; a missing repository is
  created private; objects the Hub has already are not sent again; the token never goes to the storage host;
- hf_checkpointer's export to `hf://org/name` is one commit that equals the local export byte for byte, and
  transformers loads it from huggingface_hub's download (an export over an older one deletes its leftovers in the same
  commit);
- a read-only token, a missing token, an ignored file and a missing Space are refused naming the repository, never the
  token; transient failures (500/503, resets, stalls) on the API and on the uploads are retried, and an upload that
  gives up commits nothing.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import _binary
from test_s3_checkpoints import data  # noqa: F401 (data is a fixture)
from test_s3_storage import run_batch

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def hub():
    from hub_server import HubServer

    server = HubServer()
    # Small thresholds, so a few MiB exercise every path: LFS from 1 MiB, multipart above 3 MiB in 1 MiB parts.
    server.lfs_threshold, server.multipart_threshold, server.chunk_size = 1 << 20, 3 << 20, 1 << 20
    yield server
    server.stop()


def env_for(hub, tmp_path, token=None, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "hub-cache"), HF_HOME=str(tmp_path / "hf-home"),
               HF_TOKEN=hub.token if token is None else token)
    env.update(extra)
    if token == "":
        del env["HF_TOKEN"]
    return env


def peer(hub, tmp_path, code):
    """Runs `code` with huggingface_hub online against the loopback Hub (this process is offline: conftest), `api`
    an HfApi with the token; returns what it prints."""
    script = f"from huggingface_hub import HfApi, snapshot_download\napi = HfApi(token={hub.token!r})\n{code}"
    proc = subprocess.run([sys.executable, "-c", script], env=env_for(hub, tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def make_folder(root, seed=0):
    """A folder with every kind of file: small text (regular), an empty file, a 2 MiB LFS file (basic upload), a
    5.5 MiB one (multipart: six 1 MiB parts, the last short), nested."""
    rng = __import__("random").Random(seed)
    files = {"config.json": json.dumps({"seed": seed}).encode(), "empty.txt": b"",
             "model.safetensors": rng.randbytes(2 << 20), "sub/dir/big.bin": rng.randbytes((11 << 19) + 5),
             "sub/notes.md": b"# notes\n" * 10}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def downloaded(hub, tmp_path, repo_id, repo_type=None):
    """The files of `repo_id` as huggingface_hub's snapshot_download fetches them."""
    folder = pathlib.Path(peer(hub, tmp_path, f"print(snapshot_download({repo_id!r}, repo_type={repo_type!r}, "
                                              f"token={hub.token!r}, cache_dir={str(tmp_path / 'peer-cache')!r}))"))
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_tessera_and_huggingface_hub_read_each_others_commits(hub, tmp_path):
    # The peer writes: upload_folder's commit is read back by Tessera byte for byte.
    peer_dir, ours_dir = tmp_path / "peer", tmp_path / "ours"
    peer_files, ours = make_folder(peer_dir, 1), make_folder(ours_dir, 2)
    peer(hub, tmp_path, f"api.create_repo('org/peer', private=True)\n"
                        f"api.upload_folder(repo_id='org/peer', folder_path={str(peer_dir)!r}, "
                        f"commit_message='from huggingface_hub')")
    assert any(path.startswith("/lfs-part/") for _, path, _ in hub.seen)  # the peer took the multipart path too
    env = env_for(hub, tmp_path)
    seen_before = len(hub.seen)
    # Downloads in 1 MiB ranges: the LFS files' ranges go to the CDN, pinned to the commit the first answer named.
    out = run_batch({**env, "TESSERA_HF_PART_SIZE_MB": "1"},
                    [{"op": "get", "uri": f"hf://org/peer/{n}"} for n in ("config.json", "sub/notes.md")] +
                    [{"op": "download", "uri": f"hf://org/peer/{n}", "path": str(tmp_path / "down" / n)}
                     for n in ("model.safetensors", "sub/dir/big.bin", "empty.txt")], tmp_path, "read")
    assert [r.get("error") for r in out["results"]] == [None] * 5
    assert [r["data"].encode() for r in out["results"][:2]] == [peer_files["config.json"], peer_files["sub/notes.md"]]
    for n in ("model.safetensors", "sub/dir/big.bin", "empty.txt"):
        assert (tmp_path / "down" / n).read_bytes() == peer_files[n], n
    commit = hub.repos["org/peer"]["commit"]
    ranges = [r for r in hub.seen[seen_before:] if r[1].startswith("/cdn/")]
    assert len(ranges) == 2 + 6 and not any(token for _, _, token in ranges)
    assert sum(r[1] == f"/org/peer/resolve/{commit}/sub/dir/big.bin" for r in hub.seen[seen_before:]) == 6

    # Tessera writes into a repository that does not exist yet: it is created, private.
    (tmp_path / "parts.bin").write_bytes(b"".join(bytes([i]) * (700 << 10) for i in range(6)))  # 4.1 MiB
    seen_before = len(hub.seen)
    out = run_batch(env, [
        {"op": "put_tree", "path": str(ours_dir), "uri": "hf://datasets/org/made/export", "last": ["config.json"]},
        {"op": "put", "uri": "hf://datasets/org/made/single.txt", "data": "one file, one commit"},
        {"op": "put_parts", "path": str(tmp_path / "parts.bin"), "cuts": [1000, 3 << 20],
         "uri": "hf://datasets/org/made/ckpt/rank0.safetensors"},
        {"op": "remove", "uri": "hf://datasets/org/made/never-written.txt"},
        {"op": "remove", "uri": "hf://datasets/org/made/single.txt"},
        {"op": "stat", "uri": "hf://datasets/org/made/export/sub/dir/big.bin"},
        {"op": "list", "uri": "hf://datasets/org/made/export/sub/"}], tmp_path, "write")
    assert [r.get("error") for r in out["results"]] == [None] * 7
    repo = hub.repos["datasets/org/made"]
    assert repo["private"]
    # The folder is one commit, config.json last; a missing file's removal commits nothing.
    assert [(c["summary"], c["added"], c["deleted"]) for c in repo["commits"]] == [
        ("Upload export with Tessera (5 files)", [f"export/{n}" for n in sorted(ours) if n != "config.json"] +
         ["export/config.json"], []),
        ("Upload single.txt with Tessera", ["single.txt"], []),
        ("Upload ckpt/rank0.safetensors with Tessera", ["ckpt/rank0.safetensors"], []),
        ("Delete single.txt with Tessera", [], ["single.txt"])]
    assert out["results"][5]["size"] == len(ours["sub/dir/big.bin"])
    assert [o[0] for o in out["results"][6]["objects"]] == ["hf://datasets/org/made/export/sub/dir/big.bin",
                                                           "hf://datasets/org/made/export/sub/notes.md"]
    # The peer downloads exactly what Tessera wrote; the LFS files went to LFS, the small ones into the commit.
    got = downloaded(hub, tmp_path, "org/made", "dataset")
    assert got == {**{f"export/{n}": d for n, d in ours.items()},
                   "ckpt/rank0.safetensors": (tmp_path / "parts.bin").read_bytes()}
    assert set(repo["lfs"]) == {"export/model.safetensors", "export/sub/dir/big.bin", "ckpt/rank0.safetensors"}
    ours_requests = hub.seen[seen_before:]
    # The storage host never saw the token; the uploads ran as multipart where the Hub asked for it.
    assert not [r for r in ours_requests if r[1].startswith("/lfs-") and r[2]]
    assert len([r for r in ours_requests if r[1].startswith("/lfs-part/")]) == 6 + 5
    assert ("POST", "/api/repos/create", True) in ours_requests

    # The same folder again: the Hub has its LFS objects, so nothing but the commit goes up.
    seen_before = len(hub.seen)
    out = run_batch(env, [{"op": "put_tree", "path": str(ours_dir), "uri": "hf://datasets/org/made/copy"}], tmp_path,
                    "again")
    assert out["results"] == [{}]
    assert not [r for r in hub.seen[seen_before:] if r[1].startswith("/lfs-")]
    assert hub.repos["datasets/org/made"]["files"]["copy/sub/dir/big.bin"] == ours["sub/dir/big.bin"]


def test_streaming_and_tessera_exchange_mds_datasets_through_the_hub(hub, tmp_path):
    # Streaming's MDSWriter uploads through its HFUploader (huggingface_hub's HfFileSystem, one commit per file) and
    # Tessera trains from that repository exactly as from the same shards on disk; Tessera's convert_text_to_mds
    # writes its shards to hf:// and Streaming's StreamingDataset (hf_hub_download) reads the samples the local
    # conversion holds.
    from remote_training import train_trace, write_mds

    write_mds(tmp_path / "local" / "train")
    hub.add("datasets/org/streamed", {})  # (HFUploader wants the repository to exist)
    peer(hub, tmp_path, f"""
import sys
sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
from remote_training import write_mds
write_mds("hf://datasets/org/streamed/")""")
    # (Streaming's HFUploader takes no (local, remote) pair, and puts every file at the repository's root whatever
    # path the URI names.)
    assert len(hub.repos["datasets/org/streamed"]["commits"]) == len(list((tmp_path / "local" / "train").iterdir()))
    env = env_for(hub, tmp_path)
    from_local = train_trace(env, tmp_path, "local-run", {"local": str(tmp_path / "local")})
    from_hub = train_trace(env, tmp_path, "hub-run", {"remote": "hf://datasets/org/streamed", "split": None,
                                                      "local": str(tmp_path / "cache")})
    assert from_hub["batches"] == from_local["batches"] and from_hub["losses"] == from_local["losses"]

    docs = [f"document {i}: " + " ".join(f"w{(i * 7 + j) % 50}" for j in range(i % 40 + 1)) for i in range(300)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(docs, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    for out in (tmp_path / "converted", "hf://datasets/org/converted"):
        proc = subprocess.run([_binary("TESSERA_CONVERT_BIN", "convert_text_to_mds"), "--input", tmp_path / "docs.jsonl",
                               "--format", "jsonl", "--tokenizer", tmp_path / "tokenizer.json", "--output", out,
                               "--concat-tokens", "16", "--eos-text", "<|endoftext|>", "--compression", "zstd",
                               "--size-limit", "4000"], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    samples = peer(hub, tmp_path, f"""
import json
from streaming import StreamingDataset
d = StreamingDataset(remote="hf://datasets/org/converted", local={str(tmp_path / 'py-cache')!r}, split="train",
                     shuffle=False, batch_size=1)
print(json.dumps([d[i]["tokens"].tolist() for i in range(d.num_samples)]))""")
    from streaming import StreamingDataset

    local = StreamingDataset(local=str(tmp_path / "converted"), split="train", shuffle=False, batch_size=1)
    assert json.loads(samples) == [local[i]["tokens"].tolist() for i in range(local.num_samples)]
    assert local.num_samples > 100


def test_refusals_name_the_repository_and_never_the_token(hub, tmp_path):
    hub.add("org/model", {"README.md": b"hi"})
    hub.ignored.add("logs/debug.txt")
    ops = [{"op": "put", "uri": "hf://org/model/a.txt", "data": "x"}]
    cases = {
        "read-only": (env_for(hub, tmp_path, token=hub.read_token), ops),
        "no-token": (env_for(hub, tmp_path, token=""), ops),
        "ignored": (env_for(hub, tmp_path), [{"op": "put", "uri": "hf://org/model/logs/debug.txt", "data": "x"}]),
        "space": (env_for(hub, tmp_path), [{"op": "put", "uri": "hf://spaces/org/app/app.py", "data": "x"}]),
        "no-file": (env_for(hub, tmp_path), [{"op": "put", "uri": "hf://org/model", "data": "x"}]),
        "branch": (env_for(hub, tmp_path), [{"op": "put", "uri": "hf://org/model@dev/a.txt", "data": "x"}]),
    }
    errors = {name: run_batch(env, o, tmp_path, name)["results"][0].get("error", "") for name, (env, o) in
              cases.items()}
    assert "hf://org/model/a.txt: the Hugging Face Hub at" in errors["read-only"]
    assert "refused the preupload (HTTP 403, Forbidden" in errors["read-only"]
    assert "needs write access" in errors["read-only"]
    assert "(HTTP 401" in errors["no-token"] and "no token was sent" in errors["no-token"]
    assert "the repository's .gitignore ignores logs/debug.txt" in errors["ignored"]
    assert "the Space org/app does not exist; create it first" in errors["space"]
    assert "hf://org/model: names no file inside the repository" in errors["no-file"]
    assert "RevisionNotFound" in errors["branch"]
    for e in errors.values():
        assert hub.token not in e and hub.read_token not in e, e
    assert hub.repos["org/model"]["commits"] == [] and "spaces/org/app" not in hub.repos


def test_an_export_to_the_hub_is_one_commit_that_transformers_loads(hub, tmp_path):
    import torch
    import transformers

    from remote_training import write_mds
    from test_s3_checkpoints import recipe, train

    write_mds(tmp_path / "data" / "train")
    runs = tmp_path / "runs"
    rec = recipe(tmp_path, tmp_path / "data", runs)
    env = env_for(hub, tmp_path)
    args = ["max_duration=4ba", "callbacks.hf_checkpointer.save_interval=2ba"]
    train(env, rec, "run_name=local", *args)
    train(env, rec, "run_name=hub", *args, "callbacks.hf_checkpointer.save_folder=hf://org/{run_name}-exports")
    repo = hub.repos["org/hub-exports"]
    # One commit per export (ba2, ba4), config.json last in each; the bytes equal the local export's.
    local = {f"huggingface/{p.relative_to(runs / 'local' / 'huggingface').as_posix()}": p.read_bytes()
             for p in sorted((runs / "local" / "huggingface").rglob("*")) if p.is_file()}
    assert [c["added"][-1] for c in repo["commits"]] == ["huggingface/ba2/config.json", "huggingface/ba4/config.json"]
    assert [sorted(c["added"]) for c in repo["commits"]] == [sorted(n for n in local if f"/ba{b}/" in n)
                                                            for b in (2, 4)]
    assert repo["files"] == local

    assert downloaded(hub, tmp_path, "org/hub-exports") == local
    folder = peer(hub, tmp_path, f"print(snapshot_download('org/hub-exports', cache_dir={str(tmp_path / 'peer')!r}))")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, subfolder="huggingface/ba4")
    ids = torch.arange(8).reshape(1, 8)
    reference = transformers.AutoModelForCausalLM.from_pretrained(runs / "local" / "huggingface" / "ba4")
    assert torch.equal(model(ids).logits, reference(ids).logits)

    # An export over an older one with a file the new one lacks: the leftover goes in the same commit.
    hub.repos["org/hub-exports"]["files"]["huggingface/ba4/stale.txt"] = b"from an older export"
    train(env, rec, "run_name=hub", *args, "callbacks.hf_checkpointer.save_folder=hf://org/{run_name}-exports",
          "callbacks.hf_checkpointer.overwrite=true")
    last = repo["commits"][-1]
    assert last["deleted"] == ["huggingface/ba4/stale.txt"] and "huggingface/ba4/stale.txt" not in repo["files"]
    assert repo["files"] == local

    # A token that may only read is refused by the pre-flight check, before the first batch, naming the repository.
    commits = len(repo["commits"])
    proc = train(env_for(hub, tmp_path, token=hub.read_token), rec, "run_name=denied", *args,
                 "callbacks.hf_checkpointer.save_folder=hf://org/hub-exports", check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "hf://org/hub-exports: the Hugging Face Hub" in log, log
    assert "nothing was started or written" in log and "needs write access" in log, log
    assert hub.read_token not in log and not (runs / "denied").exists()
    assert len(repo["commits"]) == commits


def test_transient_failures_are_retried_and_a_failed_upload_commits_nothing(hub, tmp_path):
    from s3_server import FaultProxy

    proxy = FaultProxy(hub.url, stall_s=4)
    try:
        hub.storage_url = proxy.url.replace("127.0.0.1", "localhost")  # uploads through the proxy too
        hub.add("org/faults", {"README.md": b"before"})
        files = make_folder(tmp_path / "f", 3)
        env = env_for(hub, tmp_path, HF_ENDPOINT=proxy.url, TESSERA_HF_STALL_TIMEOUT_S="1")
        # Failures of every kind, several in a row: on preupload, the LFS batch, the PUTs, the completion, the commit.
        proxy.plan = ["503", "500", "ok", "reset", "ok", "stall", "ok", "503", "ok", "reset", "ok", "500", "ok",
                      "stall", "ok", "503"]
        out = run_batch(env, [{"op": "put_tree", "path": str(tmp_path / "f"), "uri": "hf://org/faults/run"}],
                        tmp_path)
        assert out["results"] == [{}]
        assert not proxy.plan
        assert {n: hub.repos["org/faults"]["files"][f"run/{n}"] for n in files} == files
        assert len(hub.repos["org/faults"]["commits"]) == 1

        # A Hub that fails everything after the first requests: the upload gives up, naming what failed, and the
        # repository is as it was (no commit, no file).
        before = dict(hub.repos["org/faults"]["files"])
        files = make_folder(tmp_path / "g", 4)
        proxy.plan, proxy.after = ["ok", "ok"], "503"
        out = run_batch({**env, "TESSERA_HF_MAX_ATTEMPTS": "3"},
                        [{"op": "put_tree", "path": str(tmp_path / "g"), "uri": "hf://org/faults/run2"}], tmp_path,
                        "failing")
        err = out["results"][0]["error"]
        assert "hf://org/faults/run2" in err and "HTTP 503" in err and "X-Amz-Signature" not in err, err
        proxy.after = "ok"
        assert hub.repos["org/faults"]["files"] == before and len(hub.repos["org/faults"]["commits"]) == 1
    finally:
        proxy.stop()


def test_conditional_writes_are_checked_by_the_hub(hub, tmp_path):
    """storage::write_if on hf:// (how a checkpoint's `latest` is written): compared at the branch's commit, then
    committed with that commit as `parentCommit`, so a commit another writer lands in between makes the Hub refuse
    Tessera's; the ETag is the one huggingface_hub reads (the git blob id, an LFS file's SHA-256)."""
    from remote_training import conditional_writes

    env = env_for(hub, tmp_path)
    conditional_writes(env, tmp_path, "hf://org/cond")
    data = hub.repos["org/cond"]["files"]["cond/latest"]
    etag = peer(hub, tmp_path, "from huggingface_hub import get_hf_file_metadata, hf_hub_url\n"
                               "print(get_hf_file_metadata(hf_hub_url('org/cond', 'cond/latest'), token=api.token).etag)")
    out = run_batch(env, [{"op": "put_if", "uri": "hf://org/cond/cond/latest", "data": data.decode(),
                           "expected": etag}], tmp_path, "same")
    assert out["results"][0]["etag"] == etag  # its own bytes: the ETag huggingface_hub reads

    def another_writer(repo):
        repo["files"]["cond/latest"] = b"ep0-ba8 from another writer"
        repo["commit"] = "f" * 40

    hub.before_commit = another_writer
    commits = len(hub.repos["org/cond"]["commits"])
    out = run_batch(env, [{"op": "put_if", "uri": "hf://org/cond/cond/latest", "data": "ep0-ba10", "expected": etag},
                          {"op": "get", "uri": "hf://org/cond/cond/latest"}], tmp_path, "race")
    assert out["results"][0] == {"etag": None}, out
    assert out["results"][1]["data"] == "ep0-ba8 from another writer"
    assert len(hub.repos["org/cond"]["commits"]) == commits  # the Hub made no commit of Tessera's

    big = os.urandom(2 << 20)  # an LFS file: its ETag is its SHA-256
    (tmp_path / "big.bin").write_bytes(big)
    out = run_batch(env, [{"op": "put_file", "path": str(tmp_path / "big.bin"), "uri": "hf://org/cond/big.bin"},
                          {"op": "stat", "uri": "hf://org/cond/big.bin"}], tmp_path, "lfs")
    assert out["results"][1]["etag"] == __import__("hashlib").sha256(big).hexdigest(), out


def test_training_through_a_failing_hub_equals_the_clean_run(hub, data, tmp_path):
    # 10% of the requests fail (500, 503, resets, answers cut halfway, stalls) while a run streams its data from a
    # dataset repository and saves checkpoints there (each write a commit; `latest` conditioned on its parent
    # commit): the run ends bitwise equal to the clean one, every checkpoint whole.
    from remote_training import training_through_faults
    from s3_server import FaultProxy

    proxy = FaultProxy(hub.url, stall_s=3)
    try:
        hub.storage_url = proxy.url.replace("127.0.0.1", "localhost")  # uploads through the proxy too
        hub.add("datasets/org/faults", {"README.md": b"a dataset"})
        repo = hub.repos["datasets/org/faults"]
        training_through_faults(
            env_for(hub, tmp_path), env_for(hub, tmp_path, HF_ENDPOINT=proxy.url, TESSERA_HF_STALL_TIMEOUT_S="1"),
            proxy, tmp_path, data, "hf://datasets/org/faults",
            list_keys=lambda prefix: sorted(n for n in repo["files"] if n.startswith(prefix)),
            read=lambda key: repo["files"][key])
    finally:
        proxy.stop()
