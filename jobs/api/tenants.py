"""Per-tenant limits: bytes stored and batches in flight, each answered with 429 when reached.

The server's flags give every tenant's default; `tenants/<tenant>/limits.json` (written by `freight
keys limits`) overrides them field by field for one tenant. None means no limit.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field

from jobs.api.layout import ACTIVE_PREFIX, limits_key
from jobs.errors import ObjectNotFoundError
from jobs.storage import ObjectStore


class TenantLimits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_stored_bytes: int | None = Field(None, ge=0, description="bytes of files (uploads and outputs) kept")
    max_batches_in_flight: int | None = Field(None, ge=0, description="batches not yet in a final state")


def read_limits(store: ObjectStore, tenant: str, defaults: TenantLimits) -> TenantLimits:
    """The tenant's limits: its limits.json's fields over `defaults`."""
    try:
        own = json.loads(store.get(limits_key(tenant)))
    except ObjectNotFoundError:
        return defaults
    return defaults.model_copy(update={k: v for k, v in own.items() if k in TenantLimits.model_fields})


def write_limits(store: ObjectStore, tenant: str, limits: dict[str, int | None]) -> TenantLimits:
    """Set the tenant's own limits (the fields given; None lifts one back to the server's default)."""
    try:
        own = json.loads(store.get(limits_key(tenant)))
    except ObjectNotFoundError:
        own = {}
    own.update(limits)
    own = {k: v for k, v in own.items() if v is not None}
    checked = TenantLimits.model_validate(own)
    store.put(limits_key(tenant), json.dumps(checked.model_dump(exclude_none=True)).encode())
    return checked


def batches_in_flight(store: ObjectStore, tenant: str) -> int:
    """The tenant's batches not yet in a final state (one listing of active/<tenant>/)."""
    return len(store.list(f"{ACTIVE_PREFIX}{tenant}/"))
