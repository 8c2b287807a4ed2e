"""`Authorization: Bearer KEY` -> the key's tenant, or 401 with OpenAI's body.

Lookups are reused for at most `ttl` seconds (ServeConfig.key_cache_s, <= 1 s), so a key created or
revoked while the server runs takes effect within a second, with no restart, while a busy client
costs the store one read per key per `ttl`. The cache holds hashes, never keys; neither is logged.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from jobs.api.errors import APIError
from jobs.api.keys import KeyRecord, hash_key, lookup_hash
from jobs.storage import ObjectStore

CACHE_ENTRIES = 10_000

MISSING = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header using "
    "Bearer auth (i.e. Authorization: Bearer YOUR_KEY). Keys are made with `freight keys create`."
)
INCORRECT = "Incorrect API key provided. Keys are made with `freight keys create`; see `freight keys list`."


class Authenticator:
    def __init__(self, store: ObjectStore, ttl: float) -> None:
        self.store, self.ttl = store, ttl
        self._cache: OrderedDict[str, tuple[float, KeyRecord | None]] = OrderedDict()
        self._lock = threading.Lock()

    def tenant_of(self, authorization: str | None) -> str:
        """The tenant of the request's key; APIError 401 without a key, or with a wrong or revoked one."""
        return self._tenant(self._lookup(self._digest(authorization)))

    def cached_tenant(self, authorization: str | None) -> str | None:
        """tenant_of without reading the store: the tenant when the key's lookup is cached (APIError as
        tenant_of gives it, for a missing key and a cached wrong or revoked one), None when the store
        must be read (then call tenant_of, off the event loop)."""
        hit = self._cached(self._digest(authorization))
        return None if hit is None else self._tenant(hit[0])

    @staticmethod
    def _digest(authorization: str | None) -> str:
        scheme, _, key = (authorization or "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise APIError(401, MISSING, code=None)
        return hash_key(key)

    @staticmethod
    def _tenant(record: KeyRecord | None) -> str:
        if record is None or not record.active:
            raise APIError(401, INCORRECT, code="invalid_api_key")
        return record.tenant

    def tenant_of_hash(self, digest: str) -> str | None:
        """The tenant of the active key whose SHA-256 is `digest` (a dashboard session holds the hash,
        never the key), else None; through the same cache, so a revoked key's sessions end within `ttl`."""
        record = self._lookup(digest)
        return record.tenant if record is not None and record.active else None

    def _cached(self, digest: str) -> tuple[KeyRecord | None] | None:
        """(the cached lookup,) when it is younger than `ttl`, else None."""
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None and time.monotonic() - hit[0] < self.ttl:
                return (hit[1],)
        return None

    def _lookup(self, digest: str) -> KeyRecord | None:
        hit = self._cached(digest)
        if hit is not None:
            return hit[0]
        now = time.monotonic()
        record = lookup_hash(self.store, digest)
        with self._lock:
            self._cache[digest] = (now, record)
            self._cache.move_to_end(digest)
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return record
