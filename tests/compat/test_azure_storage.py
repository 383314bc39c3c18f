"""Tessera's Azure Blob Storage backend (azure://, azure-dl://, abfss://; src/storage/azure_store.cpp) against a
loopback Blob service (tests/compat/azure_server.py) that checks every request's credential with azure-storage-blob's
own signing code, with azure-storage-blob as the peer client:

- blobs either side writes read back identically through the other (small, 37 MiB in blocks and parallel ranges, an
  empty one, several buffers), ranges, paged prefix listings, stat, deletes, the abfss:// and azure-dl:// spellings;
  a missing blob is an error naming its URI and nothing partial is left;
- a training run streaming MDS shards from azure:// (uploaded by the SDK) equals the run on the local copy;
- checkpoints saved to azure:// autoresume past a corrupt newest one and an interrupted one, bitwise;
- a missing container fails the run before training, naming it;
- SAS tokens (made by the SDK) read and list, and a write they do not allow is refused naming the credential source;
  so is a request signed with another account's key;
- Microsoft Entra tokens (client secret, workload identity, managed identity) are fetched, refreshed as they expire
  mid-run, and a wrong secret is a clear error that does not print it;
- transient failures (500, 503, resets, stalls) are retried, and a failed upload publishes nothing.
"""
import os

import pytest

from remote_training import checkpoints_autoresume_in_a_store, round_trip_through_a_store, train_trace, write_mds
from test_s3_checkpoints import data, recipe, train  # noqa: F401 (data is a fixture)
from test_s3_storage import run_batch


@pytest.fixture(scope="module")
def azure():
    from azure_server import AzureBlobServer

    server = AzureBlobServer()
    yield server
    server.stop()


@pytest.fixture
def container(azure, request):
    import re

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") + "-" + str(os.getpid() % 10000)
    azure.client().create_container(name)
    return name


def blob_bytes(azure, container, name):
    return azure.client().get_blob_client(container, name).download_blob().readall()


def upload(azure, container, name, data):
    azure.client().get_blob_client(container, name).upload_blob(data, overwrite=True)


def test_blobs_round_trip_with_azure_storage_blob(azure, container, tmp_path):
    # Tessera's 37 MiB objects go as three 16 MiB blocks; the SDK's in 4 MiB blocks. One read names the blob the
    # abfss:// way, the listing the azure-dl:// way; the listing takes three pages.
    azure.page_size = 3
    try:
        round_trip_through_a_store(
            azure.env(), tmp_path, f"azure://{container}", lambda key, body: upload(azure, container, key, body),
            lambda key: blob_bytes(azure, container, key), "BlobNotFound",
            get_base=f"abfss://{container}@devstoreaccount1.dfs.core.windows.net", list_base=f"azure-dl://{container}")
    finally:
        azure.page_size = 5000
    # Tessera's big uploads went up as blocks committed by one Put Block List; every request was Shared Key signed.
    mine = [s for s in azure.seen if f"/{container}/from-tessera/" in s[1]]
    assert sum(1 for s in mine if s[0] == "PUT") >= 2 * 4 + 2
    assert all(s[2] == "sharedkey" and s[3] is None for s in mine)

    from remote_training import conditional_writes

    conditional_writes(azure.env(), tmp_path, f"azure://{container}")  # Put Blob with If-Match / If-None-Match: *


def test_training_from_azure_equals_training_from_local_data(azure, container, tmp_path):
    local = tmp_path / "data"
    write_mds(local / "train")
    for f in sorted((local / "train").iterdir()):
        upload(azure, container, f"ds/train/{f.name}", f.read_bytes())
    from_local = train_trace(azure.env(), tmp_path, "local", {"local": str(local)})
    from_azure = train_trace(azure.env(), tmp_path, "azure", {"remote": f"azure://{container}/ds",
                                                               "local": str(tmp_path / "cache"),
                                                               "cache_limit": "40kb", "predownload": 16})
    assert len(from_local["losses"]) == 200 // 8
    assert from_azure["batches"] == from_local["batches"]
    assert from_azure["losses"] == from_local["losses"]  # bitwise: the same floats


def test_checkpoints_in_azure_autoresume_past_a_corrupt_and_an_interrupted_one(azure, container, data, tmp_path):
    cc = azure.client().get_container_client(container)
    checkpoints_autoresume_in_a_store(
        azure.env(), tmp_path, data, f"azure://{container}",
        list_keys=lambda prefix: [b.name for b in cc.list_blobs(name_starts_with=prefix)],
        read=lambda key: blob_bytes(azure, container, key), write=lambda key, body: upload(azure, container, key, body))


