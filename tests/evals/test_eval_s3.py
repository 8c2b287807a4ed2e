"""Dataset, run OUT and history all in S3 (moto over real HTTP on loopback), the model local."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from freight_cli import app
from jobs.evals.history import History
from jobs.settings import get_settings
from jobs.storage import open_store

BUCKET = "freight-evals-test"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """A boto3 client on a fresh moto server, with the environment freight's stores read."""
    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FREIGHT_S3_ENDPOINT_URL": endpoint,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    get_settings.cache_clear()
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    try:
        yield client
    finally:
        get_settings.cache_clear()
        server.stop()


def test_suite_with_everything_in_s3(tmp_path: Path, s3) -> None:  # noqa: ANN001
    from worker.demo_model import make_demo_model

    model = make_demo_model(tmp_path / "model", "llama", seed=4)
    buffer = io.BytesIO()
    pq.write_table(pa.table({"prompt": ["one", "two", "three"], "reference": ["1", "2", "3"]}), buffer)
    s3.put_object(Bucket=BUCKET, Key="data/qa.parquet", Body=buffer.getvalue())
    suites = tmp_path / "suites.toml"
    suites.write_text(
        f'history = "s3://{BUCKET}/history"\n[[suite]]\nname = "qa"\ndataset = "s3://{BUCKET}/data/qa.parquet"\n'
        'models = ["model"]\nsampling = { max_tokens = 3 }\nmetrics = [{ type = "contains" }]\n'
    )
    for night in ("run1", "run2"):
        result = CliRunner().invoke(
            app, ["eval", "run", str(suites), "--output", f"s3://{BUCKET}/{night}"], catch_exceptions=False
        )
        assert result.exit_code == 0, result.stdout + result.stderr

    records = History(open_store(f"s3://{BUCKET}/history")).runs("qa", str(model))
    assert len(records) == 2 and records[0].metrics == records[1].metrics
    report = json.loads(open_store(f"s3://{BUCKET}/run2").get("report.json"))
    assert report["entries"][0]["metrics"][0]["previous_run_id"] == records[0].run_id
    keys = open_store(f"s3://{BUCKET}/run2").list("qa/")
    assert any(k.endswith("/scores.parquet") for k in keys) and any(k.endswith("/chart.png") for k in keys)

    suites.write_text(suites.read_text().replace("data/qa.parquet", "data/none.parquet"))
    result = CliRunner().invoke(app, ["eval", "run", str(suites), "--output", f"s3://{BUCKET}/run3"])
    assert (
        result.exit_code == 2 and "suites.toml:4:" in result.stderr and "cannot read dataset" in result.stderr
    )
    assert open_store(f"s3://{BUCKET}/run3").list() == []
