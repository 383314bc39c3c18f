"""Tessera's OCI Object Storage backend (oci://; src/storage/oci_store.cpp) against a loopback Object Storage service
(tests/compat/oci_server.py) that checks every request's signature with the `oci` SDK's own signer, with the SDK's
ObjectStorageClient as the peer:

- objects either side writes read back identically through the other (small, 37 MiB as a multipart upload and in
  parallel ranges, an empty one, several buffers), ranges, paged prefix listings, stat, deletes, with the namespace
  in the URI (oci://bucket@namespace/...) or asked of the service (oci://bucket/...);
- a training run streaming MDS shards from oci:// equals the run on the local copy;
- checkpoints saved to oci:// autoresume past a corrupt and an interrupted one, bitwise;
- a missing bucket fails the run before training, naming it; a key the service does not know is refused naming the
  config file and profile, without printing the key;
- session tokens, instance principals and resource principals (2.2) sign as the SDK's signers do, and a token
  renewed in its file is picked up by a running process;
- transient failures (500, 503, resets, stalls) are retried, and a failed multipart upload publishes nothing.
"""
import json
import os

import pytest

from remote_training import checkpoints_autoresume_in_a_store, round_trip_through_a_store, train_trace, write_mds
from test_s3_checkpoints import data, recipe, train  # noqa: F401 (data is a fixture)
from test_s3_storage import run_batch


@pytest.fixture(scope="module")
def oci_store():
    from oci_server import OciObjectStorageServer

    server = OciObjectStorageServer()
    yield server
    server.stop()


@pytest.fixture
def bucket(oci_store, request):
    import re

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-")
    oci_store.create_bucket(name)
    return name


def object_bytes(server, bucket, name):
    return server.client().get_object(server.namespace, bucket, name).data.content


def put(server, bucket, name, data):
    server.client().put_object(server.namespace, bucket, name, data)


def test_objects_round_trip_with_the_oci_sdk(oci_store, bucket, tmp_path):
    # Big objects go up as multipart uploads (the threshold is 16 MiB here); the namespace is asked of the service,
    # or named in the URI (the put and the get below); the listing takes three pages.
    oci_store.page_size = 3
    try:
        named = f"oci://{bucket}@{oci_store.namespace}"
        round_trip_through_a_store(oci_store.env(), tmp_path, f"oci://{bucket}",
                                   lambda key, body: put(oci_store, bucket, key, body),
                                   lambda key: object_bytes(oci_store, bucket, key), "ObjectNotFound",
                                   get_base=named, put_base=named)
    finally:
        oci_store.page_size = 1000
    # Two multipart uploads (created, parts, committed); every request was signed and accepted (the server answers
    # 401 to a signature the SDK would not have made).
    mine = [s for s in oci_store.seen if f"/b/{bucket}/" in s[1] or s[1] == "/n/"]
    assert sum(1 for s in mine if s[0] == "POST" and s[1].endswith(f"/b/{bucket}/u")) == 2
    assert all(s[2] != 401 for s in mine)

    from remote_training import conditional_writes

    conditional_writes(oci_store.env(), tmp_path, f"oci://{bucket}")  # PutObject with if-match / if-none-match: *


def test_training_from_oci_equals_training_from_local_data(oci_store, bucket, tmp_path):
    local = tmp_path / "data"
    write_mds(local / "train")
    for f in sorted((local / "train").iterdir()):
        put(oci_store, bucket, f"ds/train/{f.name}", f.read_bytes())
    from_local = train_trace(oci_store.env(), tmp_path, "local", {"local": str(local)})
    from_oci = train_trace(oci_store.env(), tmp_path, "oci", {"remote": f"oci://{bucket}/ds",
                                                             "local": str(tmp_path / "cache"),
                                                             "cache_limit": "40kb", "predownload": 16})
    assert len(from_local["losses"]) == 200 // 8
    assert from_oci["batches"] == from_local["batches"]
    assert from_oci["losses"] == from_local["losses"]  # bitwise: the same floats


def test_checkpoints_in_oci_autoresume_past_a_corrupt_and_an_interrupted_one(oci_store, bucket, data, tmp_path):
    client = oci_store.client()
    checkpoints_autoresume_in_a_store(
        oci_store.env(), tmp_path, data, f"oci://{bucket}",
        list_keys=lambda prefix: [o.name for o in client.list_objects(oci_store.namespace, bucket, prefix=prefix)
                                  .data.objects],
        read=lambda key: object_bytes(oci_store, bucket, key),
        write=lambda key, body: put(oci_store, bucket, key, body))


