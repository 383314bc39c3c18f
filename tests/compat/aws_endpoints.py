"""Loopback stand-ins for the AWS credential endpoints that exist only inside AWS, following their documented
protocols, with every credential they hand out minted by the moto server's real STS (so moto's S3 accepts it):

- the container credentials endpoint (ECS, SageMaker, EKS Pod Identity: GET with an Authorization header, JSON with
  AccessKeyId, SecretAccessKey, Token, Expiration),
- the EC2 instance metadata service, IMDSv2 (PUT /latest/api/token with a TTL header; GETs carrying the token),
- STS's AssumeRoleWithWebIdentity as an OIDC provider backs it: the web identity token is checked against the one
  the test issued, then the call goes on to moto's STS (signed, since moto's authentication is on).

Each endpoint says in the Expiration it returns how long its credentials last (`lifetime_s`), and records the expiry
of every key it issued in `expiry`, which `S3Front.gate` enforces in front of moto's S3 (moto does not)."""
import datetime
import http.server
import json
import threading
import time
import urllib.parse
import urllib.request

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class CredentialEndpoints:
    def __init__(self, moto, role_arn, lifetime_s=3600, auth_token="container-token", web_token="oidc-token"):
        self.moto, self.role_arn, self.lifetime_s = moto, role_arn, lifetime_s
        self.auth_token, self.web_token = auth_token, web_token
        self.expiry = {}            # access key id -> unix time it stops working
        self.early_expiry_s = None  # when set: keys stop working this long after issue, whatever Expiration says
        self.issued = []            # (endpoint, access key id) in order
        self.imds_tokens = set()
        self.web_tokens_seen = []
        self.keys_used = []         # the access key of every request S3Front passed or refused
        self.refused = []           # keys S3Front refused as expired
        self.lock = threading.Lock()
        self.sts = boto3.client("sts", endpoint_url=moto.url, region_name="us-east-1",
                                aws_access_key_id=moto.access_key_id, aws_secret_access_key=moto.secret_access_key)
        endpoints = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def answer(self, status, body, content_type="application/json"):
                data = body.encode() if isinstance(body, str) else body
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    token = f"imds-{len(endpoints.imds_tokens)}"
                    endpoints.imds_tokens.add(token)
                    return self.answer(200, token, "text/plain")
                self.answer(400, "bad token request", "text/plain")

            def do_GET(self):
                if self.path == "/container-credentials":
                    if self.headers.get("Authorization") != endpoints.auth_token:
                        return self.answer(401, '{"message": "bad authorization"}')
                    return self.answer(200, json.dumps(endpoints.mint("container", "Token")))
                base = "/latest/meta-data/iam/security-credentials/"
                if self.path.startswith(base):
                    if self.headers.get("X-aws-ec2-metadata-token") not in endpoints.imds_tokens:
                        return self.answer(401, "", "text/plain")  # IMDSv2 refuses a request without its token
                    if self.path == base:
                        return self.answer(200, "trainer-instance-role", "text/plain")
                    if self.path == base + "trainer-instance-role":
                        creds = endpoints.mint("imds", "Token")
                        creds.update(Code="Success", Type="AWS-HMAC", LastUpdated=iso(time.time()))
                        return self.answer(200, json.dumps(creds))
                self.answer(404, "not found", "text/plain")

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                form = urllib.parse.parse_qs(body.decode())
                if form.get("Action") != ["AssumeRoleWithWebIdentity"]:
                    return self.answer(400, "only AssumeRoleWithWebIdentity here", "text/plain")
                token = form.get("WebIdentityToken", [""])[0]
                with endpoints.lock:
                    endpoints.web_tokens_seen.append(token)
                if token != endpoints.web_token:
                    return self.answer(400, "<ErrorResponse><Error><Code>InvalidIdentityToken</Code><Message>the "
                                            "token is not valid</Message></Error></ErrorResponse>", "text/xml")
                # The OIDC check passed: moto's STS mints the credentials (it wants the call signed).
                request = AWSRequest(method="POST", url=endpoints.moto.url + "/", data=body,
                                     headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
                SigV4Auth(Credentials(endpoints.moto.access_key_id, endpoints.moto.secret_access_key), "sts",
                          "us-east-1").add_auth(request)
                with urllib.request.urlopen(urllib.request.Request(
                        request.url, data=body, headers=dict(request.headers.items()), method="POST")) as r:
                    data = r.read()
                key = data.decode().split("<AccessKeyId>")[1].split("</AccessKeyId>")[0]
                with endpoints.lock:
                    endpoints.issued.append(("web-identity", key))
                self.answer(200, data, "text/xml")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def mint(self, endpoint, token_name):
        with self.lock:
            c = self.sts.assume_role(RoleArn=self.role_arn, RoleSessionName=f"{endpoint}-{len(self.issued)}")
            c = c["Credentials"]
            now = time.time()
            self.expiry[c["AccessKeyId"]] = now + (self.early_expiry_s or self.lifetime_s)
            self.issued.append((endpoint, c["AccessKeyId"]))
        return {"AccessKeyId": c["AccessKeyId"], "SecretAccessKey": c["SecretAccessKey"],
                token_name: c["SessionToken"], "Expiration": iso(now + self.lifetime_s)}

    def gate(self, method, path, headers):
        """For S3Front: refuse a request signed with a key this server issued once that key has expired, as S3 does."""
        auth = headers.get("Authorization", "")
        key = auth.split("Credential=")[1].split("/")[0] if "Credential=" in auth else ""
        with self.lock:
            self.keys_used.append(key)
            expired = key in self.expiry and time.time() >= self.expiry[key]
            if expired:
                self.refused.append(key)
        return (400, "ExpiredToken", "The provided token has expired.") if expired else None

    def stop(self):
        self.server.shutdown()
