"""The Auto Scaling adapter against moto's Auto Scaling and CloudWatch APIs."""

from __future__ import annotations

import datetime as dt

import boto3
import pytest

from jobs.autoscale.aws import AutoScalingGroupAdapter
from jobs.autoscale.policy import Backlog, Decision, JobBacklog
from jobs.progress import WorkerBeat

NOW = 1_800_000_000.0
REGION = "us-east-1"


def adapter(name: str = "freight-workers") -> AutoScalingGroupAdapter:
    return AutoScalingGroupAdapter(
        name, boto3.client("autoscaling", region_name=REGION), boto3.client("cloudwatch", region_name=REGION)
    )


def test_describe_and_set_desired(make_group):
    make_group(max_size=6)
    group = adapter().describe()
    assert (group.desired, group.min_size, group.max_size, group.in_service) == (0, 0, 6, frozenset())
    assert adapter().set_desired(4, group) == 4
    group = adapter().describe()
    assert group.desired == 4
    assert len(group.in_service) == 4  # moto launches the instances
    # the group's own max bounds what is set
    assert adapter().set_desired(50, group) == 6
    assert adapter().describe().desired == 6


def test_unknown_group_says_what_to_check(aws):
    with pytest.raises(ValueError, match="FREIGHT_AUTOSCALE_GROUP"):
        adapter("no-such-group").describe()


def test_protects_busy_instances_and_releases_idle_ones(make_group):
    make_group(desired=5)
    group = adapter().describe()
    ids = sorted(group.in_service)
    change = adapter().protect_busy(ids[:3] + ["i-not-in-group"], group)
    assert change.protected == tuple(ids[:3]) and change.unprotected == ()
    group = adapter().describe()
    assert group.protected == frozenset(ids[:3])
    # one busy worker became idle, another idle one became busy
    change = adapter().protect_busy([ids[0], ids[1], ids[4]], group)
    assert (change.protected, change.unprotected) == ((ids[4],), (ids[2],))
    described = boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_instances(
        InstanceIds=ids
    )
    flags = {i["InstanceId"]: i["ProtectedFromScaleIn"] for i in described["AutoScalingInstances"]}
    assert flags == {ids[0]: True, ids[1]: True, ids[2]: False, ids[3]: False, ids[4]: True}


def test_scale_in_keeps_protected_busy_instances(make_group):
    """After protecting the busy ones, shrinking the group terminates only idle instances."""
    make_group(desired=4)
    group = adapter().describe()
    busy = sorted(group.in_service)[:2]
    adapter().protect_busy(busy, group)
    adapter().set_desired(2, adapter().describe())
    assert adapter().describe().in_service == frozenset(busy)


def test_publishes_backlog_metrics(make_group):
    make_group()
    backlog = Backlog(
        7,
        (JobBacklog("j", "running", 7, 2, 70000.0),),
        (WorkerBeat("w", True, "i-1", "q", 100.0, NOW),),
    )
    adapter().publish(backlog, Decision(desired=3, current=1, demand=3, reason="scale_out"), NOW)
    cw = boto3.client("cloudwatch", region_name=REGION)
    names = {m["MetricName"] for m in cw.list_metrics(Namespace="Freight")["Metrics"]}
    assert {
        "QueuedShards",
        "EstimatedTokensQueued",
        "RunningShards",
        "BusyWorkers",
        "DesiredWorkers",
    } <= names
    stats = cw.get_metric_statistics(
        Namespace="Freight",
        MetricName="QueuedShards",
        Dimensions=[{"Name": "AutoScalingGroupName", "Value": "freight-workers"}],
        StartTime=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5),
        EndTime=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5),
        Period=60,
        Statistics=["Maximum"],
    )
    assert [p["Maximum"] for p in stats["Datapoints"]] == [7.0]
