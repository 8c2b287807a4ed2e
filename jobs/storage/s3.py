"""S3Store: S3 (or an S3-compatible store) through boto3. put_if_absent = PutObject If-None-Match: *."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from jobs.errors import BucketNotFoundError, ObjectNotFoundError, StorageError, StorageUnavailableError
from jobs.settings import Settings, get_settings
from jobs.storage.base import READ_CHUNK, ObjectStore, ObjectWriter, check_key

# 412: the key exists. 409: another conditional write to the key is in flight (retry, then look).
_EXISTS_CODES = {"PreconditionFailed", "412"}
_CONFLICT_CODES = {"ConditionalRequestConflict", "409"}
# Checkpoints of interrupted shards are tagged so the bucket's lifecycle rule can expire them
# (a lifecycle prefix filter cannot match partial/ nested under each job's OUT).
PARTIAL_TAGGING = "freight-partial=true"
# Error codes that mean the store as a whole is unusable (not one key): reported as StorageError.
_ACCESS_CODES = {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                 "InvalidToken", "AllAccessDisabled", "AccountProblem"}  # fmt: skip
# An ObjectWriter's part size: S3 takes 5 MiB at least (but the last part), 10,000 parts at most, so
# objects up to 80 GiB; one part is the writer's whole buffer.
PART_BYTES = 8 << 20
# Answers that mean "not now" (what botocore's standard mode retries, once its tries are spent):
# StorageUnavailableError. Any 5xx status counts too, but 501 NotImplemented: the store lacks a
# feature (a conditional put on an old S3-compatible store), which no retry brings.
_BUSY_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestThrottled", "TooManyRequestsException",
               "RequestLimitExceeded", "BandwidthLimitExceeded", "RequestTimeout", "RequestTimeoutException",
               "PriorRequestNotComplete", "InternalError", "ServiceUnavailable", "429"}  # fmt: skip


def make_s3_client(settings: Settings | None = None) -> Any:
    """A boto3 S3 client; endpoint from FREIGHT_S3_ENDPOINT_URL, the rest from the AWS environment.

    Its timeouts and retries are freight's (FREIGHT_S3_CONNECT_TIMEOUT_S, _READ_TIMEOUT_S,
    _MAX_ATTEMPTS; standard retry mode), not botocore's 60 s + 60 s x 5 legacy tries. Every S3 byte
    freight moves goes through this client: results are Parquet bytes put with PutObject, downloads
    (models) use its transfer manager, inputs are ranged GETs; pyarrow's own S3 filesystem is not used.
    """
    import boto3
    from botocore.config import Config

    settings = settings or get_settings()
    config = Config(
        connect_timeout=settings.s3_connect_timeout_s,
        read_timeout=settings.s3_read_timeout_s,
        retries={"total_max_attempts": settings.s3_max_attempts, "mode": "standard"},
    )
    return boto3.client("s3", endpoint_url=settings.s3_endpoint_url, config=config)


class S3Store(ObjectStore):
    """Objects under s3://bucket/prefix. The client is thread-safe and shared by the store."""

    def __init__(
        self, bucket: str, prefix: str = "", *, settings: Settings | None = None, client: Any = None
    ):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client = client if client is not None else make_s3_client(settings)

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    @staticmethod
    def _code(exc: Exception) -> str:
        response = getattr(exc, "response", None) or {}
        return str(response.get("Error", {}).get("Code", ""))

    @staticmethod
    def _status(exc: Exception) -> int:
        response = getattr(exc, "response", None) or {}
        return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn what botocore raises into one StorageError line that says what to do, of the kind that
        says whether storage answered (jobs/errors.py): BucketNotFoundError (it did: no bucket),
        StorageUnavailableError (it did not: connection, timeout, throttling, 5xx), plain StorageError
        (credentials, access, any other refusal). Per-key errors (NoSuchKey, 412, ...) are handled by
        the method inside the guard before they reach it."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            HTTPClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        try:
            yield
        except (NoCredentialsError, PartialCredentialsError):
            raise StorageError(
                f"no AWS credentials to reach {self.url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(or AWS_PROFILE), or run where an instance role is attached"
            ) from None
        except ConnectionError as exc:  # refused, DNS, TLS, connect timeout
            endpoint = getattr(self._client.meta, "endpoint_url", "S3")
            raise StorageUnavailableError(
                f"cannot reach {endpoint} for {self.url} ({type(exc).__name__}): check the network, or "
                "FREIGHT_S3_ENDPOINT_URL for an S3-compatible store; a later try may succeed"
            ) from None
        except HTTPClientError as exc:  # read timeout, connection dropped mid-answer
            endpoint = getattr(self._client.meta, "endpoint_url", "S3")
            config = self._client.meta.config
            raise StorageUnavailableError(
                f"no answer from {endpoint} for {self.url} ({type(exc).__name__}; read timeout "
                f"{config.read_timeout} s, {(config.retries or {}).get('total_max_attempts', '?')} tries): a later "
                "try may succeed; FREIGHT_S3_READ_TIMEOUT_S and FREIGHT_S3_MAX_ATTEMPTS set how long it waits"
            ) from None
        except ClientError as exc:
            code, status = self._code(exc), self._status(exc)
            if code == "NoSuchBucket":
                raise BucketNotFoundError(
                    f"bucket {self.bucket!r} does not exist ({self.url}): create it, or check the name "
                    "and FREIGHT_S3_ENDPOINT_URL"
                ) from None
            if code in _ACCESS_CODES:
                raise StorageError(
                    f"access to {self.url} denied ({code}): check the credentials and the bucket's policy"
                ) from None
            if code in _BUSY_CODES or (status >= 500 and code != "NotImplemented" and status != 501):
                raise StorageUnavailableError(
                    f"{self.url}: S3 answered {code or status} after {self._attempts(exc)} tries (busy or "
                    "failing): a later try may succeed; raise FREIGHT_S3_MAX_ATTEMPTS to wait longer"
                ) from None
            raise StorageError(
                f"{self.url}: S3 refused the request ({code or status}: {exc}): check the bucket and "
                "FREIGHT_S3_ENDPOINT_URL"
            ) from None
        except BotoCoreError as exc:  # anything else botocore raises before a response: one line
            raise StorageError(f"{self.url}: {exc}") from None

    @staticmethod
    def _attempts(exc: Exception) -> int:
        response = getattr(exc, "response", None) or {}
        return int(response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0) + 1

    def get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        with self._guard():
            try:
                return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
            except ClientError as exc:
                if self._code(exc) in ("NoSuchKey", "404", "NotFound"):
                    raise ObjectNotFoundError(f"{self.url_of(key)} does not exist") from exc
                raise

    def get_range(self, key: str, start: int, length: int) -> bytes:
        from botocore.exceptions import ClientError

        if length <= 0:
            return b""
        with self._guard():
            try:
                body = self._client.get_object(
                    Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{start + length - 1}"
                )["Body"]
                return body.read()
            except ClientError as exc:
                code = self._code(exc)
                if code in ("NoSuchKey", "404", "NotFound"):
                    raise ObjectNotFoundError(f"{self.url_of(key)} does not exist") from exc
                if code == "InvalidRange":  # start at or past the end
                    return b""
                raise

    def size(self, key: str) -> int:
        from botocore.exceptions import ClientError

        with self._guard():
            try:
                return int(self._client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
            except ClientError as exc:
                if self._code(exc) in ("404", "NoSuchKey", "NotFound"):
                    raise ObjectNotFoundError(f"{self.url_of(key)} does not exist") from exc
                raise

    def read_chunks(self, key: str, chunk: int = READ_CHUNK) -> Iterator[bytes]:
        from botocore.exceptions import ClientError

        with self._guard():
            try:
                body = self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
            except ClientError as exc:
                if self._code(exc) in ("NoSuchKey", "404", "NotFound"):
                    raise ObjectNotFoundError(f"{self.url_of(key)} does not exist") from exc
                raise
        try:
            while True:
                with self._guard():
                    piece = body.read(chunk)
                if not piece:
                    return
                yield piece
        finally:
            body.close()

    def writer(self, key: str) -> ObjectWriter:
        return _S3Writer(self, key)

    def sizes(self, prefix: str = "") -> list[tuple[str, int]]:
        return [(key, size) for key, _, size in self.describe(prefix)]

    def put(self, key: str, data: bytes) -> None:
        extra = {"Tagging": PARTIAL_TAGGING} if key.startswith("partial/") else {}
        with self._guard():
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **extra)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        for attempt in range(5):
            with self._guard():
                try:
                    self._client.put_object(
                        Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"
                    )
                    return True
                except ClientError as exc:
                    code = self._code(exc)
                    if code in _EXISTS_CODES:
                        return False
                    if code not in _CONFLICT_CODES:
                        raise
            time.sleep(0.05 * 2**attempt)
            if self.exists(key):
                return False
        raise RuntimeError(f"{self.url_of(key)}: conditional put kept conflicting; retry the shard")

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        with self._guard():
            try:
                self._client.head_object(Bucket=self.bucket, Key=self._key(key))
                return True
            except ClientError as exc:
                if self._code(exc) in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise

    def download(self, key: str, path: str) -> None:
        """Stream `key` into the local file `path` (multipart for large objects; no full copy in memory)."""
        from botocore.exceptions import ClientError

        with self._guard():
            try:
                self._client.download_file(self.bucket, self._key(key), path)
            except ClientError as exc:
                if self._code(exc) in ("404", "NoSuchKey", "NotFound"):
                    raise ObjectNotFoundError(f"{self.url_of(key)} does not exist") from exc
                raise

    def describe(self, prefix: str = "") -> list[tuple[str, str, int]]:
        """(key, ETag, size in bytes) of every object under `prefix`, sorted by key."""
        if ".." in prefix.split("/") or prefix.startswith("/"):
            raise ValueError(f"bad key prefix {prefix!r}")
        full = (f"{self.prefix}/" if self.prefix else "") + prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        out: list[tuple[str, str, int]] = []
        with self._guard():
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full)
            for page in pages:
                out.extend(
                    (o["Key"][strip:], str(o.get("ETag", "")).strip('"'), int(o["Size"]))
                    for o in page.get("Contents", [])
                )
        return sorted(out)

    def list(self, prefix: str = "") -> list[str]:
        return [key for key, _, _ in self.describe(prefix)]

    def delete(self, key: str) -> None:
        with self._guard():
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))


