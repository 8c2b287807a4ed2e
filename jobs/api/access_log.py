"""One log line per request: method, path, status, milliseconds, bytes received (uploads).

Headers are never logged (they carry the API key); query strings are (they carry only cursors and
limits). An ASGI middleware, so a streamed upload or download is timed to its last byte.
"""

from __future__ import annotations

import time
from typing import Any

from jobs.log import get_logger

log = get_logger("freight.api")


class AccessLog:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [0]
        received = [0]

        async def counting_receive() -> Any:
            message = await receive()
            received[0] += len(message.get("body", b""))
            return message

        async def recording_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, counting_receive, recording_send)
        finally:
            query = scope.get("query_string", b"").decode("latin-1")
            log.info("request", method=scope["method"], path=scope["path"] + (f"?{query}" if query else ""),
                     status=status[0], ms=round((time.perf_counter() - t0) * 1000, 2), bytes_in=received[0])  # fmt: skip
