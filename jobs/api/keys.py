"""API keys: made once, stored only as their SHA-256, each bound to one tenant.

A key is `fk-` + 43 URL-safe characters (256 random bits). The store keeps `keys/<sha256 hex>.json`
(jobs/api/layout.py) holding the tenant, a `key_id` (the hash's first 12 hex digits: what `freight keys
list` shows and `freight keys revoke` takes), an optional name and the times it was created and
revoked. The key itself is printed once by `freight keys create` and is in no record, log line or
answer afterwards. A plain hash suffices: a key has 256 random bits, so no dictionary or brute force
reaches it (slow password hashes are for secrets people choose).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time

from pydantic import BaseModel, ConfigDict, Field

from jobs.api.layout import KEYS_PREFIX, check_tenant, key_record
from jobs.errors import FreightError, ObjectNotFoundError
from jobs.storage import ObjectStore

KEY_PREFIX = "fk-"
KEY_ID_DIGITS = 12


class KeyRecord(BaseModel):
    """One key's record (never the key)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    key_id: str
    tenant: str
    name: str | None = None
    created_at: int
    revoked_at: int | None = Field(None, description="unix seconds; a revoked key is refused")

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(store: ObjectStore, tenant: str, name: str | None = None) -> tuple[str, KeyRecord]:
    """A new key for `tenant` and its stored record; the key is returned here and nowhere else."""
    check_tenant(tenant)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    digest = hash_key(key)
    record = KeyRecord(key_id=digest[:KEY_ID_DIGITS], tenant=tenant, name=name, created_at=int(time.time()))
    if not store.put_if_absent(key_record(digest), record.model_dump_json().encode()):
        raise FreightError("a new key collided with a stored one (256 random bits): create it again")
    return key, record


def lookup_key(store: ObjectStore, key: str) -> KeyRecord | None:
    """The record of `key`, or None when no such key was made (a revoked key's record is returned:
    the caller refuses it)."""
    return lookup_hash(store, hash_key(key))


def lookup_hash(store: ObjectStore, digest: str) -> KeyRecord | None:
    """The record of the key whose SHA-256 is `digest` (hex), or None (lookup_key by the hash)."""
    try:
        return KeyRecord.model_validate(json.loads(store.get(key_record(digest))))
    except ObjectNotFoundError:
        return None


def list_keys(store: ObjectStore, tenant: str | None = None) -> list[KeyRecord]:
    """Every key's record (of `tenant` only when given), oldest first."""
    records = [KeyRecord.model_validate(json.loads(store.get(k))) for k in store.list(KEYS_PREFIX) if k.endswith(".json")]
    return sorted((r for r in records if tenant is None or r.tenant == tenant), key=lambda r: (r.created_at, r.key_id))


def revoke_key(store: ObjectStore, key_id: str) -> KeyRecord:
    """Mark the key with this key_id revoked (again is a no-op); FreightError when no key or more than
    one has it."""
    key_id = key_id.strip().lower()
    if len(key_id) < 6:
        raise FreightError(f"key id {key_id!r}: give the key_id `freight keys list` shows (12 hex digits)")
    found = [k for k in store.list(KEYS_PREFIX) if k[len(KEYS_PREFIX) :].startswith(key_id)]
    if not found:
        raise FreightError(f"no key has id {key_id!r} in {store.url}: see `freight keys list`")
    if len(found) > 1:
        raise FreightError(f"key id {key_id!r} names {len(found)} keys: give all 12 digits")
    (name,) = found
    record = KeyRecord.model_validate(json.loads(store.get(name)))
    if record.revoked_at is None:
        record = record.model_copy(update={"revoked_at": int(time.time())})
        store.put(name, record.model_dump_json().encode())
    return record
