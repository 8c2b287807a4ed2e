"""Secrets never printed: URL passwords and tokens are redacted in messages and in every log line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.log import configure_logging, get_logger
from jobs.redact import redact, redact_url

SECRET = "Zx9-s3cr3t%2Ftoken"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"cannot reach Redis at rediss://:{SECRET}@h.cache.amazonaws.com:6379/0?ssl_cert_reqs=required (x)",
         "cannot reach Redis at rediss://:***@h.cache.amazonaws.com:6379/0?ssl_cert_reqs=required (x)"),
        (f"redis://default:{SECRET}@10.0.0.5:6379/0", "redis://default:***@10.0.0.5:6379/0"),
        (f"redis://{SECRET}@10.0.0.5/0", "redis://***@10.0.0.5/0"),  # redis-py: a bare token is the password
        (f"http://minio:{SECRET}@127.0.0.1:9000", "http://minio:***@127.0.0.1:9000"),
        (f"https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA1&X-Amz-Signature={SECRET}&x=1",
         "https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***&x=1"),
        ("redis://127.0.0.1:6379/0 and s3://bucket/jobs/a:b@c", "redis://127.0.0.1:6379/0 and s3://bucket/jobs/a:b@c"),
    ],
)  # fmt: skip
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert redact(redact(text)) == expected  # idempotent


def test_redact_url_of_nothing() -> None:
    assert redact_url(None) == "" and redact_url("redis://:pw@h/0") == "redis://:***@h/0"


def test_every_log_line_is_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json", "info")
    log = get_logger("test")
    url = f"rediss://:{SECRET}@host:6379/0"
    log.warning("connect_failed", url=url, error=f"Error connecting to {url}", nested={"urls": [url]})
    try:
        raise ConnectionError(f"cannot reach {url}")
    except ConnectionError:
        log.exception("boom")
    err = capsys.readouterr().err
    assert SECRET not in err and err.count("***") >= 4
    first = json.loads(err.splitlines()[0])
    assert first["url"] == "rediss://:***@host:6379/0" and first["nested"] == {"urls": ["rediss://:***@host:6379/0"]}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_errors_never_print_the_redis_password(tmp_path: Path, demo_model_dir: Path) -> None:
    inp = tmp_path / "in.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"]}), inp)
    # FREIGHT_SUBMIT_REDIS_RETRY_S=0: submit fails at the first refusal instead of retrying for 5 s
    env = {**os.environ, "FREIGHT_REDIS_URL": f"redis://:{SECRET}@127.0.0.1:{_closed_port()}/0",
           "FREIGHT_LOG_FORMAT": "json", "FREIGHT_SUBMIT_REDIS_RETRY_S": "0"}  # fmt: skip
    exe = Path(sys.executable).with_name("freight")
    out = str(tmp_path / "out")
    runs = [
        [str(exe), "submit", str(inp), "--model", str(demo_model_dir), "--output", out],
        [str(exe), "wait", "0123456789abcdef"],
        [str(exe), "cancel", "0123456789abcdef"],
    ]
    procs = [subprocess.run(args, env=env, capture_output=True, text=True, timeout=120) for args in runs]
    for args, proc in zip(runs, procs, strict=True):
        assert proc.returncode != 0, (args, proc.stderr)
        assert SECRET not in proc.stdout + proc.stderr, (args, proc.stderr)
    assert "redis://:***@127.0.0.1" in procs[0].stderr  # the URL is still named, without its password
