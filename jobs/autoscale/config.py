"""The autoscaler's configuration, read once from the environment (the Lambda's, or the CLI's).

A plain frozen dataclass rather than jobs.settings.Settings: the Lambda package carries only
pure-Python dependencies (redis, structlog; boto3 is in the runtime), and pydantic is not one.

Environment (the Terraform autoscaler module sets all of them on the Lambda):
  FREIGHT_AUTOSCALE_GROUP                 Auto Scaling group name (required)
  FREIGHT_AUTOSCALE_MIN_WORKERS           default 0
  FREIGHT_AUTOSCALE_MAX_WORKERS           default 8
  FREIGHT_AUTOSCALE_SCALE_IN_COOLDOWN_S   default 300
  FREIGHT_AUTOSCALE_IDLE_TO_ZERO_S        default 600
  FREIGHT_AUTOSCALE_TARGET_DRAIN_S        default 1800
  FREIGHT_AUTOSCALE_DEFAULT_TOKENS_PER_SECOND  default 500 (per worker, until workers report)
  FREIGHT_AUTOSCALE_NAMESPACE             CloudWatch namespace, default Freight
  FREIGHT_REDIS_URL                       a full URL; or, on AWS, the three below
  FREIGHT_REDIS_HOST, FREIGHT_REDIS_PORT  the ElastiCache endpoint (TLS, port default 6379)
  FREIGHT_REDIS_AUTH_SECRET_ARN           Secrets Manager secret whose string is the auth token
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from jobs.autoscale.policy import ScalingLimits

PREFIX = "FREIGHT_AUTOSCALE_"
_LIMIT_FIELDS = {
    "MIN_WORKERS": ("min_workers", int),
    "MAX_WORKERS": ("max_workers", int),
    "SCALE_IN_COOLDOWN_S": ("scale_in_cooldown_s", float),
    "IDLE_TO_ZERO_S": ("idle_to_zero_s", float),
    "TARGET_DRAIN_S": ("target_drain_s", float),
    "DEFAULT_TOKENS_PER_SECOND": ("default_tokens_per_second", float),
}


def redis_url_from_token(host: str, port: int, token: str) -> str:
    """The TLS URL of an ElastiCache endpoint with an auth token (the same one the workers build)."""
    return f"rediss://:{quote(token, safe='')}@{host}:{port}/0?ssl_cert_reqs=required"


@dataclass(frozen=True)
class AutoscaleConfig:
    group_name: str
    limits: ScalingLimits = field(default_factory=ScalingLimits)
    redis_url: str | None = None
    redis_host: str | None = None
    redis_port: int = 6379
    redis_auth_secret_arn: str | None = None
    namespace: str = "Freight"

    def __post_init__(self) -> None:
        if not self.group_name:
            raise ValueError(f"set {PREFIX}GROUP (or --group) to the Auto Scaling group's name")
        if not self.redis_url and not (self.redis_host and self.redis_auth_secret_arn):
            raise ValueError(
                "no Redis to read the backlog from: set FREIGHT_REDIS_URL, or FREIGHT_REDIS_HOST with "
                "FREIGHT_REDIS_AUTH_SECRET_ARN"
            )
        if not 0 < self.redis_port < 65536:
            raise ValueError(f"FREIGHT_REDIS_PORT must be a TCP port, got {self.redis_port}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AutoscaleConfig:
        limits: dict[str, Any] = {}
        for suffix, (name, kind) in _LIMIT_FIELDS.items():
            raw = env.get(PREFIX + suffix)
            if raw is not None and raw != "":
                try:
                    limits[name] = kind(raw)
                except ValueError:
                    raise ValueError(f"{PREFIX}{suffix} must be a {kind.__name__}, got {raw!r}") from None
        port = env.get("FREIGHT_REDIS_PORT") or "6379"
        if not port.isdigit():
            raise ValueError(f"FREIGHT_REDIS_PORT must be a TCP port number, got {port!r}")
        return cls(
            group_name=env.get(PREFIX + "GROUP", ""),
            limits=ScalingLimits(**limits),
            redis_url=env.get("FREIGHT_REDIS_URL") or None,
            redis_host=env.get("FREIGHT_REDIS_HOST") or None,
            redis_port=int(port),
            redis_auth_secret_arn=env.get("FREIGHT_REDIS_AUTH_SECRET_ARN") or None,
            namespace=env.get(PREFIX + "NAMESPACE") or "Freight",
        )

    def resolve_redis_url(self, secretsmanager: Any) -> str:
        """The URL to connect with: FREIGHT_REDIS_URL, or the endpoint with the token from the secret."""
        if self.redis_url:
            return self.redis_url
        if not (self.redis_host and self.redis_auth_secret_arn):
            raise ValueError("set FREIGHT_REDIS_HOST and FREIGHT_REDIS_AUTH_SECRET_ARN, or FREIGHT_REDIS_URL")
        token = secretsmanager.get_secret_value(SecretId=self.redis_auth_secret_arn)["SecretString"]
        return redis_url_from_token(self.redis_host, self.redis_port, token.strip())