def test_a_session_token_signs_and_a_refreshed_one_is_picked_up_mid_run(oci_store, tmp_path):
    # `oci session authenticate` leaves a profile with security_token_file and the session's key_file: requests are
    # signed with keyId "ST$<token>" (the server checks them with the SDK's SecurityTokenSigner). `oci session
    # refresh` rewrites the token file; a process already running signs with the new token from then on (the server
    # accepts only the current one), and an expired session is refused naming the profile and the fix.
    import subprocess
    import time

    from conftest import _binary

    oci_store.create_bucket("session")
    seen_before = len(oci_store.seen)
    config = oci_store.start_session("token-one")
    env = oci_store.env(OCI_CONFIG_FILE=config)
    ops = tmp_path / "ops.json"
    ops.write_text(json.dumps([{"op": "put", "uri": "oci://session/a", "data": "first"},
                               {"op": "sleep", "seconds": 3},
                               {"op": "get", "uri": "oci://session/a"}]))
    proc = subprocess.Popen([_binary("TESSERA_COMPAT_DRIVER", "tessera_compat_driver"), "storage-batch", ops,
                             tmp_path / "out.json"], env=env)
    try:
        while not any(s[0] == "PUT" and s[1].endswith("/session/o/a") for s in oci_store.seen[seen_before:]):
            assert proc.poll() is None
            time.sleep(0.01)
        oci_store.start_session("token-two")  # refreshed while the process sleeps
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    results = json.loads((tmp_path / "out.json").read_text())["results"]
    assert results[0] == {} and results[2] == {"data": "first"}, results
    assert all(s[2] != 401 for s in oci_store.seen[seen_before:])

    oci_store.session_token = "token-three"  # the server moved on; the file still holds token-two
    err = run_batch(env, [{"op": "get", "uri": "oci://session/a"}], tmp_path, "expired")["results"][0]["error"]
    assert "GET HTTP 401" in err and f"the session token of {config} [DEFAULT]" in err, err
    assert "oci session refresh" in err and "token-two" not in err, err


