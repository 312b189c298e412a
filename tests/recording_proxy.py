"""A recording HTTP proxy for tests that drive a real client (an agent CLI) at a served graph:
it forwards every request to ``upstream`` as it came, streams the answer back chunk by chunk (an
SSE stream stays a stream), and records each exchange's method, path, status and request body.

    with RecordingProxy("http://127.0.0.1:8000/agents") as proxy:
        run_client(base_url=proxy.url)
    assert [(e.path, e.status) for e in proxy.exchanges] == [("/v1/messages", 200)]
"""

from __future__ import annotations

import gzip
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

HOP_BY_HOP = {"host", "connection", "keep-alive", "transfer-encoding", "content-length",
              "proxy-connection", "upgrade", "te", "trailer"}


@dataclass
class Exchange:
    method: str
    path: str
    status: int
    body: bytes  # the request's body, decoded when it came gzip-encoded

    def json(self) -> Any:
        return json.loads(self.body)


class RecordingProxy:
    def __init__(self, upstream: str, timeout: float = 600.0):
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._client = httpx.Client(timeout=timeout)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def statuses(self, method: str, path: str) -> list[int]:
        return [e.status for e in self.exchanges if (e.method, e.path) == (method, path)]


def _handler(proxy: RecordingProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._forward()

        do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = do_GET

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _forward(self) -> None:
            body = _read_body(self)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            request = proxy._client.build_request(self.command, proxy.upstream + self.path,
                                                  headers=headers, content=body)
            answer = proxy._client.send(request, stream=True)
            encoded = self.headers.get("content-encoding", "") == "gzip"
            proxy.exchanges.append(Exchange(self.command, self.path.split("?")[0],
                                            answer.status_code,
                                            gzip.decompress(body) if encoded else body))
            try:
                self.send_response(answer.status_code)
                for key, value in answer.headers.multi_items():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in answer.iter_raw():
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            finally:
                answer.close()

    return Handler


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("transfer-encoding", "").lower() != "chunked":
        return handler.rfile.read(int(handler.headers.get("content-length") or 0))
    parts = []
    while size := int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16):
        parts.append(handler.rfile.read(size))
        handler.rfile.readline()
    while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
        pass  # trailers
    return b"".join(parts)
