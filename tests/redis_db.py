"""A Redis database of a test's own at the local server: reachable, and flushed before and after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis


@contextmanager
def flushed_db(url: str) -> Iterator[str]:
    """Yields `url` once its database is reachable and empty, and empties it again after; a server
    that does not answer fails the test, saying how to start one."""
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis is not reachable at {url} ({exc}); start redis-server on 127.0.0.1:6379")
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()
