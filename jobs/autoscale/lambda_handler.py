"""AWS Lambda entry point: `jobs.autoscale.lambda_handler.handler`, invoked by an EventBridge schedule.

Packaged by infra/build_autoscaler.py with jobs/__init__, jobs/log, jobs/progress (the Redis key names)
and jobs/autoscale plus the pure-Python redis and structlog packages; boto3 comes with the Lambda
Python runtime.
"""

from __future__ import annotations

import os
import time
from typing import Any

import boto3
import redis

from jobs.autoscale.config import AutoscaleConfig
from jobs.autoscale.controller import build_autoscaler
from jobs.log import configure_logging


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """One tick. `event` is EventBridge's scheduled event (ignored except `dry_run`: true)."""
    configure_logging("json", os.environ.get("FREIGHT_LOG_LEVEL", "info"))
    config = AutoscaleConfig.from_env(os.environ)
    session = boto3.session.Session()
    url = config.resolve_redis_url(session.client("secretsmanager"))
    client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10, socket_connect_timeout=10)
    try:
        scaler = build_autoscaler(
            config,
            client,
            session.client("autoscaling"),
            session.client("cloudwatch"),
            dry_run=bool((event or {}).get("dry_run", False)),
        )
        now = time.time()
        return scaler.tick(now).as_dict(now)
    finally:
        client.close()
