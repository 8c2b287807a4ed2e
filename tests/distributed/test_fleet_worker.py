"""A real `freight worker` process: heartbeat, metrics endpoint, stop on a spot notice (no job needed)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from fleet_servers import FakeImds, WorkerProcess, free_port, wait_for

from jobs.progress import WORKERS_KEY


def test_worker_heartbeats_serves_metrics_and_leaves_on_spot_notice(
    redis_url: str, imds: FakeImds, tmp_path: Path
) -> None:
    port = free_port()
    env = {"FREIGHT_REDIS_URL": redis_url, "FREIGHT_IMDS_URL": imds.url, "FREIGHT_SPOT_POLL_S": "0.2",
           "FREIGHT_HEARTBEAT_S": "0.5", "FREIGHT_METRICS_PORT": str(port), "FREIGHT_LOG_FORMAT": "json"}  # fmt: skip
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    worker = WorkerProcess("spot", env, "freight-test", tmp_path)
    try:
        beats = wait_for(lambda: client.hgetall(WORKERS_KEY), 60, "a heartbeat in freight:workers")
        ((worker_id, raw),) = beats.items()
        beat = json.loads(raw)
        assert worker_id == "spot@test#0"
        assert beat["queue"] == "freight-test" and beat["busy"] is False
        # the beat at the pool process's start goes out before the metadata service is asked; the
        # heartbeat thread's beats carry what it said (the test read the first one in a suite run)
        beat = wait_for(lambda: (b := json.loads(client.hget(WORKERS_KEY, worker_id) or "{}")).get("instance_id")
                        and b, 30, "a heartbeat with the instance id")  # fmt: skip
        assert beat["instance_id"] == "i-0123456789abcdef0"  # read from the metadata service
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "freight_shard_attempts_total 0.0" in body and "freight_spot_interruptions" in body
        imds.announce("terminate")
        wait_for(lambda: not worker.alive(), 30, "the worker to stop after the spot notice")
        assert worker.proc.returncode == 0  # a warm shutdown, not a crash
        assert client.hgetall(WORKERS_KEY) == {}  # it said goodbye
        assert '"spot_notice"' in worker.log_text()
    finally:
        worker.stop()
        client.close()
