"""An S3 endpoint on 127.0.0.1 in front of a real one (moto): it forwards every request, but answers
503 SlowDown to the PUTs of the keys a test names (a part of the path -> refuse the first so many
PUTs of each such key; None: for ever), the way an overloaded S3 prefix throttles large writes while small ones get through; and
to every request at all while `down` is set (a store that is away as a whole)."""

from __future__ import annotations

from collections import Counter
from urllib.parse import urlsplit

from loopback_server import LoopbackServer, QuietHandler
from s3_forward import answer, read_body, send_upstream

_SLOW_DOWN = b"<?xml version='1.0'?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"


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
                read_body(self)  # read what the client sent, then refuse it
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(_SLOW_DOWN)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(_SLOW_DOWN)

            do_HEAD = do_PUT = do_POST = do_DELETE = do_GET  # noqa: N815

            def _forward(self) -> None:
                answer(self, *send_upstream(self, up, read_body(self)))

        super().__init__(Handler)
