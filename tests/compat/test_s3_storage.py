"""Tessera's S3 client (src/storage/) against a real S3-API server (moto, signatures checked) with boto3 as the peer:
objects Tessera writes read back identically through boto3 and the other way round, single and multipart, ranges,
listing with continuation, deletes; wrong credentials fail naming the bucket; credentials are read once a process."""
import base64
import json
import os
import subprocess
import zlib

import pytest

from conftest import _binary


def run_batch(env, ops, tmp_path, name="ops"):
    ops_file, out_file = tmp_path / f"{name}.json", tmp_path / f"{name}.out.json"
    ops_file.write_text(json.dumps(ops))
    proc = subprocess.run([_binary("TESSERA_COMPAT_DRIVER", "tessera_compat_driver"), "storage-batch", ops_file,
                           out_file], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out_file.read_text())


def test_objects_round_trip_with_boto3(s3_server, s3_bucket, tmp_path):
    s3 = s3_server.client()
    big = os.urandom(37 * 1024 * 1024 + 123)  # multipart: five 8 MiB parts, the last one short
    (tmp_path / "big.bin").write_bytes(big)
    s3.put_object(Bucket=s3_bucket, Key="from-boto3/a b+c.txt", Body=b"written by boto3")
    s3.put_object(Bucket=s3_bucket, Key="from-boto3/big.bin", Body=big)
    base = f"s3://{s3_bucket}"
    out = run_batch(s3_server.env(), [
        {"op": "put", "uri": f"{base}/from-tessera/small.txt", "data": "written by tessera"},
        {"op": "put_file", "path": str(tmp_path / "big.bin"), "uri": f"{base}/from-tessera/big.bin"},
        {"op": "get", "uri": f"{base}/from-boto3/a b+c.txt"},
        {"op": "range", "uri": f"{base}/from-boto3/a b+c.txt", "offset": 3, "length": 7},
        {"op": "download", "uri": f"{base}/from-boto3/big.bin", "path": str(tmp_path / "down" / "big.bin")},
        {"op": "stat", "uri": f"{base}/from-boto3/big.bin"},
        {"op": "stat", "uri": f"{base}/missing"},
        {"op": "list", "uri": f"{base}/from-"},
        {"op": "remove", "uri": f"{base}/from-boto3/a b+c.txt"},
        {"op": "remove", "uri": f"{base}/never-existed"},
        {"op": "get", "uri": f"{base}/from-boto3/a b+c.txt"},
    ], tmp_path)
    r = out["results"]
    assert [x.get("error") for x in r[:10]] == [None] * 10
    assert s3.get_object(Bucket=s3_bucket, Key="from-tessera/small.txt")["Body"].read() == b"written by tessera"
    assert s3.get_object(Bucket=s3_bucket, Key="from-tessera/big.bin")["Body"].read() == big
    # A multipart object's ETag says how many parts it was sent in.
    assert s3.head_object(Bucket=s3_bucket, Key="from-tessera/big.bin")["ETag"].strip('"').endswith("-5")
    assert r[2]["data"] == "written by boto3" and r[3]["data"] == "tten by"
    assert (tmp_path / "down" / "big.bin").read_bytes() == big
    assert not [p for p in (tmp_path / "down").iterdir() if p.name != "big.bin"]  # no temporary file left
    assert r[5]["size"] == len(big) and r[6]["size"] is None
    listed = {o[0]: o[1] for o in r[7]["objects"]}
    assert listed == {f"{base}/from-boto3/a b+c.txt": 16, f"{base}/from-boto3/big.bin": len(big),
                      f"{base}/from-tessera/big.bin": len(big), f"{base}/from-tessera/small.txt": 18}
    assert "NoSuchKey" in r[10]["error"] and f"{base}/from-boto3/a b+c.txt" in r[10]["error"]
    assert out["credential_loads"] == 1


def test_a_write_from_several_buffers_is_their_concatenation(s3_server, s3_bucket, tmp_path):
    # What a checkpoint's rank file goes up as: a header and tensors, each its own buffer, gathered into 8 MiB parts
    # (buffers shorter than a part, longer than several, empty, and ending exactly on a part boundary).
    s3 = s3_server.client()
    data = os.urandom(29 * 1024 * 1024 + 77)
    (tmp_path / "data.bin").write_bytes(data)
    mib = 1024 * 1024
    cuts = [100, 100, 5 * mib, 8 * mib, 8 * mib + 1, 27 * mib]
    small = [3, 7, 7, 20]
    (tmp_path / "small.bin").write_bytes(data[:50])
    base = f"s3://{s3_bucket}"
    out = run_batch(s3_server.env(), [
        {"op": "put_parts", "path": str(tmp_path / "data.bin"), "cuts": cuts, "uri": f"{base}/parts/big"},
        {"op": "put_parts", "path": str(tmp_path / "small.bin"), "cuts": small, "uri": f"{base}/parts/small"},
        {"op": "put_parts", "path": str(tmp_path / "data.bin"), "cuts": cuts, "uri": str(tmp_path / "local.bin")},
    ], tmp_path)
    assert [x.get("error") for x in out["results"]] == [None] * 3
    assert s3.get_object(Bucket=s3_bucket, Key="parts/big")["Body"].read() == data
    assert s3.head_object(Bucket=s3_bucket, Key="parts/big")["ETag"].strip('"').endswith("-4")
    assert s3.get_object(Bucket=s3_bucket, Key="parts/small")["Body"].read() == data[:50]
    assert (tmp_path / "local.bin").read_bytes() == data


