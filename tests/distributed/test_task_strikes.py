"""freight.run_shard's strike accounting, run in process: the real task code, a real Redis and a real
OUT folder, with the engine left out (worker.shard.run_shard answers at once) and one storage call made
to fail. test_storage_outage.py and test_fleet_deadline.py run the same rules in real workers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import Reject
from fleet_jobs import make_input

import worker.shard
import worker.tasks
from jobs.errors import StorageUnavailableError
from jobs.planner import prepare_job
from jobs.progress import aux_key
from jobs.settings import Settings
from jobs.spec import JobSpec
from jobs.storage import ObjectStore, open_store
from worker.runtime import ProcessRuntime
from worker.shard_commit import ShardOutcome


class _DeleteUnavailable:
    """An ObjectStore whose DELETE does not answer (503 after the client's retries); all else works."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def delete(self, key: str) -> None:
        raise StorageUnavailableError(f"S3 answered 503 SlowDown to DELETE {key}")


@pytest.fixture()
def rt(redis_url: str) -> Iterator[ProcessRuntime]:
    settings = Settings(redis_url=redis_url, metrics_port=0, storage_outage_backoff_cap_s=0.05)
    runtime = ProcessRuntime(settings, worker_id="test#0", queues=())  # not started: no threads
    yield runtime
    runtime.live.close()
    runtime.live_fast.close()


def test_an_outage_after_a_hand_back_keeps_an_earlier_crash_strike(
    rt: ProcessRuntime, tmp_path: Path, demo_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 1 of shard 0 crashed (its strike stays in Redis). Attempt 2 is handed back (a spot
    notice: it ends cleanly, its strike taken back), then deleting the stale lost-attempt record meets
    a storage outage. That outage is counted, and attempt 1's strike still stands."""
    out = tmp_path / "out"
    spec = JobSpec(input=str(make_input(tmp_path / "in.parquet", 4)), model=str(demo_model), output=str(out),
                   shard_rows=2)  # fmt: skip
    job_id = prepare_job(spec).manifest.job_id
    monkeypatch.setattr(worker.tasks, "runtime", lambda: rt)
    monkeypatch.setattr(worker.tasks, "open_store", lambda url, s=None: _DeleteUnavailable(open_store(url, s)))
    monkeypatch.setattr(worker.tasks, "_engine_for", lambda rt, manifest, on_load: (object(), 0.0))
    monkeypatch.setattr(worker.shard, "run_shard", lambda *a, **k: ShardOutcome(0, "interrupted", 0, 0))

    assert rt.live.begin_attempt(job_id, 0) == (1, 1)  # attempt 1: SIGKILLed, never ended
    with pytest.raises(Reject):
        worker.tasks.run_shard_task(job_id, str(out), 0)  # attempt 2
    counts = {kind: rt.live.client.hget(aux_key(kind, job_id), "0") for kind in ("attempts", "strikes", "outages")}
    assert counts == {"attempts": "2", "strikes": "1", "outages": "1"}  # before the fix: strikes "0"
    assert open_store(str(out)).exists("waste/00000-2-error.json")  # billed as any failed attempt


def test_a_newer_freights_job_is_handed_back_without_a_strike(
    rt: ProcessRuntime, tmp_path: Path, demo_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet mid-upgrade: a newer freight wrote the manifest (a field this worker does not know).
    This worker's attempts and its finalize hand the job back for a newer worker, taking no strike, so
    the newer worker does not find the shard's budget spent; no failure is recorded."""
    out = tmp_path / "out"
    spec = JobSpec(input=str(make_input(tmp_path / "in.parquet", 4)), model=str(demo_model), output=str(out),
                   shard_rows=2)  # fmt: skip
    job_id = prepare_job(spec).manifest.job_id
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "retention_days": 7}))
    monkeypatch.setattr(worker.tasks, "runtime", lambda: rt)
    monkeypatch.setattr(worker.tasks, "ERROR_BACKOFF_CAP_S", 0.01)
    for _ in range(rt.settings.max_shard_attempts + 1):
        with pytest.raises(Reject, match="newer freight"):
            worker.tasks.run_shard_task(job_id, str(out), 0)
    with pytest.raises(Reject, match="newer freight"):
        worker.tasks.finalize_task(job_id, str(out))
    strikes = rt.live.client.hgetall(aux_key("strikes", job_id))
    assert strikes == {"0": "0", "-1": "0"}  # before: 4 strikes on shard 0 (a newer worker then fails it)
    assert rt.live.client.hget(aux_key("attempts", job_id), "0") == "4"
    assert not (out / "failures").exists()
