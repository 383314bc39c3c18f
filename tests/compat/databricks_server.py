"""A Databricks workspace on loopback for the dbfs:/Volumes tests: the Files API that databricks-sdk's `files` client
speaks (databricks-sdk and mosaicml-streaming's Unity Catalog uploader and downloader are the peers, pointed at it
with DATABRICKS_HOST), and the workspace's OAuth token endpoint for service principals.

- `PUT /api/2.0/fs/files{path}?overwrite=` (parent folders created), `GET` (with `Range` and
  `If-Unmodified-Since`), `HEAD`, `DELETE`; `GET /api/2.0/fs/directories{path}` (`contents`, paged with
  `page_size` / `page_token`), `PUT` and `HEAD` on directories. Paths must lie in a volume the test created
  (`create_volume`), else 404 NOT_FOUND, as in Unity Catalog.
- Every request needs `Authorization: Bearer` with a personal access token the server knows (`pats`) or an unexpired
  OAuth token it issued; anything else answers 401.
- `GET /oidc/.well-known/oauth-authorization-server` and `POST /oidc/v1/token` (client credentials in HTTP basic
  authentication, scope all-apis) issue OAuth tokens valid for `token_lifetime_s`.
- Multipart uploads as databricks-sdk's files client makes them through presigned URLs (its IO_OFFLOAD endpoint):
  `POST /api/2.0/fs/files{path}?action=initiate-upload` opens a session (`multipart_upload.session_token`);
  `POST /api/2.0/fs/create-upload-part-urls` hands out one signed, expiring URL per part, on this server's
  `/storage/` (a cloud store: the workspace's credentials must not reach it, and each part must carry the header the
  URL names); `action=complete-upload` publishes the parts named by part number and ETag, `action=abort-upload` drops
  the session. `POST /api/2.0/fs/create-download-url` gives a signed URL for a ranged read. With `multipart = False`
  initiate-upload answers 501 (a workspace with single PUTs only). `expire_urls` hands out that many part URLs
  already expired (answered as S3 answers them), `part_faults` answers the next part PUTs with those statuses.

Every Files API request is recorded in `seen` as (method, path, auth kind, status); every part PUT in `part_puts` as
(part number, whether it carried an Authorization header, status)."""
import base64
import email.utils
import hashlib
import hmac
import http.server
import json
import os
import secrets
import threading
import time
import urllib.parse

from loopback_http import QuietHandler
from s3_server import free_port


