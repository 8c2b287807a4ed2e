"""A distributed job whose OUT is in S3 (moto over real HTTP): two worker processes commit shards with
S3 conditional puts; the results equal the embedded run's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_jobs import RESULT_COLUMNS, Fleet, embedded_run, make_input, submit
from fleet_servers import free_port

from jobs import datasets
from jobs.client import queue_for_model
from jobs.settings import Settings, get_settings
from jobs.storage import open_store
from worker.demo_model import make_demo_model


@pytest.fixture()
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "FREIGHT_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}"}  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    boto3.client("s3", endpoint_url=env["FREIGHT_S3_ENDPOINT_URL"]).create_bucket(Bucket="fleet")
    yield env
    server.stop()
    get_settings.cache_clear()


@pytest.mark.slow
def test_two_workers_commit_to_s3(redis_url: str, tmp_path: Path, s3: dict[str, str]) -> None:
    model = Path(make_demo_model(tmp_path / "model")).resolve()
    inp = make_input(tmp_path / "input.parquet", 16)
    reference = embedded_run(inp, model, tmp_path / "embedded", 2)
    fleet = Fleet(redis_url, tmp_path, model)
    try:
        fleet.start("a", **s3), fleet.start("b", **s3)
        out = "s3://fleet/jobs/one"
        sub = submit({**fleet.env(), **s3}, inp, model, out, 2)
        assert sub["shards"] == 8 and sub["output"] == out and sub["queue"] == queue_for_model(str(model))
        done = fleet.wait_done(out)
        assert done.returncode == 0, done.stderr
        store = open_store(out, Settings())
        assert store.exists("_SUCCESS") and store.exists("cost.json")
        rows = datasets.read_results(store).select(RESULT_COLUMNS).to_pylist()
        assert rows == reference
    finally:
        fleet.stop()
