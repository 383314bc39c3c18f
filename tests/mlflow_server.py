"""A real MLflow tracking server (`mlflow server`, PyPI mlflow) on a free loopback port with a SQLite store, for the
tests of the `mlflow` logger (tests/compat/test_mlflow.py and tests/composer/test_eval_recipe_vs_llmfoundry.py)."""
import os
import socket
import subprocess
import time
import urllib.request

import pytest


def start(root, mlflow):
    """Starts `mlflow` (the server program) with its store and artifacts under `root`; returns (process, URI) once
    /health answers, or fails the test with the server's log."""
    proc, uri = launch(root, mlflow)
    wait(proc, uri, root, mlflow)
    return proc, uri


def launch(root, mlflow):
    """Starts the server without waiting for it (its start-up takes seconds: overlap it with other work); returns
    (process, URI). wait() waits for it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
                             "--artifacts-destination", str(root / "artifacts")],
                            stdout=open(root / "server.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def wait(proc, uri, root, mlflow):
    """Waits until the server at `uri` answers /health; fails the test with its log if it exits or takes 2 minutes."""
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(uri + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{mlflow} server did not start:\n" + (root / "server.log").read_text()[-3000:])
        time.sleep(0.3)


def stop(proc):
    os.killpg(proc.pid, 15)
    proc.wait(timeout=30)
