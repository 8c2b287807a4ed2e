"""Fixtures of the dashboard tests: a dashboard served by uvicorn on a thread over a fresh store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from jobs.dashboard.app import DashboardConfig, create_dashboard
from jobs.settings import get_settings
from jobs.storage import LocalStore
from tests.api.serve_harness import uvicorn_thread


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
    with uvicorn_thread(app, "the dashboard") as url:
        yield DashboardServer(url=url, store=store, app=app)


Start = Callable[..., DashboardServer]
