"""Fixtures of the distributed tests: one private redis-server per session (never the shared :6379)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_servers import FakeImds, RedisServer, free_port


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture()
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A clean DB for each test (FLUSHALL before)."""
    client = redis_server.client()
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture()
def imds() -> Iterator[FakeImds]:
    server = FakeImds().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo checkpoint (llama), absolute: the model every fleet test's jobs name."""
    from worker.demo_model import make_demo_model

    return Path(make_demo_model(tmp_path_factory.mktemp("demo") / "model")).resolve()


@pytest.fixture(scope="session")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The "small" demo checkpoint (~4M parameters), for tests that need a shard to run for seconds:
    the engine runs the tiny one at well under a millisecond a step (2 x 1,000 tokens in ~0.2 s)."""
    from worker.demo_model import make_demo_model

    return Path(make_demo_model(tmp_path_factory.mktemp("small") / "model", size="small")).resolve()


@pytest.fixture()
def moto_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's S3 on a free loopback port with bucket "fleet" (moto keeps buckets across servers in one
    process), and this process's AWS variables set for it."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    url = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=url).create_bucket(Bucket="fleet")
    yield url
    server.stop()
