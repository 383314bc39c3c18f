"""A Hugging Face Hub on loopback for the download tests, following the protocol huggingface_hub speaks to
huggingface.co (huggingface_hub's own client is the peer, pointed at it with HF_ENDPOINT):

- `GET /api/{models|datasets}/{repo}/revision/{rev}`: the revision's commit `sha` and its `siblings` (`rfilename`);
- `GET /api/{kind}/{repo}/tree/{rev}/{folder}?recursive=true`: the files under a folder, paged with a `Link` header;
- `HEAD|GET [/datasets]/{repo}/resolve/{rev}/{file}`: a regular file answers 200 with its git blob id as ETag (206 for
  a Range); an LFS file
  (*.safetensors) answers 302 to the CDN (`/cdn/{repo}/{sha256}` at `localhost`, another host, to which clients must not send the token)
  with `X-Linked-Etag` (the SHA-256) and `X-Linked-Size`; both carry `X-Repo-Commit`;
- a private repository answers 401 without `Authorization: Bearer <token>`.

Every request is recorded in `seen` (method, path, whether it carried the token)."""
import hashlib
import http.server
import json
import threading
import urllib.parse

from s3_server import free_port


class HubServer:
    def __init__(self, token="hf_test_token_not_a_secret_elsewhere", page_size=1000):
        self.token, self.repos, self.seen, self.page_size = token, {}, [], page_size
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def answer(self, status, body=b"", headers=()):
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def handle_any(self):
                path = urllib.parse.urlparse(self.path).path
                auth = self.headers.get("Authorization", "")
                hub.seen.append((self.command, path, auth == f"Bearer {hub.token}"))
                if path.startswith("/cdn/"):  # /cdn/{repo key}/{sha256}
                    key, _, sha = path[len("/cdn/"):].rpartition("/")
                    repo = hub.repos.get(key, {"files": {}, "lfs_body": {}})
                    bodies = [repo["lfs_body"][sha]] if sha in repo["lfs_body"] else []
                    bodies += [d for d in repo["files"].values() if hashlib.sha256(d).hexdigest() == sha]
                    return self.answer(200, bodies[0]) if bodies else self.answer(404)
                api = path.startswith("/api/")
                parts = path.lstrip("/").split("/")[1 if api else 0:]
                kind = parts.pop(0) if parts and parts[0] in ("datasets", "spaces", "models") else "models"
                if len(parts) < 3 or (not api and (len(parts) < 5 or parts[2] != "resolve")):
                    return self.answer(404)
                repo_id, verb = "/".join(parts[:2]), parts[2]
                rev = urllib.parse.unquote(parts[3]) if len(parts) > 3 else "main"
                key = f"{kind}/{repo_id}" if kind != "models" else repo_id
                repo = hub.repos.get(key)
                if repo is None:
                    return self.answer(404, b'{"error":"Repository not found"}',
                                       [("X-Error-Code", "RepoNotFound"), ("Content-Type", "application/json")])
                if repo["private"] and auth != f"Bearer {hub.token}":
                    return self.answer(401, b'{"error":"Invalid credentials in Authorization header"}',
                                       [("X-Error-Code", "RepoNotFound"), ("Content-Type", "application/json")])
                if rev not in ("main", repo["commit"]):
                    return self.answer(404, b'{"error":"Revision not found"}', [("X-Error-Code", "RevisionNotFound")])
                if api and verb == "tree":  # recursive listing under a folder, `page_size` entries per page
                    folder = urllib.parse.unquote("/".join(parts[4:]))
                    names = sorted(n for n in repo["files"] if not folder or n.startswith(folder + "/"))
                    query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                    start = int(query.get("cursor", ["0"])[0])
                    chunk = names[start:start + hub.page_size]
                    items = [{"type": "file", "path": n, "size": len(repo["files"][n])} for n in chunk]
                    headers = [("Content-Type", "application/json")]
                    if start + hub.page_size < len(names):
                        headers.append(("Link", f'<{hub.url}{path}?recursive=true&cursor={start + hub.page_size}>; '
                                                'rel="next"'))
                    return self.answer(200, json.dumps(items).encode(), headers)
                if api:
                    names = list(repo["files"]) + repo["extra_siblings"]
                    body = json.dumps({"id": repo_id, "sha": repo["commit"],
                                       "siblings": [{"rfilename": n} for n in names]}).encode()
                    return self.answer(200, body, [("Content-Type", "application/json")])
                name = urllib.parse.unquote("/".join(parts[4:]))
                data = repo["files"].get(name)
                if data is None:
                    return self.answer(404, b'{"error":"Entry not found"}', [("X-Error-Code", "EntryNotFound")])
                common = [("X-Repo-Commit", repo["commit"])]
                if name.endswith(".safetensors"):
                    sha = hashlib.sha256(data).hexdigest()
                    return self.answer(302, b"", common + [
                        ("Location", f"{hub.cdn_url}/cdn/{key}/{sha}"), ("X-Linked-Etag", f'"{sha}"'),
                        ("X-Linked-Size", str(len(data))), ("ETag", f'"{git_blob_id(b"lfs-pointer")}"')])
                headers = common + [("ETag", f'"{git_blob_id(data)}"'), ("Accept-Ranges", "bytes")]
                ranged = self.headers.get("Range", "")
                if ranged.startswith("bytes=") and self.command == "GET":
                    first, last = (int(x) for x in ranged[len("bytes="):].split("-"))
                    body = data[first:last + 1]
                    return self.answer(206, body, headers + [
                        ("Content-Range", f"bytes {first}-{first + len(body) - 1}/{len(data)}")])
                return self.answer(200, data, headers)

            do_GET = do_HEAD = handle_any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # The CDN under another host name, as cdn-lfs.huggingface.co is: clients drop the token on the redirect.
        self.cdn_url = f"http://localhost:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, repo_id, files, private=False, extra_siblings=(), lfs_body=None):
        """`repo_id`: "org/name" (a model) or "datasets/org/name". `files`: {name: bytes}. `extra_siblings`: names listed but not served; `lfs_body`: {sha256: bytes the CDN
        sends instead} (a damaged transfer)."""
        commit = hashlib.sha1((repo_id + "".join(sorted(files))).encode()).hexdigest()
        self.repos[repo_id] = {"files": dict(files), "private": private, "commit": commit,
                               "extra_siblings": list(extra_siblings), "lfs_body": dict(lfs_body or {})}
        return commit

    def stop(self):
        self.server.shutdown()


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
