"""Tessera's Google Cloud Storage backend (gs://, src/storage/gcs_store.cpp) against a GCS emulator
(fake-gcs-server, tests/compat/gcs_server.py) with Google's own Python client, google-cloud-storage, as the peer:

- objects either side writes read back identically through the other (small, 37 MiB in parallel ranges, an empty
  one, several buffers), ranges, key-prefix listings, stat, deletes; a missing object is an error naming its URI;
- a training run streaming MDS shards from gs:// (uploaded by google-cloud-storage) equals the run on the local
  copy, loss for loss;
- checkpoints saved to gs:// with hf_checkpointer's export beside them; autoresume from gs:// skips a corrupt newest
  checkpoint and an interrupted one and ends bitwise equal to the uninterrupted run;
- a bucket that does not exist fails the run before training, naming it;
- write_if checked by GCS (ifGenerationMatch through the JSON API), with Tessera's own tokens for service accounts,
  user credentials and the metadata server.
"""
import contextlib
import json
import os

import pytest

from remote_training import checkpoints_autoresume_in_a_store, train_trace, write_mds
from test_s3_checkpoints import data, recipe, train  # noqa: F401 (data is a fixture)
from test_s3_storage import run_batch


@pytest.fixture(scope="module")
def gcs():
    from gcs_server import FakeGcsServer

    server = FakeGcsServer()
    yield server
    server.stop()


@pytest.fixture
def bucket(gcs, request):
    import re

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") + "-" + str(os.getpid() % 10000)
    gcs.client().create_bucket(name)
    return name


def blob_bytes(gcs, bucket, key):
    return gcs.client().bucket(bucket).blob(key).download_as_bytes()


def test_objects_round_trip_with_google_cloud_storage(gcs, bucket, tmp_path):
    b = gcs.client().bucket(bucket)
    big = os.urandom(37 * 1024 * 1024 + 123)  # five 8 MiB ranges down, one resumable upload up
    (tmp_path / "big.bin").write_bytes(big)
    (tmp_path / "empty.bin").write_bytes(b"")
    b.blob("from-sdk/a b+c.txt").upload_from_string(b"written by google-cloud-storage")
    b.blob("from-sdk/big.bin").upload_from_string(big)
    b.blob("from-sdk-other").upload_from_string(b"x")
    b.blob("fromage").upload_from_string(b"not under the prefix")
    text = bytes(ord("a") + i % 26 for i in range(1 << 20)) * 20 + b"the end"  # read whole, in three ranges
    b.blob("text.txt").upload_from_string(text)
    base = f"gs://{bucket}"
    out = run_batch(gcs.env(), [
        {"op": "put", "uri": f"{base}/from-tessera/small.txt", "data": "written by tessera"},
        {"op": "put_file", "path": str(tmp_path / "big.bin"), "uri": f"{base}/from-tessera/big.bin"},
        {"op": "put_file", "path": str(tmp_path / "empty.bin"), "uri": f"{base}/from-tessera/empty"},
        {"op": "put_parts", "path": str(tmp_path / "big.bin"), "cuts": [5, 9 << 20, 20 << 20],
         "uri": f"{base}/from-tessera/parts.bin"},
        {"op": "get", "uri": f"{base}/from-sdk/a b+c.txt"},
        {"op": "range", "uri": f"{base}/from-sdk/a b+c.txt", "offset": 3, "length": 7},
        {"op": "download", "uri": f"{base}/from-sdk/big.bin", "path": str(tmp_path / "down" / "big.bin")},
        {"op": "stat", "uri": f"{base}/from-sdk/big.bin"},
        {"op": "stat", "uri": f"{base}/missing"},
        {"op": "list", "uri": f"{base}/from-"},
        {"op": "remove", "uri": f"{base}/from-sdk/a b+c.txt"},
        {"op": "remove", "uri": f"{base}/never-existed"},
        {"op": "get", "uri": f"{base}/from-sdk/a b+c.txt"},
        {"op": "range", "uri": f"{base}/from-sdk-other", "offset": 0, "length": 2},
        {"op": "download", "uri": f"{base}/absent", "path": str(tmp_path / "down" / "absent")},
        {"op": "get", "uri": f"{base}/text.txt"},
    ], tmp_path)
    r = out["results"]
    assert [x.get("error") for x in r[:12]] == [None] * 12
    assert blob_bytes(gcs, bucket, "from-tessera/small.txt") == b"written by tessera"
    assert blob_bytes(gcs, bucket, "from-tessera/big.bin") == big
    assert blob_bytes(gcs, bucket, "from-tessera/empty") == b""
    assert blob_bytes(gcs, bucket, "from-tessera/parts.bin") == big
    assert r[4]["data"] == "written by google-cloud-storage" and r[5]["data"] == "tten by"
    assert (tmp_path / "down" / "big.bin").read_bytes() == big
    assert r[7]["size"] == len(big) and r[8]["size"] is None
    listed = {o[0]: o[1] for o in r[9]["objects"]}
    assert listed == {f"{base}/from-sdk/a b+c.txt": 31, f"{base}/from-sdk/big.bin": len(big),
                      f"{base}/from-sdk-other": 1, f"{base}/from-tessera/big.bin": len(big),
                      f"{base}/from-tessera/empty": 0, f"{base}/from-tessera/parts.bin": len(big),
                      f"{base}/from-tessera/small.txt": 18}
    assert [o[0] for o in r[9]["objects"]] == sorted(listed)
    assert f"{base}/from-sdk/a b+c.txt: GET: no such object or bucket" in r[12]["error"]
    assert "asked for 2 bytes at 0, the object has 1" in r[13]["error"]
    assert "no such object" in r[14]["error"] and not (tmp_path / "down" / "absent").exists()
    assert sorted(p.name for p in (tmp_path / "down").iterdir()) == ["big.bin"]  # no temporary file left
    assert r[15].get("error") is None and r[15]["data"].encode() == text