class DatabricksServer:
    def __init__(self, token="dapi-tessera-test-token", token_lifetime_s=3600, page_size=1000):
        self.files, self.dirs, self.volumes = {}, set(), set()
        self.pats, self.oauth_clients, self.oauth_tokens = {token}, {}, {}
        self.token, self.token_lifetime_s, self.page_size = token, token_lifetime_s, page_size
        self.seen, self.token_requests = [], []
        self.multipart, self.uploads, self.aborted, self.part_puts = True, {}, [], []
        self.expire_urls, self.part_faults = 0, []
        self.url_key = secrets.token_bytes(16)
        self.lock = threading.Lock()
        server = self

        class Handler(QuietHandler):
            def error(self, status, code, message):
                return self.json(status, {"error_code": code, "message": message})

            def auth_kind(self):
                auth = self.headers.get("Authorization", "")
                token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
                if token in server.pats:
                    return "pat", None
                if token in server.oauth_tokens:
                    if server.oauth_tokens[token] < time.time():
                        return "oauth", (401, "UNAUTHENTICATED", "Token is expired.")
                    return "oauth", None
                return "none", (401, "UNAUTHENTICATED", "Credential was not sent or was of an unsupported type for "
                                                        "this API.")

            def handle_any(self):
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
                length = int(self.headers.get("Content-Length", 0) or 0)
                body = self.rfile.read(length) if length else b""
                if url.path == "/oidc/.well-known/oauth-authorization-server":
                    return self.json(200, {"issuer": f"{server.url}/oidc",
                                           "authorization_endpoint": f"{server.url}/oidc/v1/authorize",
                                           "token_endpoint": f"{server.url}/oidc/v1/token"})
                if url.path == "/oidc/v1/token" and self.command == "POST":
                    return self.token_endpoint(body)
                if url.path.startswith("/storage/"):
                    with server.lock:
                        return self.storage(url.path, query, body)
                for api in ("/api/2.0/fs/create-upload-part-urls", "/api/2.0/fs/create-download-url"):
                    if url.path == api and self.command == "POST":
                        who, refusal = self.auth_kind()
                        with server.lock:
                            status = self.error(*refusal) if refusal else self.presign(api, query, body)
                            server.seen.append((self.command, api, who, status))
                        return status
                for api, kind in (("/api/2.0/fs/files", "file"), ("/api/2.0/fs/directories", "dir")):
                    if url.path.startswith(api + "/"):
                        path = urllib.parse.unquote(url.path[len(api):])
                        who, refusal = self.auth_kind()
                        with server.lock:
                            status = self.error(*refusal) if refusal else (
                                self.file(path, query, body) if kind == "file" else self.directory(path, query))
                            server.seen.append((self.command, path, who, status))
                        return status
                return self.error(404, "ENDPOINT_NOT_FOUND", f"No API found for '{self.command} {url.path}'")

            def token_endpoint(self, body):
                form = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode()).items()}
                client = secret = None
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Basic "):
                    client, _, secret = base64.b64decode(auth[len("Basic "):]).decode().partition(":")
                client, secret = client or form.get("client_id"), secret or form.get("client_secret")
                server.token_requests.append((client, form))
                if form.get("grant_type") != "client_credentials" or "all-apis" not in form.get("scope", "").split():
                    return self.json(400, {"error": "invalid_request"})
                if client not in server.oauth_clients or server.oauth_clients[client] != secret:
                    return self.json(401, {"error": "invalid_client", "error_description": "Client authentication "
                                                                                          "failed"})
                token = "dose" + secrets.token_hex(16)
                server.oauth_tokens[token] = time.time() + server.token_lifetime_s
                return self.json(200, {"access_token": token, "token_type": "Bearer", "scope": "all-apis",
                                       "expires_in": server.token_lifetime_s})

            def sign(self, *fields):
                return hmac.new(server.url_key, "\n".join(map(str, fields)).encode(), hashlib.sha256).hexdigest()

            def presign(self, api, query, body):
                host = self.headers.get("Host")
                if api.endswith("create-download-url"):
                    path, expires = query.get("path", [""])[0], int(time.time()) + 3600
                    if path not in server.files:
                        return self.error(404, "NOT_FOUND", f"The file {path} does not exist.")
                    q = urllib.parse.urlencode({"path": path, "expires": expires,
                                                "sig": self.sign("get", path, expires)})
                    return self.json(200, {"url": f"http://{host}/storage/get?{q}", "headers": []})
                ask = json.loads(body)
                session = server.uploads.get(ask.get("session_token"))
                if session is None or session["path"] != ask.get("path"):
                    return self.error(404, "NOT_FOUND", "No such upload session.")
                first, count = int(ask["start_part_number"]), int(ask["count"])
                urls = []
                for number in range(first, first + count):
                    expires = int(time.time()) + 3600
                    if server.expire_urls > 0:
                        server.expire_urls, expires = server.expire_urls - 1, int(time.time()) - 1
                    token = ask["session_token"]
                    q = urllib.parse.urlencode({"session": token, "part": number, "expires": expires,
                                                "sig": self.sign("put", token, number, expires)})
                    urls.append({"part_number": number, "url": f"http://{host}/storage/put?{q}",
                                 "headers": [{"name": "x-ms-blob-type", "value": "BlockBlob"}]})
                return self.json(200, {"upload_part_urls": urls})

            def storage(self, path, query, body):
                q = {k: v[0] for k, v in query.items()}
                expired = int(q.get("expires", 0)) < time.time()
                if path == "/storage/put" and self.command == "PUT":
                    status = self.store_part(q, body, expired)
                    server.part_puts.append((int(q.get("part", 0)), "Authorization" in self.headers, status))
                    return status
                if path == "/storage/get" and self.command == "GET":
                    if not hmac.compare_digest(q.get("sig", ""), self.sign("get", q.get("path"), q.get("expires"))):
                        return self.s3_error(403, "AccessDenied", "Signature mismatch")
                    if expired:
                        return self.s3_error(403, "AccessDenied", "Request has expired")
                    data = server.files[q["path"]]["data"]
                    rng = self.headers.get("Range")
                    if rng:
                        first, _, last = rng[len("bytes="):].partition("-")
                        first, last = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
                        return self.answer(206, memoryview(data)[first:last + 1],
                                           [("Content-Range", f"bytes {first}-{last}/{len(data)}")])
                    return self.answer(200, data)
                return self.s3_error(400, "InvalidRequest", "Unknown storage request")

            def store_part(self, q, body, expired):
                token, number = q.get("session", ""), int(q.get("part", 0))
                if not hmac.compare_digest(q.get("sig", ""), self.sign("put", token, number, q.get("expires"))):
                    return self.s3_error(403, "AccessDenied", "Signature mismatch")
                if expired:
                    return self.s3_error(403, "AccessDenied", "Request has expired")
                if self.headers.get("x-ms-blob-type") != "BlockBlob":
                    return self.s3_error(400, "MissingRequiredHeader", "x-ms-blob-type was not sent")
                if server.part_faults:
                    fault = server.part_faults.pop(0)
                    return self.s3_error(int(fault), "AccessDenied" if fault == "403" else "InternalError", "fault")
                if token not in server.uploads:
                    return self.s3_error(404, "NoSuchUpload", "The upload does not exist")
                etag = '"' + hashlib.md5(body).hexdigest() + '"'
                server.uploads[token]["parts"][number] = (etag, body)
                return self.answer(200, headers=[("ETag", etag)])

            def s3_error(self, status, code, message):
                xml = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message>" \
                      "</Error>"
                return self.answer(status, xml.encode(), [("Content-Type", "application/xml")])

            def multipart_action(self, path, query, body):
                action = query["action"][0]
                if action == "initiate-upload":
                    if not server.multipart:
                        return self.error(501, "NOT_IMPLEMENTED", "Multipart uploads are not enabled.")
                    token = "mpu-" + secrets.token_hex(12)
                    server.uploads[token] = {"path": path, "parts": {},
                                             "overwrite": query.get("overwrite", ["false"])[0] == "true"}
                    return self.json(200, {"multipart_upload": {"session_token": token}})
                token = query.get("session_token", [""])[0]
                session = server.uploads.get(token)
                if session is None or session["path"] != path or query.get("upload_type") != ["multipart"]:
                    return self.error(404, "NOT_FOUND", "No such upload session.")
                if action == "abort-upload":
                    server.aborted.append(path)
                    del server.uploads[token]
                    return self.json(200, {})
                if action != "complete-upload":
                    return self.error(400, "INVALID_PARAMETER_VALUE", f"Unknown action {action}.")
                named = json.loads(body)["parts"]
                if [p["part_number"] for p in named] != list(range(1, len(session["parts"]) + 1)) or any(
                        session["parts"][p["part_number"]][0] != p["etag"] for p in named):
                    return self.error(400, "INVALID_PARAMETER_VALUE", "The parts do not match the upload.")
                if path in server.files and not session["overwrite"]:
                    return self.error(409, "ALREADY_EXISTS", f"The file {path} already exists.")
                del server.uploads[token]
                return self.publish(path, b"".join(session["parts"][p["part_number"]][1] for p in named))

            def publish(self, path, data):
                now = time.time()
                server.files[path] = {"data": data, "mtime": now, "modified": email.utils.formatdate(now, usegmt=True)}
                parent = path.rsplit("/", 1)[0]
                while parent.count("/") >= 5:
                    server.dirs.add(parent)
                    parent = parent.rsplit("/", 1)[0]
                return self.answer(204) if self.command == "PUT" else self.json(200, {})

            def in_volume(self, path):
                parts = path.split("/")
                return len(parts) >= 5 and parts[1] == "Volumes" and "/".join(parts[:5]) in server.volumes

            def file(self, path, query, body):
                if not self.in_volume(path) or path.endswith("/"):
                    return self.error(404, "NOT_FOUND", f"The path {path} is not in an existing volume.")
                item = server.files.get(path)
                if self.command == "POST" and "action" in query:
                    return self.multipart_action(path, query, body)
                if self.command == "PUT":
                    if item is not None and query.get("overwrite", ["false"])[0] != "true":
                        return self.error(409, "ALREADY_EXISTS", f"The file {path} already exists.")
                    return self.publish(path, body)
                if item is None:
                    return self.error(404, "NOT_FOUND", f"The file {path} does not exist.")
                if self.command == "DELETE":
                    del server.files[path]
                    return self.answer(204)
                since = self.headers.get("If-Unmodified-Since")
                if since and int(item["mtime"]) > email.utils.parsedate_to_datetime(since).timestamp():
                    return self.error(412, "PRECONDITION_FAILED", "The file was modified since the given time.")
                data = item["data"]
                props = [("Content-Type", "application/octet-stream"), ("Last-Modified", item["modified"])]
                if self.command == "HEAD":
                    return self.answer(200, headers=props + [("Content-Length", str(len(data)))])
                rng = self.headers.get("Range")
                if rng:
                    first, _, last = rng[len("bytes="):].partition("-")
                    first, last = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
                    if first >= len(data):
                        return self.answer(416, headers=[("Content-Range", f"bytes */{len(data)}")])
                    # A view, not a copy: the server's own memcpy would cap ranged reads below whole ones.
                    return self.answer(206, memoryview(data)[first:last + 1],
                                       props + [("Content-Range", f"bytes {first}-{last}/{len(data)}")])
                return self.answer(200, data, props)

            def directory(self, path, query):
                path = path.rstrip("/")
                exists = path in server.dirs or path in server.volumes
                if not self.in_volume(path + "/x"):
                    return self.error(404, "NOT_FOUND", f"The path {path} is not in an existing volume.")
                if self.command == "PUT":
                    server.dirs.add(path)
                    return self.answer(204)
                if not exists:
                    return self.error(404, "NOT_FOUND", f"The directory {path} does not exist.")
                if self.command == "HEAD":
                    return self.answer(200)
                children = {}
                for f, item in server.files.items():
                    if f.startswith(path + "/"):
                        name = f[len(path) + 1:].split("/", 1)[0]
                        child = f"{path}/{name}"
                        if child == f:
                            children[child] = {"path": child, "is_directory": False, "file_size": len(item["data"]),
                                               "last_modified": int(item["mtime"] * 1000), "name": name}
                        else:
                            children.setdefault(child, {"path": child, "is_directory": True, "name": name})
                for d in server.dirs:
                    if d.startswith(path + "/") and "/" not in d[len(path) + 1:]:
                        children.setdefault(d, {"path": d, "is_directory": True, "name": d.rsplit("/", 1)[1]})
                entries = [children[k] for k in sorted(children)]
                start = int(query.get("page_token", ["0"])[0])
                size = min(int(query.get("page_size", [server.page_size])[0]), server.page_size)
                page = {"contents": entries[start:start + size]}
                if start + size < len(entries):
                    page["next_page_token"] = str(start + size)
                return self.json(200, page)

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = handle_any

        self.port = free_port()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def create_volume(self, catalog, schema, volume):
        self.volumes.add(f"/Volumes/{catalog}/{schema}/{volume}")
        return f"dbfs:/Volumes/{catalog}/{schema}/{volume}"

    def env(self, host=None, **extra):
        """The environment of a process using the workspace with its personal access token (or what `extra` says),
        with no Databricks settings of the user's; databricks-sdk in it uses its default files client (presigned URLs
        for downloads and large uploads)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DATABRICKS_")}
        env.update(DATABRICKS_HOST=host or self.url, DATABRICKS_TOKEN=self.token, TESSERA_DBFS_MAX_ATTEMPTS="6",
                   DATABRICKS_CONFIG_FILE=os.devnull)
        env.update(extra)
        return {k: v for k, v in env.items() if v is not None}

    def client(self, files_ext=True, **config):
        """databricks-sdk's client with `config`'s settings: its default files client (presigned URLs for downloads
        and uploads above 50 MiB), or without `files_ext` the plain Files API client."""
        from databricks.sdk import WorkspaceClient
        from databricks.sdk.config import Config

        return WorkspaceClient(config=Config(host=self.url, token=self.token,
                                             disable_experimental_files_api_client=not files_ext, **config))


if __name__ == "__main__":  # a server process of its own (the benchmark): prints its URL, serves until killed
    import sys

    server = DatabricksServer()
    for name in sys.argv[1:]:  # catalog.schema.volume
        server.create_volume(*name.split("."))
    print(server.url, flush=True)
    threading.Event().wait()
