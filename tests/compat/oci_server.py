"""OCI Object Storage on loopback for the oci:// tests, following the native REST API the `oci` SDK's
ObjectStorageClient speaks (the SDK is the peer, pointed at it with `service_endpoint`), with the SDK also judging
every request's signature:

- each request's `Authorization` must equal what `oci.signer.Signer` computes, with the test's API key, for the request
  as received (or, for keyId `ST$<token>`, what `oci.auth.signers.SecurityTokenSigner` computes with the session key
  for `session_token`, the one token the server currently accepts; `start_session` makes them) (date, (request-target), host; for a JSON body also content-length, content-type and
  x-content-sha256, which must be the body's; object and part uploads are signed without their bodies, as the SDK
  signs them), and `date` must be within 5 minutes;
- GetNamespace (`GET /n/`), PutObject, GetObject (Range, If-Match), HeadObject, DeleteObject, ListObjects (`prefix`,
  `start`, `fields`; pages of `page_size` with `nextStartWith`), and multipart uploads (create, upload part, commit,
  abort; the object appears only when committed). Buckets exist when the test made them (`create_bucket`).

Instance principals (`start_instance_principal`): an instance metadata service at `/opc/v2/` (region, leaf certificate
with `opc-tenant:` in its subject, its key, the intermediate certificate; only with "Authorization: Bearer Oracle")
and the auth service's `POST /v1/x509`, whose signature must equal what the SDK's `AuthTokenRequestSigner` computes
with the leaf key and whose certificates must be the instance's; it answers a JWT (`exp` `token_lifetime_s` ahead)
bound to the request's session public key. Requests signed "ST$<token>" with such a token are verified against that
public key (the signing string rebuilt from the signed headers) until the token expires.

Every request is recorded in `seen` as (method, path, status)."""
import base64
import datetime
import email.utils
import hashlib
import http.server
import json
import os
import secrets
import tempfile
import threading
import time
import urllib.parse

from loopback_http import QuietHandler
from s3_server import free_port

TENANCY = "ocid1.tenancy.oc1..aaaatesseratenancy"
USER = "ocid1.user.oc1..aaaatesserauser"


def pem_body(pem):
    """A PEM's base64 on one line, as the auth service takes certificates and keys (the SDK's sanitizing)."""
    return "".join(line for line in pem.splitlines() if not line.startswith("-----"))


