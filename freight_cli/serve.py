"""`freight serve`: OpenAI's Files and Batches API over a store, batches run embedded or on the fleet.

The composition root of the server: the app (jobs/api/) gets a BatchProcessRunner whose child is
`python -m freight_cli.batch_process`: with --redis that child submits batches to the fleet and
never loads torch; without, it runs them with the embedded runner.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from freight_cli.common import fail
from freight_cli.quantities import parse_size, parse_ttl
from jobs.errors import FreightError
from jobs.settings import Settings, get_settings


def serve(
    store: str = typer.Option(..., "--store", metavar="STORE", help="where files, batches and their jobs live: "
                              "a folder or s3://bucket/prefix (the truth: a restarted server resumes from it)"),
    host: str = typer.Option("127.0.0.1", help="address to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(8000, help="port to listen on"),
    redis: str | None = typer.Option(None, "--redis", metavar="URL", help="run batches on the fleet of this "
                                     "Redis (freight workers and the autoscaler); default: in this server, one at a time"),
    models: Path | None = typer.Option(None, "--models", metavar="FILE", help="TOML or JSON: the model names "
                                       "requests may give, each a checkpoint (default: a request names a "
                                       "checkpoint folder or s3:// prefix)"),
    max_upload: str = typer.Option("200MiB", "--max-upload", metavar="SIZE", help="largest file a client may upload"),
    max_upload_requests: int = typer.Option(50_000, "--max-upload-requests", metavar="N",
                                            help="most requests (lines) of one uploaded file"),
    file_ttl: str = typer.Option("30d", "--file-ttl", metavar="DURATION", help="lifetime of an uploaded file "
                                 "without expires_after (never: kept until deleted)"),
    output_ttl: str = typer.Option("30d", "--output-ttl", metavar="DURATION", help="lifetime of a batch's output "
                                   "and error files without output_expires_after (never: kept until deleted)"),
    max_stored: str = typer.Option("none", "--max-stored", metavar="SIZE", help="every tenant's limit on the "
                                   "bytes of its files (`freight keys limits` sets one tenant's)"),
    max_batches: int | None = typer.Option(None, "--max-batches-in-flight", metavar="N",
                                           help="every tenant's limit on its unfinished batches"),
    min_window: str = typer.Option("1m", "--min-completion-window", metavar="DURATION",
                                   help="the shortest completion_window a batch may ask for"),
    default_max_tokens: int = typer.Option(4096, "--default-max-tokens", metavar="N",
                                           help="tokens generated for a request that gives no max_tokens"),
    result_cache: str | None = typer.Option(None, "--result-cache", metavar="DIR|s3://...", help="reuse the answers "
                                            "of deterministic requests (greedy, or seeded) that a tenant's earlier "
                                            "batches computed: each tenant has its own cache, under "
                                            "DIR/tenants/<tenant>/ (default: FREIGHT_RESULT_CACHE; off: none)"),
    shard_rows: int = typer.Option(256, "--shard-rows", metavar="N", help="requests per shard of a batch's job"),
    instance_type: str = typer.Option("cpu-local", "--instance-type", help="price table key of the machines "
                                      "batches run on (their cost reports)"),
    market: str = typer.Option("on-demand", "--market", help="on-demand or spot"),
    price_per_hour: float | None = typer.Option(None, "--price-per-hour", metavar="USD", help="overrides the table"),
    poll: float = typer.Option(1.0, "--poll", metavar="SECONDS", help="how often the batch process looks at the store"),
    sweep: float = typer.Option(60.0, "--sweep", metavar="SECONDS", help="seconds between retention sweeps"),
    access_log: bool = typer.Option(True, "--access-log/--no-access-log", help="log each request (never a key)"),
) -> None:
    """Serve OpenAI's Files and Batches API (/v1/files, /v1/batches): the openai SDK runs its batches here."""
    import uvicorn

    from freight_cli.job_options import absolute
    from jobs.api.app import create_app
    from jobs.api.config import ServeConfig
    from jobs.api.models import load_models
    from jobs.api.supervisor import BatchProcessRunner
    from jobs.api.tenants import TenantLimits
    from jobs.dashboard.access import loopback_host
    from jobs.dashboard.app import DashboardConfig
    from jobs.lifecycle import parse_window
    from jobs.redact import redact_url
    from jobs.result_cache.options import cache_options
    from jobs.storage import open_store

    settings = get_settings()
    try:
        served = load_models(models) if models is not None else {}
        cache_root = cache_options(result_cache, None, None, settings.result_cache).url
        config = ServeConfig(
            max_upload_bytes=parse_size(max_upload, "--max-upload") or 1 << 62,
            max_upload_lines=max_upload_requests,
            file_ttl_s=parse_ttl(file_ttl, "--file-ttl"),
            output_ttl_s=parse_ttl(output_ttl, "--output-ttl"),
            sweep_s=sweep,
            limits=TenantLimits(max_stored_bytes=parse_size(max_stored, "--max-stored"),
                                max_batches_in_flight=max_batches),  # fmt: skip
            min_completion_window_s=parse_window(min_window, minimum=1, name="--min-completion-window"),
            default_max_tokens=default_max_tokens,
            shard_rows=shard_rows,
            instance_type=instance_type,
            market=market,  # type: ignore[arg-type]
            price_per_hour=price_per_hour,
            models=served,
            result_cache=None if cache_root is None else absolute(cache_root),
            poll_s=poll,
        )
        serve_store = open_store(store, settings)
        serve_store.list("serve/")  # unreachable or refused storage fails here, not at the first request
        if config.result_cache is not None:
            _check_cache_root(config.result_cache, settings)
    except (FreightError, ValueError) as exc:  # ValueError: pydantic's, a malformed URL or duration
        raise fail(str(exc).splitlines()[0] if "validation error" not in str(exc) else _first_error(exc)) from None
    env = dict(os.environ)
    env["FREIGHT_SERVE_CONFIG"] = config.model_dump_json()
    command = [sys.executable, "-m", "freight_cli.batch_process", "--store", serve_store.url]
    if redis is not None:
        env["FREIGHT_REDIS_URL"] = redis
        command.append("--fleet")
    runner = BatchProcessRunner(command, env)
    app = create_app(serve_store, config, runner=runner, settings=settings, access_log=access_log,
                     dashboard=DashboardConfig(loopback=loopback_host(host)), redis_url=redis)  # fmt: skip
    mode = f"on the fleet of {redact_url(redis)}" if redis else "in this server, one at a time"
    if config.result_cache is not None:
        mode += f", each tenant's with its own result cache under {config.result_cache}/tenants/"
    Console(stderr=True, highlight=False).print(
        f"freight serve: OpenAI Files + Batches API on http://{host}:{port}/v1, dashboard on http://{host}:{port}/ "
        f"(store {serve_store.url}; batches run {mode}); make a key with `freight keys create --tenant NAME "
        f"--store {serve_store.url}`", soft_wrap=True,
    )  # fmt: skip
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on",
                timeout_graceful_shutdown=30)  # fmt: skip


def _check_cache_root(url: str, settings: Settings) -> None:
    """The root of the tenants' caches can hold them (each tenant's cache is opened, and made, by its
    first batch's job; one that cannot be opened then runs without it)."""
    from jobs.storage import LocalStore, open_store

    root = open_store(url, settings)
    if isinstance(root, LocalStore) and root.root.exists() and not root.root.is_dir():
        raise FreightError(f"--result-cache {url} is a file: give a folder (each tenant's cache goes under it)")
    root.list("tenants/")  # unreachable or refused storage fails here, not at a batch


def _first_error(exc: Exception) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err['msg']}"
    return str(exc)


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""
    app.command("serve")(serve)
