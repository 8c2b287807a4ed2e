"""Process settings: read once from the environment (prefix FREIGHT_), validated, passed explicitly."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything freight reads from the environment. Construct once; pass it where needed."""

    model_config = SettingsConfigDict(env_prefix="FREIGHT_", frozen=True, extra="ignore")

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Celery broker and live progress")
    s3_endpoint_url: str | None = Field(None, description="S3-compatible endpoint (MinIO, moto, ...)")
    imds_url: str = Field("http://169.254.169.254", description="EC2 instance metadata service base URL")
    cache_dir: Path = Field(Path.home() / ".cache" / "freight", description="downloaded models, etc.")
    log_format: str = Field("auto", pattern="^(auto|json|console)$", description="auto: console on a TTY")
    log_level: str = Field("info", pattern="^(debug|info|warning|error)$")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, parsed on first use (tests build their own `Settings(...)`)."""
    return Settings()
