"""The S3 client's bounds and how S3Store names what went wrong, against real loopback HTTP (boto3):
a stuck endpoint (stuck_s3.py) costs a call its configured tries x read timeout, not minutes; no
answer (refused, timed out, throttled, 5xx) is StorageUnavailableError, a missing bucket is
BucketNotFoundError, a refusal is a plain StorageError."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fleet_servers import free_port
from loopback_server import LoopbackServer, QuietHandler
from stuck_s3 import StuckS3

from jobs.errors import BucketNotFoundError, StorageError, StorageUnavailableError
from jobs.settings import Settings
from jobs.storage import S3Store
from jobs.storage.s3 import make_s3_client


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


class _Answers(LoopbackServer):
    """An S3 endpoint that answers every request with one status and error code; counts them."""

    def __init__(self, status: int, code: str) -> None:
        self.requests = 0
        body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>m</Message></Error>".encode()
        outer = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.requests += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler)


@pytest.fixture()
def stuck() -> Iterator[StuckS3]:
    server = StuckS3()
    yield server
    server.close()


def _store(endpoint: str, **bounds: float) -> S3Store:
    return S3Store("bucket", "jobs/one", settings=Settings(s3_endpoint_url=endpoint, **bounds))


def test_the_bounds_come_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_s3_client(Settings(s3_endpoint_url="http://127.0.0.1:9")).meta.config
    assert (config.connect_timeout, config.read_timeout) == (10.0, 30.0)  # the defaults
    assert config.retries == {"total_max_attempts": 5, "mode": "standard"}
    monkeypatch.setenv("FREIGHT_S3_CONNECT_TIMEOUT_S", "2.5")
    monkeypatch.setenv("FREIGHT_S3_READ_TIMEOUT_S", "120")
    monkeypatch.setenv("FREIGHT_S3_MAX_ATTEMPTS", "8")
    config = make_s3_client(Settings(s3_endpoint_url="http://127.0.0.1:9")).meta.config
    assert (config.connect_timeout, config.read_timeout) == (2.5, 120.0)
    assert config.retries == {"total_max_attempts": 8, "mode": "standard"}
    monkeypatch.setenv("FREIGHT_S3_MAX_ATTEMPTS", "0")
    with pytest.raises(ValueError, match="s3_max_attempts"):
        Settings()


def test_a_stuck_endpoint_costs_a_call_its_tries_times_the_read_timeout(stuck: StuckS3) -> None:
    store = _store(stuck.url, s3_read_timeout_s=0.5, s3_connect_timeout_s=1.0, s3_max_attempts=2)
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailableError) as err:
        store.get("manifest.json")
    took = time.monotonic() - t0
    # two reads of 0.5 s, and one jittered backoff of at most 1 s between them (botocore standard mode)
    assert 1.0 <= took < 4.0, took
    assert len(stuck.requests) == 2
    assert "no answer from" in str(err.value) and "FREIGHT_S3_READ_TIMEOUT_S" in str(err.value)
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailableError):  # a listing too
        store.list("shards/")
    assert time.monotonic() - t0 < 4.0


def test_a_closed_port_is_unavailable_not_gone() -> None:
    store = _store(f"http://127.0.0.1:{free_port()}", s3_max_attempts=1)
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailableError, match="cannot reach http://127.0.0.1:"):
        store.exists("_SUCCESS")
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (503, "SlowDown", StorageUnavailableError),
        (500, "InternalError", StorageUnavailableError),
        (502, "BadGateway", StorageUnavailableError),
        (501, "NotImplemented", StorageError),  # the store lacks the feature: no later try helps
        (404, "NoSuchBucket", BucketNotFoundError),
        (403, "AccessDenied", StorageError),
        (400, "InvalidRequest", StorageError),
    ],
)
def test_what_storage_answered_names_the_error(status: int, code: str, kind: type[StorageError]) -> None:
    server = _Answers(status, code)
    try:
        with pytest.raises(StorageError) as err:
            _store(server.url, s3_max_attempts=2).get("manifest.json")
        assert type(err.value) is kind, err.value
        retried = kind is StorageUnavailableError  # standard mode tries what may pass again
        assert server.requests == (2 if retried else 1)
    finally:
        server.close()
