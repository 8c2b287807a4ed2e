"""`freight dashboard`: the web dashboard alone, read-only, over a store (and a fleet's Redis).

The same pages `freight serve` shows at `/` (jobs/dashboard/), for a store without the API: jobs
that `freight run` and `submit` wrote anywhere below it, served batches, eval history, the fleet.
With API keys in the store a browser signs in as one tenant and sees its jobs; `--all-tenants` is
the operator's view of every job (those outside tenants/ included), on a loopback address only.
"""

from __future__ import annotations

import typer
from rich.console import Console

from freight_cli.common import fail
from jobs.errors import FreightError
from jobs.settings import get_settings


def dashboard(
    store: str = typer.Option(..., "--store", metavar="STORE", help="folder or s3://bucket/prefix: every job "
                              "below it is shown (as `freight jobs --prefix` finds them)"),
    redis: str | None = typer.Option(None, "--redis", metavar="URL", help="the fleet's Redis: live state of fleet "
                                     "jobs, and the fleet page (workers, queues, autoscaler decisions)"),
    host: str = typer.Option("127.0.0.1", help="address to listen on; without API keys in the store only a "
                             "loopback address is allowed"),
    port: int = typer.Option(8050, help="port to listen on"),
    refresh: float = typer.Option(1.0, "--refresh", metavar="SECONDS", help="the oldest data a page may show"),
    scan: float = typer.Option(5.0, "--scan", metavar="SECONDS", help="how often the whole store is listed "
                               "for new jobs (in between, only unfinished jobs are looked at)"),
    all_tenants: bool = typer.Option(False, "--all-tenants", help="the operator's view: every job, every "
                                     "tenant's and those outside tenants/, with no sign-in even when the store has "
                                     "API keys; on a loopback address only"),
) -> None:
    """Serve the web dashboard (jobs, progress, cost, evals, fleet), read-only."""
    import redis as redis_lib
    import uvicorn

    from jobs.api.layout import KEYS_PREFIX
    from jobs.dashboard.access import loopback_host
    from jobs.dashboard.app import DashboardConfig, create_dashboard
    from jobs.live_state import LiveState
    from jobs.redact import redact_url
    from jobs.storage import open_store

    settings = get_settings()
    if all_tenants and not loopback_host(host):
        raise fail(f"--host {host}: --all-tenants shows every tenant's jobs without a sign-in, so it listens on a "
                   "loopback address only; leave --host out, or sign in per tenant without --all-tenants")  # fmt: skip
    try:
        config = DashboardConfig(loopback=loopback_host(host), refresh_s=refresh, scan_s=scan, all_tenants=all_tenants)
        root = open_store(store, settings)
        keys = bool(root.list(KEYS_PREFIX))  # an unreachable store fails here, not at the first page
        if redis is not None:
            live = LiveState(redis, socket_timeout=2.0, retry_for_s=0)
            try:
                live.client.ping()
            except redis_lib.RedisError as exc:
                raise FreightError(f"--redis {redact_url(redis)} did not answer ({exc}): start it, or leave --redis "
                                   "out to show the store alone") from None  # fmt: skip
            finally:
                live.close()
    except (FreightError, ValueError) as exc:
        raise fail(str(exc).splitlines()[0]) from None
    if not keys and not config.loopback:
        raise fail(f"--host {host}: this store has no API keys, so the dashboard would show every job to anyone; "
                   "it listens on 127.0.0.1 only. Create a key (`freight keys create --tenant NAME --store "
                   f"{root.url}`) to sign in from elsewhere, or leave --host out")  # fmt: skip
    app = create_dashboard(root, settings, config, redis_url=redis)
    if all_tenants:
        who = "all tenants: every job is shown without a sign-in, on 127.0.0.1 only"
    else:
        who = "sign in with an API key" if keys else "no API keys: every job is shown, on 127.0.0.1 only"
    fleet = f"; fleet of {redact_url(redis)}" if redis else ""
    Console(stderr=True, highlight=False).print(
        f"freight dashboard: http://{host}:{port}/ (store {root.url}{fleet}; {who})", soft_wrap=True
    )
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""
    app.command("dashboard")(dashboard)
