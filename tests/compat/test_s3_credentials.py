"""Tessera's S3 credentials chain (src/storage/credentials.cpp) as the AWS SDKs resolve it, against moto's real STS
and S3 (signatures checked) on loopback: a profile's role through STS AssumeRole signed by a credential_process
profile; EKS's web identity through AssumeRoleWithWebIdentity; the container endpoint and IMDSv2, which exist only
inside AWS, from loopback servers that follow their documented protocols (tests/compat/aws_endpoints.py). Temporary
credentials expire during a run of uploads: the client fetches new ones before they do, and one the server refuses
as expired first (ExpiredToken) is fetched again and the request retried; no upload fails."""
import json
import os
import sys

import boto3
import pytest

from aws_endpoints import CredentialEndpoints
from s3_server import FaultProxy
from test_s3_storage import run_batch


@pytest.fixture(scope="module")
def role_arn(s3_server):
    iam = boto3.client("iam", endpoint_url=s3_server.url, region_name="us-east-1",
                       aws_access_key_id=s3_server.access_key_id, aws_secret_access_key=s3_server.secret_access_key)
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": ["sts:AssumeRole", "sts:AssumeRoleWithWebIdentity"]}]}
    arn = iam.create_role(RoleName="trainer", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_role_policy(RoleName="trainer", PolicyName="all", PolicyDocument=json.dumps(policy))
    return arn


@pytest.fixture
def endpoints(s3_server, role_arn):
    e = CredentialEndpoints(s3_server, role_arn)
    yield e
    e.stop()


@pytest.fixture
def s3_front(s3_server, endpoints):
    """The S3 server behind a proxy that refuses expired keys, as S3 does (moto does not)."""
    proxy = FaultProxy(s3_server.url, gate=endpoints.gate)
    yield proxy
    proxy.stop()


def chain_env(s3_server, s3_front, tmp_path, **extra):
    """No static keys, no ~/.aws files, no instance metadata: each test adds the one source it is about."""
    env = s3_server.env(S3_ENDPOINT_URL=s3_front.url, AWS_EC2_METADATA_DISABLED="true",
                        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"),
                        AWS_CONFIG_FILE=str(tmp_path / "no-config"))
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    env.update(extra)
    return env


def put_get_ops(bucket, n, prefix="obj"):
    return ([{"op": "put", "uri": f"s3://{bucket}/{prefix}/{i}", "data": f"payload {i}"} for i in range(n)] +
            [{"op": "get", "uri": f"s3://{bucket}/{prefix}/{i}"} for i in range(n)])


def test_a_profile_role_is_assumed_with_a_credential_process_profile_as_source(s3_server, s3_bucket, s3_front,
                                                                              endpoints, role_arn, tmp_path):
    calls = tmp_path / "process-calls"
    process = tmp_path / "print-keys.py"
    process.write_text(f"import json\nopen({str(calls)!r}, 'a').write('x')\n"
                       f"print(json.dumps({{'Version': 1, 'AccessKeyId': {s3_server.access_key_id!r}, "
                       f"'SecretAccessKey': {s3_server.secret_access_key!r}}}))\n")
    config = tmp_path / "config"
    config.write_text(f"[profile base]\ncredential_process = {sys.executable} {process}\n\n"
                      f"[profile trainer]\nrole_arn = {role_arn}\nsource_profile = base\n"
                      f"role_session_name = tessera-ci\nregion = us-east-1\n")
    sts = FaultProxy(s3_server.url)  # counts the STS calls
    try:
        env = chain_env(s3_server, s3_front, tmp_path, AWS_CONFIG_FILE=str(config), AWS_PROFILE="trainer",
                        AWS_ENDPOINT_URL_STS=sts.url)
        out = run_batch(env, put_get_ops(s3_bucket, 5), tmp_path)
        assert [r.get("error") for r in out["results"]] == [None] * 10
        assert [r["data"] for r in out["results"][5:]] == [f"payload {i}" for i in range(5)]
        assert [m for m, _, _ in sts.seen] == ["POST"]  # one AssumeRole for the whole run
    finally:
        sts.stop()
    assert calls.read_text() == "x"  # the source profile's process ran once
    # Every S3 request was signed with the role's temporary key (moto's ASIA...), never the source's own.
    assert endpoints.keys_used and all(k.startswith("ASIA") for k in endpoints.keys_used)
    assert s3_server.access_key_id not in endpoints.keys_used
    got = s3_server.client().get_object(Bucket=s3_bucket, Key="obj/3")["Body"].read()
    assert got == b"payload 3"
    assert out["credential_loads"] == 1


def test_web_identity_as_eks_gives_it(s3_server, s3_bucket, s3_front, endpoints, role_arn, tmp_path):
    token = tmp_path / "token"
    token.write_text(endpoints.web_token + "\n")
    env = chain_env(s3_server, s3_front, tmp_path, AWS_WEB_IDENTITY_TOKEN_FILE=str(token), AWS_ROLE_ARN=role_arn,
                    AWS_ROLE_SESSION_NAME="pod-7", AWS_ENDPOINT_URL_STS=endpoints.url)
    out = run_batch(env, put_get_ops(s3_bucket, 3), tmp_path)
    assert [r.get("error") for r in out["results"]] == [None] * 6
    assert endpoints.web_tokens_seen == [endpoints.web_token]
    issued = {k for e, k in endpoints.issued if e == "web-identity"}
    assert len(issued) == 1 and set(endpoints.keys_used) == issued

    # A token the identity provider does not accept: the error names the call, the role and STS's reason.
    token.write_text("stale-token")
    out = run_batch(env, [{"op": "get", "uri": f"s3://{s3_bucket}/obj/0"}], tmp_path, "bad")
    err = out["results"][0]["error"]
    assert "AssumeRoleWithWebIdentity" in err and role_arn in err and "InvalidIdentityToken" in err, err


def test_container_credentials_expire_during_uploads_and_every_upload_succeeds(s3_server, s3_bucket, s3_front,
                                                                               endpoints, tmp_path):
    # Credentials that last 6 s, enforced by the S3 front; uploads (12 MiB: 2 parts in parallel) go on for ~10 s.
    endpoints.lifetime_s = 6
    auth = tmp_path / "auth-token"
    auth.write_text(endpoints.auth_token)
    env = chain_env(s3_server, s3_front, tmp_path,
                    AWS_CONTAINER_CREDENTIALS_FULL_URI=endpoints.url + "/container-credentials",
                    AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=str(auth))
    blob = os.urandom(12 * 1024 * 1024 + 5)
    (tmp_path / "blob").write_bytes(blob)
    ops = []
    for i in range(7):
        ops += [{"op": "put_file", "path": str(tmp_path / "blob"), "uri": f"s3://{s3_bucket}/ckpt/{i}"},
                {"op": "sleep", "seconds": 1.5}]
    out = run_batch(env, ops, tmp_path)
    assert [r.get("error") for r in out["results"]] == [None] * len(ops)
    container = [k for e, k in endpoints.issued if e == "container"]
    assert len(container) >= 3, endpoints.issued  # refreshed at least twice during the run
    assert endpoints.refused == []                # and always before S3 would have refused them
    assert set(endpoints.keys_used) <= set(container)
    s3 = s3_server.client()
    assert all(s3.get_object(Bucket=s3_bucket, Key=f"ckpt/{i}")["Body"].read() == blob for i in range(7))

    # The endpoint refuses a wrong authorization token: the error names the endpoint and the status.
    auth.write_text("wrong")
    out = run_batch(env, [{"op": "get", "uri": f"s3://{s3_bucket}/ckpt/0"}], tmp_path, "bad")
    err = out["results"][0]["error"]
    assert "container credentials endpoint" in err and "HTTP 401" in err, err


def test_imdsv2_credentials_the_server_expires_early_are_fetched_again(s3_server, s3_bucket, s3_front, endpoints,
                                                                       tmp_path):
    # Expiration says an hour, but S3 refuses the keys after 1 s (a revoked session; a skewed clock): the client
    # hears ExpiredToken, fetches new credentials from the instance metadata and retries the request.
    endpoints.early_expiry_s = 1
    env = chain_env(s3_server, s3_front, tmp_path, AWS_EC2_METADATA_DISABLED="false",
                    AWS_EC2_METADATA_SERVICE_ENDPOINT=endpoints.url)
    ops = [{"op": "put", "uri": f"s3://{s3_bucket}/a", "data": "first"}, {"op": "sleep", "seconds": 1.5},
           {"op": "put", "uri": f"s3://{s3_bucket}/b", "data": "second"}, {"op": "get", "uri": f"s3://{s3_bucket}/a"}]
    out = run_batch(env, ops, tmp_path)
    assert [r.get("error") for r in out["results"]] == [None] * 4
    assert out["results"][3]["data"] == "first"
    imds = [k for e, k in endpoints.issued if e == "imds"]
    assert len(imds) == 2 and endpoints.refused == [imds[0]]
    assert endpoints.imds_tokens  # every metadata GET carried an IMDSv2 session token (else it is refused)


def test_misconfigured_sources_are_clear_errors(s3_server, s3_front, role_arn, tmp_path):
    config = tmp_path / "config"
    config.write_text(f"[profile lonely]\nrole_arn = {role_arn}\n")
    out = run_batch(chain_env(s3_server, s3_front, tmp_path, AWS_CONFIG_FILE=str(config), AWS_PROFILE="lonely"),
                    [{"op": "get", "uri": "s3://b/x"}], tmp_path, "lonely")
    err = out["results"][0]["error"]
    assert "profile [lonely]" in err and "source_profile" in err, err
    # Nothing anywhere, and no metadata service answering: the error lists where it looked.
    out = run_batch(chain_env(s3_server, s3_front, tmp_path, AWS_EC2_METADATA_DISABLED="false",
                              AWS_EC2_METADATA_SERVICE_ENDPOINT="http://127.0.0.1:9"),
                    [{"op": "get", "uri": "s3://b/x"}], tmp_path, "nothing")
    err = out["results"][0]["error"]
    assert "no AWS credentials" in err and "AWS_WEB_IDENTITY_TOKEN_FILE" in err and "instance metadata" in err, err
