"""A shard attempt that ends because storage did not answer is no strike against the shard
(worker/outages.py). A real worker writes to moto through SlowDownS3, which answers 503 SlowDown to
the result PUT (shards/<n>.parquet) while every other request (manifest, waste and failure records)
gets through. Shortened for speed: FREIGHT_S3_MAX_ATTEMPTS=1 (one 503 ends the call),
FREIGHT_STORAGE_OUTAGE_BACKOFF_CAP_S=0.1; FREIGHT_MAX_SHARD_ATTEMPTS is the fleet's 3."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleet_jobs import Fleet, make_input, submit
from fleet_servers import wait_for
from slow_down_s3 import SlowDownS3

from jobs import datasets
from jobs.progress import aux_key
from jobs.settings import Settings, get_settings
from jobs.storage import open_store

OUT = "s3://fleet/jobs/outage-{}"  # moto keeps its buckets across servers in one process
MAX_ATTEMPTS = 3


MakeFleet = Callable[..., tuple[SlowDownS3, Fleet]]


@pytest.fixture
def outage_fleet(
    redis_url: str, tmp_path: Path, demo_model: Path, moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MakeFleet]:
    """make(refuse, **env) -> (proxy, fleet): a SlowDownS3 over moto refusing the PUTs `refuse` names,
    and a fleet (no worker yet) whose storage is that proxy, this process's too; both stopped at the
    end of the test."""
    proxies: list[SlowDownS3] = []
    fleets: list[Fleet] = []

    def make(refuse: dict[str, int | None], **env: str) -> tuple[SlowDownS3, Fleet]:
        proxy = SlowDownS3(moto_url, refuse)
        proxies.append(proxy)
        monkeypatch.setenv("FREIGHT_S3_ENDPOINT_URL", proxy.url)
        get_settings.cache_clear()
        overrides = {"FREIGHT_S3_ENDPOINT_URL": proxy.url, "FREIGHT_S3_MAX_ATTEMPTS": "1",
                     "FREIGHT_STORAGE_OUTAGE_BACKOFF_CAP_S": "0.1", **env}  # fmt: skip
        fleets.append(Fleet(redis_url, tmp_path, demo_model, overrides=overrides))
        return proxy, fleets[-1]

    yield make
    for fleet in fleets:
        fleet.stop()
    for proxy in proxies:
        proxy.close()


def _run_job(fleet: Fleet, out: str) -> int:
    """Submit 4 rows in 2 shards; one worker; returns `freight wait`'s code."""
    fleet.start("a")
    submit(fleet.env(), make_input(fleet.tmp / "input.parquet", 4), fleet.model, out, 2)
    return fleet.wait_done(out, timeout=60).returncode


def _counts(fleet: Fleet, out: str, kind: str) -> dict[int, int]:
    job_id = fleet.live.find_job(out)
    assert job_id is not None
    return {
        int(k): int(v) for k, v in fleet.live.client.hgetall(aux_key(kind, job_id)).items() if int(k) >= 0
    }


def test_outages_past_the_attempt_limit_are_no_strikes(outage_fleet: MakeFleet) -> None:
    """Each result PUT is refused 4 times (more than FREIGHT_MAX_SHARD_ATTEMPTS): both shards commit
    on their 5th attempt, every row once; the outages were counted, the strikes are all taken back."""
    proxy, fleet = outage_fleet({"/shards/": MAX_ATTEMPTS + 1})
    out = OUT.format("recovers")
    assert _run_job(fleet, out) == 0, fleet.workers[0].log_text()[-3000:]
    store = open_store(out, Settings())
    assert store.exists("_SUCCESS") and not store.list("failures/")
    ids = datasets.read_results(store).column("id").to_pylist()
    assert sorted(ids) == ["0", "1", "2", "3"]  # every row (ids are row numbers), exactly once
    refused = {p: n for p, n in proxy.refused.items() if n}
    assert sorted(refused.values()) == [4, 4] and all(proxy.puts[p] == 5 for p in refused), proxy.puts
    assert _counts(fleet, out, "outages") == {0: 4, 1: 4}
    assert _counts(fleet, out, "attempts") == {0: 5, 1: 5}
    assert set(_counts(fleet, out, "strikes").values()) == {0}
    assert len(store.list("waste/")) == 8  # each refused attempt billed once, as an error
    # the worker's metrics count them as storage outages, not errors
    assert fleet.metric("a", 'freight_shard_outcomes_total{outcome="storage_outage"}') == 8
    assert fleet.metric("a", 'freight_shard_outcomes_total{outcome="error"}') == 0
    assert fleet.metric("a", 'freight_shard_outcomes_total{outcome="committed"}') == 2


