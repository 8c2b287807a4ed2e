"""The submit side: messages on the wire are JSON task calls by name; the client imports no worker/torch."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

from jobs.client import TASK_RUN_SHARD, FleetClient, celery_config, queue_for_model
from jobs.live_state import LiveState
from jobs.settings import Settings


def test_enqueue_publishes_json_tasks_by_name_on_the_model_queue(redis_url: str) -> None:
    settings = Settings(redis_url=redis_url)
    client = FleetClient(settings)
    sub = client.enqueue(job_id="j1", output="/out", model="/models/m", shard_tokens={0: 5, 1: 5, 2: 5},
                         committed=[1])  # fmt: skip
    client.close()
    queue = queue_for_model("/models/m")
    assert sub.queue == queue and queue.startswith("freight-") and sub.shards_enqueued == 2
    live = LiveState(redis_url)
    raw = live.client.lrange(queue, 0, -1)
    assert len(raw) == 2 and live.client.sismember("freight:queues", queue)
    shards = []
    for item in raw:
        message = json.loads(item)
        assert message["content-type"] == "application/json"
        assert message["headers"]["task"] == TASK_RUN_SHARD and message["headers"]["enqueued_at"] > 0
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        assert args == [] and kwargs["job_id"] == "j1" and kwargs["output"] == "/out"
        shards.append(kwargs["shard"])
    assert sorted(shards) == [0, 2]  # the committed shard is not queued again
    job = live.job("j1")
    assert (job["shards_queued"], job["shards_committed"], job["est_tokens_queued"]) == (2, 1, 10)


def test_only_json_is_accepted_and_acks_are_late() -> None:
    from worker.celery_app import worker_config

    conf = worker_config(Settings(visibility_timeout_s=7200))
    assert conf["accept_content"] == ["json"] and conf["task_serializer"] == "json"
    assert (
        conf["task_acks_late"]
        and conf["task_reject_on_worker_lost"]
        and conf["worker_prefetch_multiplier"] == 1
    )
    assert conf["broker_transport_options"]["visibility_timeout"] == 7200
    assert conf["worker_soft_shutdown_timeout"] > 0
    assert celery_config(Settings())["result_backend"] is None


def test_client_imports_neither_worker_nor_torch() -> None:
    code = ("import sys, jobs.client, jobs.progress, freight_cli.fleet, jobs.fleet_status; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('worker')]; print(bad)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
