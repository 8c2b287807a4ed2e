"""`freight autoscale --once|--loop`: the backlog autoscaler outside Lambda (a cron job, a container,
or a laptop pointed at the fleet). The Lambda runs the very same tick (jobs/autoscale/controller.py).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from jobs.autoscale.config import AutoscaleConfig


def _config(group: str | None, limits: dict[str, float | int | None]) -> AutoscaleConfig:
    from jobs.autoscale.config import AutoscaleConfig
    from jobs.settings import get_settings

    env = dict(os.environ)
    if group:
        env["FREIGHT_AUTOSCALE_GROUP"] = group
    if not (env.get("FREIGHT_REDIS_HOST") and env.get("FREIGHT_REDIS_AUTH_SECRET_ARN")):
        env["FREIGHT_REDIS_URL"] = get_settings().redis_url
    config = AutoscaleConfig.from_env(env)
    chosen = {name: value for name, value in limits.items() if value is not None}
    return replace(config, limits=replace(config.limits, **chosen)) if chosen else config


def _reconciler(redis_url: str):  # noqa: ANN202 - a tick step: now -> repairs
    """jobs/reconcile.py over the whole fleet, with the CLI's settings (storage) and the tick's Redis."""
    from jobs.reconcile import reconcile_once
    from jobs.settings import get_settings

    settings = get_settings().model_copy(update={"redis_url": redis_url})
    return lambda now: reconcile_once(settings)


def _line(summary: dict) -> str:
    return (
        f"desired {summary['desired']} (was {summary['previous']}, {summary['reason']}): "
        f"{summary['queued_shards']} queued shards, {summary['est_tokens_queued']:.0f} est. tokens, "
        f"{summary['running_shards']} running, {summary['busy_workers']}/{summary['live_workers']} workers busy"
        + (" [dry run]" if summary["dry_run"] else "")
    )


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""

    @app.command("autoscale")
    def autoscale(
        once: bool = typer.Option(False, "--once", help="Run one tick and exit."),
        loop: bool = typer.Option(False, "--loop", help="Run a tick every --interval seconds until stopped."),
        group: str | None = typer.Option(
            None, "--group", metavar="NAME", help="Auto Scaling group name (default: $FREIGHT_AUTOSCALE_GROUP)."
        ),
        interval: float = typer.Option(
            60.0, "--interval", min=0.0, metavar="SECONDS", help="Seconds between ticks with --loop."
        ),
        ticks: int = typer.Option(
            0, "--ticks", min=0, metavar="N", help="With --loop: stop after N ticks (0: never)."
        ),
        min_workers: int | None = typer.Option(
            None, "--min-workers", min=0, metavar="N", help="Fewest workers (default: $FREIGHT_AUTOSCALE_MIN_WORKERS)."
        ),
        max_workers: int | None = typer.Option(
            None, "--max-workers", min=1, metavar="N", help="Most workers (default: $FREIGHT_AUTOSCALE_MAX_WORKERS)."
        ),
        scale_in_cooldown: float | None = typer.Option(
            None, "--scale-in-cooldown", min=0.0, metavar="SECONDS",
            help="Demand must stay below the group this long before it shrinks.",
        ),
        idle_to_zero: float | None = typer.Option(
            None, "--idle-to-zero", min=0.0, metavar="SECONDS",
            help="With nothing queued or running, wait this long, then go to --min-workers.",
        ),
        target_drain: float | None = typer.Option(
            None, "--target-drain", min=1.0, metavar="SECONDS",
            help="Size the fleet to work off the queued tokens within this time.",
        ),
        dry_run: bool = typer.Option(False, "--dry-run", help="Decide and print; change nothing."),
        as_json: bool = typer.Option(False, "--json", help="One JSON object per tick."),
    ) -> None:
        """Size the worker Auto Scaling group from the Redis backlog (queued shards, tokens, deadlines)."""
        if once == loop:
            raise typer.BadParameter("give exactly one of --once or --loop")
        import boto3
        import botocore.exceptions
        import redis

        from jobs.autoscale.controller import build_autoscaler
        from jobs.log import get_logger

        log = get_logger("freight.autoscale")
        limits = {
            "min_workers": min_workers,
            "max_workers": max_workers,
            "scale_in_cooldown_s": scale_in_cooldown,
            "idle_to_zero_s": idle_to_zero,
            "target_drain_s": target_drain,
        }
        try:
            config = _config(group, limits)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        session = boto3.session.Session()
        redis_url = config.resolve_redis_url(session.client("secretsmanager"))
        client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=10)
        scaler = build_autoscaler(
            config, client, session.client("autoscaling"), session.client("cloudwatch"), dry_run=dry_run,
            upkeep=[_reconciler(redis_url)],  # here storage is at hand: Redis is checked against it each tick
        )  # fmt: skip
        done = 0
        try:
            while True:
                now = time.time()
                try:
                    summary = scaler.tick(now).as_dict(now)
                    typer.echo(json.dumps(summary) if as_json else _line(summary))
                except (
                    ValueError,  # e.g. the group does not exist in this account and region
                    redis.RedisError,
                    botocore.exceptions.BotoCoreError,
                    botocore.exceptions.ClientError,
                ) as exc:
                    if once:
                        raise typer.BadParameter(f"autoscale tick failed: {exc}") from exc
                    log.error("autoscale.tick_failed", error=str(exc))  # the next tick retries
                done += 1
                if once or (ticks and done >= ticks):
                    break
                time.sleep(interval)
        finally:
            client.close()
