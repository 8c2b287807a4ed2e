"""Fixtures of the job pipeline tests: a tiny demo model, a moto S3 server on loopback, datasets."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.settings import Settings, get_settings


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from worker.demo_model import make_demo_model

    return make_demo_model(tmp_path_factory.mktemp("models") / "tiny", arch="llama")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 over real HTTP on 127.0.0.1 (a free port) for the whole session."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """Environment for boto3 + FREIGHT_S3_ENDPOINT_URL; returns fresh Settings. Creates bucket 'freight-test'."""
    import boto3

    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FREIGHT_S3_ENDPOINT_URL": s3_endpoint,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    get_settings.cache_clear()
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if "freight-test" not in existing:
        client.create_bucket(Bucket="freight-test")
    yield Settings()
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder of built CPU kernels for the whole session: each test's own FREIGHT_CACHE_DIR would
    rebuild them (~7 s of gcc per test that runs the CPU engine). Builds are keyed by source, flags,
    compiler and CPU (kernels/cpu/build.py), so sharing them is what a user's cache does too."""
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(autouse=True)
def _fresh_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_cache: Path) -> Iterator[None]:
    monkeypatch.setenv("FREIGHT_CACHE_DIR", str(tmp_path / "cache"))  # a fresh model cache and profiles
    monkeypatch.setenv("FREIGHT_KERNEL_CACHE", str(kernel_cache))
    monkeypatch.setenv("FREIGHT_PROFILES_PATH", str(tmp_path / "cache" / "profiles.json"))
    monkeypatch.setenv("FREIGHT_LOG_FORMAT", "json")
    monkeypatch.setenv("FREIGHT_LOG_LEVEL", "warning")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
