"""`freight run` killed (kill -9) while its notification is on the wire: running the complete job
again sends it, once, with the claim's delivery id and body bytes (at least once without a fleet)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pipeline_data import prompts_table, write_parquet
from typer.testing import CliRunner
from webhook_receiver import WebhookReceiver

from freight_cli import app
from jobs.settings import get_settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_settings() -> Iterator[None]:
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_a_rerun_delivers_what_a_killed_run_left_unconfirmed(
    tmp_path: Path, demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch, fresh_settings: None
) -> None:
    rx = WebhookReceiver(hold=1)
    data = write_parquet(prompts_table(8), tmp_path / "in.parquet")
    out = tmp_path / "out"
    args = ["run", str(data), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "2",
            "--notify", rx.url]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "FREIGHT_NOTIFY_TIMEOUT_S": "60", "FREIGHT_NOTIFY_DRAIN_S": "60"}
    exe = Path(sys.executable).with_name("freight")
    run = subprocess.Popen([str(exe), *args], env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        (held,) = rx.wait(1, delivered=False, timeout=300)  # the job is done; its POST is unanswered
    finally:
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
    rx.release()
    try:
        assert (out / "_SUCCESS").exists()
        claim = json.loads((out / "notify" / "succeeded.json").read_text())
        assert claim["delivery_id"] == held.delivery_id and not list(out.rglob("delivered.json"))

        monkeypatch.setenv("FREIGHT_NOTIFY_REDELIVER_GRACE_S", "0.5")
        get_settings.cache_clear()
        time.sleep(0.6)
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0 and "already complete" in result.output, result.output
        (post,) = rx.wait(1)
        assert post.delivery_id == held.delivery_id and post.body == held.body
        assert [p.parent.parent.name for p in out.rglob("delivered.json")] == [held.delivery_id]
        again = CliRunner().invoke(app, args)  # delivered: nothing more
        assert again.exit_code == 0
        time.sleep(0.3)
        assert len(rx.posts) == 2 and len(rx.delivered()) == 1
    finally:
        rx.close()
