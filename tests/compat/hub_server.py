"""A Hugging Face Hub on loopback for the download and upload tests, following the protocol huggingface_hub speaks to
huggingface.co (huggingface_hub's own client is the peer, pointed at it with HF_ENDPOINT):

- `GET /api/{models|datasets}/{repo}[/revision/{rev}]`: the revision's commit `sha` and its `siblings` (`rfilename`);
- `GET /api/{kind}/{repo}/tree/{rev}/{folder}?recursive=true`: the files under a folder, paged with a `Link` header;
- `HEAD|GET [/datasets]/{repo}/resolve/{rev}/{file}`: a regular file answers 200 with its git blob id as ETag (206 for
  a Range); an LFS file (*.safetensors, or committed as one) answers 302 to the CDN (`/cdn/{repo}/{sha256}` at
  `localhost`, another host, to which clients must not send the token) with `X-Linked-Etag` (the SHA-256) and
  `X-Linked-Size`; both carry `X-Repo-Commit`;
- a private repository answers 401 without `Authorization: Bearer <token>`.

Writes, as huggingface_hub's create_commit makes them (every one needs the token; `read_token` may read only):
- `POST /api/repos/create` ({name, organization, private, type}): 409 when the repository exists;
- `POST /api/{kind}/{repo}/preupload/{rev}` ({files: [{path, sample, size}]}): "lfs" for *.safetensors and files of
  `lfs_threshold` bytes or more, else "regular"; `shouldIgnore` for the names in `ignored`;
- `POST /[{prefix}]{repo}.git/info/lfs/objects/batch` (Git LFS batch API): objects already stored get no actions;
  others a basic upload URL, or above `multipart_threshold` a multipart one (`chunk_size` and numbered part URLs);
  every upload URL is at `storage_url` (default the CDN host), plus a verify URL on the Hub;
- `PUT /lfs-upload/{oid}`, `PUT /lfs-part/{oid}/{n}` (answers an ETag), `POST /lfs-complete/{oid}` ({oid, parts});
  an object whose bytes do not hash to its oid is refused;
- `POST /{prefix}{repo}.git/info/lfs/objects/verify` ({oid, size});
- `POST /api/{kind}/{repo}/commit/{rev}` (NDJSON: header, file, lfsFile, deletedFile, deletedFolder lines): applied
  whole or not at all, recorded in `repo["commits"]` (summary, added, deleted), a new commit sha; a header naming a
  `parentCommit` that is not the branch's commit any more answers 412, as the Hub does. `before_commit(repo)`, when
  set, runs once just before the next commit is checked (another writer's commit landing first).

Every request is recorded in `seen` (method, path, whether it carried the token)."""
import base64
import hashlib
import http.server
import json
import threading
import urllib.parse

from s3_server import free_port


