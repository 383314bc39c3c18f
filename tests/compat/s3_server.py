"""A real S3-API server for the storage tests and benchmarks: moto's server mode (the server mosaicml-streaming's own
tests mock S3 with) in its own process on a free loopback port, with IAM authentication switched on, so that every
request Tessera sends must carry a valid Signature Version 4 for an access key the server issued."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import boto3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_answering(url, proc, name, timeout_s=60):
    """Polls `url` until the server process `proc` answers it; RuntimeError naming `name` if it exits or never does."""
    deadline = time.time() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except Exception:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{name} did not start on {url}")
            time.sleep(0.1)


class MotoServer:
    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # The first requests (making the IAM user and key below) go through unauthenticated; every later one is checked.
        env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_answering(self.url + "/moto-api/", self.proc, "moto server")
        iam = boto3.client("iam", endpoint_url=self.url, region_name="us-east-1", aws_access_key_id="bootstrap",
                           aws_secret_access_key="bootstrap")
        iam.create_user(UserName="tessera")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="tessera", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="tessera")["AccessKey"]
        self.access_key_id = key["AccessKeyId"]
        self.secret_access_key = key["SecretAccessKey"]

    def env(self, **extra):
        """Environment for a Tessera process (or Streaming) talking to this server, with no ~/.aws files and no
        instance metadata lookup (on a cloud VM 169.254.169.254 may answer)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(S3_ENDPOINT_URL=self.url, AWS_ACCESS_KEY_ID=self.access_key_id,
                   AWS_SECRET_ACCESS_KEY=self.secret_access_key, AWS_REGION="us-east-1",
                   AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent",
                   AWS_EC2_METADATA_DISABLED="true")
        env.update(extra)
        return env

    def client(self):
        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=self.access_key_id, aws_secret_access_key=self.secret_access_key)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class FaultProxy:
    """An HTTP proxy in front of the server that misbehaves on request: each request takes the next action from
    `plan` ("ok", "500", "503", "reset": close the connection without answering, "stall": answer nothing for
    `stall_s` seconds, "cut": a GET's answer closed halfway through its body, a reset for other requests), then "ok"
    (or `after`) once the plan is used up; with `rate` > 0 each unplanned request instead fails that often, with one
    of `faults` drawn at random (seeded by TESSERA_FAULT_SEED, default 0). Counts what it saw."""

    def __init__(self, upstream_url, stall_s=30, gate=None):
        import http.client
        import http.server
        import threading
        import urllib.parse

        # gate(method, path, headers) -> None to go on, or (status, code, message) to answer with that S3 error.
        import random

        self.plan, self.after, self.stall_s, self.seen, self.gate = [], "ok", stall_s, [], gate
        self.rate, self.faults, self.rng = 0.0, ("500", "503", "reset", "cut", "stall"), random.Random(int(os.environ.get("TESSERA_FAULT_SEED", "0")))
        self.lock = threading.Lock()
        upstream = urllib.parse.urlparse(upstream_url)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_any(self):
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length) if length else b""
                with proxy.lock:
                    action = proxy.plan.pop(0) if proxy.plan else proxy.after
                    if not proxy.plan and action == "ok" and proxy.rate and proxy.rng.random() < proxy.rate:
                        action = proxy.rng.choice(proxy.faults)
                    proxy.seen.append((self.command, self.path, action))
                if action == "reset" or (action == "cut" and self.command != "GET"):
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if action == "stall":
                    time.sleep(proxy.stall_s)
                    self.close_connection = True
                    return
                refusal = proxy.gate(self.command, self.path, self.headers) if proxy.gate else None
                if refusal or action in ("500", "503"):
                    status, code, message = refusal or (int(action), {"500": "InternalError", "503": "SlowDown"}[action],
                                                        "injected")
                    payload = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=120)
                conn.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(k, v)
                # A HEAD answer carries the object's length without the object.
                length = resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                if action == "cut":  # half the body, then the connection goes
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
