"""`freight serve --redis`: a batch made through the official `openai` client runs as a fleet job on
two real `freight worker` processes (a private redis-server), and `freight jobs` lists it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fleet_jobs import Fleet, freight

from jobs.cost import ShardRecord
from jobs.storage import open_store
from tests.api.serve_harness import batch_line, start_server, wait_batch

ROWS = 24


def test_a_batch_runs_on_two_fleet_workers(redis_url: str, tmp_path: Path, demo_model: Path) -> None:
    fleet = Fleet(redis_url, tmp_path, demo_model)
    server = None
    try:
        fleet.start("a"), fleet.start("b")
        env = {**os.environ, **fleet.env(), "FREIGHT_CACHE_DIR": str(tmp_path / "cache"),
               "FREIGHT_PROFILES_PATH": str(tmp_path / "profiles.json")}  # fmt: skip
        server = start_server(tmp_path / "store", env, "--redis", redis_url, "--shard-rows", "2")
        client = server.client(server.key("team-a"))
        lines = [batch_line(f"r{i:02d}", f"{i:03d} alpha bravo", model=str(demo_model), max_tokens=3)
                 for i in range(ROWS)]  # fmt: skip
        (tmp_path / "in.jsonl").write_text("".join(x + "\n" for x in lines))
        upload = client.files.create(file=(tmp_path / "in.jsonl").open("rb"), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="1h")
        done = wait_batch(client, batch.id, timeout=300)
        assert done.status == "completed", done
        assert done.request_counts.completed == ROWS and done.request_counts.failed == 0  # type: ignore[union-attr]
        out = [json.loads(x) for x in client.files.content(done.output_file_id).read().splitlines()]  # type: ignore[arg-type]
        assert sorted(x["custom_id"] for x in out) == [f"r{i:02d}" for i in range(ROWS)]
        job = open_store(str(server.store_dir / "tenants" / "team-a" / "jobs" / batch.id))
        workers = {ShardRecord.model_validate_json(job.get(k)).worker for k in job.list("costs/")}
        assert len(workers) == 2, "both workers took shards"
        listed = freight(["jobs", "--json"], fleet.env())  # the fleet's jobs, from Redis
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        assert row["state"] == "succeeded" and row["mode"] == "fleet" and row["rows_total"] == ROWS
        assert row["output"] == job.url
    finally:
        if server is not None:
            server.stop()
        fleet.stop()
