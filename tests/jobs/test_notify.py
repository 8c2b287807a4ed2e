"""Notifications: a loopback webhook receiver gets exactly one signed POST per final state, with its
delivery id (also when a finalizer crashed mid-finalize and another finishes the job), a dead or hanging receiver delays
nothing, and `sns:ARN` publishes through boto3 (moto's SNS over real HTTP)."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pipeline_data import prompts_table, write_parquet
from typer.testing import CliRunner
from webhook_receiver import WebhookReceiver

from freight_cli import app
from jobs.settings import Settings, get_settings

SECRET = "s3cret-for-tests"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[WebhookReceiver]:
    monkeypatch.setenv("FREIGHT_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("FREIGHT_NOTIFY_BACKOFF_S", "0.05")
    get_settings.cache_clear()
    r = WebhookReceiver(fail=1)  # the first try gets a 503: the sender must retry
    yield r
    r.close()


def _run_args(data: Path, model: Path, out: Path, *extra: str) -> list[str]:
    return ["run", str(data), "--model", str(model), "--output", str(out), "--max-tokens", "4",
            "--shard-rows", "4", *extra]  # fmt: skip


def _check_signed(headers: dict[str, str], body: bytes) -> None:
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["X-Freight-Signature"], expected)


def test_webhook_gets_one_signed_post_when_the_job_succeeds(
    tmp_path: Path, demo_model_dir: Path, receiver: WebhookReceiver
) -> None:
    data = write_parquet(prompts_table(8), tmp_path / "in.parquet")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, _run_args(data, demo_model_dir, out, "--notify", receiver.url))
    assert result.exit_code == 0, result.output
    (post,) = receiver.wait(1)  # the first try got a 503: retried, delivered once
    headers, body = post.headers, post.json()
    _check_signed(headers, post.body)
    claim = json.loads((out / "notify" / "succeeded.json").read_text())
    assert headers["X-Freight-Delivery"] == body["delivery_id"] == claim["delivery_id"]
    assert list((out / "notify" / "succeeded").rglob("delivered.json"))  # recorded: never redelivered
    report = json.loads((out / "cost.json").read_text())
    assert body["state"] == "succeeded" and body["job_id"] == report["job_id"]
    assert body["rows"] == 8 and body["rows_failed"] == report["rows_failed"] == 3
    assert body["cost_usd"] == pytest.approx(report["cost_usd"]) and body["output"] == str(out)
    again = CliRunner().invoke(app, _run_args(data, demo_model_dir, out, "--notify", receiver.url))
    assert again.exit_code == 0 and "already complete" in again.output
    time.sleep(0.3)
    assert len(receiver.delivered()) == 1  # once per final state


class _CrashOnce:
    """A store whose first write of _SUCCESS raises: a finalizer dying between cost.json and _SUCCESS."""

    def __init__(self, store: object) -> None:
        self._store = store
        self.crashed = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if key == "_SUCCESS" and not self.crashed:
            self.crashed = True
            raise OSError("worker killed during finalize")
        return self._store.put_if_absent(key, data)  # type: ignore[attr-defined]


def test_one_post_across_a_finalizer_crash_and_failed_state_too(
    tmp_path: Path, demo_model_dir: Path, receiver: WebhookReceiver
) -> None:
    from jobs.expiry import finalize_and_notify
    from jobs.lifecycle import Lifecycle, write_lifecycle
    from jobs.markers import write_failure
    from jobs.planner import prepare_job
    from jobs.spec import JobSpec
    from worker.local import run_local

    data = write_parquet(prompts_table(8), tmp_path / "in.parquet")
    spec = JobSpec(input=str(data), model=str(demo_model_dir), output=str(tmp_path / "out"), shard_rows=4,
                   sampling={"max_tokens": 2})  # fmt: skip
    prepared = prepare_job(spec)
    write_lifecycle(prepared.store, Lifecycle(notify=(receiver.url,)))
    settings = get_settings()
    # run the shards but let finalize crash: the embedded runner raises out of finalize
    crashing = _CrashOnce(prepared.store)
    with pytest.raises(OSError, match="killed during finalize"):
        run_local(crashing, prepared.manifest, settings=settings)  # type: ignore[arg-type]
    assert (tmp_path / "out" / "cost.json").exists() and not (tmp_path / "out" / "_SUCCESS").exists()
    assert receiver.wait(1, timeout=0.5) == []
    # the redelivered finalize, twice (two workers racing): one POST
    finalize_and_notify(prepared.store, prepared.manifest, settings)
    finalize_and_notify(prepared.store, prepared.manifest, settings)
    posts = receiver.wait(1)
    time.sleep(0.3)
    assert len(receiver.delivered()) == 1 and posts[0].json()["state"] == "succeeded"
    _check_signed(posts[0].headers, posts[0].body)

    # another final state of another job: failed, through the failures path's notify_final
    from jobs.notify import notify_final

    write_failure(prepared.store, {"job_id": spec.job_id, "shard": 0, "rows": 4, "attempts": 3, "reason": "x"})
    assert notify_final(prepared.store, prepared.manifest, "failed", None, settings)
    assert not notify_final(prepared.store, prepared.manifest, "failed", None, settings)
    assert [p.json()["state"] for p in receiver.wait(2)] == ["succeeded", "failed"]


def test_a_dead_or_hanging_receiver_delays_nothing(tmp_path: Path, demo_model_dir: Path) -> None:
    from jobs.expiry import finalize_and_notify
    from jobs.lifecycle import Lifecycle, write_lifecycle
    from jobs.notify import Notifier
    from jobs.planner import prepare_job
    from jobs.spec import JobSpec
    from worker.local import run_local

    hanging = socket.socket()  # accepts connections (backlog), never answers
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(8)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # closed: connection refused
    data = write_parquet(prompts_table(4), tmp_path / "in.parquet")
    spec = JobSpec(input=str(data), model=str(demo_model_dir), output=str(tmp_path / "out"),
                   sampling={"max_tokens": 2})  # fmt: skip
    prepared = prepare_job(spec)
    targets = (f"http://127.0.0.1:{hanging.getsockname()[1]}/h", f"http://127.0.0.1:{dead_port}/h")
    write_lifecycle(prepared.store, Lifecycle(notify=targets))
    settings = Settings(notify_timeout_s=30.0, notify_backoff_s=10.0)
    with pytest.raises(OSError, match="killed during finalize"):  # shards run; finalize left to time alone
        run_local(_CrashOnce(prepared.store), prepared.manifest, settings=settings)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    report = finalize_and_notify(prepared.store, prepared.manifest, settings)
    assert time.perf_counter() - t0 < 1.0  # finalize + notify with one hanging and one dead receiver
    assert report["state"] == "succeeded" and (tmp_path / "out" / "_SUCCESS").exists()
    assert (tmp_path / "out" / "notify" / "succeeded.json").exists()
    t0 = time.perf_counter()
    sender = Notifier(settings)
    sender.send(targets[0], b"{}", "s")
    sender.send(targets[1], b"{}", "s")
    assert time.perf_counter() - t0 < 0.1 and not sender.drain(0.2)  # still trying, in the background
    hanging.close()


def test_sns_target_publishes_once(
    tmp_path: Path, demo_model_dir: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sns.models import sns_backends

    from jobs.expiry import expire_job
    from jobs.lifecycle import Lifecycle, write_lifecycle
    from jobs.notify import notifier
    from jobs.planner import prepare_job
    from jobs.spec import JobSpec

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "FREIGHT_SNS_ENDPOINT_URL": s3_endpoint}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    settings = get_settings()
    arn = boto3.client("sns", region_name="us-east-1", endpoint_url=s3_endpoint).create_topic(Name="jobs")["TopicArn"]
    data = write_parquet(prompts_table(4), tmp_path / "in.parquet")
    prepared = prepare_job(JobSpec(input=str(data), model=str(demo_model_dir), output=str(tmp_path / "out")))
    write_lifecycle(prepared.store, Lifecycle(deadline=time.time() - 1, notify=(f"sns:{arn}",)))
    report = expire_job(prepared.store, prepared.manifest, settings)
    assert report is not None and report["state"] == "expired"
    assert expire_job(prepared.store, prepared.manifest, settings) == report  # again: same, no 2nd send
    assert notifier(settings).drain(10.0)
    sent = sns_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].topics[arn].sent_notifications
    assert len(sent) == 1
    message = json.loads(sent[0][1])
    assert message["state"] == "expired" and message["job_id"] == prepared.manifest.job_id
    attributes = sent[0][3] or {}
    assert attributes["delivery_id"]["Value"] == message["delivery_id"]  # SNS message attribute


def test_a_forked_child_gets_its_own_sender(receiver: WebhookReceiver) -> None:
    """A Celery pool process forked while the main process's sender runs: a sender of its own."""
    import os

    from jobs.notify import notifier

    settings = get_settings()
    parent = notifier(settings)
    parent.send(receiver.url, b"{}", "s")  # the parent's thread is running (first try: a 503)
    pid = os.fork()
    if pid == 0:  # the child: a fresh sender whose delivery completes
        child = notifier(settings)
        child.send(receiver.url, b'{"from": "child"}', "s")
        os._exit(0 if child is not parent and child.drain(10) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent.drain(10) and sorted(p.body for p in receiver.delivered()) == sorted([b"{}", b'{"from": "child"}'])
