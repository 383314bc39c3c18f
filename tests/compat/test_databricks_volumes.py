"""Tessera's Unity Catalog volume backend (dbfs:/Volumes/...; src/storage/dbfs_store.cpp) against a loopback
Databricks workspace (tests/compat/databricks_server.py) with databricks-sdk and mosaicml-streaming as the peers:

- files either side writes read back identically through the other (small, 37 MiB in parallel ranges, an empty one,
  several buffers), ranges, paged recursive listings, stat, deletes; a missing file is an error naming its URI;
- MDS shards that Streaming's own MDSWriter uploaded to a volume train Tessera exactly as the local copy does;
- checkpoints saved to a volume autoresume past a corrupt and an interrupted one, bitwise;
- a missing volume fails the run before training, naming it;
- OAuth machine-to-machine tokens (a service principal from ~/.databrickscfg) are refreshed as they expire mid-run,
  and a wrong secret or token is a clear error that does not print it;
- transient failures (500, 503, resets, stalls) are retried, and a failed upload publishes nothing;
- large files go in parts through presigned URLs both ways as databricks-sdk's files client sends them (expired
  URLs replaced, a refused part aborts the upload, the workspace's token never reaches the cloud store), and a
  workspace without multipart uploads gets single PUTs.
"""
import os

import pytest

from remote_training import checkpoints_autoresume_in_a_store, round_trip_through_a_store, train_trace, write_mds
from test_s3_checkpoints import data, recipe, train  # noqa: F401 (data is a fixture)
from test_s3_storage import run_batch


@pytest.fixture(scope="module")
def workspace():
    from databricks_server import DatabricksServer

    server = DatabricksServer()
    yield server
    server.stop()


@pytest.fixture
def volume(workspace, request):
    import re

    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40]
    return workspace.create_volume("main", "tessera", name)


def sdk_path(uri):
    return uri[len("dbfs:"):]


def read_back(workspace, uri):
    return workspace.client().files.download(sdk_path(uri)).contents.read()


def upload(workspace, uri, data):
    import io

    workspace.client().files.upload(sdk_path(uri), io.BytesIO(data), overwrite=True)


def test_files_round_trip_with_databricks_sdk(workspace, volume, tmp_path):
    workspace.page_size = 2  # every listing takes pages
    try:
        round_trip_through_a_store(workspace.env(), tmp_path, volume,
                                   lambda key, body: upload(workspace, f"{volume}/{key}", body),
                                   lambda key: read_back(workspace, f"{volume}/{key}"), "NOT_FOUND")
        upload(workspace, f"{volume}/deep/er/x.bin", b"x")  # listings walk folders, and a missing one holds nothing
        out = run_batch(workspace.env(), [{"op": "list", "uri": f"{volume}/deep"},
                                          {"op": "list", "uri": f"{volume}/no-such-folder/"}], tmp_path, "walk")
    finally:
        workspace.page_size = 1000
    r = out["results"]
    assert r[0].get("objects") == [[f"{volume}/deep/er/x.bin", 1, ""]], r[0]
    assert r[1].get("error") is None and r[1].get("objects") is None
    assert all(s[2] == "pat" for s in workspace.seen)


def test_training_from_a_volume_streaming_wrote_equals_training_from_local_data(workspace, volume, tmp_path,
                                                                                monkeypatch):
    local = tmp_path / "data"
    write_mds(local / "train")
    for k, v in workspace.env().items():  # Streaming's uploader is databricks-sdk's WorkspaceClient() from the env
        if k.startswith("DATABRICKS_"):
            monkeypatch.setenv(k, v)
    write_mds((str(tmp_path / "staging"), f"{volume}/ds/train"))
    assert sorted(o.name for o in workspace.client().files.list_directory_contents(sdk_path(f"{volume}/ds/train"))) \
        == sorted(p.name for p in (local / "train").iterdir())

    from_local = train_trace(workspace.env(), tmp_path, "local", {"local": str(local)})
    from_volume = train_trace(workspace.env(), tmp_path, "volume", {"remote": f"{volume}/ds",
                                                                    "local": str(tmp_path / "cache"),
                                                                    "cache_limit": "40kb", "predownload": 16})
    assert len(from_local["losses"]) == 200 // 8
    assert from_volume["batches"] == from_local["batches"]
    assert from_volume["losses"] == from_local["losses"]  # bitwise: the same floats


