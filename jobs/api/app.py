"""The ASGI app of `freight serve`: OpenAI's Files and Batches API over a store.

`create_app(store, config, runner=...)` is all a server needs; the `freight serve` command (the
composition root) builds the runner: an embedded batch process, or one that submits to the fleet.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from jobs.api.access_log import AccessLog
from jobs.api.auth import Authenticator
from jobs.api.config import ServeConfig
from jobs.api.context import ServeContext
from jobs.api.errors import install_handlers
from jobs.api.routes_batches import router as batches_router
from jobs.api.routes_files import router as files_router
from jobs.api.runner import BatchRunner
from jobs.settings import Settings, get_settings
from jobs.storage import ObjectStore


def create_app(
    store: ObjectStore,
    config: ServeConfig | None = None,
    *,
    runner: BatchRunner | None = None,
    settings: Settings | None = None,
    access_log: bool = False,
) -> FastAPI:
    """The app over `store`. `runner` runs the batches (started and stopped with the app); None
    serves files and records only (batches stay validating until a runner looks at the store).
    `access_log`: a log line per request (jobs/api/access_log.py)."""
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
    app.include_router(files_router)
    app.include_router(batches_router)
    if access_log:
        app.add_middleware(AccessLog)
    return app
