"""Whole ticks: real Redis (DB 13) backlog -> policy -> moto Auto Scaling group, in process and
through `freight autoscale --once|--loop`."""

from __future__ import annotations

import json
import re
import time

import boto3
import pytest
from typer.testing import CliRunner

from jobs.autoscale.config import AutoscaleConfig
from jobs.autoscale.controller import build_autoscaler
from jobs.autoscale.decisions import KEPT, DecisionLog
from jobs.autoscale.policy import ScalingLimits
from freight_cli import app
from jobs.settings import get_settings

GROUP = "freight-workers"
REGION = "us-east-1"


def queue_job(rdb, shards: int, tokens_per_shard: int, running: int = 0) -> None:
    rdb.sadd("freight:queues", "freight.tiny")
    rdb.rpush("freight.tiny", *[json.dumps({"shard": i}) for i in range(shards)])
    rdb.hset(
        "freight:job:j1",
        mapping={
            "state": "running",
            "shards_total": shards + running,
            "shards_queued": shards,
            "shards_running": running,
            "est_tokens_queued": shards * tokens_per_shard,
        },
    )


def beat(rdb, worker_id: str, instance_id: str, busy: bool, now: float) -> None:
    data = {
        "busy": busy,
        "instance_id": instance_id,
        "queue": "freight.tiny",
        "tokens_per_second": 500.0,
        "heartbeat": now,
    }
    rdb.hset("freight:workers", worker_id, json.dumps(data))


def scaler(rdb, limits: ScalingLimits, dry_run: bool = False):
    config = AutoscaleConfig(group_name=GROUP, limits=limits, redis_url="redis://unused")
    return build_autoscaler(
        config,
        rdb,
        boto3.client("autoscaling", region_name=REGION),
        boto3.client("cloudwatch", region_name=REGION),
        dry_run=dry_run,
    )


def group_state():
    group = boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=[GROUP]
    )
    return group["AutoScalingGroups"][0]


def test_burst_protect_drain_and_idle_to_zero(rdb, make_group):
    make_group(GROUP, max_size=10)
    limits = ScalingLimits(max_workers=10, scale_in_cooldown_s=300, idle_to_zero_s=600, target_drain_s=1800)
    now = time.time()
    # burst: 6 shards of 300k tokens at the default 500 tok/s -> ceil(1.8e6 / 9e5) = 2 workers
    queue_job(rdb, shards=6, tokens_per_shard=300_000)
    result = scaler(rdb, limits).tick(now)
    assert (result.applied_desired, result.decision.reason) == (2, "scale_out")
    assert group_state()["DesiredCapacity"] == 2
    # both instances take a shard: they are protected from scale-in
    ids = sorted(i["InstanceId"] for i in group_state()["Instances"])
    rdb.delete("freight.tiny")
    rdb.rpush("freight.tiny", "x")  # one shard left in the queue
    rdb.hset("freight:job:j1", mapping={"shards_queued": 1, "shards_running": 2, "est_tokens_queued": 1000})
    for n, instance in enumerate(ids):
        beat(rdb, f"w{n}", instance, True, now + 60)
    result = scaler(rdb, limits).tick(now + 60)
    assert result.applied_desired == 3 and result.protection.protected == tuple(ids)
    # drain: queue empty, one worker still busy; hold for the cooldown, then shrink to the busy one
    rdb.delete("freight.tiny")
    rdb.hset("freight:job:j1", mapping={"shards_queued": 0, "shards_running": 1, "est_tokens_queued": 0})
    beat(rdb, "w0", ids[0], True, now + 120)
    beat(rdb, "w1", ids[1], False, now + 120)
    held = scaler(rdb, limits).tick(now + 120)
    assert (held.applied_desired, held.decision.reason, held.protection.unprotected) == (
        3,
        "hold_cooldown",
        (ids[1],),
    )
    beat(rdb, "w0", ids[0], True, now + 420)  # still busy, heartbeat fresh
    shrunk = scaler(rdb, limits).tick(now + 420)
    assert (shrunk.applied_desired, shrunk.decision.reason) == (1, "scale_in")
    survivors = {i["InstanceId"] for i in group_state()["Instances"]}
    assert survivors == {ids[0]}  # the busy, protected instance stays
    # all done: idle for idle_to_zero_s, then zero
    rdb.hset("freight:job:j1", mapping={"state": "succeeded", "shards_running": 0})
    beat(rdb, "w0", ids[0], False, now + 480)
    assert scaler(rdb, limits).tick(now + 480).decision.reason == "idle_hold"
    assert group_state()["DesiredCapacity"] == 1
    beat(rdb, "w0", ids[0], False, now + 1080)
    final = scaler(rdb, limits).tick(now + 1080)
    assert (final.applied_desired, final.decision.reason) == (0, "idle_to_min")
    assert group_state()["DesiredCapacity"] == 0
    assert rdb.hget(f"freight:autoscaler:{GROUP}", "idle_since") == repr(now + 480)
    # the decision log people read: each change once, newest first, with its reason and time span
    log = DecisionLog(rdb, GROUP).recent()
    assert [(d["desired"], d["reason"]) for d in log] == [
        (0, "idle_to_min"), (1, "idle_hold"), (1, "scale_in"), (3, "hold_cooldown"), (3, "scale_out"),
        (2, "scale_out"),
    ]  # fmt: skip
    assert log[-1]["at"] == log[-1]["until"] == now and log[0]["queued_shards"] == 0


