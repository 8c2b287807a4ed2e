"""Fixtures of the dashboard tests: a dashboard served by uvicorn on a thread over a fresh store."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from jobs.dashboard.app import DashboardConfig, create_dashboard
from jobs.settings import get_settings
from jobs.storage import LocalStore
from tests.api.serve_harness import free_port


@dataclass
class DashboardServer:
    url: str
    store: LocalStore
    app: object


@contextmanager
def dashboard_server(root: Path, *, redis_url: str | None = None, **config: object) -> Iterator[DashboardServer]:
    """The dashboard over the folder `root` on a free loopback port (stopped on exit)."""
    store = LocalStore(root)
    settings = {"loopback": True, "refresh_s": 0.2, "scan_s": 0.5, **config}
    app = create_dashboard(store, get_settings(), DashboardConfig(**settings), redis_url=redis_url)  # type: ignore[arg-type]
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the dashboard did not start")
        time.sleep(0.01)
    try:
        yield DashboardServer(url=f"http://127.0.0.1:{port}", store=store, app=app)
    finally:
        server.should_exit = True
        thread.join(timeout=20)


Start = Callable[..., DashboardServer]
