"""The reconcile pass against storage that does not answer: a live job in S3 (moto over real HTTP)
whose shards Redis lost stays as it is while the store is unreachable or stuck, is repaired by the
first pass once the store answers, and is failed only on storage's own answer (no manifest, no
bucket). A job's repair lock is released only by the pass that holds it. A private redis-server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_jobs import make_input
from fleet_servers import free_port
from structlog.testing import capture_logs
from stuck_s3 import StuckS3

from jobs.client import FleetClient
from jobs.leases import UNACKED_INDEX_KEY, UNACKED_KEY
from jobs.live_state import LiveState
from jobs.planner import prepare_job
from jobs.progress import aux_key
from jobs.reconcile import Reconciler
from jobs.settings import Settings
from jobs.spec import JobSpec
from jobs.submission import submit_job

GRACE_S = 10.0  # FREIGHT_ORPHAN_GRACE_S's default; the passes below are given their `now`


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture()
def s3(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A boto3 client of the moto server, with bucket 'out' (the AWS variables set for every client)."""
    import boto3

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=moto_url)
    if "out" not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket="out")
    return client


def _orphaned_job(settings: Settings, inp: Path, model: Path, out: str) -> str:
    """A job of 2 shards submitted (manifest in OUT, state in Redis), then every queue key flushed:
    its shards are 'queued' in Redis with no message anywhere (what a failover without AOF leaves)."""
    spec = JobSpec(input=str(inp), model=str(model), output=out, shard_rows=2, sampling={"max_tokens": 2})
    sub = submit_job(prepare_job(spec, settings), settings)
    live = LiveState(settings.redis_url)
    queues = [sub.queue, *(f"{sub.queue}\x06\x16{p}" for p in range(1, 10))]
    live.client.delete(*queues, UNACKED_KEY, UNACKED_INDEX_KEY)
    live.close()
    return sub.job_id


def _pass(settings: Settings, now: float) -> tuple[list[Any], list[dict[str, Any]]]:
    client = FleetClient(settings)
    try:
        with capture_logs() as logs:
            repairs = Reconciler(client, settings).run(now)
        return repairs, logs
    finally:
        client.close()


def test_storage_without_an_answer_never_fails_a_live_job(
    redis_url: str, s3: Any, moto_url: str, tmp_path: Path, demo_model: Path
) -> None:
    good = Settings(redis_url=redis_url, s3_endpoint_url=moto_url)
    job_id = _orphaned_job(good, make_input(tmp_path / "in.parquet", 4), demo_model, "s3://out/jobs/one")
    live = LiveState(redis_url)
    now = time.time()
    assert _pass(good, now)[0] == []  # first seen missing: the grace starts
    sightings = live.client.hgetall(aux_key("orphans", job_id))
    assert sorted(sightings) == ["0", "1"]

    stuck = StuckS3()
    try:
        away = {  # a refused connection, and an endpoint that takes the request and never answers
            "closed": Settings(redis_url=redis_url, s3_endpoint_url=f"http://127.0.0.1:{free_port()}",
                               s3_max_attempts=2),
            "stuck": Settings(redis_url=redis_url, s3_endpoint_url=stuck.url, s3_read_timeout_s=0.3,
                              s3_max_attempts=2),
        }  # fmt: skip
        for name, settings in away.items():
            t0 = time.monotonic()
            repairs, logs = _pass(settings, now + GRACE_S + 1)
            assert repairs == [] and time.monotonic() - t0 < 5.0, name
            assert live.job(job_id)["state"] == "queued", name  # not failed: storage said nothing
            assert set(live.shard_states(job_id).values()) == {"queued"}
            assert live.client.hgetall(aux_key("orphans", job_id)) == sightings  # still due next pass
            (warning,) = [e for e in logs if e["event"] == "reconcile_storage_unavailable"]
            assert warning["job_id"] == job_id and warning["transient"] is True, warning
            assert not [e for e in logs if e["event"] == "job_output_gone"]
        assert stuck.requests and stuck.requests[0][1].endswith("/jobs/one/manifest.json")
    finally:
        stuck.close()

    # storage answers again: the next pass repairs at once (the sightings kept their age)
    (repair,), logs = _pass(good, now + GRACE_S + 2)
    assert repair.job_id == job_id and repair.requeued == (0, 1) and repair.state is None
    assert live.job(job_id)["state"] == "queued" and live.client.llen(live.job_meta(job_id)["queue"]) == 2
    assert any(e["event"] == "shards_requeued" for e in logs)

    # the output really gone: storage's answer fails the job, with the reason
    s3.delete_object(Bucket="out", Key="jobs/one/manifest.json")
    live.client.delete(live.job_meta(job_id)["queue"])
    assert _pass(good, now + 2 * GRACE_S)[0] == []
    (gone,), logs = _pass(good, now + 3 * GRACE_S + 1)
    assert gone.state == "failed" and live.job(job_id)["state"] == "failed"
    (error,) = [e for e in logs if e["event"] == "job_output_gone"]
    assert error["error"] == "s3://out/jobs/one holds no freight job (no manifest.json)"
    live.close()