def crc32_b64(data):
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def test_uploads_carry_the_crc32_checksums_the_sdks_send(s3_server, s3_bucket, tmp_path):
    # As boto3 does by default: each PUT carries its body's CRC32, and a multipart upload declares CRC32 and lists each
    # part's, so the store can check every part and keeps the composite checksum (CRC32 of the parts' CRC32s, "-N").
    s3 = s3_server.client()
    big = os.urandom(20 * 1024 * 1024 + 5)
    (tmp_path / "big.bin").write_bytes(big)
    base = f"s3://{s3_bucket}"
    out = run_batch(s3_server.env(), [
        {"op": "put", "uri": f"{base}/crc/small", "data": "checked on arrival"},
        {"op": "put_file", "path": str(tmp_path / "big.bin"), "uri": f"{base}/crc/big"},
    ], tmp_path)
    assert [x.get("error") for x in out["results"]] == [None] * 2
    # moto keeps the value a PUT sent (S3 also checks it against the body).
    small = s3.head_object(Bucket=s3_bucket, Key="crc/small", ChecksumMode="ENABLED")
    assert small["ChecksumCRC32"] == crc32_b64(b"checked on arrival")
    part = 8 * 1024 * 1024
    parts = [big[i:i + part] for i in range(0, len(big), part)]
    composite = crc32_b64(b"".join(zlib.crc32(p).to_bytes(4, "big") for p in parts))
    head = s3.head_object(Bucket=s3_bucket, Key="crc/big", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] in (composite, f"{composite}-{len(parts)}")  # S3 appends "-N"; moto's HEAD does not
    assert s3.get_object(Bucket=s3_bucket, Key="crc/big")["Body"].read() == big
    # AWS_REQUEST_CHECKSUM_CALCULATION=when_required (the SDKs' switch, for stores that refuse the headers): none sent.
    run_batch(s3_server.env(AWS_REQUEST_CHECKSUM_CALCULATION="when_required"),
              [{"op": "put", "uri": f"{base}/crc/plain", "data": "no checksum"}], tmp_path, "plain")
    assert "ChecksumCRC32" not in s3.head_object(Bucket=s3_bucket, Key="crc/plain", ChecksumMode="ENABLED")


def test_listing_follows_continuation_tokens(s3_server, s3_bucket, tmp_path):
    s3 = s3_server.client()
    keys = [f"many/{i:05d}" for i in range(1005)]  # S3 pages listings at 1,000 keys
    for k in keys:
        s3.put_object(Bucket=s3_bucket, Key=k, Body=k.encode())
    out = run_batch(s3_server.env(), [{"op": "list", "uri": f"s3://{s3_bucket}/many/"}], tmp_path)
    assert [o[0] for o in out["results"][0]["objects"]] == [f"s3://{s3_bucket}/{k}" for k in keys]


def test_wrong_credentials_name_the_bucket_and_hide_the_secret(s3_server, s3_bucket, tmp_path):
    env = s3_server.env(AWS_SECRET_ACCESS_KEY="not-the-secret-key")
    out = run_batch(env, [{"op": "get", "uri": f"s3://{s3_bucket}/x"}], tmp_path)
    err = out["results"][0]["error"]
    assert "SignatureDoesNotMatch" in err and s3_bucket in err and "403" in err and "environment" in err
    assert "not-the-secret-key" not in err


def test_credentials_come_from_a_profile_file_read_once(s3_server, s3_bucket, tmp_path):
    creds = tmp_path / "credentials"
    creds.write_text(f"[other]\naws_access_key_id = AKIAWRONG\naws_secret_access_key = wrong\n\n"
                     f"[ci]\naws_access_key_id = {s3_server.access_key_id}\n"
                     f"aws_secret_access_key = {s3_server.secret_access_key}\n")
    env = s3_server.env(AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_PROFILE="ci")
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    ops = [{"op": "put", "uri": f"s3://{s3_bucket}/p/{i}", "data": str(i)} for i in range(20)]
    ops += [{"op": "get", "uri": f"s3://{s3_bucket}/p/{i}"} for i in range(20)]
    out = run_batch(env, ops, tmp_path)
    assert [r["data"] for r in out["results"][20:]] == [str(i) for i in range(20)]
    assert out["credential_loads"] == 1 and out["requests"] == 40


def test_no_credentials_is_a_clear_error(s3_server, tmp_path):
    env = s3_server.env()
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    out = run_batch(env, [{"op": "get", "uri": "s3://some-bucket/x"}], tmp_path)
    assert "no AWS credentials" in out["results"][0]["error"] and "AWS_PROFILE" in out["results"][0]["error"]


