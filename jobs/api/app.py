"""The ASGI app of `freight serve`: OpenAI's Files and Batches API over a store, and the dashboard.

`create_app(store, config, runner=...)` is all a server needs; the `freight serve` command (the
composition root) builds the runner: an embedded batch process, or one that submits to the fleet.
With `dashboard`, the web dashboard (jobs/dashboard/) answers every path outside /v1.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount

from jobs.api.access_log import AccessLog
from jobs.api.auth import Authenticator
from jobs.api.config import ServeConfig
from jobs.api.context import ServeContext
from jobs.api.errors import install_handlers
from jobs.api.routes_batches import router as batches_router
from jobs.api.routes_files import router as files_router
from jobs.api.runner import BatchRunner
from jobs.dashboard.app import DashboardConfig, create_dashboard
from jobs.settings import Settings, get_settings
from jobs.storage import ObjectStore


def create_app(
    store: ObjectStore,
    config: ServeConfig | None = None,
    *,
    runner: BatchRunner | None = None,
    settings: Settings | None = None,
    access_log: bool = False,
    dashboard: DashboardConfig | None = None,
    redis_url: str | None = None,
) -> FastAPI:
    """The app over `store`. `runner` runs the batches (started and stopped with the app); None
    serves files and records only (batches stay validating until a runner looks at the store).
    `access_log`: a log line per request (jobs/api/access_log.py). `dashboard`: serve the dashboard
    at `/` too (with `redis_url`, the fleet's)."""
    config = config or ServeConfig()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runner is not None:
            runner.start()
        try:
            yield
        finally:
            if runner is not None:
                runner.stop()

    app = FastAPI(title="freight", summary="OpenAI Files + Batches API over freight jobs", lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)  # fmt: skip
    app.state.serve = ServeContext(
        store=store, config=config, settings=settings or get_settings(),
        auth=Authenticator(store, config.key_cache_s), runner=runner,
    )  # fmt: skip
    install_handlers(app)

    @app.get("/health", include_in_schema=False)
    def health() -> dict[str, str]:
        """Liveness for a load balancer's health check: answers without a key, reads nothing."""
        return {"status": "ok"}

    app.include_router(files_router)
    app.include_router(batches_router)
    if dashboard is not None:
        # an unknown /v1 path stays the API's (OpenAI's JSON 404 / 405), everything else is the dashboard's
        app.add_api_route("/v1/{rest:path}", _unknown_v1, methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                          include_in_schema=False)  # fmt: skip
        app.mount("/", create_dashboard(store, app.state.serve.settings, dashboard, redis_url=redis_url))
    if access_log:
        app.add_middleware(AccessLog)
    return app


def _unknown_v1(request: Request, rest: str) -> None:
    """405 when an API route has this path for another method, else 404 (the API's error bodies)."""
    for route in request.app.router.routes:
        if isinstance(route, Mount) or getattr(route, "endpoint", None) is _unknown_v1:
            continue
        if route.matches(request.scope)[0] == Match.PARTIAL:
            raise StarletteHTTPException(405)
    raise StarletteHTTPException(404)
