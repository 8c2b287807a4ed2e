"""The ObjectStore contract shared by LocalStore and S3Store."""

from __future__ import annotations

import posixpath
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

READ_CHUNK = 1 << 20  # bytes per piece of `read_chunks`


class ObjectWriter(ABC):
    """An object written in pieces and published under its key at `commit`, atomically: a reader sees
    the whole object or none of it, never a prefix. Memory stays bounded whatever the object's size
    (a local temp file beside the key; S3 multipart parts). Used as a context manager, it commits when
    the block ends normally and aborts (discards every byte) when it ends by an exception."""

    bytes_written: int = 0

    @abstractmethod
    def write(self, data: bytes) -> int: ...

    @abstractmethod
    def commit(self) -> None:
        """Publish the bytes written so far under the key (create or replace)."""

    @abstractmethod
    def abort(self) -> None:
        """Discard what was written; the key keeps what it held before. Safe to call twice."""

    def __enter__(self) -> ObjectWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()


class ObjectStore(ABC):
    """A flat key -> bytes store rooted at `url`.

    Contract (both backends):
    - `get(key)` returns the bytes or raises `jobs.errors.ObjectNotFoundError`.
    - `put(key, data)` creates or replaces atomically (a reader sees old or new bytes, never a mix).
    - `put_if_absent(key, data)` creates only if `key` does not exist; returns True if this call
      created it, False if it already existed. Among racing callers exactly one gets True.
    - `list(prefix)` returns the keys under `prefix` (a plain string prefix), sorted.
    - `delete(key)` is a no-op for a missing key.
    - `writer(key)` streams an object in (ObjectWriter); `read_chunks(key)` streams one out. Neither
      holds the whole object in memory.
    """

    url: str

    @abstractmethod
    def get(self, key: str) -> bytes: ...

    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to `length` bytes of `key` from byte `start` (fewer at the end of the object); raises
        ObjectNotFoundError like `get`. Backends override it to read only that range."""
        return self.get(key)[start : start + length]

    def size(self, key: str) -> int:
        """The object's size in bytes; raises ObjectNotFoundError like `get`."""
        return len(self.get(key))

    @abstractmethod
    def writer(self, key: str) -> ObjectWriter:
        """An ObjectWriter that publishes `key` at commit (create or replace)."""

    def read_chunks(self, key: str, chunk: int = READ_CHUNK) -> Iterator[bytes]:
        """The object's bytes in pieces of at most `chunk` bytes, in order; raises ObjectNotFoundError
        like `get` (before the first piece). Backends override it to stream one read."""
        size = self.size(key)
        for start in range(0, size, chunk):
            yield self.get_range(key, start, min(chunk, size - start))

    def sizes(self, prefix: str = "") -> list[tuple[str, int]]:
        """(key, size in bytes) of every object under `prefix`, sorted by key (one listing where the
        backend's listing carries sizes)."""
        return [(key, self.size(key)) for key in self.list(prefix)]

    def local_path(self, key: str) -> Path | None:
        """A filesystem path for `key` when the store is local (readers may mmap it), else None."""
        return None

    def url_of(self, key: str) -> str:
        """The full URL of `key` (for messages and manifests)."""
        return join_url(self.url, key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def check_key(key: str) -> str:
    """Refuse keys that would escape the root or be ambiguous."""
    if not key or key.startswith("/") or "\\" in key:
        raise ValueError(f"bad object key {key!r}: use a relative '/'-separated path")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"bad object key {key!r}: no empty, '.' or '..' parts")
    return key


def join_url(url: str, key: str) -> str:
    """`url` + '/' + `key` for both local paths and s3:// URLs."""
    return f"{url.rstrip('/')}/{key}" if key else url


def split_url(url: str) -> tuple[str, str]:
    """('s3://b/p/x.parquet') -> ('s3://b/p', 'x.parquet'); works for local paths too."""
    parent, name = posixpath.split(url.rstrip("/"))
    return parent, name
