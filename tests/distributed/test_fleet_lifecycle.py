"""Completion windows and notifications on the fleet (a real worker, a private redis-server): a job
whose deadline passes mid-run stops at the next engine step, keeps its committed rows once, ends
"expired" (wait exits 4, status, cost.json, `freight jobs`), its webhook gets one signed POST; a
resubmit of the same spec runs only the missing shards, succeeds and notifies once more."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fleet_jobs import Fleet, freight
from fleet_servers import wait_for
from webhook_receiver import WebhookReceiver

from jobs import datasets
from jobs.progress import WorkerBeat
from jobs.storage import open_store

SECRET = "fleet-secret"
ROWS, SHARDS = 24, 12


@pytest.fixture
def fleet(redis_url: str, tmp_path: Path, small_model: Path) -> Iterator[Fleet]:
    f = Fleet(redis_url, tmp_path, small_model, defaults=True)
    yield f
    f.stop()


def _states(hook: WebhookReceiver) -> list[str]:
    """The states of the POSTs the hook received, each checked signed with SECRET."""
    for post in hook.posts:
        assert post.headers["X-Freight-Signature"] == "sha256=" + hmac.new(SECRET.encode(), post.body,
                                                                            hashlib.sha256).hexdigest()  # fmt: skip
    return [post.json()["state"] for post in hook.posts]


def _input(path: Path) -> Path:
    """Shards 0-1 (2 rows each) finish at once; shards 2-11 generate 1,200 tokens a row on the small
    model: about a second each on a quiet machine, so a deadline 4 s after the start falls inside them."""
    rows = ROWS
    table = pa.table({
        "id": [f"r{i:02d}" for i in range(rows)],
        "prompt": [f"{i:02d} prompt number {i}" for i in range(rows)],
        "max_tokens": pa.array([2 if i < 4 else 1200 for i in range(rows)], pa.int64()),
    })  # fmt: skip
    pq.write_table(table, path)
    return path


@pytest.mark.slow
def test_a_fleet_job_expires_mid_run_and_a_resubmit_finishes_it(fleet: Fleet, tmp_path: Path) -> None:
    from jobs.lifecycle import Lifecycle
    from jobs.planner import prepare_job
    from jobs.settings import Settings
    from jobs.spec import JobSpec
    from jobs.submission import submit_job

    hook = WebhookReceiver()
    env = fleet.env(FREIGHT_WEBHOOK_SECRET=SECRET)
    w = fleet.start("life", model=str(fleet.model), FREIGHT_WEBHOOK_SECRET=SECRET)
    wait_for(lambda: (raw := fleet.live.client.hget("freight:workers", "life@test#0"))
             and WorkerBeat.from_json("life@test#0", raw).model == str(fleet.model), 90, "the model loaded")  # fmt: skip
    inp, out = _input(tmp_path / "in.parquet"), tmp_path / "out"
    spec = JobSpec(input=str(inp), model=str(fleet.model), output=str(out), id_column="id", shard_rows=2,
                   sampling={"max_tokens": 1200})  # fmt: skip
    settings = Settings(redis_url=fleet.redis_url)
    deadline = time.time() + 4.0
    sub = submit_job(prepare_job(spec, settings), settings, deadline=deadline,
                     lifecycle=Lifecycle(deadline=deadline, notify=(hook.url,)))  # fmt: skip
    assert float(fleet.live.client.hget(f"freight:job:{sub.job_id}", "deadline")) == pytest.approx(deadline)

    done = fleet.wait_done(out, timeout=120)
    assert done.returncode == 4, done.stderr[-1200:]
    assert f"job {sub.job_id}: expired" in done.stderr
    assert time.time() - deadline < 60  # stopped at a step, not after its 1,200 tokens a row
    assert (out / "_EXPIRED").exists() and not (out / "_SUCCESS").exists()
    report = json.loads((out / "cost.json").read_text())
    committed = {p.name: p.read_bytes() for p in (out / "shards").glob("*.parquet")}
    assert report["state"] == "expired" and 2 <= len(committed) < SHARDS
    assert report["shards_missing"] == SHARDS - len(committed) and report["rows"] == 2 * len(committed)
    stopped = [e for line in w.log_text().splitlines() if line.startswith("{")
               and (e := json.loads(line)).get("event") == "shard_stopped"]  # fmt: skip
    assert [e["reason"] for e in stopped] == ["expired"]  # the running attempt stopped at a step
    waste = [json.loads(p.read_text()) for p in (out / "waste").glob("*.json")]
    assert len(waste) == 1 and waste[0]["cost_usd"] > 0  # billed (its finished rows kept as partial)
    wait_for(lambda: hook.posts, 15, "the expired webhook")
    assert _states(hook) == ["expired"]
    assert fleet.live.client.hget(f"freight:job:{sub.job_id}", "state") == "expired"
    status = freight(["status", sub.job_id], env)
    assert status.returncode == 0 and "expired" in status.stdout, status.stderr
    listed = freight(["jobs", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["job_id"] == sub.job_id and row["state"] == "expired" and row["mode"] == "fleet"

    again = freight(["submit", str(inp), "--model", str(fleet.model), "--output", str(out), "--id-column", "id",
                     "--shard-rows", "2", "--max-tokens", "1200", "--notify", hook.url], env)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert f"queued {SHARDS - len(committed)} of {SHARDS} shards" in again.stderr
    done = fleet.wait_done(out, timeout=300)
    assert done.returncode == 0, done.stderr[-1200:]
    for name, data in committed.items():  # the resubmit ran only the missing shards
        assert (out / "shards" / name).read_bytes() == data
    final = json.loads((out / "cost.json").read_text())
    assert final["state"] == "succeeded" and final["rows"] == ROWS
    ids = sorted(datasets.read_results(open_store(str(out))).column("id").to_pylist())
    assert ids == [f"r{i:02d}" for i in range(ROWS)]
    wait_for(lambda: len(hook.posts) == 2, 15, "the succeeded webhook")
    time.sleep(0.5)
    assert _states(hook) == ["expired", "succeeded"]
    listed = json.loads(freight(["jobs", "--json", "--state", "succeeded"], env).stdout)
    assert [r["job_id"] for r in listed] == [sub.job_id]
    cost = freight(["cost", sub.job_id, "--json"], env)
    assert cost.returncode == 0 and json.loads(cost.stdout)["rows"] == ROWS, cost.stderr
    assert w.alive()
    hook.close()
