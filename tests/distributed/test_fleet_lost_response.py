"""A Celery worker's commit whose PUT S3 stored but whose response was lost (LostResponseS3 drops the
answer to the first conditional PUT of each shard result; the client's retry gets 412) is the
shard's commit, not a lost race: the job succeeds with no waste record, every costs/<n>.json, every
row once, and no strike or outage counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fleet_jobs import Fleet, make_input, submit
from lost_response_s3 import LostResponseS3

from jobs import datasets
from jobs.cost import ShardRecord
from jobs.progress import aux_key
from jobs.settings import Settings, get_settings
from jobs.storage import open_store


@pytest.mark.slow
def test_a_lost_commit_response_is_the_shards_commit(
    redis_url: str, tmp_path: Path, demo_model: Path, moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, out = LostResponseS3(moto_url, part="/shards/"), "s3://fleet/jobs/lost-response"
    monkeypatch.setenv("FREIGHT_S3_ENDPOINT_URL", proxy.url)
    get_settings.cache_clear()
    fleet = Fleet(redis_url, tmp_path, demo_model, overrides={"FREIGHT_S3_ENDPOINT_URL": proxy.url})
    try:
        fleet.start("a")
        job_id = submit(fleet.env(), make_input(tmp_path / "input.parquet", 4), demo_model, out, 2)["job_id"]
        done = fleet.wait_done(out, timeout=60)
        assert done.returncode == 0, fleet.workers[0].log_text()[-3000:]
        assert len(proxy.dropped) == 2 and proxy.dropped_status == [200, 200]
        assert sorted(s for _, s in proxy.statuses) == [200, 200, 412, 412]  # each retry met its own object

        store = open_store(out, Settings())
        assert not store.list("waste/") and not store.list("partial/") and not store.list("failures/")
        records = [ShardRecord.model_validate_json(store.get(k)) for k in store.list("costs/")]
        assert [r.shard for r in records] == [0, 1]
        report = json.loads(store.get("cost.json"))
        assert report["uncommitted_attempts"] == 0 and report["wasted_cost_usd"] == 0
        assert report["cost_usd"] == pytest.approx(sum(r.cost_usd for r in records), rel=1e-9, abs=1e-12)
        assert sorted(datasets.read_results(store).column("id").to_pylist()) == ["0", "1", "2", "3"]
        for kind in ("strikes", "outages"):
            counts = fleet.live.client.hgetall(aux_key(kind, job_id))
            assert all(int(v) == 0 for k, v in counts.items() if int(k) >= 0), (kind, counts)
        assert fleet.metric("a", 'freight_shard_outcomes_total{outcome="committed"}') == 2
        assert fleet.metric("a", 'freight_shard_outcomes_total{outcome="lost_race"}') == 0
    finally:
        fleet.stop()
        proxy.close()
