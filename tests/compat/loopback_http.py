"""The request handler the loopback object-store servers share (azure_server.py, databricks_server.py,
oci_server.py): HTTP/1.1 keep-alive, quiet logs, and answers with an exact Content-Length (a HEAD answer carries the
object's length without its body)."""
import http.server
import json


class QuietHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def service_headers(self):
        """Headers the service puts on every answer (request ids, versions)."""
        return []

    def answer(self, status, body=b"", headers=()):
        """Sends one answer; a Content-Length among `headers` wins (a HEAD's object length). Returns `status`."""
        self.send_response(status)
        length = None
        for k, v in [*self.service_headers(), *headers]:
            if k.lower() == "content-length":
                length = v
            else:
                self.send_header(k, v)
        self.send_header("Content-Length", length if length is not None else str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return status

    def json(self, status, obj, headers=()):
        return self.answer(status, json.dumps(obj).encode(), [("Content-Type", "application/json"), *headers])
