"""ServeConfig: what `freight serve`'s flags set, shared by the API process and its batch process.

Validated once where the server starts; the batch process gets the same values as JSON.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from jobs.api.models import ServedModel
from jobs.api.tenants import TenantLimits
from jobs.result_cache.options import CacheOptions

DAY_S = 86_400


class ServeConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # uploads: OpenAI's limits by default
    max_upload_bytes: int = Field(200 << 20, ge=1, description="bytes of one uploaded file, at most")
    max_upload_lines: int = Field(50_000, ge=1, description="requests (non-blank lines) of one file, at most")
    # retention (jobs/api/retention.py): None keeps files until deleted
    file_ttl_s: int | None = Field(30 * DAY_S, ge=1, description="lifetime of an upload without expires_after")
    output_ttl_s: int | None = Field(
        30 * DAY_S, ge=1, description="lifetime of a batch's output and error files without output_expires_after"
    )
    sweep_s: float = Field(60.0, gt=0, description="seconds between the sweeper's passes")
    # every tenant's limits unless its limits.json says otherwise
    limits: TenantLimits = TenantLimits()
    # batches
    min_completion_window_s: float = Field(60.0, gt=0, description="the shortest completion_window taken")
    default_max_tokens: int = Field(
        4096, ge=1, le=1_000_000, description="generated tokens of a request that gives no max_tokens"
    )
    shard_rows: int = Field(256, ge=1, description="requests per shard of a batch's job")
    instance_type: str = "cpu-local"
    market: Literal["on-demand", "spot"] = "on-demand"
    price_per_hour: float | None = Field(None, ge=0)
    models: dict[str, ServedModel] = Field(
        default_factory=dict, description="--models: names a request's model may give (empty: any checkpoint path)"
    )
    result_cache: str | None = Field(
        None, description="--result-cache: the root (a folder or s3://bucket/prefix) of the tenants' result "
        "caches, one each under tenants/<tenant>/ (tenant_cache); None: batches use no cache"
    )
    # the batch process (jobs/api/batch_process.py)
    poll_s: float = Field(1.0, gt=0, description="seconds between the batch process's looks at the store")
    key_cache_s: float = Field(0.5, ge=0, le=1.0, description="how long a key lookup is reused (<= 1 s)")

    def tenant_cache(self, tenant: str) -> CacheOptions:
        """The cache options of `tenant`'s batch jobs: its own result cache under the root, never one
        another tenant's batches write. A hit shows in a batch's cost and time, so a shared cache
        would tell one tenant which requests another sent. `tenant` is a checked name
        (jobs/api/layout.py check_tenant), so the URL stays under the root."""
        if self.result_cache is None:
            return CacheOptions()
        return CacheOptions(url=f"{self.result_cache.rstrip('/')}/tenants/{tenant}")