@pytest.fixture
def fault_proxy(s3_server):
    from s3_server import FaultProxy

    proxy = FaultProxy(s3_server.url, stall_s=8)
    yield proxy
    proxy.stop()


def test_transient_failures_are_retried(s3_server, s3_bucket, fault_proxy, tmp_path):
    data = os.urandom(40 * 1024 * 1024)
    s3_server.client().put_object(Bucket=s3_bucket, Key="obj", Body=data)
    # Every kind of failure, several in a row, on a ranged download and on a multipart upload.
    fault_proxy.plan = ["503", "500", "reset", "stall", "503", "ok", "reset", "ok", "500", "ok", "stall", "503"]
    env = s3_server.env(S3_ENDPOINT_URL=fault_proxy.url, TESSERA_S3_STALL_TIMEOUT_S="2",
                        TESSERA_S3_PARALLELISM="2")
    (tmp_path / "up.bin").write_bytes(data[::-1])
    out = run_batch(env, [{"op": "download", "uri": f"s3://{s3_bucket}/obj", "path": str(tmp_path / "obj")},
                          {"op": "put_file", "path": str(tmp_path / "up.bin"), "uri": f"s3://{s3_bucket}/up"}],
                    tmp_path)
    assert [r.get("error") for r in out["results"]] == [None, None]
    assert (tmp_path / "obj").read_bytes() == data
    assert s3_server.client().get_object(Bucket=s3_bucket, Key="up")["Body"].read() == data[::-1]
    assert not fault_proxy.plan  # every planned failure was met, and survived
    # 5 ranges, create + 5 parts + complete without faults; every injected failure cost a retry (libcurl itself
    # resends once on a reused connection that was reset, which the proxy sees and the client does not count).
    assert out["requests"] >= 12 + 7  # the 7 failures other than resets


def test_conditional_writes_refuse_a_stale_etag(s3_server, s3_bucket, tmp_path):
    from remote_training import conditional_writes

    conditional_writes(s3_server.env(), tmp_path, f"s3://{s3_bucket}")  # If-Match / If-None-Match: * on PutObject


def test_a_store_without_conditional_puts_gets_etags_compared_instead(s3_server, s3_bucket, tmp_path):
    # An S3-compatible store that answers a conditional PUT with 501 NotImplemented (as stores without the feature
    # do): the write is not lost; the client compares HEAD's ETag before a plain PUT from then on, with a warning.
    from remote_training import conditional_writes
    from s3_server import FaultProxy

    refused = []

    def gate(method, path, headers):
        if method == "PUT" and (headers.get("If-Match") or headers.get("If-None-Match")):
            refused.append(path)
            return 501, "NotImplemented", "A header you provided implies functionality that is not implemented"
        return None

    proxy = FaultProxy(s3_server.url, gate=gate)
    try:
        conditional_writes(s3_server.env(S3_ENDPOINT_URL=proxy.url), tmp_path, f"s3://{s3_bucket}/plain-store")
    finally:
        proxy.stop()
    assert len(refused) == 2  # once per process (conditional_writes runs two), then no conditional PUT is tried


def test_an_empty_object_downloads_as_an_empty_file(s3_server, s3_bucket, tmp_path):
    s3_server.client().put_object(Bucket=s3_bucket, Key="empty", Body=b"")
    out = run_batch(s3_server.env(), [{"op": "download", "uri": f"s3://{s3_bucket}/empty", "path": str(tmp_path / "e")},
                                      {"op": "download", "uri": f"s3://{s3_bucket}/absent", "path": str(tmp_path / "a")}],
                    tmp_path)
    assert out["results"][0].get("error") is None and (tmp_path / "e").read_bytes() == b""
    assert "NoSuchKey" in out["results"][1]["error"] and not (tmp_path / "a").exists()


def test_a_server_that_keeps_failing_exhausts_the_retry_budget(s3_server, s3_bucket, fault_proxy, tmp_path):
    fault_proxy.after = "503"
    env = s3_server.env(S3_ENDPOINT_URL=fault_proxy.url, TESSERA_S3_MAX_ATTEMPTS="3")
    out = run_batch(env, [{"op": "get", "uri": f"s3://{s3_bucket}/obj"}], tmp_path)
    err = out["results"][0]["error"]
    assert f"s3://{s3_bucket}/obj" in err and "HTTP 503 SlowDown" in err and "gave up after 3 attempts" in err
    assert len(fault_proxy.seen) == 3


def test_an_unreachable_endpoint_is_a_clear_error(s3_server, tmp_path):
    from s3_server import free_port

    env = s3_server.env(S3_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}", TESSERA_S3_MAX_ATTEMPTS="2")
    out = run_batch(env, [{"op": "get", "uri": "s3://bucket/key"}], tmp_path)
    err = out["results"][0]["error"]
    assert "s3://bucket/key" in err and "Couldn't connect" in err and "gave up after 2 attempts" in err
