"""The policy's memory between ticks, kept in Redis so a Lambda cold start or a restarted
`freight autoscale --loop` carries on where the last tick stopped.

Key (written by the autoscaler only): `freight:autoscaler:<group>` HASH with `idle_since`,
`scale_in_pending_since` (unix seconds, or "" for none) and `updated_at`.
"""

from __future__ import annotations

import redis

from jobs.autoscale.policy import ScalerState

STATE_KEY_PREFIX = "freight:autoscaler:"
# Long enough to outlive any tick interval; a forgotten group's key goes away by itself.
STATE_TTL_S = 7 * 24 * 3600


def _optional_float(value: str | bytes | None) -> float | None:
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    try:
        return float(text) if text else None
    except ValueError:
        return None  # unreadable memory is no memory: the policy starts its windows afresh


class RedisStateStore:
    """Loads and saves one group's `ScalerState`."""

    def __init__(self, client: redis.Redis, group_name: str) -> None:
        if not group_name:
            raise ValueError("group_name must be the Auto Scaling group's name, got an empty string")
        self._redis = client
        self.key = f"{STATE_KEY_PREFIX}{group_name}"

    def load(self) -> ScalerState:
        idle, pending = self._redis.hmget(self.key, ["idle_since", "scale_in_pending_since"])
        return ScalerState(idle_since=_optional_float(idle), scale_in_pending_since=_optional_float(pending))

    def save(self, state: ScalerState, now: float) -> None:
        def text(value: float | None) -> str:
            return "" if value is None else repr(value)

        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(
            self.key,
            mapping={
                "idle_since": text(state.idle_since),
                "scale_in_pending_since": text(state.scale_in_pending_since),
                "updated_at": repr(now),
            },
        )
        pipe.expire(self.key, STATE_TTL_S)
        pipe.execute()
