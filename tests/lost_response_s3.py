"""An S3 endpoint on 127.0.0.1 in front of a real one (moto) that loses the response of a conditional
PUT: it forwards every request, but the first conditional PUT (If-None-Match) of each key whose path
contains `part` is forwarded, stored by moto, and then the connection is closed without an answer,
as a connection reset or a read timeout after S3 stored the object looks to the client. The client's
retry of that PUT meets the object its first try created: 412 PreconditionFailed."""

from __future__ import annotations

from collections import Counter
from urllib.parse import urlsplit

from loopback_server import LoopbackServer, QuietHandler
from s3_forward import answer, read_body, send_upstream


class LostResponseS3(LoopbackServer):
    """`conditional_puts`: conditional PUTs seen per path; `dropped`: paths whose first one lost its
    answer (moto's status is in `dropped_status`); `statuses`: every answer to a conditional PUT of a
    `part` path, in order (the retry's 412 among them)."""

    def __init__(self, upstream: str, part: str = "/shards/") -> None:
        self.conditional_puts: Counter[str] = Counter()
        self.dropped: list[str] = []
        self.dropped_status: list[int] = []
        self.statuses: list[tuple[str, int]] = []
        up = urlsplit(upstream)
        outer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                path = urlsplit(self.path).path
                watched = self.command == "PUT" and part in path and "If-None-Match" in self.headers
                drop = False
                if watched:
                    with outer.lock:
                        outer.conditional_puts[path] += 1
                        drop = outer.conditional_puts[path] == 1
                status, headers, data = send_upstream(self, up, read_body(self))
                if watched:
                    with outer.lock:
                        outer.statuses.append((path, status))
                        if drop:
                            outer.dropped.append(path)
                            outer.dropped_status.append(status)
                if drop:  # stored upstream; the client hears nothing and its connection closes
                    self.close_connection = True
                    return
                answer(self, status, headers, data)

            do_HEAD = do_PUT = do_POST = do_DELETE = do_GET  # noqa: N815

        super().__init__(Handler)
