"""Applies a decision to an EC2 Auto Scaling group and publishes the backlog to CloudWatch.

boto3 clients are passed in (the Lambda, the CLI and the tests each make their own). Calls used, and
so the only ones the autoscaler's IAM role allows: autoscaling:DescribeAutoScalingGroups,
autoscaling:SetDesiredCapacity, autoscaling:SetInstanceProtection, cloudwatch:PutMetricData.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jobs.autoscale.policy import Backlog, Decision
from jobs.log import get_logger

# SetInstanceProtection takes at most 50 instance ids per call.
PROTECTION_BATCH = 50
# Instances that can hold a worker: launching ones are not protectable yet, leaving ones no longer.
ACTIVE_STATES = frozenset({"InService"})

log = get_logger(__name__)


@dataclass(frozen=True)
class GroupState:
    """The part of DescribeAutoScalingGroups the autoscaler needs."""

    name: str
    desired: int
    min_size: int
    max_size: int
    in_service: frozenset[str]  # instance ids in service
    protected: frozenset[str]  # of those, the ones protected from scale-in


@dataclass(frozen=True)
class ProtectionChange:
    protected: tuple[str, ...]
    unprotected: tuple[str, ...]


def _batches(ids: Iterable[str]) -> Iterable[list[str]]:
    ordered = sorted(ids)
    for start in range(0, len(ordered), PROTECTION_BATCH):
        yield ordered[start : start + PROTECTION_BATCH]


class AutoScalingGroupAdapter:
    """One Auto Scaling group, seen through boto3 `autoscaling` and `cloudwatch` clients."""

    def __init__(
        self, group_name: str, autoscaling: Any, cloudwatch: Any, namespace: str = "Freight"
    ) -> None:
        if not group_name:
            raise ValueError("group_name must be the Auto Scaling group's name, got an empty string")
        self.group_name = group_name
        self._asg = autoscaling
        self._cw = cloudwatch
        self.namespace = namespace

    def describe(self) -> GroupState:
        groups = self._asg.describe_auto_scaling_groups(AutoScalingGroupNames=[self.group_name])[
            "AutoScalingGroups"
        ]
        if not groups:
            raise ValueError(
                f"Auto Scaling group {self.group_name!r} not found in this account and region: "
                "check FREIGHT_AUTOSCALE_GROUP (terraform output asg_name) and AWS_REGION"
            )
        group = groups[0]
        instances = [i for i in group.get("Instances", []) if i.get("LifecycleState") in ACTIVE_STATES]
        return GroupState(
            name=self.group_name,
            desired=int(group["DesiredCapacity"]),
            min_size=int(group["MinSize"]),
            max_size=int(group["MaxSize"]),
            in_service=frozenset(i["InstanceId"] for i in instances),
            protected=frozenset(i["InstanceId"] for i in instances if i.get("ProtectedFromScaleIn")),
        )

    def set_desired(self, desired: int, group: GroupState) -> int:
        """Set the group's desired capacity (within its own min/max); returns what was set."""
        bounded = min(max(desired, group.min_size), group.max_size)
        if bounded != desired:
            log.warning(
                "autoscale.desired_outside_group", desired=desired, min=group.min_size, max=group.max_size
            )
        if bounded != group.desired:
            # HonorCooldown=False: the policy owns pacing (its scale-in cooldown), not the group.
            self._asg.set_desired_capacity(
                AutoScalingGroupName=self.group_name, DesiredCapacity=bounded, HonorCooldown=False
            )
        return bounded

    def protect_busy(self, busy_instance_ids: Iterable[str], group: GroupState) -> ProtectionChange:
        """Protect the instances whose worker is busy from scale-in; release all others.

        Only the group's in-service instances are touched: a heartbeat from an instance outside the
        group (a laptop, another fleet) is ignored.
        """
        want = frozenset(busy_instance_ids) & group.in_service
        to_protect = want - group.protected
        to_release = group.protected - want
        for ids, flag in ((to_protect, True), (to_release, False)):
            for batch in _batches(ids):
                self._asg.set_instance_protection(
                    AutoScalingGroupName=self.group_name, InstanceIds=batch, ProtectedFromScaleIn=flag
                )
        return ProtectionChange(protected=tuple(sorted(to_protect)), unprotected=tuple(sorted(to_release)))

    def publish(self, backlog: Backlog, decision: Decision, now: float) -> None:
        """Backlog and fleet figures as CloudWatch metrics, one data point each, per group."""
        dims = [{"Name": "AutoScalingGroupName", "Value": self.group_name}]
        figures = {
            "QueuedShards": (backlog.queued_shards, "Count"),
            "EstimatedTokensQueued": (backlog.est_tokens_queued, "Count"),
            "RunningShards": (backlog.running_shards(now), "Count"),
            "LiveWorkers": (len(backlog.live_workers(now)), "Count"),
            "BusyWorkers": (len(backlog.busy_workers(now)), "Count"),
            "DemandWorkers": (decision.demand, "Count"),
            "DesiredWorkers": (decision.desired, "Count"),
        }
        self._cw.put_metric_data(
            Namespace=self.namespace,
            MetricData=[
                {"MetricName": name, "Dimensions": dims, "Value": float(value), "Unit": unit}
                for name, (value, unit) in figures.items()
            ],
        )
