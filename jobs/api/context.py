"""What every route reads: the store, the config, the runner, and the tenant of the request's key."""

from __future__ import annotations

from dataclasses import dataclass

from anyio import to_thread
from fastapi import Request

from jobs.api.auth import Authenticator
from jobs.api.config import ServeConfig
from jobs.api.runner import BatchRunner
from jobs.settings import Settings
from jobs.storage import ObjectStore


@dataclass(frozen=True)
class ServeContext:
    store: ObjectStore
    config: ServeConfig
    settings: Settings
    auth: Authenticator
    runner: BatchRunner | None


def serve_context(request: Request) -> ServeContext:
    return request.app.state.serve


async def tenant(request: Request) -> str:
    """FastAPI dependency: the tenant of the request's API key (401 without a valid one). A key
    looked up within the last `key_cache_s` answers on the event loop; a lookup that reads the store
    runs on a worker thread (a sync dependency would cost every request a thread hop)."""
    auth = serve_context(request).auth
    header = request.headers.get("authorization")
    return auth.cached_tenant(header) or await to_thread.run_sync(auth.tenant_of, header)
