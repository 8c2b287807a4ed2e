"""A real webhook receiver on 127.0.0.1 for the notification tests: records every POST it reads, can
hold requests unanswered (a sender killed mid-delivery) or answer 503 (a receiver that is down)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from loopback_server import LoopbackServer, QuietHandler


@dataclass(frozen=True)
class Post:
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered (0: held, never answered)

    @property
    def delivery_id(self) -> str:
        return self.headers["X-Freight-Delivery"]

    def json(self) -> dict:
        return json.loads(self.body)


class WebhookReceiver(LoopbackServer):
    """`hold` requests are read and then left unanswered until `release()`; `fail` more are answered
    503; the rest 204. `posts` has every request in arrival order; `delivered()` the 2xx ones."""

    def __init__(self, *, hold: int = 0, fail: int = 0) -> None:
        self.posts: list[Post] = []
        self.hold = hold
        self.fail = fail
        outer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with outer.lock:
                    held, failing = outer.hold > 0, outer.hold <= 0 and outer.fail > 0
                    outer.hold -= held
                    outer.fail -= failing
                    status = 0 if held else 503 if failing else 204
                    outer.posts.append(Post(dict(self.headers), body, status))
                if held:
                    outer.released.wait(60)
                    status = 503
                try:
                    self.send_response(status)
                    self.end_headers()
                except OSError:
                    pass  # the sender is gone

        super().__init__(Handler, "/hook")

    def delivered(self) -> list[Post]:
        return [p for p in self.posts if 200 <= p.status < 300]

    def wait(self, n: int, *, delivered: bool = True, timeout: float = 15.0) -> list[Post]:
        """Wait until `n` posts (delivered ones, or any) arrived; returns them (maybe fewer)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = self.delivered() if delivered else list(self.posts)
            if len(got) >= n:
                return got
            time.sleep(0.02)
        return self.delivered() if delivered else list(self.posts)