def test_a_missing_container_fails_the_run_before_training_naming_it(azure, data, tmp_path):
    rec = recipe(tmp_path, data, tmp_path / "runs")
    proc = train(azure.env(), rec, "run_name=nc", "save_folder=azure://no-such-container/ckpt", "max_duration=2ba",
                 check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "azure://no-such-container/ckpt" in out and "ContainerNotFound" in out, out[-3000:]
    assert "account devstoreaccount1 has no container no-such-container" in out, out[-3000:]
    assert not (tmp_path / "runs" / "nc" / "metrics.jsonl").exists()


def test_a_sas_token_reads_and_a_write_it_does_not_allow_is_refused(azure, container, tmp_path):
    upload(azure, container, "d/one", b"first")
    upload(azure, container, "d/two", b"second")
    token = azure.container_sas(container, "rl")
    env = azure.env(AZURE_STORAGE_CONNECTION_STRING=azure.connection_string(key=False), AZURE_STORAGE_SAS_TOKEN=token)
    out = run_batch(env, [{"op": "list", "uri": f"azure://{container}/d/"},
                          {"op": "get", "uri": f"azure://{container}/d/two"},
                          {"op": "put", "uri": f"azure://{container}/d/three", "data": "refused"}], tmp_path)
    r = out["results"]
    assert [o[0] for o in r[0]["objects"]] == [f"azure://{container}/d/one", f"azure://{container}/d/two"]
    assert r[1]["data"] == "second"
    err = r[2]["error"]
    assert f"azure://{container}/d/three: PUT HTTP 403 AuthorizationPermissionMismatch" in err, err
    assert "credentials from AZURE_STORAGE_SAS_TOKEN" in err, err
    sig = dict(p.split("=", 1) for p in token.split("&"))["sig"]
    assert sig not in err
    sas = [(s[0], s[3]) for s in azure.seen if s[2] == "sas" and f"/{container}" in s[1]]
    assert sas == [("GET", None), ("GET", None), ("PUT", "AuthorizationPermissionMismatch")]

    # Another account's key: the signature does not match, and the error says which credential was tried.
    wrong = azure.connection_string(key=False) + "AccountKey=" + "QUJD" * 21 + "QQ=="
    out = run_batch(azure.env(AZURE_STORAGE_CONNECTION_STRING=wrong),
                    [{"op": "get", "uri": f"azure://{container}/d/one"}], tmp_path, "wrong-key")
    err = out["results"][0]["error"]
    assert f"azure://{container}/d/one: GET HTTP 403 AuthenticationFailed" in err, err
    assert "credentials from AZURE_STORAGE_CONNECTION_STRING (AccountKey)" in err and "QUJD" not in err, err


def test_entra_tokens_are_refreshed_mid_run_and_a_wrong_secret_is_a_clear_error(azure, container, tmp_path):
    from azure_server import ACCOUNT

    azure.client_secrets["trainer-app"] = "s3cr3t-for-the-test"
    azure.token_lifetime_s = 2  # refreshed after half its life: several tokens over the batch below
    cs = azure.connection_string(key=False)
    env = azure.env(AZURE_STORAGE_CONNECTION_STRING=cs, AZURE_TENANT_ID="tenant-1", AZURE_CLIENT_ID="trainer-app",
                    AZURE_CLIENT_SECRET="s3cr3t-for-the-test", AZURE_AUTHORITY_HOST=azure.url)
    data = os.urandom(3 << 20)
    (tmp_path / "d.bin").write_bytes(data)
    before = len(azure.token_requests)
    try:
        ops = []
        for i in range(4):
            ops += [{"op": "put_file", "path": str(tmp_path / "d.bin"), "uri": f"azure://{container}/t/{i}"},
                    {"op": "sleep", "seconds": 1.2}]
        ops += [{"op": "download", "uri": f"azure://{container}/t/3", "path": str(tmp_path / "back.bin")},
                {"op": "list", "uri": f"azure://{container}/t/"}]
        out = run_batch(env, ops, tmp_path)
        assert [x.get("error") for x in out["results"]] == [None] * len(ops)
        assert (tmp_path / "back.bin").read_bytes() == data and len(out["results"][-1]["objects"]) == 4
        fetched = azure.token_requests[before:]
        assert len(fetched) >= 3, fetched  # refreshed as the tokens aged
        assert all(f[1] == "/tenant-1/oauth2/v2.0/token" and f[2]["client_id"] == "trainer-app" for f in fetched)
        mine = [s for s in azure.seen if f"/{ACCOUNT}/{container}/t/" in s[1] or
                (s[0], s[1]) == ("GET", f"/{ACCOUNT}/{container}")]  # the blobs' requests and the listing
        assert mine and all(s[2] == "bearer" and s[3] is None for s in mine)  # no request met an expired token

        # Workload identity: the federated token file is read at each refresh; then the instance metadata service.
        (tmp_path / "federated").write_text("eyJhbGciOi.federated-token.sig\n")
        azure.federated_tokens.add("eyJhbGciOi.federated-token.sig")
        wi = {k: v for k, v in env.items() if k != "AZURE_CLIENT_SECRET"}
        wi["AZURE_FEDERATED_TOKEN_FILE"] = str(tmp_path / "federated")
        mi = {k: v for k, v in env.items() if k not in ("AZURE_CLIENT_SECRET", "AZURE_TENANT_ID", "AZURE_CLIENT_ID")}
        mi["AZURE_POD_IDENTITY_AUTHORITY_HOST"] = azure.url
        for name, e in (("wi", wi), ("mi", mi)):
            out = run_batch(e, [{"op": "stat", "uri": f"azure://{container}/t/0"}], tmp_path, name)
            assert out["results"][0].get("size") == len(data), out
        assert azure.token_requests[-2][2]["client_assertion"] == "eyJhbGciOi.federated-token.sig"
        assert azure.token_requests[-1][1] == "/metadata/identity/oauth2/token"

        out = run_batch({**env, "AZURE_CLIENT_SECRET": "not-the-secret"},
                        [{"op": "get", "uri": f"azure://{container}/t/0"}], tmp_path, "wrong")
        err = out["results"][0]["error"]
        assert "Microsoft Entra client secret (AZURE_CLIENT_SECRET) for client trainer-app" in err, err
        assert "invalid_client" in err and "not-the-secret" not in err, err
    finally:
        azure.token_lifetime_s = 3600


def test_transient_failures_are_retried_and_a_failed_upload_publishes_nothing(tmp_path):
    from azure_server import AzureBlobServer
    from s3_server import FaultProxy

    server = AzureBlobServer()
    proxy = FaultProxy(server.url, stall_s=4)
    try:
        server.client().create_container("faults")
        data = os.urandom(40 * 1024 * 1024)
        upload(server, "faults", "obj", data)
        upload(server, "faults", "up", b"the previous version")
        env = server.env(AZURE_STORAGE_CONNECTION_STRING=server.connection_string(endpoint=proxy.url),
                         TESSERA_AZURE_STALL_TIMEOUT_S="1")
        (tmp_path / "up.bin").write_bytes(data[::-1])
        # Every kind of failure, several in a row, on a ranged download and on a block upload.
        proxy.plan = ["503", "500", "reset", "stall", "ok", "reset", "ok", "500", "ok", "503", "reset", "stall"]
        out = run_batch(env, [{"op": "download", "uri": "azure://faults/obj", "path": str(tmp_path / "obj")},
                              {"op": "put_file", "path": str(tmp_path / "up.bin"), "uri": "azure://faults/up"}],
                        tmp_path)
        assert [r.get("error") for r in out["results"]] == [None, None]
        assert (tmp_path / "obj").read_bytes() == data
        assert blob_bytes(server, "faults", "up") == data[::-1]
        assert not proxy.plan  # every planned failure was met, and survived

        # A store that fails every request after the first blocks went up: the upload gives up, and readers still
        # see the previous version, not a part of the new one.
        proxy.plan, proxy.after = ["ok"], "503"
        out = run_batch({**env, "TESSERA_AZURE_MAX_ATTEMPTS": "3"},
                        [{"op": "put_file", "path": str(tmp_path / "obj"), "uri": "azure://faults/up"}],
                        tmp_path, "failing")
        err = out["results"][0]["error"]
        assert "azure://faults/up: PUT HTTP 503" in err and "gave up after 3 attempts" in err, err
        proxy.after = "ok"
        assert blob_bytes(server, "faults", "up") == data[::-1]
    finally:
        server.stop()
        proxy.stop()


def test_training_through_a_failing_blob_service_equals_the_clean_run(data, tmp_path):
    # 10% of the requests fail (500, 503, resets, answers cut halfway, stalls) while a run streams its data from
    # Azure and saves checkpoints there: the run ends bitwise equal to the clean one, every checkpoint whole.
    from azure_server import AzureBlobServer
    from remote_training import training_through_faults
    from s3_server import FaultProxy

    server = AzureBlobServer()
    proxy = FaultProxy(server.url, stall_s=3)
    try:
        cc = server.client().create_container("faults")
        training_through_faults(
            server.env(), server.env(AZURE_STORAGE_CONNECTION_STRING=server.connection_string(endpoint=proxy.url),
                                     TESSERA_AZURE_STALL_TIMEOUT_S="1"),
            proxy, tmp_path, data, "azure://faults",
            list_keys=lambda prefix: [b.name for b in cc.list_blobs(name_starts_with=prefix)],
            read=lambda key: blob_bytes(server, "faults", key))
    finally:
        server.stop()
        proxy.stop()
