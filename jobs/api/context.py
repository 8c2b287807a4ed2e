"""What every route reads: the store, the config, the runner, and the tenant of the request's key."""

from __future__ import annotations

from dataclasses import dataclass

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


def tenant(request: Request) -> str:
    """FastAPI dependency: the tenant of the request's API key (401 without a valid one)."""
    return serve_context(request).auth.tenant_of(request.headers.get("authorization"))
