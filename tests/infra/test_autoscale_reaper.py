"""The autoscaler tick puts a vanished worker's shard back on its queue (lease reaper) and never
scales to zero under a delivered, unacked shard: real Redis (DB 13), a real kombu delivery, moto."""

from __future__ import annotations

import json
import time

import boto3
from kombu import Connection

from jobs.autoscale.backlog import RedisBacklogReader
from jobs.autoscale.config import AutoscaleConfig
from jobs.autoscale.controller import build_autoscaler
from jobs.autoscale.policy import ScalingLimits
from jobs.client import FleetClient, queue_for_model
from jobs.leases import UNACKED_KEY
from jobs.progress import LEASES_KEY, NODES_KEY, NodeBeat
from jobs.settings import Settings

GROUP = "freight-workers"
REGION = "us-east-1"


def _group() -> dict:
    client = boto3.client("autoscaling", region_name=REGION)
    return client.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]


def test_tick_restores_a_vanished_workers_shard_and_counts_unacked_as_demand(redis_url, rdb, make_group):
    make_group(GROUP, max_size=4, desired=0)
    queue = queue_for_model("/models/m")
    client = FleetClient(Settings(redis_url=redis_url))
    client.enqueue(job_id="00000000000000aa", output="/out", model="/models/m", shard_tokens={0: 100})
    client.close()
    config = AutoscaleConfig(group_name=GROUP, limits=ScalingLimits(max_workers=4), redis_url=redis_url)
    scaler = build_autoscaler(config, rdb, boto3.client("autoscaling", region_name=REGION),
                              boto3.client("cloudwatch", region_name=REGION))  # fmt: skip
    # a worker takes the shard (kombu moves it to `unacked`) and holds it: the queue lists are empty
    with Connection(redis_url) as conn:
        message = conn.SimpleQueue(queue, no_ack=False).get(timeout=5)
        tag = message.delivery_tag
        assert rdb.hexists(UNACKED_KEY, tag) and rdb.llen(queue) == 0
        now = time.time()
        node = NodeBeat("w@host/1-aa", "w@host", now, (queue,))
        rdb.hset(NODES_KEY, node.node_id, node.to_json())
        rdb.hset(LEASES_KEY, tag, node.node_id)
        backlog = RedisBacklogReader(rdb).read()
        assert (backlog.queued_shards, backlog.unacked_shards) == (0, 1)
        first = scaler.tick(now)  # its node beats: the shard stays where it is, and it is demand
        assert first.decision.demand == 1 and first.applied_desired == 1 and rdb.hexists(UNACKED_KEY, tag)
        # the node vanished a minute ago: the next tick puts the shard back on its queue first
        rdb.hset(NODES_KEY, node.node_id, NodeBeat(node.node_id, "w@host", now - 61, (queue,)).to_json())
        second = scaler.tick(time.time())
        assert not rdb.hexists(UNACKED_KEY, tag) and not rdb.hexists(LEASES_KEY, tag)
        assert rdb.llen(queue) == 1 and second.backlog.queued_shards == 1 and second.applied_desired == 1
        restored = json.loads(rdb.lindex(queue, 0))
        assert restored["headers"]["redelivered"] is True and restored["headers"]["id"] == message.headers["id"]
        assert rdb.hget("freight:shards:00000000000000aa", "0") == "queued"
        # the attempt was lost with its worker: counted as a node loss, not as a crash of the shard
        assert rdb.hget("freight:nodelost:00000000000000aa", "0") == "1"
    assert _group()["DesiredCapacity"] == 1