def make_api_key(folder, name="oci_api_key"):
    """A fresh RSA API key as `oci setup keys` makes one: the PEM path and the key's fingerprint."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = os.path.join(folder, f"{name}.pem")
    with open(path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                  serialization.NoEncryption()))
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    fingerprint = ":".join(f"{b:02x}" for b in hashlib.md5(der).digest())
    return path, fingerprint


class OciObjectStorageServer:
    def __init__(self, namespace="tessera-ns", page_size=1000):
        self.namespace, self.page_size = namespace, page_size
        self.buckets, self.uploads, self.seen = {}, {}, []
        self.lock = threading.Lock()
        self.folder = tempfile.mkdtemp(prefix="oci-server-")
        self.key_file, self.fingerprint = make_api_key(self.folder)
        server = self

        import oci
        import requests

        signer = oci.signer.Signer(TENANCY, USER, self.fingerprint, self.key_file)
        self.session_token, self.session_key = None, None
        self.instance, self.principal_tokens, self.token_lifetime_s, self.federations = None, {}, 3600, 0

        def expected(method, url, headers, body, with_body):
            sent = headers.get("Authorization", "")
            if server.session_token and f'keyId="ST${server.session_token}"' in sent:
                from oci.auth.signers import SecurityTokenSigner

                session = SecurityTokenSigner(server.session_token, server.session_key)
                prepared = requests.Request(method, url, headers={k: v for k, v in headers.items()
                                                                  if k.lower() != "authorization"},
                                            data=body).prepare()
                session(prepared, enforce_content_headers=with_body)
                return prepared.headers["authorization"]
            prepared = requests.Request(method, url, headers={k: v for k, v in headers.items()
                                                              if k.lower() != "authorization"}, data=body).prepare()
            signer(prepared, enforce_content_headers=with_body)
            return prepared.headers["authorization"]

        class Handler(QuietHandler):
            def service_headers(self):
                return [("opc-request-id", secrets.token_hex(8))]

            def error(self, status, code, message):
                return self.json(status, {"code": code, "message": message})

            def principal_refusal(self, auth, path_and_query):
                """None when `auth` is a valid signature by the session key an unexpired instance-principal token is
                bound to; else why not."""
                from cryptography.hazmat.primitives import hashes
                from cryptography.hazmat.primitives.asymmetric import padding

                fields = dict(part.split("=", 1) for part in auth[len("Signature "):].split(","))
                fields = {k: v.strip('"') for k, v in fields.items()}
                token = fields.get("keyId", "")[len("ST$"):]
                public_key, expires = server.principal_tokens[token]
                if time.time() > expires:
                    return "the security token has expired"
                lines = []
                for name in fields.get("headers", "").split(" "):
                    if name == "(request-target)":
                        lines.append(f"(request-target): {self.command.lower()} {path_and_query}")
                    else:
                        lines.append(f"{name}: {self.headers.get(name, '')}")
                try:
                    public_key.verify(base64.b64decode(fields.get("signature", "")), "\n".join(lines).encode(),
                                      padding.PKCS1v15(), hashes.SHA256())
                except Exception:
                    return "the signature does not verify with the token's session key"
                return None

            def refusal(self, path, body):
                auth = self.headers.get("Authorization", "")
                keyed = auth.split('keyId="', 1)[-1].split('"', 1)[0] if 'keyId="' in auth else ""
                if keyed.startswith("ST$") and keyed[3:] in server.principal_tokens:
                    why = self.principal_refusal(auth, self.path)
                    return (401, "NotAuthenticated", why) if why else None
                if not auth.startswith("Signature "):
                    return 401, "NotAuthenticated", "The required information to complete authentication was not " \
                                                    "provided."
                try:
                    sent = email.utils.parsedate_to_datetime(self.headers.get("date", "")).timestamp()
                except (TypeError, ValueError):
                    sent = 0
                if abs(sent - time.time()) > 300:
                    return 401, "NotAuthenticated", "The request date is missing or too far from now."
                upload = self.command == "PUT" and ("/o/" in path or "/u/" in path)
                with_body = self.command in ("PUT", "POST") and not upload
                if with_body and self.headers.get("x-content-sha256") != base64.b64encode(
                        hashlib.sha256(body).digest()).decode():
                    return 401, "NotAuthenticated", "x-content-sha256 does not match the body."
                url = f"http://{self.headers.get('Host')}{self.path}"
                if auth != expected(self.command, url, self.headers, body or None, with_body):
                    return 401, "NotAuthenticated", "The required information to complete authentication was not " \
                                                    "provided or was incorrect."
                return None

            def instance_metadata(self, path):
                if self.headers.get("Authorization") != "Bearer Oracle":
                    return self.error(401, "NotAuthenticated", "IMDS v2 needs Authorization: Bearer Oracle")
                answers = {"/opc/v2/instance/canonicalRegionName": server.instance["region"],
                           "/opc/v2/instance/region": server.instance["region"],
                           "/opc/v2/identity/cert.pem": server.instance["leaf_pem"],
                           "/opc/v2/identity/key.pem": server.instance["key_pem"],
                           "/opc/v2/identity/intermediate.pem": server.instance["intermediate_pem"]}
                if path not in answers:
                    return self.error(404, "NotFound", path)
                return self.answer(200, answers[path].encode(), [("Content-Type", "text/plain")])

            def federation(self, body):
                from cryptography.hazmat.primitives import serialization
                from oci.auth.federation_client import AuthTokenRequestSigner

                instance = server.instance

                class Leaf:
                    def get_private_key(self):
                        return instance["leaf_key"]

                expected_auth = AuthTokenRequestSigner(TENANCY, instance["fingerprint"], Leaf())
                prepared = requests.Request("POST", f"http://{self.headers.get('Host')}{self.path}",
                                            headers={k: v for k, v in self.headers.items()
                                                     if k.lower() != "authorization"}, data=body).prepare()
                expected_auth(prepared, enforce_content_headers=True)
                if self.headers.get("Authorization") != prepared.headers["authorization"]:
                    return self.error(401, "NotAuthenticated", "The federation request's signature is not the "
                                                               "instance certificate's.")
                request = json.loads(body)
                if request.get("certificate") != pem_body(instance["leaf_pem"]) or \
                        request.get("intermediateCertificates") != [pem_body(instance["intermediate_pem"])]:
                    return self.error(401, "NotAuthenticated", "Not this instance's certificates.")
                public_key = serialization.load_der_public_key(base64.b64decode(request["publicKey"]))
                server.federations += 1
                exp = int(time.time() + server.token_lifetime_s)
                claims = base64.urlsafe_b64encode(json.dumps({"exp": exp, "n": server.federations}).encode())
                token = f"eyJhbGciOiJSUzI1NiJ9.{claims.decode().rstrip('=')}.c2lnbmF0dXJl"
                server.principal_tokens[token] = (public_key, exp)
                return self.json(200, {"token": token})

            def handle_any(self):
                url = urllib.parse.urlsplit(self.path)
                query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
                length = int(self.headers.get("Content-Length", 0) or 0)
                body = self.rfile.read(length) if length else b""
                if server.instance and (url.path.startswith("/opc/v2/") or url.path == "/v1/x509"):
                    with server.lock:
                        status = (self.instance_metadata(url.path) if url.path.startswith("/opc/v2/")
                                  else self.federation(body))
                        server.seen.append((self.command, url.path, status))
                    return
                refusal = self.refusal(url.path, body)
                with server.lock:
                    status = self.error(*refusal) if refusal else self.dispatch(url.path, query, body)
                    server.seen.append((self.command, url.path, status))

            def dispatch(self, path, query, body):
                if path in ("/n", "/n/") and self.command == "GET":  # GetNamespace (the SDK sends /n)
                    return self.json(200, server.namespace)
                parts = path.split("/")  # ['', 'n', ns, 'b', bucket, 'o'|'u', object...]
                if len(parts) < 5 or parts[1] != "n" or parts[3] != "b":
                    return self.error(404, "NotFound", f"no such resource {path}")
                ns, bucket = urllib.parse.unquote(parts[2]), urllib.parse.unquote(parts[4])
                store = server.buckets.get(bucket) if ns == server.namespace else None
                if store is None:
                    return self.error(404, "BucketNotFound", f"Either the bucket named '{bucket}' does not exist in "
                                                             f"the namespace '{ns}' or you are not authorized to "
                                                             "access it")
                kind = parts[5] if len(parts) > 5 else ""
                name = urllib.parse.unquote("/".join(parts[6:])) if len(parts) > 6 else ""
                if kind == "o" and not name:
                    return self.listing(store, query)
                if kind == "u":
                    return self.multipart(store, bucket, name, query, body)
                item = store.get(name)
                if self.command == "PUT":  # (if-match / if-none-match: * make it conditional)
                    match, none_match = self.headers.get("if-match"), self.headers.get("if-none-match")
                    if match and (item is None or match != item["etag"]):
                        return self.error(412, "IfMatchFailed", "The If-Match precondition failed.")
                    if none_match == "*" and item is not None:
                        return self.error(409, "IfNoneMatchFailed", "The If-None-Match precondition failed.")
                    return self.put(store, name, body)
                if item is None:
                    return self.error(404, "ObjectNotFound", f"The object '{name}' was not found in the bucket "
                                                             f"'{bucket}'")
                if self.command == "DELETE":
                    del store[name]
                    return self.answer(204)
                match = self.headers.get("if-match")
                if match and match not in (item["etag"], "*"):
                    return self.error(412, "IfMatchFailed", "The If-Match precondition failed.")
                data = item["data"]
                props = [("ETag", item["etag"]), ("Last-Modified", item["modified"]),
                         ("Content-Type", "application/octet-stream"), ("Accept-Ranges", "bytes")]
                if self.command == "HEAD":
                    return self.answer(200, headers=props + [("Content-Length", str(len(data)))])
                rng = self.headers.get("range")
                if rng:
                    first, _, last = rng[len("bytes="):].partition("-")
                    first, last = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
                    if first >= len(data):
                        return self.error(416, "InvalidRange", "The requested range is not satisfiable.")
                    # A view, not a copy: the server's own memcpy would cap ranged reads below whole ones.
                    return self.answer(206, memoryview(data)[first:last + 1],
                                       props + [("Content-Range", f"bytes {first}-{last}/{len(data)}")])
                return self.answer(200, data, props)

            def put(self, store, name, data):
                etag = secrets.token_hex(16)
                store[name] = {"data": data, "etag": etag, "modified": email.utils.formatdate(usegmt=True)}
                md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
                return self.answer(200, headers=[("ETag", etag), ("opc-content-md5", md5),
                                                 ("Last-Modified", store[name]["modified"])])

            def multipart(self, store, bucket, name, query, body):
                if self.command == "POST" and not name:
                    obj = json.loads(body)["object"]
                    upload_id = secrets.token_hex(12)
                    server.uploads[upload_id] = {"object": obj, "parts": {}}
                    return self.json(200, {"namespace": server.namespace, "bucket": bucket, "object": obj,
                                           "uploadId": upload_id,
                                           "timeCreated": datetime.datetime.now(datetime.timezone.utc).isoformat()})
                upload = server.uploads.get(query.get("uploadId", ""))
                if upload is None or upload["object"] != name:
                    return self.error(404, "NoSuchUpload", "The upload does not exist.")
                if self.command == "PUT":
                    etag = secrets.token_hex(16)
                    upload["parts"][int(query["uploadPartNum"])] = (etag, body)
                    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
                    return self.answer(200, headers=[("ETag", etag), ("opc-content-md5", md5)])
                if self.command == "DELETE":
                    del server.uploads[query["uploadId"]]
                    return self.answer(204)
                pieces = []
                for p in json.loads(body)["partsToCommit"]:
                    etag, data = upload["parts"].get(p["partNum"], (None, None))
                    if etag != p["etag"]:
                        return self.error(400, "InvalidParameter", f"part {p['partNum']}: no such part or ETag")
                    pieces.append(data)
                del server.uploads[query["uploadId"]]
                return self.put(store, name, b"".join(pieces))

            def listing(self, store, query):
                prefix, start = query.get("prefix", ""), query.get("start", "")
                names = sorted(n for n in store if n.startswith(prefix) and n >= start)
                size = min(int(query.get("limit", server.page_size)), server.page_size)
                page, rest = names[:size], names[size:]
                fields = query.get("fields", "name").split(",")
                objects = []
                for n in page:
                    o = {"name": n}
                    if "size" in fields:
                        o["size"] = len(store[n]["data"])
                    if "etag" in fields:
                        o["etag"] = store[n]["etag"]
                    objects.append(o)
                doc = {"objects": objects, "prefixes": []}
                if rest:
                    doc["nextStartWith"] = rest[0]
                return self.json(200, doc)

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = handle_any

        self.port = free_port()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_file = self.write_config("config", self.key_file, self.fingerprint)

    def write_config(self, name, key_file, fingerprint, profile="DEFAULT"):
        path = os.path.join(self.folder, name)
        with open(path, "w") as f:
            f.write(f"[{profile}]\nuser={USER}\nfingerprint={fingerprint}\ntenancy={TENANCY}\nregion=us-ashburn-1\n"
                    f"key_file={key_file}\n")
        return path

    def start_session(self, token):
        """A session as `oci session authenticate` leaves one: a fresh session key, `token` the one the server accepts
        from now on, and a config profile with security_token_file and key_file (no user). Returns the config path;
        calling it again with another token is `oci session refresh` (the same files rewritten)."""
        from cryptography.hazmat.primitives import serialization

        if self.session_key is None:
            path, _ = make_api_key(self.folder, "session_key")
            with open(path, "rb") as f:
                self.session_key = serialization.load_pem_private_key(f.read(), password=None)
        token_file = os.path.join(self.folder, "session_token")
        with open(token_file + ".tmp", "w") as f:
            f.write(token)
        os.replace(token_file + ".tmp", token_file)
        self.session_token = token
        path = os.path.join(self.folder, "session_config")
        with open(path, "w") as f:
            f.write(f"[DEFAULT]\nfingerprint=session\ntenancy={TENANCY}\nregion=us-ashburn-1\n"
                    f"key_file={os.path.join(self.folder, 'session_key.pem')}\nsecurity_token_file={token_file}\n")
        return path

    def start_instance_principal(self, region="us-ashburn-1"):
        """This server as an instance's metadata service and its region's auth service: a fresh intermediate CA and
        a leaf certificate for the tenancy (subject OU opc-tenant:<tenancy>), as OCI issues to an instance."""
        import datetime as dt

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        leaf_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        now = dt.datetime.now(dt.timezone.utc)
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "PKISVC Identity Intermediate test")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
              .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
              .sign(ca_key, hashes.SHA256()))
        leaf = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ocid1.instance.oc1..tessera"),
                                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME,
                                                            "opc-certtype:instance"),
                                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME,
                                                            f"opc-tenant:{TENANCY}")]))
                .issuer_name(ca_name).public_key(leaf_key.public_key()).serial_number(2)
                .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1)).sign(ca_key, hashes.SHA256()))
        pem = serialization.Encoding.PEM
        self.instance = {
            "region": region, "leaf_key": leaf_key,
            "leaf_pem": leaf.public_bytes(pem).decode(), "intermediate_pem": ca.public_bytes(pem).decode(),
            "key_pem": leaf_key.private_bytes(pem, serialization.PrivateFormat.TraditionalOpenSSL,
                                              serialization.NoEncryption()).decode(),
            "fingerprint": ":".join(f"{b:02X}" for b in leaf.fingerprint(hashes.SHA1())),
        }
        return {"OCI_CLI_AUTH": "instance_principal", "OCI_METADATA_BASE_URL": f"{self.url}/opc/v2",
                "TESSERA_OCI_AUTH_ENDPOINT_URL": self.url}

    def stop(self):
        import shutil

        self.httpd.shutdown()
        self.httpd.server_close()
        shutil.rmtree(self.folder, ignore_errors=True)  # the API key it made

    def create_bucket(self, name):
        self.buckets[name] = {}

    def env(self, endpoint=None, **extra):
        """The environment of a Tessera process with the test's API key and this server as the endpoint, with no OCI
        settings of the user's."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("OCI_")}
        env.update(OCI_CONFIG_FILE=self.config_file, TESSERA_OCI_ENDPOINT_URL=endpoint or self.url,
                   TESSERA_OCI_MAX_ATTEMPTS="6", TESSERA_OCI_MULTIPART_THRESHOLD_MB="16")  # multipart on small data
        env.update(extra)
        return env

    def client(self):
        import oci

        config = oci.config.from_file(self.config_file)
        return oci.object_storage.ObjectStorageClient(config, service_endpoint=self.url)


if __name__ == "__main__":  # a server process of its own (the benchmark): prints its URL and config file, serves
    import sys

    server = OciObjectStorageServer()
    for name in sys.argv[1:]:
        server.create_bucket(name)
    print(server.url, server.config_file, flush=True)
    threading.Event().wait()