class _S3Writer(ObjectWriter):
    """A multipart upload, PART_BYTES buffered at a time; an object that ends under one part is a plain
    PutObject at commit. S3 shows the key only when the upload completes; an abort (or a process that
    dies) leaves no object (the bucket's AbortIncompleteMultipartUpload rule reclaims dead uploads'
    parts)."""

    def __init__(self, store: S3Store, key: str) -> None:
        self.store, self.key = store, key
        self.full_key = store._key(key)
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._closed = False
        self.bytes_written = 0

    def write(self, data: bytes) -> int:
        if self._closed:
            raise ValueError(f"{self.store.url_of(self.key)}: the writer is closed")
        self._buffer += data
        self.bytes_written += len(data)
        while len(self._buffer) >= PART_BYTES:
            self._send(bytes(self._buffer[:PART_BYTES]))
            del self._buffer[:PART_BYTES]
        return len(data)

    def _send(self, part: bytes) -> None:
        client = self.store._client
        with self.store._guard():
            if self._upload_id is None:
                self._upload_id = client.create_multipart_upload(Bucket=self.store.bucket, Key=self.full_key)[
                    "UploadId"
                ]
            number = len(self._parts) + 1
            answer = client.upload_part(
                Bucket=self.store.bucket, Key=self.full_key, UploadId=self._upload_id, PartNumber=number, Body=part
            )
        self._parts.append({"PartNumber": number, "ETag": answer["ETag"]})

    def commit(self) -> None:
        if self._closed:
            raise ValueError(f"{self.store.url_of(self.key)}: the writer is closed")
        try:
            if self._upload_id is None:
                self.store.put(self.key, bytes(self._buffer))
            else:
                if self._buffer:
                    self._send(bytes(self._buffer))
                with self.store._guard():
                    self.store._client.complete_multipart_upload(
                        Bucket=self.store.bucket, Key=self.full_key, UploadId=self._upload_id,
                        MultipartUpload={"Parts": self._parts},
                    )  # fmt: skip
            self._closed = True
            self._buffer = bytearray()
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        self._closed = True
        self._buffer = bytearray()
        if self._upload_id is not None:
            upload, self._upload_id = self._upload_id, None
            with contextlib.suppress(Exception):  # the bucket's rule reclaims what this leaves
                self.store._client.abort_multipart_upload(
                    Bucket=self.store.bucket, Key=self.full_key, UploadId=upload
                )
