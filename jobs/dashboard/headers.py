"""The headers on every dashboard answer.

- Security: a Content-Security-Policy that lets a page run and load only this server's own files,
  and no framing, sniffing or referrer leaks. The pages hold no inline script or style: their code
  is in static/, their data in `<script type="application/json">` blocks (data, never run), and
  element styles are set from script through the CSSOM, which style-src does not govern.
- Server-Timing: `app;dur=MS`, the milliseconds from the request reaching the app to the answer's
  headers (W3C Server-Timing), so a client tells the server's own time apart from the network and
  from waiting for a CPU (bench/dashboard_load.py reports both). It names no part of the work and
  no data: only the one duration a client measures less precisely itself.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "font-src 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
    "base-uri 'none'",
))  # fmt: skip
HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
)


class AnswerHeaders:
    """ASGI middleware: HEADERS and Server-Timing on every HTTP answer (a pure ASGI wrapper:
    streamed downloads pass through unbuffered)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                ms = (time.perf_counter() - began) * 1000
                timing = (b"server-timing", f"app;dur={ms:.2f}".encode())
                message["headers"] = [*message.get("headers", []), *HEADERS, timing]
            await send(message)

        await self.app(scope, receive, with_headers)