def test_training_from_gcs_equals_training_from_local_data(gcs, bucket, tmp_path):
    local = tmp_path / "data"
    write_mds(local / "train")
    b = gcs.client().bucket(bucket)
    for f in sorted((local / "train").iterdir()):
        b.blob(f"ds/train/{f.name}").upload_from_filename(str(f))

    from_local = train_trace(gcs.env(), tmp_path, "local", {"local": str(local)})
    from_gcs = train_trace(gcs.env(), tmp_path, "gcs", {"remote": f"gs://{bucket}/ds", "local": str(tmp_path / "cache"),
                                                        "cache_limit": "40kb", "predownload": 16})
    assert len(from_local["losses"]) == 200 // 8
    assert from_gcs["batches"] == from_local["batches"]
    assert from_gcs["losses"] == from_local["losses"]  # bitwise: the same floats


def test_checkpoints_in_gcs_autoresume_past_a_corrupt_and_an_interrupted_one(gcs, bucket, data, tmp_path):
    b = gcs.client().bucket(bucket)
    checkpoints_autoresume_in_a_store(
        gcs.env(), tmp_path, data, f"gs://{bucket}",
        list_keys=lambda prefix: [x.name for x in gcs.client().list_blobs(bucket, prefix=prefix)],
        read=lambda key: blob_bytes(gcs, bucket, key), write=lambda key, body: b.blob(key).upload_from_string(body))


