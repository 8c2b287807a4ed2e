"""The autoscaler's recent decisions, kept in Redis for people to read (the dashboard's fleet page).

Key (written by the autoscaler only): `freight:decisions:<group>` LIST of JSON objects, newest
first, at most KEPT: a tick's summary (TickResult.as_dict: desired, previous, demand, reason, the
backlog it saw) plus `at` and `until` (unix seconds: the first and the latest tick that decided
it). A tick that decides what the newest entry says (same desired count, same reason) only moves
that entry's `until`, so the list holds changes, not one line a minute.
"""

from __future__ import annotations

import json
from typing import Any

import redis

DECISIONS_KEY_PREFIX = "freight:decisions:"
KEPT = 100
TTL_S = 7 * 24 * 3600

# KEYS: the list. ARGV: the new entry's JSON, its desired count, its reason, now, KEPT, TTL.
_RECORD = """
local head = redis.call('LINDEX', KEYS[1], 0)
if head then
  local last = cjson.decode(head)
  if tostring(last['desired']) == ARGV[2] and last['reason'] == ARGV[3] then
    last['until'] = tonumber(ARGV[4])
    redis.call('LSET', KEYS[1], 0, cjson.encode(last))
    redis.call('EXPIRE', KEYS[1], tonumber(ARGV[6]))
    return 0
  end
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[5]) - 1)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[6]))
return 1
"""


class DecisionLog:
    """One Auto Scaling group's decision list."""

    def __init__(self, client: redis.Redis, group_name: str) -> None:
        if not group_name:
            raise ValueError("group_name must be the Auto Scaling group's name, got an empty string")
        self.key = f"{DECISIONS_KEY_PREFIX}{group_name}"
        self._redis = client
        self._record = client.register_script(_RECORD)

    def record(self, summary: dict[str, Any], now: float) -> bool:
        """Add the tick's `summary` (or extend the newest entry when it decided the same); True when
        a new entry was added."""
        entry = {**summary, "at": now, "until": now}
        added = self._record(keys=[self.key], args=[json.dumps(entry), int(summary["desired"]), str(summary["reason"]),
                                                    repr(now), KEPT, TTL_S])  # fmt: skip
        return bool(added)

    def recent(self, limit: int = KEPT) -> list[dict[str, Any]]:
        """The newest `limit` entries, newest first (malformed ones skipped)."""
        out = []
        for raw in self._redis.lrange(self.key, 0, limit - 1):
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
        return out


def groups(client: redis.Redis) -> list[str]:
    """The groups that have a decision list."""
    names = (k.decode() if isinstance(k, bytes) else str(k) for k in client.scan_iter(match=f"{DECISIONS_KEY_PREFIX}*"))
    return sorted(n[len(DECISIONS_KEY_PREFIX) :] for n in names)
