"""ObjectStore: one small API over a local folder (LocalStore) and S3 (S3Store), with put_if_absent.

Keys are relative, '/'-separated paths under the store's root ("shards/00000.parquet").
"""

from __future__ import annotations

from jobs.settings import Settings
from jobs.storage.base import ObjectStore, join_url, split_url
from jobs.storage.local import LocalStore
from jobs.storage.s3 import S3Store


def open_store(url: str, settings: Settings | None = None) -> ObjectStore:
    """A store rooted at `url`: a local path (created lazily on first write) or s3://bucket/prefix."""
    if url.startswith("s3://"):
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise ValueError(f"'{url}' has no bucket: use s3://bucket/prefix")
        return S3Store(bucket, prefix.strip("/"), settings=settings)
    if "://" in url:
        raise ValueError(f"'{url}': only local paths and s3://bucket/prefix URLs are supported")
    return LocalStore(url)


__all__ = ["LocalStore", "ObjectStore", "S3Store", "join_url", "open_store", "split_url"]