@pytest.mark.slow
def test_a_store_that_never_recovers_fails_the_shard_past_the_outage_budget(outage_fleet: MakeFleet) -> None:
    """Every result PUT is refused: with FREIGHT_MAX_SHARD_STORAGE_OUTAGES=5 each shard fails after its
    5th attempt (not the 3rd), and failures/<n>.json says storage was unavailable and what to do."""
    proxy, fleet = outage_fleet({"/shards/": None}, FREIGHT_MAX_SHARD_STORAGE_OUTAGES="5")
    out = OUT.format("never")
    assert _run_job(fleet, out) == 1, fleet.workers[0].log_text()[-3000:]
    store = open_store(out, Settings())
    assert not store.exists("_SUCCESS")
    for shard in (0, 1):
        failure = json.loads(store.get(f"failures/{shard:05d}.json"))
        assert failure["attempts"] == 5
        reason = failure["reason"]
        assert reason.startswith("storage was unavailable for 5 attempts of this shard"), reason
        assert "SlowDown" in reason and "FREIGHT_S3_ENDPOINT_URL" in reason and "freight submit" in reason
    assert sorted(n for n in proxy.refused.values() if n) == [5, 5]
    assert _counts(fleet, out, "outages") == {0: 5, 1: 5}


@pytest.mark.slow
def test_a_store_away_as_a_whole_costs_no_strikes(outage_fleet: MakeFleet) -> None:
    """Submitted, then every request refused (the manifest read of each attempt, the waste record):
    each shard's attempts end at their first storage call, past FREIGHT_MAX_SHARD_ATTEMPTS; storage
    back, the job succeeds with every row once and no strike left."""
    proxy, fleet = outage_fleet({})
    out = OUT.format("away")
    job_id = submit(fleet.env(), make_input(fleet.tmp / "input.parquet", 4), fleet.model, out, 2)["job_id"]
    proxy.down = True
    fleet.start("a")
    wait_for(lambda: all(fleet.live.storage_outages(job_id, n) > MAX_ATTEMPTS for n in (0, 1)), 60,
             "both shards past the attempt limit in outages")  # fmt: skip
    proxy.down = False
    done = fleet.wait_done(out, timeout=60)
    assert done.returncode == 0, fleet.workers[0].log_text()[-3000:]
    store = open_store(out, Settings())
    assert not store.list("failures/")
    assert sorted(datasets.read_results(store).column("id").to_pylist()) == ["0", "1", "2", "3"]
    assert set(_counts(fleet, out, "strikes").values()) == {0}
    assert all(n > MAX_ATTEMPTS for n in _counts(fleet, out, "outages").values())
    assert proxy.refused_down > 0


@pytest.mark.slow
def test_past_the_budget_the_engine_does_not_run_again(outage_fleet: MakeFleet) -> None:
    """Result PUTs refused for ever, and the first PUT of each failure record too: the attempt that
    spends the budget (FREIGHT_MAX_SHARD_STORAGE_OUTAGES=3) cannot record the failure, so the shard
    is requeued; the next attempt records it before the engine runs: 3 result PUTs per shard, no 4th."""
    proxy, fleet = outage_fleet({"/shards/": None, "/failures/": 1}, FREIGHT_MAX_SHARD_STORAGE_OUTAGES="3")
    out = OUT.format("spent")
    assert _run_job(fleet, out) == 1, fleet.workers[0].log_text()[-3000:]
    store = open_store(out, Settings())
    for shard in (0, 1):
        failure = json.loads(store.get(f"failures/{shard:05d}.json"))
        assert failure["attempts"] == 4
        assert failure["reason"].startswith("storage was unavailable for 3 attempts of this shard")
    results = {p: n for p, n in proxy.puts.items() if "/shards/" in p}
    failures = {p: n for p, n in proxy.puts.items() if "/failures/" in p}
    assert sorted(results.values()) == [3, 3] and sorted(failures.values()) == [2, 2], proxy.puts
    assert _counts(fleet, out, "outages") == {0: 3, 1: 3}
