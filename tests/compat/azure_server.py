"""Azure Blob Storage on loopback for the azure:// tests, following the Blob service REST API that azure-storage-blob
speaks (Azurite's path-style addressing: http://127.0.0.1:PORT/{account}/{container}/{blob}), with the official SDK as
both the peer client and the judge of every request's credential:

- Shared Key: the Authorization header must equal the one azure-storage-blob's own SharedKeyCredentialPolicy computes
  for the request as received (verb, standard headers, x-ms-* headers, canonicalized resource and query), and
  x-ms-date must be within 15 minutes;
- SAS: the query must carry every parameter of a token the test issued with the SDK's generate_*_sas, unexpired, with
  the permission the operation needs (r, w, l, d);
- Microsoft Entra bearer tokens, issued by this server's own token endpoints: `POST /{tenant}/oauth2/v2.0/token`
  (client secret or federated client assertion) and `GET /metadata/identity/oauth2/token` (the instance metadata
  service, `Metadata: true`), each token valid for `token_lifetime_s`; an expired one answers 401
  InvalidAuthenticationInfo, as Azure does.

Operations: create container, Put Blob, Put Block, Put Block List (a blob appears only when committed), Get Blob
(x-ms-range or Range, If-Match), Get Blob Properties, Delete Blob, List Blobs (prefix, marker, maxresults; pages of
`page_size`), Get Container Properties. Every request is recorded in `seen` as (method, path, auth kind, the error
code it was refused with or None)."""
import base64
import datetime
import email.utils
import hashlib
import http.server
import os
import secrets
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET

from loopback_http import QuietHandler
from s3_server import free_port

ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key: public, never a secret.
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def connection_string(url, key=True):
    """Azurite's form of a connection string for the server at `url`, with the account key or without."""
    cs = f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};BlobEndpoint={url}/{ACCOUNT};"
    return cs + (f"AccountKey={ACCOUNT_KEY};" if key else "")


def tessera_env(url, **extra):
    """The environment of a Tessera process using Shared Key (default), or what `extra` says, with no Azure
    credentials of the user's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "IDENTITY_", "MSI_"))}
    env.update(AZURE_STORAGE_CONNECTION_STRING=connection_string(url), TESSERA_AZURE_MAX_ATTEMPTS="6")
    env.update(extra)
    return env


def sdk_client(url):
    """azure-storage-blob's client, uploading in 4 MiB blocks above 4 MiB (Put Block + Put Block List)."""
    from azure.storage.blob import BlobServiceClient

    return BlobServiceClient.from_connection_string(connection_string(url), max_single_put_size=4 << 20,
                                                    max_block_size=4 << 20)


def rfc1123(t=None):
    return email.utils.formatdate(t if t is not None else time.time(), usegmt=True)


