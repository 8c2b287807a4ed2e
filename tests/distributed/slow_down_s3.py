"""An S3 endpoint on 127.0.0.1 in front of a real one (moto): it forwards every request, but answers
503 SlowDown to the PUTs of the keys a test names (a part of the path -> refuse the first so many
PUTs of each such key; None: for ever), the way an overloaded S3 prefix throttles large writes while small ones get through; and
to every request at all while `down` is set (a store that is away as a whole)."""

from __future__ import annotations

import http.client
from collections import Counter
from urllib.parse import urlsplit

from loopback_server import LoopbackServer, QuietHandler

_SLOW_DOWN = b"<?xml version='1.0'?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}


class SlowDownS3(LoopbackServer):
    """`puts`: PUTs seen per path; `refused`: of them answered SlowDown. `refuse` picks the keys.
    `down`: while True every request is answered SlowDown (`refused_down` counts them)."""

    def __init__(self, upstream: str, refuse: dict[str, int | None], *, down: bool = False) -> None:
        self.down = down
        self.refused_down = 0
        self.puts: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        up = urlsplit(upstream)
        outer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                refused = False
                with outer.lock:
                    if outer.down:
                        outer.refused_down += 1
                        refused = True
                    elif self.command == "PUT":
                        path = urlsplit(self.path).path
                        outer.puts[path] += 1
                        limits = [n for part, n in refuse.items() if part in path]
                        refused = bool(limits) and (limits[0] is None or outer.puts[path] <= limits[0])
                        outer.refused[path] += refused
                if not refused:
                    self._forward()
                    return
                self._body()  # read what the client sent, then refuse it
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(_SLOW_DOWN)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(_SLOW_DOWN)

            do_HEAD = do_PUT = do_POST = do_DELETE = do_GET  # noqa: N815

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", ""):
                    data = b""
                    while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                        data += self.rfile.read(size)
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return data
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _forward(self) -> None:
                body = self._body()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in _HOP_BY_HOP:
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

        super().__init__(Handler)