def test_a_bucket_that_is_gone_fails_its_job(
    redis_url: str, s3: Any, moto_url: str, tmp_path: Path, demo_model: Path
) -> None:
    s3.create_bucket(Bucket="doomed")
    good = Settings(redis_url=redis_url, s3_endpoint_url=moto_url)
    job_id = _orphaned_job(good, make_input(tmp_path / "in.parquet", 4), demo_model, "s3://doomed/jobs/two")
    for obj in s3.list_objects_v2(Bucket="doomed").get("Contents", []):
        s3.delete_object(Bucket="doomed", Key=obj["Key"])
    s3.delete_bucket(Bucket="doomed")
    now = time.time()
    assert _pass(good, now)[0] == []
    (gone,), logs = _pass(good, now + GRACE_S + 1)
    assert gone.job_id == job_id and gone.state == "failed"
    live = LiveState(redis_url)
    assert live.job(job_id)["state"] == "failed"
    live.close()
    (error,) = [e for e in logs if e["event"] == "job_output_gone"]
    assert error["error"].startswith("bucket 'doomed' does not exist")


def test_a_job_lock_is_released_only_by_its_holder(redis_url: str, tmp_path: Path, demo_model: Path) -> None:
    """The first pass's repair outlives its lock; a second reconciler takes the lock; the first one's
    release must leave it to the second, whose own release then frees it."""
    settings = Settings(redis_url=redis_url)
    job_id = _orphaned_job(settings, make_input(tmp_path / "in.parquet", 4), demo_model, str(tmp_path / "out"))
    key = f"freight:lock:reconcile:{job_id}"
    live = LiveState(redis_url)
    now = time.time()
    _pass(settings, now)
    clients = [FleetClient(settings), FleetClient(settings)]
    first = Reconciler(clients[0], settings, job_lock_s=0.3)
    second = Reconciler(clients[1], settings)
    second_holds, first_done = threading.Event(), threading.Event()

    def slow_repair(job: str, meta: dict[str, str], due: set[int]) -> Any:
        while live.client.exists(key):  # outlive the lock (0.3 s)
            time.sleep(0.02)
        threading.Thread(target=second.run, args=(now + GRACE_S + 1,), daemon=True).start()
        assert second_holds.wait(10)
        return Reconciler._repair(first, job, meta, due)

    def held_repair(job: str, meta: dict[str, str], due: set[int]) -> Any:
        second_holds.set()
        assert first_done.wait(10)
        return Reconciler._repair(second, job, meta, due)

    first._repair, second._repair = slow_repair, held_repair  # type: ignore[method-assign]
    with capture_logs() as logs:
        (repair,) = first.run(now + GRACE_S + 1)
        assert repair.requeued == (0, 1)
        token = live.client.get(key)
        assert token is not None and live.client.pttl(key) > 0  # the second's lock stands
        assert not live.client.lock(key, timeout=5).acquire(blocking=False)  # and keeps out a third
        first_done.set()
        deadline = time.monotonic() + 10
        while live.client.exists(key):  # the second's repair ends and releases its own lock
            assert time.monotonic() < deadline, "the second reconciler never released its lock"
            time.sleep(0.02)
    expired = [e for e in logs if e["event"] == "reconcile_job_lock_expired"]
    assert len(expired) == 1 and expired[0]["job_id"] == job_id and expired[0]["lock_s"] == 0.3
    for client in clients:
        client.close()
    live.close()


def test_a_newer_freights_manifest_leaves_its_job_and_a_damaged_one_fails_it(
    redis_url: str, tmp_path: Path, demo_model: Path
) -> None:
    """A rolling upgrade: a newer freight wrote the manifest (a field, then a format version, this one
    does not know). The pass leaves the job and its sightings as they are, with a warning that says to
    upgrade; once the manifest is really damaged (cut short), the job fails with a reason to act on."""
    settings = Settings(redis_url=redis_url)
    out = tmp_path / "out"
    job_id = _orphaned_job(settings, make_input(tmp_path / "in.parquet", 4), demo_model, str(out))
    manifest = json.loads((out / "manifest.json").read_text())
    live = LiveState(redis_url)
    now = time.time()
    assert _pass(settings, now)[0] == []  # first seen missing: the grace starts
    sightings = live.client.hgetall(aux_key("orphans", job_id))
    for step, newer in enumerate(({**manifest, "retention_days": 7}, {**manifest, "format": "freight.manifest/2"})):
        (out / "manifest.json").write_text(json.dumps(newer))
        repairs, logs = _pass(settings, now + GRACE_S + 1 + step)
        assert repairs == [] and live.job(job_id)["state"] == "queued"
        assert live.client.hgetall(aux_key("orphans", job_id)) == sightings  # still due next pass
        (warning,) = [e for e in logs if e["event"] == "reconcile_manifest_newer"]
        assert "newer freight" in warning["error"] and "upgrade this worker" in warning["then"], warning
        assert not [e for e in logs if e["log_level"] == "error"]

    (out / "manifest.json").write_text(json.dumps(manifest)[:100])  # damaged: cut short
    (failed,), logs = _pass(settings, now + GRACE_S + 3)
    assert failed.state == "failed" and live.job(job_id)["state"] == "failed"
    (error,) = [e for e in logs if e["event"] == "job_manifest_unreadable"]
    assert "manifest.json is not JSON" in error["error"] and "new --output" in error["error"], error
    live.close()