def test_a_missing_bucket_fails_the_run_before_training_naming_it(gcs, data, tmp_path):
    rec = recipe(tmp_path, data, tmp_path / "runs")
    proc = train(gcs.env(), rec, "run_name=nb", "save_folder=gs://no-such-bucket-here/ckpt", "max_duration=2ba",
                 check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "gs://no-such-bucket-here/ckpt" in out and "the bucket no-such-bucket-here does not exist" in out, out[-3000:]
    assert not (tmp_path / "runs" / "nb" / "metrics.jsonl").exists()


def service_account(tmp_path, name, token_uri):
    """A service account key file as the Cloud console makes one (a fresh RSA key), and the key's public half."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"type": "service_account", "project_id": "tessera-test", "private_key_id": name,
                                "private_key": pem, "client_email": f"{name}@tessera-test.iam.gserviceaccount.com",
                                "client_id": "1", "token_uri": token_uri}))
    return path, public, pem


def test_a_service_account_signs_every_request_and_a_wrong_key_is_a_clear_error(tmp_path):
    # Every request through a proxy that checks its bearer token with google-auth's own JWT verification against the
    # service account's public key, as Google's front end checks the self-signed JWTs Google's client libraries send.
    import google.auth.jwt
    from gcs_server import FakeGcsServer
    from s3_server import FaultProxy, free_port

    accepted = {}
    tokens = []

    def gate(method, path, headers):
        auth = headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            return 401, "Unauthorized", "no bearer token"
        try:
            claims = google.auth.jwt.decode(auth[len("Bearer "):], certs=accepted)
        except Exception as e:  # noqa: BLE001 (any refusal is the test's answer)
            return 401, "Unauthorized", f"invalid token: {e}"
        tokens.append(claims)
        return None

    port = free_port()
    proxy = FaultProxy(f"http://127.0.0.1:{port}", gate=gate)
    server = FakeGcsServer(port=port, external_url=proxy.url)
    try:
        server.client().create_bucket("signed")
        good, public, _ = service_account(tmp_path, "trainer", proxy.url + "/token")
        accepted["trainer"] = public
        env = credentialed_env(server, proxy, GOOGLE_APPLICATION_CREDENTIALS=str(good))
        data = os.urandom(9 * 1024 * 1024)
        (tmp_path / "d.bin").write_bytes(data)
        out = run_batch(env, [{"op": "put_file", "path": str(tmp_path / "d.bin"), "uri": "gs://signed/d.bin"},
                              {"op": "download", "uri": "gs://signed/d.bin", "path": str(tmp_path / "back.bin")},
                              {"op": "list", "uri": "gs://signed/"},
                              {"op": "remove", "uri": "gs://signed/d.bin"},
                              # Tessera's own JSON API requests, with tokens it signs itself
                              {"op": "put_if", "uri": "gs://signed/latest", "data": "ep0-ba2", "expected": None},
                              {"op": "stat", "uri": "gs://signed/latest"}], tmp_path)
        assert [r.get("error") for r in out["results"]] == [None] * 6
        assert (tmp_path / "back.bin").read_bytes() == data and len(out["results"][2]["objects"]) == 1
        assert out["results"][4]["etag"] and out["results"][5]["etag"] == out["results"][4]["etag"], out
        assert any(m == "POST" and "ifGenerationMatch=0" in p for m, p, _ in proxy.seen)
        assert tokens and all(t["iss"] == "trainer@tessera-test.iam.gserviceaccount.com" for t in tokens)
        assert len(tokens) == len(proxy.seen)  # every request carried a valid token

        wrong, _, wrong_pem = service_account(tmp_path, "stranger", proxy.url + "/token")
        out = run_batch({**env, "GOOGLE_APPLICATION_CREDENTIALS": str(wrong)},
                        [{"op": "get", "uri": "gs://signed/x"}], tmp_path, "wrong")
        err = out["results"][0]["error"]
        assert "gs://signed/x" in err and f"GOOGLE_APPLICATION_CREDENTIALS={wrong} (service_account)" in err, err
        assert "UNAUTHENTICATED" in err, err
        assert wrong_pem.splitlines()[1] not in err
    finally:
        server.stop()
        proxy.stop()


@contextlib.contextmanager
def emulator_behind_tokens(handler, gate):
    """fake-gcs-server behind a proxy that lets through what `gate` accepts, and a loopback server of `handler` (a
    token endpoint or a metadata server) that issues the tokens: yields (emulator, proxy, the token server's
    host:port). Tessera reaches the emulator as GCS itself (TESSERA_GCS_ENDPOINT_URL), with credentials."""
    import http.server
    import threading

    from gcs_server import FakeGcsServer
    from s3_server import FaultProxy, free_port

    tokens = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=tokens.serve_forever, daemon=True).start()
    port = free_port()
    proxy = FaultProxy(f"http://127.0.0.1:{port}", gate=gate)
    server = FakeGcsServer(port=port, external_url=proxy.url)
    try:
        yield server, proxy, f"127.0.0.1:{tokens.server_address[1]}"
    finally:
        server.stop()
        proxy.stop()
        tokens.shutdown()


def credentialed_env(server, proxy, **extra):
    """The environment of a Tessera process reaching the emulator through `proxy` as GCS, with credentials."""
    env = {k: v for k, v in server.env().items() if k != "STORAGE_EMULATOR_HOST"}
    env.update(TESSERA_GCS_ENDPOINT_URL=proxy.url, TESSERA_GCS_RETRY_LIMIT_S="3", **extra)
    return env


def test_user_credentials_are_refreshed_mid_run(tmp_path):
    # `gcloud auth application-default login` credentials (authorized_user): access tokens from the token endpoint,
    # here living 4 seconds; the proxy accepts only unexpired ones. A process that writes, waits past the first token's
    # life and reads again must have fetched another (google-cloud-cpp's refresh, under Tessera's gs:// backend).
    import time
    import urllib.parse

    from loopback_http import QuietHandler

    issued = {}  # token -> expiry

    class TokenEndpoint(QuietHandler):
        def do_POST(self):
            form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            if form.get("grant_type") != ["refresh_token"] or form.get("refresh_token") != ["1//refresh-me"] or \
                    form.get("client_secret") != ["not-a-secret"]:
                return self.json(400, {"error": "invalid_grant"})
            token = f"ya29.token-{len(issued) + 1}"
            issued[token] = time.time() + 4
            return self.json(200, {"access_token": token, "expires_in": 4, "token_type": "Bearer"})

    conditional = []  # the tokens of Tessera's own JSON API uploads (write_if)

    def gate(method, path, headers):
        token = headers.get("Authorization", "")[len("Bearer "):]
        if issued.get(token, 0) < time.time():
            return 401, "Unauthorized", "expired or unknown access token"
        if "ifGenerationMatch=" in path:
            conditional.append(token)
        return None

    with emulator_behind_tokens(TokenEndpoint, gate) as (server, proxy, token_host):
        server.client().create_bucket("user")
        creds = tmp_path / "application_default_credentials.json"
        creds.write_text(json.dumps({"type": "authorized_user", "client_id": "tessera-test.apps.googleusercontent.com",
                                     "client_secret": "not-a-secret", "refresh_token": "1//refresh-me",
                                     "token_uri": f"http://{token_host}/token"}))
        env = credentialed_env(server, proxy, GOOGLE_APPLICATION_CREDENTIALS=str(creds))
        out = run_batch(env, [{"op": "put", "uri": "gs://user/a.txt", "data": "before the token expired"},
                              {"op": "put_if", "uri": "gs://user/latest", "data": "ep0-ba2", "expected": None},
                              {"op": "sleep", "seconds": 6},
                              {"op": "get", "uri": "gs://user/a.txt"},
                              {"op": "put_if", "uri": "gs://user/latest-2", "data": "ep0-ba4", "expected": None}],
                        tmp_path)
        assert [r.get("error") for r in out["results"]] == [None] * 5, out
        assert out["results"][3]["data"] == "before the token expired"
        assert out["results"][1]["etag"] and out["results"][4]["etag"], out
        assert len(issued) >= 2  # a second token, fetched after the first one's 4 seconds
        assert len(conditional) == 2 and conditional[0] != conditional[1]  # Tessera's own tokens, refreshed too


def test_metadata_server_tokens_for_conditional_writes(tmp_path):
    # On GCE and GKE (no credentials file): the metadata server's tokens, asked with Metadata-Flavor: Google, carry
    # Tessera's own JSON API requests (write_if); a metadata server that refuses is named in the error.
    from loopback_http import QuietHandler
    from s3_server import free_port

    served = []

    class Metadata(QuietHandler):
        def do_GET(self):
            if self.path != "/computeMetadata/v1/instance/service-accounts/default/token" or \
                    self.headers.get("Metadata-Flavor") != "Google":
                return self.json(403, {"error": "forbidden"})
            served.append(f"ya29.metadata-{len(served) + 1}")
            return self.json(200, {"access_token": served[-1], "expires_in": 3599, "token_type": "Bearer"})

    def gate(method, path, headers):
        return None if headers.get("Authorization", "")[len("Bearer "):] in served else (401, "Unauthorized", "no")

    with emulator_behind_tokens(Metadata, gate) as (server, proxy, metadata_host):
        server.client().create_bucket("gce")
        env = credentialed_env(server, proxy, HOME=str(tmp_path), GCE_METADATA_ROOT=metadata_host)
        out = run_batch(env, [{"op": "put_if", "uri": "gs://gce/latest", "data": "ep0-ba2", "expected": None},
                              {"op": "stat", "uri": "gs://gce/latest"},
                              {"op": "put_if", "uri": "gs://gce/latest", "data": "ep0-ba4", "expected": None}], tmp_path)
        r = out["results"]
        assert r[0]["etag"] and r[1]["etag"] == r[0]["etag"] and r[2] == {"etag": None}, out
        assert served and server.client().bucket("gce").blob("latest").download_as_bytes() == b"ep0-ba2"

        refused = {**env, "GCE_METADATA_ROOT": f"127.0.0.1:{free_port()}"}  # nothing listens there
        out = run_batch(refused, [{"op": "stat", "uri": "gs://gce/latest"}], tmp_path, "refused")
        err = out["results"][0]["error"]
        assert "gs://gce/latest" in err and "the metadata server (127.0.0.1:" in err, err


def test_transient_failures_are_retried_and_a_failed_upload_publishes_nothing(tmp_path):
    from gcs_server import FakeGcsServer
    from s3_server import FaultProxy, free_port

    port = free_port()
    proxy = FaultProxy(f"http://127.0.0.1:{port}")
    server = FakeGcsServer(port=port, external_url=proxy.url)
    try:
        b = server.client().create_bucket("faults")
        data = os.urandom(40 * 1024 * 1024)
        b.blob("obj").upload_from_string(data)
        b.blob("up").upload_from_string(b"the previous version")
        env = server.env(STORAGE_EMULATOR_HOST=proxy.url)
        (tmp_path / "up.bin").write_bytes(data[::-1])
        # Every kind of failure but a stall, several in a row, on a ranged download and on a resumable upload.
        proxy.plan = ["503", "500", "reset", "503", "ok", "reset", "ok", "500", "ok", "503", "reset"]
        out = run_batch(env, [{"op": "download", "uri": "gs://faults/obj", "path": str(tmp_path / "obj")},
                              {"op": "put_file", "path": str(tmp_path / "up.bin"), "uri": "gs://faults/up"}],
                        tmp_path)
        assert [r.get("error") for r in out["results"]] == [None, None]
        assert (tmp_path / "obj").read_bytes() == data
        assert b.blob("up").download_as_bytes() == data[::-1]
        assert not proxy.plan  # every planned failure was met, and survived

        # A store that fails every request after the upload session opened: the upload gives up, and readers still
        # see the previous version, not a part of the new one.
        proxy.plan, proxy.after = ["ok"], "503"
        out = run_batch(server.env(STORAGE_EMULATOR_HOST=proxy.url, TESSERA_GCS_RETRY_LIMIT_S="3"),
                        [{"op": "put", "uri": "gs://faults/up", "data": "a new version that never completes"}],
                        tmp_path, "failing")
        err = out["results"][0]["error"]
        assert "gs://faults/up: PUT failed" in err and "UNAVAILABLE" in err, err
        proxy.after = "ok"
        assert b.blob("up").download_as_bytes() == data[::-1]
    finally:
        server.stop()
        proxy.stop()


def test_training_through_a_failing_gcs_equals_the_clean_run(data, tmp_path):
    # 10% of the requests fail (500, 503, resets, answers cut halfway; no stalls: google-cloud-cpp's own stall
    # timeout is minutes) while a run streams its data from GCS and saves checkpoints there: the run ends bitwise
    # equal to the clean one, every checkpoint whole.
    from gcs_server import FakeGcsServer
    from remote_training import training_through_faults
    from s3_server import FaultProxy, free_port

    port = free_port()
    proxy = FaultProxy(f"http://127.0.0.1:{port}")
    proxy.faults = ("500", "503", "reset", "cut")
    server = FakeGcsServer(port=port, external_url=proxy.url)
    try:
        server.client().create_bucket("faults")
        training_through_faults(
            server.env(), server.env(STORAGE_EMULATOR_HOST=proxy.url), proxy, tmp_path, data, "gs://faults",
            list_keys=lambda prefix: [x.name for x in server.client().list_blobs("faults", prefix=prefix)],
            read=lambda key: blob_bytes(server, "faults", key))
    finally:
        server.stop()
        proxy.stop()


def test_conditional_writes_are_checked_by_gcs(gcs, bucket, tmp_path):
    """storage::write_if on gs:// (how a checkpoint's `latest` is written): an upload through GCS's JSON API with
    ifGenerationMatch (Arrow's client has no preconditions), so a writer landing between Tessera's look at the object
    and its upload makes GCS refuse Tessera's; the version is the update time stat() gives."""
    from remote_training import conditional_writes
    from s3_server import FaultProxy

    conditional_writes(gcs.env(), tmp_path, f"gs://{bucket}")
    uri = f"gs://{bucket}/cond/latest"
    out = run_batch(gcs.env(), [{"op": "stat", "uri": uri},
                                {"op": "put_if", "uri": uri, "data": "ep0-ba8", "expected": None}], tmp_path, "stat")
    etag = out["results"][0]["etag"]
    assert etag and out["results"][1] == {"etag": None}, out

    blob = gcs.client().bucket(bucket).blob("cond/latest")
    conditional = []

    def another_writer(method, path, headers):  # lands just before Tessera's conditional upload reaches GCS
        if method == "POST" and "ifGenerationMatch=" in path:
            conditional.append(path)
            blob.upload_from_string(b"ep0-ba8 from another writer")
        return None

    proxy = FaultProxy(gcs.url, gate=another_writer)
    try:
        out = run_batch(gcs.env(STORAGE_EMULATOR_HOST=proxy.url),
                        [{"op": "put_if", "uri": uri, "data": "ep0-ba10", "expected": etag}], tmp_path, "race")
    finally:
        proxy.stop()
    assert out["results"][0] == {"etag": None}, out
    assert len(conditional) == 1 and blob.download_as_bytes() == b"ep0-ba8 from another writer"
    out = run_batch(gcs.env(), [{"op": "stat", "uri": uri},
                                {"op": "put_if", "uri": uri, "data": "ep0-ba10", "expected": etag}], tmp_path, "after")
    assert out["results"][0]["etag"] != etag and out["results"][1] == {"etag": None}, out
