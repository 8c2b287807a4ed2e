"""The serve store's layout: every key `freight serve` reads or writes, in one place.

```
keys/<sha256 hex of the key>.json          an API key, by hash: {key_id, tenant, name, created_at, revoked_at}
tenants/<tenant>/limits.json               the tenant's own limits (optional): {max_stored_bytes, max_batches_in_flight}
tenants/<tenant>/files/<file id>.jsonl     a file's bytes
tenants/<tenant>/files/<file id>.json      its record: the OpenAI file object + freight's fields
tenants/<tenant>/batches/<batch id>.json   a batch's record: the OpenAI batch object + freight's fields
tenants/<tenant>/jobs/<batch id>/          the batch's freight job: its OUT (manifest.json, shards/, cost.json, ...)
active/<tenant>/<batch id>                 a batch not yet in a final state (the batch process's work list)
expiring/<unix s, 10 digits>/<tenant>/<file id>   when a file expires (the sweeper's work list)
serve/batch-process.lock                   which batch process does the batch work now
```

The store is the truth: a server started on it lists every batch and resumes every active one. Keys
are only ever built here, from tenant names and ids that were checked against their patterns, so a
request can name nothing outside its tenant's prefix. Records are JSON objects whose OpenAI fields
are exactly the API's answer; freight's own fields are listed by each record's model.
"""

from __future__ import annotations

import re

from jobs.settings import Settings
from jobs.storage import ObjectStore, S3Store, open_store

KEYS_PREFIX = "keys/"
ACTIVE_PREFIX = "active/"
EXPIRING_PREFIX = "expiring/"
LOCK_KEY = "serve/batch-process.lock"

TENANT_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


def check_tenant(name: str) -> str:
    """`name` when it can name a tenant (lowercase letters, digits, _ and -, 64 at most, starting
    with a letter or digit); ValueError naming the rule otherwise."""
    if not TENANT_PATTERN.fullmatch(name):
        raise ValueError(
            f"tenant {name!r}: use 1-64 lowercase letters, digits, '_' or '-', starting with a letter or digit"
        )
    return name


def key_record(key_hash: str) -> str:
    return f"{KEYS_PREFIX}{key_hash}.json"


def limits_key(tenant: str) -> str:
    return f"tenants/{tenant}/limits.json"


def files_prefix(tenant: str) -> str:
    return f"tenants/{tenant}/files/"


def file_record(tenant: str, file_id: str) -> str:
    return f"{files_prefix(tenant)}{file_id}.json"


def file_content(tenant: str, file_id: str) -> str:
    return f"{files_prefix(tenant)}{file_id}.jsonl"


def batches_prefix(tenant: str) -> str:
    return f"tenants/{tenant}/batches/"


def batch_record(tenant: str, batch_id: str) -> str:
    return f"{batches_prefix(tenant)}{batch_id}.json"


def job_prefix(tenant: str, batch_id: str) -> str:
    return f"tenants/{tenant}/jobs/{batch_id}"


def active_key(tenant: str, batch_id: str) -> str:
    return f"{ACTIVE_PREFIX}{tenant}/{batch_id}"


def parse_active(key: str) -> tuple[str, str]:
    """(tenant, batch id) of an active/ key."""
    tenant, _, batch_id = key[len(ACTIVE_PREFIX) :].partition("/")
    return tenant, batch_id


def expiring_key(expires_at: int, tenant: str, file_id: str) -> str:
    return f"{EXPIRING_PREFIX}{expires_at:010d}/{tenant}/{file_id}"


def parse_expiring(key: str) -> tuple[int, str, str]:
    """(expires_at, tenant, file id) of an expiring/ key."""
    at, tenant, file_id = key[len(EXPIRING_PREFIX) :].split("/")
    return int(at), tenant, file_id


def sub_store(store: ObjectStore, prefix: str, settings: Settings | None = None) -> ObjectStore:
    """A store rooted at `prefix` inside `store` (a batch's job OUT); an S3 store shares its client."""
    if isinstance(store, S3Store):
        return S3Store(store.bucket, f"{store.prefix}/{prefix}".strip("/"), client=store._client)
    return open_store(store.url_of(prefix), settings)
