"""One autoscaler tick: upkeep (the lease reaper; in the CLI also the storage reconciler), read the
backlog, decide, protect busy instances, set the capacity, publish.

The same tick runs in the Lambda (every minute on an EventBridge schedule) and in
`freight autoscale --once|--loop`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from jobs.autoscale.aws import AutoScalingGroupAdapter, ProtectionChange
from jobs.autoscale.backlog import RedisBacklogReader
from jobs.autoscale.config import AutoscaleConfig
from jobs.autoscale.decisions import DecisionLog
from jobs.autoscale.policy import Backlog, Decision, ScalerState, ScalingLimits, decide
from jobs.autoscale.state import RedisStateStore
from jobs.leases import LeaseReaper
from jobs.log import get_logger

log = get_logger(__name__)


class BacklogSource(Protocol):
    def read(self) -> Backlog: ...


class StateStore(Protocol):
    def load(self) -> ScalerState: ...

    def save(self, state: ScalerState, now: float) -> None: ...


@dataclass(frozen=True)
class TickResult:
    decision: Decision
    backlog: Backlog
    applied_desired: int  # what the group was set to (the decision bounded by the group's min/max)
    protection: ProtectionChange
    dry_run: bool

    def as_dict(self, now: float) -> dict[str, Any]:
        """A JSON-ready summary (the Lambda's return value, the CLI's --json line)."""
        return {
            "desired": self.applied_desired,
            "previous": self.decision.current,
            "demand": self.decision.demand,
            "reason": self.decision.reason,
            "queued_shards": self.backlog.queued_shards,
            "est_tokens_queued": self.backlog.est_tokens_queued,
            "running_shards": self.backlog.running_shards(now),
            "live_workers": len(self.backlog.live_workers(now)),
            "busy_workers": len(self.backlog.busy_workers(now)),
            "protected": list(self.protection.protected),
            "unprotected": list(self.protection.unprotected),
            "dry_run": self.dry_run,
        }


class Autoscaler:
    """Wires a backlog source, the policy, its state and one Auto Scaling group together."""

    def __init__(
        self,
        source: BacklogSource,
        group: AutoScalingGroupAdapter,
        state: StateStore,
        limits: ScalingLimits,
        *,
        dry_run: bool = False,
        upkeep: Sequence[Callable[[float], object]] = (),
        decisions: DecisionLog | None = None,
    ) -> None:
        self._source = source
        self._decisions = decisions
        self._group = group
        self._state = state
        self.limits = limits
        self.dry_run = dry_run
        self._upkeep = tuple(upkeep)

    def tick(self, now: float) -> TickResult:
        if not self.dry_run:
            # first, put back what vanished workers held (jobs/leases.py) and, where storage can be
            # read, re-queue shards Redis lost (jobs/reconcile.py): the backlog below then counts them
            for step in self._upkeep:
                try:
                    step(now)
                except Exception as exc:  # upkeep must not stop the fleet from scaling
                    log.error("autoscale.upkeep_failed", step=getattr(step, "__qualname__", str(step)),
                              error=str(exc))  # fmt: skip
        backlog = self._source.read()
        group = self._group.describe()
        decision = decide(backlog, group.desired, self._state.load(), self.limits, now)
        busy_ids = [w.instance_id for w in backlog.busy_workers(now) if w.instance_id]
        if self.dry_run:
            result = TickResult(decision, backlog, decision.desired, ProtectionChange((), ()), True)
        else:
            # protect before shrinking, so the group's scale-in picks idle instances only
            protection = self._group.protect_busy(busy_ids, group)
            applied = self._group.set_desired(decision.desired, group)
            self._state.save(decision.state, now)
            self._group.publish(backlog, decision, now)
            result = TickResult(decision, backlog, applied, protection, False)
            self._record(result, now)
        log.info("autoscale.tick", group=group.name, **result.as_dict(now))
        return result

    def _record(self, result: TickResult, now: float) -> None:
        """Add the decision to the log people read; the log failing must not stop the scaling."""
        if self._decisions is None:
            return
        try:
            self._decisions.record(result.as_dict(now), now)
        except redis.RedisError as exc:
            log.warning("autoscale.decision_log_failed", error=str(exc))


def build_autoscaler(
    config: AutoscaleConfig,
    redis_client: redis.Redis,
    autoscaling: Any,
    cloudwatch: Any,
    *,
    dry_run: bool = False,
    upkeep: Sequence[Callable[[float], object]] = (),
) -> Autoscaler:
    """The autoscaler for `config`, over the given Redis client and boto3 clients.

    Every tick first runs the lease reaper, then `upkeep` (the CLI adds the storage reconciler)."""
    return Autoscaler(
        RedisBacklogReader(redis_client),
        AutoScalingGroupAdapter(config.group_name, autoscaling, cloudwatch, config.namespace),
        RedisStateStore(redis_client, config.group_name),
        config.limits,
        dry_run=dry_run,
        upkeep=(LeaseReaper(redis_client).reap, *upkeep),
        decisions=DecisionLog(redis_client, config.group_name),
    )