def test_checkpoints_in_a_volume_autoresume_past_a_corrupt_and_an_interrupted_one(workspace, volume, data, tmp_path):
    root = sdk_path(volume) + "/"
    checkpoints_autoresume_in_a_store(
        workspace.env(), tmp_path, data, volume,
        list_keys=lambda prefix: [p[len(root):] for p in workspace.files if p.startswith(root + prefix)],
        read=lambda key: read_back(workspace, f"{volume}/{key}"),
        write=lambda key, body: upload(workspace, f"{volume}/{key}", body))


def test_a_missing_volume_fails_the_run_before_training_naming_it(workspace, data, tmp_path):
    rec = recipe(tmp_path, data, tmp_path / "runs")
    folder = "dbfs:/Volumes/main/tessera/no_such_volume/ckpt"
    proc = train(workspace.env(), rec, "run_name=nv", f"save_folder={folder}", "max_duration=2ba", check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert folder in out and "NOT_FOUND" in out and "not in an existing volume" in out, out[-3000:]
    assert not (tmp_path / "runs" / "nv" / "metrics.jsonl").exists()


def test_oauth_tokens_from_a_profile_are_refreshed_mid_run_and_bad_credentials_are_clear(workspace, volume,
                                                                                           tmp_path):
    workspace.oauth_clients["sp-trainer"] = "dose-secret-for-the-test"
    workspace.token_lifetime_s = 2  # refreshed after half its life: several tokens over the batch below
    cfg = tmp_path / "databrickscfg"
    cfg.write_text(f"[DEFAULT]\nhost = {workspace.url}\ntoken = dapi-not-this-one\n\n[trainer]\nhost = "
                   f"{workspace.url}\nclient_id = sp-trainer\nclient_secret = dose-secret-for-the-test\n")
    env = workspace.env(DATABRICKS_HOST=None, DATABRICKS_TOKEN=None, DATABRICKS_CONFIG_FILE=str(cfg),
                        DATABRICKS_CONFIG_PROFILE="trainer")
    data = os.urandom(3 << 20)
    (tmp_path / "d.bin").write_bytes(data)
    before, seen_before = len(workspace.token_requests), len(workspace.seen)
    try:
        ops = []
        for i in range(4):
            ops += [{"op": "put_file", "path": str(tmp_path / "d.bin"), "uri": f"{volume}/t/{i}"},
                    {"op": "sleep", "seconds": 1.2}]
        ops += [{"op": "download", "uri": f"{volume}/t/3", "path": str(tmp_path / "back.bin")},
                {"op": "list", "uri": f"{volume}/t/"}]
        out = run_batch(env, ops, tmp_path)
        assert [x.get("error") for x in out["results"]] == [None] * len(ops)
        assert (tmp_path / "back.bin").read_bytes() == data and len(out["results"][-1]["objects"]) == 4
        fetched = workspace.token_requests[before:]
        assert len(fetched) >= 3 and all(f[0] == "sp-trainer" for f in fetched), fetched
        mine = workspace.seen[seen_before:]
        assert mine and all(s[2] == "oauth" and s[3] < 400 for s in mine)  # no request met an expired token

        cfg.write_text(cfg.read_text().replace("dose-secret-for-the-test", "not-the-secret"))
        out = run_batch(env, [{"op": "stat", "uri": f"{volume}/t/0"}], tmp_path, "wrong")
        err = out["results"][0]["error"]
        assert f"OAuth machine-to-machine for client sp-trainer ({cfg} [trainer])" in err, err
        assert "invalid_client" in err and "not-the-secret" not in err, err
    finally:
        workspace.token_lifetime_s = 3600

    out = run_batch(workspace.env(DATABRICKS_TOKEN="dapi-revoked"), [{"op": "stat", "uri": f"{volume}/t/0"}],
                    tmp_path, "revoked")
    err = out["results"][0]["error"]
    assert f"{volume}/t/0: HEAD HTTP 401" in err and "credentials from DATABRICKS_TOKEN" in err, err
    assert "dapi-revoked" not in err
    out = run_batch(workspace.env(DATABRICKS_HOST=None), [{"op": "stat", "uri": f"{volume}/t/0"}], tmp_path, "nohost")
    assert "no Databricks workspace: set DATABRICKS_HOST" in out["results"][0]["error"]


def test_transient_failures_are_retried_and_a_failed_upload_publishes_nothing(tmp_path):
    from databricks_server import DatabricksServer
    from s3_server import FaultProxy

    server = DatabricksServer()
    proxy = FaultProxy(server.url, stall_s=4)
    try:
        vol = server.create_volume("main", "faults", "v")
        data = os.urandom(40 * 1024 * 1024)
        upload(server, f"{vol}/obj", data)
        upload(server, f"{vol}/up", b"the previous version")
        env = server.env(host=proxy.url, TESSERA_DBFS_STALL_TIMEOUT_S="1")
        (tmp_path / "up.bin").write_bytes(data[::-1])
        proxy.plan = ["503", "500", "reset", "stall", "ok", "reset", "ok", "500", "503", "reset", "stall"]
        out = run_batch(env, [{"op": "download", "uri": f"{vol}/obj", "path": str(tmp_path / "obj")},
                              {"op": "put_file", "path": str(tmp_path / "up.bin"), "uri": f"{vol}/up"}], tmp_path)
        assert [r.get("error") for r in out["results"]] == [None, None]
        assert (tmp_path / "obj").read_bytes() == data
        assert read_back(server, f"{vol}/up") == data[::-1]
        assert not proxy.plan  # every planned failure was met, and survived

        proxy.plan, proxy.after = [], "503"
        out = run_batch({**env, "TESSERA_DBFS_MAX_ATTEMPTS": "3"},
                        [{"op": "put_file", "path": str(tmp_path / "obj"), "uri": f"{vol}/up"}], tmp_path, "failing")
        err = out["results"][0]["error"]
        assert f"{vol}/up: PUT HTTP 503" in err and "gave up after 3 attempts" in err, err
        proxy.after = "ok"
        assert read_back(server, f"{vol}/up") == data[::-1]
    finally:
        server.stop()
        proxy.stop()


def test_large_files_go_in_parts_through_presigned_urls_as_databricks_sdk_sends_them(workspace, volume, tmp_path):
    import io

    sdk = workspace.client()  # databricks-sdk's default files client: 60 MiB in 10 MiB parts
    data = os.urandom(60 << 20)
    puts = len(workspace.part_puts)
    sdk.files.upload(sdk_path(f"{volume}/sdk.bin"), io.BytesIO(data), overwrite=True)
    assert len(workspace.part_puts) - puts == 6
    puts = len(workspace.part_puts)

    # Tessera in 1 MiB parts above 1 MiB: a mapped file and one of several buffers (cut off part boundaries), with two
    # part URLs handed out already expired and a part answered 503 on the way.
    env = workspace.env(TESSERA_DBFS_MULTIPART_THRESHOLD_MB="1", TESSERA_DBFS_PART_SIZE_MB="1")
    mine = os.urandom((11 << 19) + 7)
    (tmp_path / "mine.bin").write_bytes(mine)
    workspace.expire_urls, workspace.part_faults = 2, ["503"]
    out = run_batch(env, [{"op": "download", "uri": f"{volume}/sdk.bin", "path": str(tmp_path / "sdk.bin")},
                          {"op": "put_file", "path": str(tmp_path / "mine.bin"), "uri": f"{volume}/mine.bin"},
                          {"op": "put_parts", "path": str(tmp_path / "mine.bin"), "cuts": [1000, 3 << 20],
                           "uri": f"{volume}/parts.bin"}], tmp_path)
    assert [r.get("error") for r in out["results"]] == [None] * 3
    assert (tmp_path / "sdk.bin").read_bytes() == data
    assert sdk.files.download(sdk_path(f"{volume}/mine.bin")).contents.read() == mine
    assert read_back(workspace, f"{volume}/parts.bin") == mine
    parts = workspace.part_puts[puts:]
    assert sorted(n for n, _, status in parts if status < 300) == sorted(list(range(1, 7)) * 2), parts
    assert sorted(status for _, _, status in parts if status >= 300) == [403, 403, 503], parts
    assert not any(auth for _, auth, _ in parts)  # the workspace's token stays with the workspace
    assert not workspace.uploads  # every session was completed

    # A part the cloud store refuses: the upload is aborted, the older file stays, and the error names the URI and
    # the part but not the URL (its signature is a credential).
    puts = len(workspace.part_puts)
    workspace.part_faults = ["403"]
    (tmp_path / "other.bin").write_bytes(mine[::-1])
    out = run_batch(env, [{"op": "put_file", "path": str(tmp_path / "other.bin"), "uri": f"{volume}/mine.bin"}],
                    tmp_path, "refused")
    err = out["results"][0]["error"]
    assert f"{volume}/mine.bin: part" in err and "PUT HTTP 403 from the cloud store (AccessDenied)" in err, err
    assert "sig=" not in err and "/storage/" not in err, err
    assert workspace.aborted[-1] == sdk_path(f"{volume}/mine.bin") and not workspace.uploads
    assert read_back(workspace, f"{volume}/mine.bin") == mine
    assert [status for _, _, status in workspace.part_puts[puts:] if status >= 300] == [403]

    # A workspace that offers single PUTs only gets one.
    puts = len(workspace.part_puts)
    workspace.multipart = False
    try:
        out = run_batch(env, [{"op": "put_file", "path": str(tmp_path / "other.bin"), "uri": f"{volume}/mine.bin"}],
                        tmp_path, "single")
    finally:
        workspace.multipart = True
    assert out["results"][0].get("error") is None
    assert read_back(workspace, f"{volume}/mine.bin") == mine[::-1]
    assert len(workspace.part_puts) == puts


def test_training_through_a_failing_workspace_equals_the_clean_run(data, tmp_path):
    # 10% of the requests fail (500, 503, resets, answers cut halfway, stalls) while a run streams its data from a
    # volume and saves checkpoints there: the run ends bitwise equal to the clean one, every checkpoint whole.
    from databricks_server import DatabricksServer
    from remote_training import training_through_faults
    from s3_server import FaultProxy

    server = DatabricksServer()
    proxy = FaultProxy(server.url, stall_s=3)
    try:
        vol = server.create_volume("main", "faults", "v")
        root = sdk_path(vol) + "/"
        training_through_faults(
            server.env(), server.env(host=proxy.url, TESSERA_DBFS_STALL_TIMEOUT_S="1"), proxy, tmp_path, data, vol,
            list_keys=lambda prefix: [p[len(root):] for p in server.files if p.startswith(root + prefix)],
            read=lambda key: read_back(server, f"{vol}/{key}"))
    finally:
        server.stop()
        proxy.stop()


def test_conditional_writes_a_first_one_checked_by_the_workspace(workspace, volume, tmp_path):
    # write_if (a checkpoint's `latest`): a first write is a PUT with overwrite=false, which the workspace refuses when
    # the file exists; a later one compares Last-Modified (to the second) before writing.
    uri = f"{volume}/cond/latest"
    out = run_batch(workspace.env(), [{"op": "put_if", "uri": uri, "data": "ep0-ba2", "expected": None},
                                      {"op": "put_if", "uri": uri, "data": "ep0-ba4", "expected": None},
                                      {"op": "sleep", "seconds": 1.1},
                                      {"op": "stat", "uri": uri}], tmp_path, "first")
    r = out["results"]
    assert r[0]["etag"] and r[1] == {"etag": None} and r[3]["etag"] == r[0]["etag"], r
    assert ("PUT", sdk_path(uri), "pat", 409) in workspace.seen  # the workspace refused the second first write
    out = run_batch(workspace.env(), [{"op": "put_if", "uri": uri, "data": "ep0-ba4", "expected": r[0]["etag"]},
                                      {"op": "put_if", "uri": uri, "data": "ep0-ba6", "expected": r[0]["etag"]},
                                      {"op": "get", "uri": uri}], tmp_path, "later")
    r = out["results"]
    assert r[0]["etag"] and r[1] == {"etag": None} and r[2]["data"] == "ep0-ba4", r