def test_dry_run_changes_nothing(rdb, make_group):
    make_group(GROUP)
    queue_job(rdb, shards=3, tokens_per_shard=0)
    result = scaler(rdb, ScalingLimits(), dry_run=True).tick(time.time())
    assert result.decision.desired == 3 and result.dry_run
    assert group_state()["DesiredCapacity"] == 0
    assert not rdb.exists(f"freight:autoscaler:{GROUP}")
    assert DecisionLog(rdb, GROUP).recent() == []


def test_a_repeated_decision_extends_its_entry(rdb):
    decisions = DecisionLog(rdb, GROUP)
    steady = {"desired": 2, "previous": 2, "reason": "steady", "queued_shards": 4}
    assert decisions.record(steady, 100.0) and not decisions.record(steady, 160.0)
    assert decisions.record({**steady, "desired": 3, "reason": "scale_out"}, 220.0)
    assert [(d["reason"], d["at"], d["until"]) for d in decisions.recent()] == [
        ("scale_out", 220.0, 220.0), ("steady", 100.0, 160.0)]  # fmt: skip
    for t in range(KEPT + 5):
        decisions.record({**steady, "desired": t % 2}, 300.0 + t)
    assert len(decisions.recent()) == KEPT


@pytest.fixture
def cli_env(monkeypatch, redis_url):
    monkeypatch.setenv("FREIGHT_REDIS_URL", redis_url)
    monkeypatch.setenv("FREIGHT_AUTOSCALE_GROUP", GROUP)
    monkeypatch.setenv("FREIGHT_LOG_FORMAT", "json")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_cli_once_scales_the_group(rdb, make_group, cli_env):
    make_group(GROUP)
    queue_job(rdb, shards=4, tokens_per_shard=0)
    result = CliRunner().invoke(app, ["autoscale", "--once", "--max-workers", "3"])
    assert result.exit_code == 0, result.output
    assert "desired 3 (was 0, scale_out): 4 queued shards" in result.output
    assert group_state()["DesiredCapacity"] == 3


def test_cli_loop_runs_ticks_as_json(rdb, make_group, cli_env):
    make_group(GROUP)
    queue_job(rdb, shards=2, tokens_per_shard=0)
    result = CliRunner().invoke(app, ["autoscale", "--loop", "--ticks", "2", "--interval", "0", "--json"])
    assert result.exit_code == 0, result.output
    ticks = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [(t["desired"], t["reason"]) for t in ticks] == [(2, "scale_out"), (2, "steady")]


def test_cli_needs_exactly_one_mode(cli_env):
    result = CliRunner().invoke(app, ["autoscale"])
    assert result.exit_code == 2
    assert "exactly one of --once or --loop" in result.output


def test_cli_says_what_is_missing(monkeypatch, cli_env):
    monkeypatch.delenv("FREIGHT_AUTOSCALE_GROUP")
    result = CliRunner().invoke(app, ["autoscale", "--once"])
    assert result.exit_code == 2
    assert "FREIGHT_AUTOSCALE_GROUP" in result.output


def test_cli_names_a_missing_group(rdb, aws, cli_env):
    result = CliRunner().invoke(app, ["autoscale", "--once", "--group", "no-such-group"])
    assert result.exit_code == 2
    text = " ".join(re.sub("[\u2500-\u257f]", " ", result.output).split())  # rich's box, unwrapped
    assert "Auto Scaling group 'no-such-group' not found" in text
