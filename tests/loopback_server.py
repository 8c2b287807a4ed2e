"""LoopbackServer: a real HTTP server on 127.0.0.1 (a free port) under the tests' fake endpoints (a
webhook receiver; stuck, scripted and throttling S3 endpoints): a ThreadingHTTPServer on daemon
threads, `released` (an event held requests wait on: `release()`), `lock` for the subclass's
counters, and `close()` (releases what is held, then stops). A subclass builds its handler class
(QuietHandler: no request log on stderr) over its own state, then calls LoopbackServer.__init__."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


class LoopbackServer:
    def __init__(self, handler: type[BaseHTTPRequestHandler], path: str = "") -> None:
        """Serve `handler` at once; `url` is the server's address, then `path`."""
        self.released = threading.Event()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self) -> None:
        """Answer what is held, and everything after at once."""
        self.released.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()