class AzureBlobServer:
    def __init__(self, token_lifetime_s=3600, page_size=5000):
        self.containers, self.blocks, self.seen = {}, {}, []
        self.sas_tokens, self.tokens, self.token_lifetime_s, self.page_size = [], {}, token_lifetime_s, page_size
        self.client_secrets, self.federated_tokens, self.token_requests = {}, set(), []
        self.lock = threading.Lock()
        self.etag_counter = 0
        server = self

        from azure.core.pipeline import PipelineContext, PipelineRequest
        from azure.core.pipeline.transport import HttpRequest
        from azure.storage.blob._shared.authentication import SharedKeyCredentialPolicy

        policy = SharedKeyCredentialPolicy(ACCOUNT, ACCOUNT_KEY)

        def expected_shared_key(method, url, headers):
            req = HttpRequest(method, url, headers={k: v for k, v in headers.items() if k.lower() != "authorization"})
            policy.on_request(PipelineRequest(req, PipelineContext(None)))
            return req.headers["Authorization"]

        class Handler(QuietHandler):
            def service_headers(self):
                return [("x-ms-request-id", secrets.token_hex(8)), ("x-ms-version", "2023-11-03"),
                        ("Date", rfc1123())]

            def error(self, status, code, message):
                body = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{message}\n'
                        f"RequestId:{secrets.token_hex(8)}</Message></Error>").encode()
                self.answer(status, body, [("x-ms-error-code", code), ("Content-Type", "application/xml")])

            def authorized(self, query, permission):
                """None when the request's credential is good for `permission`, else it has been answered."""
                auth = self.headers.get("Authorization", "")
                if "sig" in query:
                    kind = "sas"
                    given = {k: v[0] for k, v in query.items()}
                    for token in server.sas_tokens:
                        params = {k: v[0] for k, v in urllib.parse.parse_qs(token).items()}
                        if all(given.get(k) == v for k, v in params.items()):
                            expiry = datetime.datetime.strptime(params["se"], "%Y-%m-%dT%H:%M:%SZ")
                            if expiry.replace(tzinfo=datetime.timezone.utc) < datetime.datetime.now(
                                    datetime.timezone.utc):
                                return kind, (403, "AuthenticationFailed", "Signed expiry time has passed")
                            if permission not in params.get("sp", ""):
                                return kind, (403, "AuthorizationPermissionMismatch",
                                              "This request is not authorized to perform this operation using this "
                                              "permission.")
                            return kind, None
                    return kind, (403, "AuthenticationFailed", "Signature did not match.")
                if auth.startswith("Bearer "):
                    expiry = server.tokens.get(auth[len("Bearer "):])
                    if expiry is None:
                        return "bearer", (401, "InvalidAuthenticationInfo", "Authentication information is not given "
                                                                           "in the correct format.")
                    if expiry < time.time():
                        return "bearer", (401, "InvalidAuthenticationInfo", "Lifetime validation failed. The token "
                                                                           "is expired.")
                    return "bearer", None
                if auth.startswith("SharedKey "):
                    date = self.headers.get("x-ms-date", "")
                    try:
                        sent = email.utils.parsedate_to_datetime(date).timestamp()
                    except (TypeError, ValueError):
                        sent = 0
                    if abs(sent - time.time()) > 900:
                        return "sharedkey", (403, "AuthenticationFailed", f"x-ms-date '{date}' is missing or stale")
                    want = expected_shared_key(self.command, f"http://127.0.0.1:{server.port}{self.path}",
                                               self.headers)
                    if auth != want:
                        return "sharedkey", (403, "AuthenticationFailed",
                                             "Server failed to authenticate the request. Make sure the value of "
                                             "Authorization header is formed correctly including the signature.")
                    return "sharedkey", None
                return "anonymous", (401, "NoAuthenticationInformation",
                                     "Server failed to authenticate the request.")

            def token_endpoint(self, path, query, body):
                form = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode()).items()}
                server.token_requests.append((self.command, path, form))
                if path.endswith("/oauth2/v2.0/token") and self.command == "POST":
                    client = form.get("client_id", "")
                    secret = form.get("client_secret")
                    ok = form.get("grant_type") == "client_credentials" and \
                        form.get("scope") == "https://storage.azure.com/.default" and (
                            (secret is not None and server.client_secrets.get(client) == secret)
                            or form.get("client_assertion") in server.federated_tokens)
                    if not ok:
                        return self.json(401, {"error": "invalid_client",
                                               "error_description": "AADSTS7000215: Invalid client secret provided."})
                    return self.json(200, self.issue() | {"token_type": "Bearer", "ext_expires_in": 3600})
                if path == "/metadata/identity/oauth2/token" and self.headers.get("Metadata") == "true":
                    if query.get("resource", [""])[0] != "https://storage.azure.com/":
                        return self.json(400, {"error": "invalid_resource"})
                    issued = self.issue()
                    return self.json(200, {"access_token": issued["access_token"],
                                           "expires_in": str(issued["expires_in"]),
                                           "expires_on": str(int(time.time()) + issued["expires_in"]),
                                           "resource": "https://storage.azure.com/", "token_type": "Bearer"})
                return self.json(400, {"error": "invalid_request"})

            def issue(self):
                token = "eyJ0eXAi." + secrets.token_urlsafe(24)
                server.tokens[token] = time.time() + server.token_lifetime_s
                return {"access_token": token, "expires_in": server.token_lifetime_s}

            def handle_any(self):
                url = urllib.parse.urlparse(self.path)
                query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
                length = int(self.headers.get("Content-Length", 0) or 0)
                body = self.rfile.read(length) if length else b""
                parts = url.path.lstrip("/").split("/", 2)
                if url.path.startswith("/metadata/") or url.path.endswith("/oauth2/v2.0/token"):
                    return self.token_endpoint(url.path, query, body)
                if parts[0] != ACCOUNT:
                    return self.error(400, "InvalidUri", f"no account {parts[0]}")
                container = urllib.parse.unquote(parts[1]) if len(parts) > 1 else ""
                blob = urllib.parse.unquote(parts[2]) if len(parts) > 2 else ""
                comp, restype = query.get("comp", [""])[0], query.get("restype", [""])[0]
                need = {"GET": "l" if comp == "list" else "r", "HEAD": "r", "PUT": "w", "DELETE": "d"}[self.command]
                kind, refusal = self.authorized(query, need)
                server.seen.append((self.command, url.path, kind, refusal[1] if refusal else None))
                if refusal:
                    return self.error(*refusal)
                with server.lock:
                    return self.dispatch(container, blob, comp, restype, query, body)

            def dispatch(self, container, blob, comp, restype, query, body):
                store = server.containers.get(container)
                if restype == "container" and not blob:
                    if self.command == "PUT":
                        if store is not None:
                            return self.error(409, "ContainerAlreadyExists", "The specified container already exists.")
                        server.containers[container] = {}
                        return self.answer(201, headers=[("ETag", server.etag()), ("Last-Modified", rfc1123())])
                    if store is None:
                        return self.error(404, "ContainerNotFound", "The specified container does not exist.")
                    if comp == "list":
                        return self.listing(container, store, query)
                    return self.answer(200, headers=[("ETag", '"0x1"'), ("Last-Modified", rfc1123())])
                if store is None:
                    return self.error(404, "ContainerNotFound", "The specified container does not exist.")
                if self.command == "PUT":
                    if comp == "block":
                        block_id = query["blockid"][0]
                        server.blocks.setdefault((container, blob), {})[block_id] = body
                        return self.answer(201)
                    if comp == "blocklist":
                        staged = server.blocks.get((container, blob), {})
                        committed = store.get(blob, {}).get("blocks", {})
                        pieces, kept = [], {}
                        for item in ET.fromstring(body):
                            block_id = item.text or ""
                            source = {"Latest": [staged, committed], "Uncommitted": [staged],
                                      "Committed": [committed]}.get(item.tag, [])
                            found = next((s[block_id] for s in source if block_id in s), None)
                            if found is None:
                                return self.error(400, "InvalidBlockList", "The specified block list is invalid.")
                            pieces.append(found)
                            kept[block_id] = found
                        server.blocks.pop((container, blob), None)
                        return self.put_blob(store, blob, b"".join(pieces), kept)
                    if self.headers.get("x-ms-blob-type") != "BlockBlob":
                        return self.error(400, "MissingRequiredHeader", "x-ms-blob-type")
                    match, none_match = self.headers.get("If-Match"), self.headers.get("If-None-Match")
                    current = store.get(blob)
                    if match and (current is None or match.strip('"') != current["etag"].strip('"')):
                        return self.error(412, "ConditionNotMet", "The condition specified using HTTP conditional "
                                                                  "header(s) is not met.")
                    if none_match == "*" and current is not None:
                        return self.error(409, "BlobAlreadyExists", "The specified blob already exists.")
                    return self.put_blob(store, blob, body, {})
                item = store.get(blob)
                if self.command == "DELETE":
                    if item is None:
                        return self.error(404, "BlobNotFound", "The specified blob does not exist.")
                    del store[blob]
                    return self.answer(202)
                if item is None:
                    return self.error(404, "BlobNotFound", "The specified blob does not exist.")
                match = self.headers.get("If-Match")
                if match and match not in (item["etag"], "*"):
                    return self.error(412, "ConditionNotMet", "The condition specified using HTTP conditional "
                                                              "header(s) is not met.")
                data = item["data"]
                props = [("ETag", item["etag"]), ("Last-Modified", item["modified"]), ("x-ms-blob-type", "BlockBlob"),
                         ("Content-Type", "application/octet-stream"), ("Accept-Ranges", "bytes"),
                         ("x-ms-creation-time", item["modified"]), ("x-ms-lease-state", "available"),
                         ("x-ms-lease-status", "unlocked"), ("x-ms-server-encrypted", "true")]
                if self.command == "HEAD":
                    return self.answer(200, headers=props + [("Content-Length", str(len(data)))])
                rng = self.headers.get("x-ms-range") or self.headers.get("Range")
                if rng:
                    first, _, last = rng[len("bytes="):].partition("-")
                    first = int(first)
                    last = min(int(last) if last else len(data) - 1, len(data) - 1)
                    if first >= len(data):
                        return self.error(416, "InvalidRange", "The range specified is invalid for the current size "
                                                               "of the resource.")
                    # A view, not a copy: the server's own memcpy would cap ranged reads below whole ones.
                    return self.answer(206, memoryview(data)[first:last + 1],
                                       props + [("Content-Range", f"bytes {first}-{last}/{len(data)}")])
                return self.answer(200, data, props)

            def put_blob(self, store, blob, data, blocks):
                store[blob] = {"data": data, "etag": server.etag(), "modified": rfc1123(), "blocks": blocks}
                return self.answer(201, headers=[("ETag", store[blob]["etag"]),
                                                 ("Last-Modified", store[blob]["modified"]),
                                                 ("Content-MD5", base64.b64encode(hashlib.md5(data).digest()).decode()),
                                                 ("x-ms-request-server-encrypted", "true")])

            def listing(self, container, store, query):
                prefix = query.get("prefix", [""])[0]
                marker = query.get("marker", [""])[0]
                size = min(int(query.get("maxresults", [server.page_size])[0]), server.page_size)
                names = sorted(n for n in store if n.startswith(prefix) and (not marker or n >= marker))
                page, rest = names[:size], names[size:]
                root = ET.Element("EnumerationResults", ServiceEndpoint=f"http://127.0.0.1:{server.port}/{ACCOUNT}",
                                  ContainerName=container)
                ET.SubElement(root, "Prefix").text = prefix
                blobs = ET.SubElement(root, "Blobs")
                for name in page:
                    b = ET.SubElement(blobs, "Blob")
                    ET.SubElement(b, "Name").text = name
                    props = ET.SubElement(b, "Properties")
                    ET.SubElement(props, "Last-Modified").text = store[name]["modified"]
                    ET.SubElement(props, "Etag").text = store[name]["etag"]
                    ET.SubElement(props, "Content-Length").text = str(len(store[name]["data"]))
                    ET.SubElement(props, "Content-Type").text = "application/octet-stream"
                    ET.SubElement(props, "BlobType").text = "BlockBlob"
                ET.SubElement(root, "NextMarker").text = rest[0] if rest else None
                body = b'<?xml version="1.0" encoding="utf-8"?>' + ET.tostring(root)
                return self.answer(200, body, [("Content-Type", "application/xml")])

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = handle_any

        self.port = free_port()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.port}"

    def etag(self):
        self.etag_counter += 1
        return f'"0x8DC{self.etag_counter:012X}"'

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def connection_string(self, key=True, endpoint=None):
        """Azurite's form; `endpoint` puts another URL (a proxy's) in front."""
        return connection_string(endpoint or self.url, key)

    def env(self, **extra):
        return tessera_env(self.url, **extra)

    def client(self):
        return sdk_client(self.url)

    def container_sas(self, container, permission, expiry_s=3600):
        """A container SAS made by azure-storage-blob's generate_container_sas, accepted by this server."""
        from azure.storage.blob import generate_container_sas

        expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=expiry_s)
        token = generate_container_sas(ACCOUNT, container, account_key=ACCOUNT_KEY, permission=permission,
                                       expiry=expiry.replace(microsecond=0))
        self.sas_tokens.append(token)
        return token


if __name__ == "__main__":  # a server process of its own (the benchmark): prints its URL, serves until killed
    server = AzureBlobServer()
    print(server.url, flush=True)
    threading.Event().wait()
