"""Backlog autoscaler: queued shards and their estimated tokens -> desired worker count -> the
Auto Scaling group (docs/ARCHITECTURE.md, "Fleet and autoscaling").

policy (pure) · backlog (Redis reader) · state (policy memory in Redis) · aws (group adapter and
CloudWatch metrics) · controller (one tick) · config (environment) · lambda_handler (AWS Lambda).
"""

from jobs.autoscale.policy import (
    Backlog,
    Decision,
    JobBacklog,
    ScalerState,
    ScalingLimits,
    decide,
    demand,
)

__all__ = [
    "Backlog",
    "Decision",
    "JobBacklog",
    "ScalerState",
    "ScalingLimits",
    "decide",
    "demand",
]