class HubServer:
    def __init__(self, token="hf_test_token_not_a_secret_elsewhere", page_size=1000):
        self.token, self.repos, self.seen, self.page_size = token, {}, [], page_size
        self.read_token = "hf_read_only_token_for_tests"
        self.lfs_threshold, self.multipart_threshold, self.chunk_size = 10 * 1024 * 1024, 64 * 1024 * 1024, 16 << 20
        self.ignored, self.lfs_objects, self.parts, self.storage_url = set(), {}, {}, None
        self.before_commit = None
        self.lock = threading.Lock()
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

            def answer_json(self, status, value, headers=()):
                self.answer(status, json.dumps(value).encode(), [("Content-Type", "application/json"), *headers])

            def refuse(self, status, code, message):
                self.answer_json(status, {"error": message}, [("X-Error-Code", code), ("X-Error-Message", message)])

            def handle_any(self):
                path = urllib.parse.urlparse(self.path).path
                auth = self.headers.get("Authorization", "")
                hub.seen.append((self.command, path, auth == f"Bearer {hub.token}"))
                if self.command in ("POST", "PUT"):
                    length = int(self.headers.get("Content-Length", 0))
                    body = self.rfile.read(length) if length else b""
                    with hub.lock:
                        return self.handle_write(path, auth, body)
                if path.startswith("/cdn/"):  # /cdn/{repo key}/{sha256}
                    key, _, sha = path[len("/cdn/"):].rpartition("/")
                    repo = hub.repos.get(key, {"lfs_body": {}})
                    bodies = [repo["lfs_body"][sha]] if sha in repo["lfs_body"] else []
                    bodies += [hub.lfs_objects[sha]] if sha in hub.lfs_objects else []
                    return self.ranged(bodies[0], [("ETag", f'"{sha}"')]) if bodies else self.answer(404)
                api = path.startswith("/api/")
                parts = path.lstrip("/").split("/")[1 if api else 0:]
                kind = parts.pop(0) if parts and parts[0] in ("datasets", "spaces", "models") else "models"
                if api and len(parts) == 2:  # /api/{kind}/{repo}: the repository's info, as of main
                    parts += ["revision", "main"]
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
                if name in repo["lfs"]:
                    sha = repo["lfs"][name]
                    return self.answer(302, b"", common + [
                        ("Location", f"{hub.cdn_url}/cdn/{key}/{sha}"), ("X-Linked-Etag", f'"{sha}"'),
                        ("X-Linked-Size", str(len(data))), ("ETag", f'"{git_blob_id(b"lfs-pointer")}"')])
                return self.ranged(data, common + [("ETag", f'"{git_blob_id(data)}"')])

            def ranged(self, data, headers):
                """`data` whole (200), or the bytes a Range asks for (206; 416 past the end, as for an empty file)."""
                headers = headers + [("Accept-Ranges", "bytes")]
                asked = self.headers.get("Range", "")
                if not asked.startswith("bytes=") or self.command != "GET":
                    return self.answer(200, data, headers)
                first, last = (int(x) for x in asked[len("bytes="):].split("-"))
                if first >= len(data):
                    return self.answer(416, b"", headers + [("Content-Range", f"bytes */{len(data)}")])
                body = data[first:last + 1]
                return self.answer(206, body, headers + [
                    ("Content-Range", f"bytes {first}-{first + len(body) - 1}/{len(data)}")])

            def handle_write(self, path, auth, body):
                # Uploads to the storage host: signed URLs, no token (one sent here would leak it).
                if path.startswith("/lfs-upload/"):
                    oid = path.rsplit("/", 1)[1]
                    if hashlib.sha256(body).hexdigest() != oid:
                        return self.refuse(400, "BadDigest", "the body does not hash to the object id")
                    hub.lfs_objects[oid] = body
                    return self.answer(200, b"", [("ETag", f'"{hashlib.md5(body).hexdigest()}"')])
                if path.startswith("/lfs-part/"):
                    _, oid, number = path.rsplit("/", 2)
                    hub.parts.setdefault(oid, {})[int(number)] = body
                    return self.answer(200, b"", [("ETag", f'"{hashlib.md5(body).hexdigest()}"')])
                if path.startswith("/lfs-complete/"):
                    oid = path.rsplit("/", 1)[1]
                    request, got = json.loads(body), hub.parts.get(oid, {})
                    listed = [(p["partNumber"], p["etag"]) for p in request["parts"]]
                    if request["oid"] != oid or listed != [(n, f'"{hashlib.md5(got[n]).hexdigest()}"') for n in sorted(got)]:
                        return self.refuse(400, "InvalidPart", "the parts listed are not the parts uploaded")
                    data = b"".join(got[n] for n in sorted(got))
                    if hashlib.sha256(data).hexdigest() != oid:
                        return self.refuse(400, "BadDigest", "the parts do not hash to the object id")
                    hub.lfs_objects[oid] = data
                    del hub.parts[oid]
                    return self.answer_json(200, {})
                if auth not in (f"Bearer {hub.token}", f"Bearer {hub.read_token}"):
                    return self.refuse(401, "Unauthorized", "Invalid credentials in Authorization header")
                if auth != f"Bearer {hub.token}":
                    return self.refuse(403, "Forbidden", "You don't have the rights to write to this repository")
                if path == "/api/repos/create":
                    request = json.loads(body)
                    kind = {"dataset": "datasets", "space": "spaces"}.get(request.get("type"), "models")
                    repo_id = f"{request['organization']}/{request['name']}"
                    key = repo_id if kind == "models" else f"{kind}/{repo_id}"
                    if key in hub.repos:
                        return self.refuse(409, "RepoExists", "You already created this repo")
                    hub.add(key, {}, private=bool(request.get("private", False)))
                    return self.answer_json(200, {"url": f"{hub.url}/{key}"})
                lfs_api = ".git/info/lfs/objects/"
                if lfs_api in path:
                    repo_part, verb = path.lstrip("/").split(lfs_api)
                    key = repo_part[:-len(".git")] if repo_part.endswith(".git") else repo_part
                    if key not in hub.repos:
                        return self.refuse(404, "RepoNotFound", "Repository not found")
                    request = json.loads(body)
                    if verb == "verify":
                        stored = hub.lfs_objects.get(request["oid"])
                        ok = stored is not None and len(stored) == request["size"]
                        return self.answer_json(200, {}) if ok else self.refuse(404, "NotFound", "object not stored")
                    for name in ("Accept", "Content-Type"):
                        if self.headers.get(name) != "application/vnd.git-lfs+json":
                            return self.refuse(406, "NotAcceptable", f"{name} must be application/vnd.git-lfs+json")
                    storage = hub.storage_url or hub.cdn_url
                    objects, transfer = [], "basic"
                    for o in request["objects"]:
                        oid, size = o["oid"], o["size"]
                        if oid in hub.lfs_objects:
                            objects.append({"oid": oid, "size": size})
                            continue
                        # (on the host the client asked: a proxy in front of the Hub stays in front)
                        verify = {"href": f"http://{self.headers['Host']}/{key}.git/info/lfs/objects/verify"}
                        if size > hub.multipart_threshold and "multipart" in request["transfers"]:
                            n = (size + hub.chunk_size - 1) // hub.chunk_size
                            header = {"chunk_size": str(hub.chunk_size)}
                            header.update({f"{i:05d}": f"{storage}/lfs-part/{oid}/{i}?X-Amz-Signature=secret{i}"
                                           for i in range(1, n + 1)})
                            upload = {"href": f"{storage}/lfs-complete/{oid}?uploadId=u1", "header": header}
                            transfer = "multipart"
                        else:
                            upload = {"href": f"{storage}/lfs-upload/{oid}?X-Amz-Signature=secret"}
                        objects.append({"oid": oid, "size": size, "authenticated": True,
                                        "actions": {"upload": upload, "verify": verify}})
                    return self.answer(200, json.dumps({"transfer": transfer, "objects": objects}).encode(),
                                       [("Content-Type", "application/vnd.git-lfs+json")])
                parts = path.lstrip("/").split("/")
                if len(parts) < 6 or parts[0] != "api" or parts[4] not in ("preupload", "commit"):
                    return self.refuse(404, "NotFound", "no such endpoint")
                kind, repo_id, verb, rev = parts[1], "/".join(parts[2:4]), parts[4], urllib.parse.unquote(parts[5])
                key = repo_id if kind == "models" else f"{kind}/{repo_id}"
                repo = hub.repos.get(key)
                if repo is None:
                    return self.refuse(404, "RepoNotFound", "Repository not found")
                if rev != "main":
                    return self.refuse(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                if verb == "preupload":
                    answers = []
                    for f in json.loads(body)["files"]:
                        lfs = f["path"].endswith(".safetensors") or f["size"] >= hub.lfs_threshold
                        answers.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular",
                                        "shouldIgnore": f["path"] in hub.ignored})
                        repo["samples"][f["path"]] = base64.b64decode(f["sample"])
                    return self.answer_json(200, {"files": answers, "commitOid": repo["commit"]})
                if self.headers.get("Content-Type") != "application/x-ndjson":
                    return self.refuse(400, "BadRequest", "a commit is application/x-ndjson")
                lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                if not lines or lines[0]["key"] != "header" or not lines[0]["value"].get("summary"):
                    return self.refuse(400, "BadRequest", "a commit starts with a header line with a summary")
                hook, hub.before_commit = hub.before_commit, None
                if hook:
                    hook(repo)
                parent = lines[0]["value"].get("parentCommit")
                if parent is not None and parent != repo["commit"]:
                    return self.refuse(412, "PreconditionFailed", "A commit has happened since. Please refresh and "
                                                                  "try again.")
                files, lfs_names, added, deleted = dict(repo["files"]), dict(repo["lfs"]), [], []
                for line in lines[1:]:
                    value = line["value"]
                    if line["key"] == "file":
                        data = base64.b64decode(value["content"])
                        if repo["samples"].get(value["path"], data[:512]) != data[:512]:
                            return self.refuse(400, "BadRequest", f"{value['path']}: not the sample preuploaded")
                        files[value["path"]] = data
                        lfs_names.pop(value["path"], None)
                    elif line["key"] == "lfsFile":
                        data = hub.lfs_objects.get(value["oid"])
                        if data is None or len(data) != value["size"] or value["algo"] != "sha256":
                            return self.refuse(422, "LfsObjectMissing", f"{value['path']}: LFS object not uploaded")
                        files[value["path"]] = data
                        lfs_names[value["path"]] = value["oid"]
                    elif line["key"] in ("deletedFile", "deletedFolder"):
                        folder = value["path"].rstrip("/") + "/"
                        gone = [value["path"]] if line["key"] == "deletedFile" else [
                            n for n in files if n.startswith(folder)]
                        if not gone or gone[0] not in files:
                            return self.refuse(404, "EntryNotFound", f"{value['path']}: no such file or folder")
                        for name in gone:
                            del files[name]
                            lfs_names.pop(name, None)
                        deleted.extend(gone)
                        continue
                    else:
                        return self.refuse(400, "BadRequest", f"unknown commit line {line['key']}")
                    added.append(value["path"])
                commit = hashlib.sha1(repo["commit"].encode() + body).hexdigest()
                dropped = {repo["lfs"][p] for p in deleted if p in repo["lfs"]}
                repo.update(files=files, lfs=lfs_names, commit=commit)
                # LFS objects no file refers to any more are forgotten (the benchmark's memory; the Hub keeps them).
                kept = {oid for r in hub.repos.values() for oid in r["lfs"].values()}
                for oid in dropped - kept:
                    hub.lfs_objects.pop(oid, None)
                repo["commits"].append({"summary": lines[0]["value"]["summary"], "added": added, "deleted": deleted})
                return self.answer_json(200, {"commitUrl": f"{hub.url}/{key}/commit/{commit}", "commitOid": commit,
                                              "pullRequestUrl": None})

            do_GET = do_HEAD = do_POST = do_PUT = handle_any

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
                               "extra_siblings": list(extra_siblings), "lfs_body": dict(lfs_body or {}),
                               "lfs": {}, "samples": {}, "commits": []}
        for name, data in files.items():  # LFS files by name (name -> SHA-256), their bytes with the CDN
            if name.endswith(".safetensors"):
                self.repos[repo_id]["lfs"][name] = hashlib.sha256(data).hexdigest()
                self.lfs_objects[self.repos[repo_id]["lfs"][name]] = data
        return commit

    def stop(self):
        self.server.shutdown()


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


if __name__ == "__main__":  # a server process of its own (the benchmark): prints its URL and token, serves
    import sys

    server = HubServer()
    for name in sys.argv[1:]:
        server.add(name, {}, private=True)
    print(server.url, server.token, flush=True)
    threading.Event().wait()
