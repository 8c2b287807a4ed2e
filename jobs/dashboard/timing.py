"""Server-Timing on every dashboard answer: `app;dur=MS`, the milliseconds from the request reaching
the app to the answer's headers (W3C Server-Timing), so a client tells the server's own time apart
from the network and from waiting for a CPU (bench/dashboard_load.py reports both). It names no
part of the work and no data: only the one duration a client measures less precisely itself."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ServerTiming:
    """ASGI middleware (pure: streamed downloads pass through unbuffered)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                ms = (time.perf_counter() - began) * 1000
                message["headers"] = [*message.get("headers", []), (b"server-timing", f"app;dur={ms:.2f}".encode())]
            await send(message)

        await self.app(scope, receive, timed)
