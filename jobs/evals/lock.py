"""One beat per suite file: a lease in Redis (SET NX with an expiry, refreshed while beat runs).

The key is `freight:beat-lock:<sha256 of the suite file's lock id>`; its value names the holder
(host, pid, a random token). A second beat for the same file is refused and told who holds it.
A holder that dies stops refreshing and its lease expires after `ttl_seconds`.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import threading
from types import TracebackType

import redis

from jobs.log import get_logger

log = get_logger(__name__)
KEY_PREFIX = "freight:beat-lock:"
# refresh / release only if the lease is still ours (compare-and-set in one round trip)
_REFRESH = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


class LockHeldError(RuntimeError):
    """Another beat holds the lock of this suite file."""


def lock_key(lock_id: str) -> str:
    return KEY_PREFIX + hashlib.sha256(lock_id.encode()).hexdigest()[:32]


class BeatLock:
    """A lease on a suite file. `acquire()` or raise LockHeldError; `start_refreshing()` keeps it
    alive from a daemon thread; `lost` is set when the lease could not be kept."""

    def __init__(self, client: redis.Redis, lock_id: str, ttl_seconds: float = 30.0) -> None:
        if ttl_seconds < 1:
            raise ValueError("ttl_seconds must be at least 1")
        self.client, self.lock_id, self.ttl_seconds = client, lock_id, ttl_seconds
        self.key = lock_key(lock_id)
        self.token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holder(self) -> str | None:
        value = self.client.get(self.key)
        return value.decode() if isinstance(value, bytes) else value

    def acquire(self) -> None:
        if not self.client.set(self.key, self.token, nx=True, px=int(self.ttl_seconds * 1000)):
            raise LockHeldError(
                f"another beat already runs for suite file {self.lock_id!r} (held by {self.holder()}); "
                f"run only one `freight beat` per suite file. If that beat is gone, its lock expires within "
                f"{self.ttl_seconds:.0f} s, or delete the Redis key {self.key}"
            )
        log.info("beat lock acquired", key=self.key, holder=self.token)

    def refresh(self) -> bool:
        """Extend the lease; False (and `lost` set) when it is no longer ours."""
        ok = bool(self.client.eval(_REFRESH, 1, self.key, self.token, int(self.ttl_seconds * 1000)))
        if not ok:
            self.lost.set()
            log.error("beat lock lost", key=self.key)
        return ok

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.client.eval(_RELEASE, 1, self.key, self.token)

    def start_refreshing(self) -> None:
        """Refresh every ttl/3 seconds from a daemon thread until release() or the lease is lost."""

        def loop() -> None:
            while not self._stop.wait(self.ttl_seconds / 3):
                try:
                    if not self.refresh():
                        return
                except redis.RedisError as exc:  # keep trying until the lease would have expired
                    log.warning("beat lock refresh failed", key=self.key, error=str(exc))

        self._thread = threading.Thread(target=loop, name="freight-beat-lock", daemon=True)
        self._thread.start()

    def __enter__(self) -> BeatLock:
        self.acquire()
        self.start_refreshing()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