def test_a_resource_principal_signs_as_the_sdk_does_and_its_rewritten_token_is_picked_up(oci_store, tmp_path):
    # OCI_CLI_AUTH=resource_principal, version 2.2 as OCI Functions and Data Science jobs set it: the session token
    # (RPST) and its key in the environment, each the value itself or a path to a file the platform rewrites. The
    # SDK's own get_resource_principals_signer() with the same environment is the peer: each reads what the other
    # wrote (the server checks every signature with the SDK's SecurityTokenSigner).
    import subprocess
    import sys
    import time

    import jwt

    def token(n):
        now = int(time.time())
        return jwt.encode({"iat": now, "exp": now + 3600, "res_tenant": "ocid1.tenancy.oc1..aaaatesseratenancy",
                           "res_compartment": "ocid1.compartment.oc1..aaaatessera", "n": n},
                          "the service signs tokens; nobody checks this key", algorithm="HS256")

    oci_store.create_bucket("rp")
    folder = os.path.dirname(oci_store.start_session(token(1)))
    key_file, token_file = os.path.join(folder, "session_key.pem"), os.path.join(folder, "session_token")
    rp = dict(OCI_CLI_AUTH="resource_principal", OCI_RESOURCE_PRINCIPAL_VERSION="2.2",
              OCI_RESOURCE_PRINCIPAL_REGION="us-ashburn-1", OCI_CONFIG_FILE=str(tmp_path / "no-config"))
    inline = oci_store.env(**rp, OCI_RESOURCE_PRINCIPAL_RPST=oci_store.session_token,
                           OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM=open(key_file).read())
    files = oci_store.env(**rp, OCI_RESOURCE_PRINCIPAL_RPST=token_file, OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM=key_file)
    seen_before = len(oci_store.seen)
    out = run_batch(inline, [{"op": "put", "uri": "oci://rp/inline", "data": "signed with the inline token"}],
                    tmp_path, "inline")
    assert out["results"] == [{}], out
    oci_store.start_session(token(2))  # the platform rewrote the token file: the server takes only the new token
    out = run_batch(files, [{"op": "put", "uri": "oci://rp/files", "data": "signed with the token file"},
                            {"op": "get", "uri": "oci://rp/inline"}], tmp_path, "files")
    assert out["results"] == [{}, {"data": "signed with the inline token"}], out
    assert all(s[2] != 401 for s in oci_store.seen[seen_before:])

    peer = ("import oci, sys\n"
            "signer = oci.auth.signers.get_resource_principals_signer()\n"
            f"client = oci.object_storage.ObjectStorageClient({{'region': 'us-ashburn-1'}}, signer=signer, "
            f"service_endpoint={oci_store.url!r})\n"
            "ns = client.get_namespace().data\n"
            "print(client.get_object(ns, 'rp', 'files').data.content.decode())\n"
            "client.put_object(ns, 'rp', 'from-sdk', b'written by the SDK')\n")
    proc = subprocess.run([sys.executable, "-c", peer], env=files, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "signed with the token file"
    out = run_batch(files, [{"op": "get", "uri": "oci://rp/from-sdk"}], tmp_path, "peer")
    assert out["results"] == [{"data": "written by the SDK"}], out

    out = run_batch({**files, "OCI_RESOURCE_PRINCIPAL_VERSION": "2.1"}, [{"op": "stat", "uri": "oci://rp/files"}],
                    tmp_path, "v21")
    assert "OCI_RESOURCE_PRINCIPAL_VERSION is \"2.1\"; Tessera takes version 2.2" in out["results"][0]["error"]
    out = run_batch({**files, "OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM": ""}, [{"op": "stat", "uri": "oci://rp/files"}],
                    tmp_path, "nokey")
    assert "OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM is not set" in out["results"][0]["error"]
    oci_store.session_token = "expired-" + oci_store.session_token  # the server moved on; the file did not
    out = run_batch(files, [{"op": "stat", "uri": "oci://rp/files"}], tmp_path, "stale")
    err = out["results"][0]["error"]
    assert "HTTP 401" in err and f"the platform renews the token in {token_file}" in err, err
    assert token(2).split(".")[1] not in err


def test_an_instance_principal_signs_as_the_sdk_does_and_its_token_is_refreshed(oci_store, tmp_path, monkeypatch):
    # OCI_CLI_AUTH=instance_principal: the instance's certificates from the metadata service, exchanged at the auth
    # service for a token bound to a session key (the federation request checked with the SDK's AuthTokenRequestSigner).
    # The SDK's own InstancePrincipalsSecurityTokenSigner, federating through the same services, is the peer: each
    # reads what the other wrote. A token that lives 4 s is fetched again before it expires while a process runs.
    import oci

    extra = oci_store.start_instance_principal()
    oci_store.create_bucket("principal")
    seen_before = len(oci_store.seen)
    monkeypatch.setenv("OCI_METADATA_BASE_URL", extra["OCI_METADATA_BASE_URL"])
    signer = oci.auth.signers.InstancePrincipalsSecurityTokenSigner(federation_endpoint=f"{oci_store.url}/v1/x509")
    client = oci.object_storage.ObjectStorageClient({"region": "us-ashburn-1"}, signer=signer,
                                                    service_endpoint=oci_store.url)
    ns = client.get_namespace().data
    client.put_object(ns, "principal", "from-sdk", b"written by the SDK as an instance")
    assert oci_store.federations == 1

    oci_store.token_lifetime_s = 4
    env = {**oci_store.env(OCI_CONFIG_FILE=str(tmp_path / "no-config-file")), **extra}
    out = run_batch(env, [{"op": "get", "uri": "oci://principal/from-sdk"},
                          {"op": "put", "uri": "oci://principal/from-tessera", "data": "written by Tessera"},
                          {"op": "sleep", "seconds": 5},
                          {"op": "get", "uri": "oci://principal/from-tessera"}], tmp_path)
    r = out["results"]
    assert [x.get("error") for x in r] == [None] * 4, r
    assert r[0]["data"] == "written by the SDK as an instance" and r[3]["data"] == "written by Tessera"
    assert oci_store.federations >= 3  # the SDK's one, Tessera's first, and a refresh past the first's expiry
    assert all(s[2] != 401 for s in oci_store.seen[seen_before:])
    assert client.get_object(ns, "principal", "from-tessera").data.content == b"written by Tessera"

    # Not on an instance (nothing answers at the metadata address): one sentence naming it.
    bad = {**env, "OCI_METADATA_BASE_URL": "http://127.0.0.1:9/opc/v2"}
    err = run_batch(bad, [{"op": "stat", "uri": "oci://principal/x"}], tmp_path, "no-imds")["results"][0]["error"]
    assert "instance principal: the instance metadata service answered" in err and "127.0.0.1:9" in err, err

    # The region becomes a host name: a metadata answer that is not a region name is refused, not put in a URL.
    oci_store.instance["region"] = "evil.example.com/x"
    env_no_endpoint = {k: v for k, v in env.items() if k != "TESSERA_OCI_ENDPOINT_URL"}
    err = run_batch(env_no_endpoint, [{"op": "stat", "uri": "oci://principal/x"}], tmp_path, "region")["results"][0]
    assert 'answered "evil.example.com/x", not a region name' in err["error"], err


def test_a_missing_bucket_and_an_unknown_key_are_clear_errors(oci_store, data, tmp_path):
    from oci_server import make_api_key

    rec = recipe(tmp_path, data, tmp_path / "runs")
    proc = train(oci_store.env(), rec, "run_name=nb", "save_folder=oci://no-such-bucket/ckpt", "max_duration=2ba",
                 check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "oci://no-such-bucket/ckpt" in out and "BucketNotFound" in out, out[-3000:]
    assert not (tmp_path / "runs" / "nb" / "metrics.jsonl").exists()

    oci_store.create_bucket("signed")
    stranger_key, stranger_fingerprint = make_api_key(str(tmp_path), "stranger")
    config = oci_store.write_config("stranger", stranger_key, stranger_fingerprint, profile="TRAINER")
    out = run_batch(oci_store.env(OCI_CONFIG_FILE=config, OCI_CLI_PROFILE="TRAINER"),
                    [{"op": "stat", "uri": "oci://signed/x"}], tmp_path)
    err = out["results"][0]["error"]
    # (the first request, GetNamespace, is the one refused)
    assert "oci://signed/x: GET HTTP 401 NotAuthenticated" in err and f"the API key of {config} [TRAINER]" in err, err
    assert open(stranger_key).read().splitlines()[1] not in err
    out = run_batch(oci_store.env(OCI_CONFIG_FILE=config), [{"op": "stat", "uri": "oci://signed/x"}], tmp_path, "np")
    assert f"no OCI credentials: {config} [DEFAULT] has no `user`" in out["results"][0]["error"]


def test_transient_failures_are_retried_and_a_failed_upload_publishes_nothing(tmp_path):
    from oci_server import OciObjectStorageServer
    from s3_server import FaultProxy

    server = OciObjectStorageServer()
    proxy = FaultProxy(server.url, stall_s=4)
    try:
        server.create_bucket("faults")
        data = os.urandom(40 * 1024 * 1024)
        put(server, "faults", "obj", data)
        put(server, "faults", "up", b"the previous version")
        env = server.env(endpoint=proxy.url, TESSERA_OCI_STALL_TIMEOUT_S="1")
        (tmp_path / "up.bin").write_bytes(data[::-1])
        proxy.plan = ["503", "500", "reset", "stall", "ok", "reset", "ok", "500", "ok", "503", "reset", "stall"]
        out = run_batch(env, [{"op": "download", "uri": "oci://faults/obj", "path": str(tmp_path / "obj")},
                              {"op": "put_file", "path": str(tmp_path / "up.bin"), "uri": "oci://faults/up"}],
                        tmp_path)
        assert [r.get("error") for r in out["results"]] == [None, None]
        assert (tmp_path / "obj").read_bytes() == data
        assert object_bytes(server, "faults", "up") == data[::-1]
        assert not proxy.plan  # every planned failure was met, and survived

        # A store that fails every request after the upload was created: the parts give up, the upload is aborted,
        # and readers still see the previous version.
        proxy.plan, proxy.after = ["ok", "ok"], "503"
        out = run_batch({**env, "TESSERA_OCI_MAX_ATTEMPTS": "3"},
                        [{"op": "put_file", "path": str(tmp_path / "obj"), "uri": "oci://faults/up"}], tmp_path,
                        "failing")
        err = out["results"][0]["error"]
        assert "oci://faults/up: PUT HTTP 503" in err and "gave up after 3 attempts" in err, err
        proxy.after = "ok"
        assert object_bytes(server, "faults", "up") == data[::-1]
    finally:
        server.stop()
        proxy.stop()


def test_training_through_a_failing_object_storage_equals_the_clean_run(data, tmp_path):
    # 10% of the requests fail (500, 503, resets, answers cut halfway, stalls) while a run streams its data from
    # OCI and saves checkpoints there: the run ends bitwise equal to the clean one, every checkpoint whole.
    from oci_server import OciObjectStorageServer
    from remote_training import training_through_faults
    from s3_server import FaultProxy

    server = OciObjectStorageServer()
    proxy = FaultProxy(server.url, stall_s=3)
    try:
        server.create_bucket("faults")
        client = server.client()
        training_through_faults(
            server.env(), server.env(endpoint=proxy.url, TESSERA_OCI_STALL_TIMEOUT_S="1"), proxy, tmp_path, data,
            "oci://faults",
            list_keys=lambda prefix: [o.name for o in client.list_objects(server.namespace, "faults", prefix=prefix)
                                      .data.objects],
            read=lambda key: object_bytes(server, "faults", key))
    finally:
        server.stop()
        proxy.stop()
