"""Reads the backlog from Redis's live-state keys (docs/ARCHITECTURE.md, "Live state in Redis").

Read exactly as documented, and nothing else:
- `freight:queues`: SET of Celery queue names; a queue's queued shards are the LLEN of its list plus
  the LLEN of kombu's priority sub-queues (`<name>\\x06\\x16<priority>`, priorities 1..9).
- `freight:job:<job_id>`: HASH; the fields read are state, shards_queued, shards_running,
  est_tokens_queued, updated_at and the optional `deadline` (unix seconds, absent when none).
- `freight:workers`: HASH worker_id -> JSON {busy, instance_id, queue, tokens_per_second, heartbeat}.
- kombu's `unacked` HASH: its length, the messages delivered to workers and not yet acked.
Malformed entries are logged and skipped: a bad heartbeat must not stop the fleet from scaling.
"""

from __future__ import annotations

from typing import Any

import redis

from jobs.autoscale.policy import Backlog, JobBacklog
from jobs.leases import UNACKED_KEY
from jobs.log import get_logger
from jobs.progress import JOB_KEY_PREFIX, QUEUES_KEY, WORKERS_KEY, WorkerBeat

# kombu's Redis transport keeps priority p > 0 of queue Q in the list Q + "\x06\x16" + str(p).
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITIES = range(1, 10)
JOB_FIELDS = ("state", "shards_queued", "shards_running", "est_tokens_queued", "updated_at", "deadline")

log = get_logger(__name__)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _number(value: Any, *, key: str, name: str) -> float:
    """A hash field as a float; a missing field is 0, a malformed one is logged and taken as 0."""
    if value is None or value == b"" or value == "":
        return 0.0
    try:
        return float(_text(value))
    except ValueError:
        log.warning("autoscale.bad_field", key=key, field=name, value=_text(value))
        return 0.0


def queue_lists(queue: str) -> list[str]:
    """The Redis lists that hold a Celery queue's messages: the queue and its priority sub-queues."""
    return [queue] + [f"{queue}{PRIORITY_SEPARATOR}{p}" for p in PRIORITIES]


def parse_heartbeat(worker_id: str, raw: str | bytes) -> WorkerBeat | None:
    """One `freight:workers` entry, or None (logged) when it is not the documented JSON."""
    try:
        return WorkerBeat.from_json(worker_id, raw)
    except ValueError as exc:
        log.warning("autoscale.bad_heartbeat", worker_id=worker_id, error=str(exc))
        return None


class RedisBacklogReader:
    """Takes one consistent-enough snapshot of the backlog per `read()` (a few pipelined round trips)."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def queued_shards(self) -> int:
        queues = sorted(_text(q) for q in self._redis.smembers(QUEUES_KEY))
        if not queues:
            return 0
        pipe = self._redis.pipeline(transaction=False)
        for queue in queues:
            for name in queue_lists(queue):
                pipe.llen(name)
        return int(sum(pipe.execute()))

    def jobs(self) -> tuple[JobBacklog, ...]:
        keys = []
        for key in self._redis.scan_iter(match=f"{JOB_KEY_PREFIX}*", count=500):
            key = _text(key)
            if ":" not in key[len(JOB_KEY_PREFIX) :]:  # only freight:job:<id>, never deeper keys
                keys.append(key)
        if not keys:
            return ()
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, JOB_FIELDS)
        jobs = []
        for key, values in zip(keys, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(values, Exception):  # e.g. WRONGTYPE: not a job hash
                log.warning("autoscale.bad_job_key", key=key, error=str(values))
                continue
            state, queued, running, tokens, updated_at, deadline = values
            if state is None and queued is None and running is None:
                continue  # vanished between SCAN and HMGET
            deadline_s = _number(deadline, key=key, name="deadline")
            updated_s = _number(updated_at, key=key, name="updated_at")
            jobs.append(
                JobBacklog(
                    job_id=key[len(JOB_KEY_PREFIX) :],
                    state=_text(state) if state is not None else "",
                    shards_queued=max(int(_number(queued, key=key, name="shards_queued")), 0),
                    shards_running=max(int(_number(running, key=key, name="shards_running")), 0),
                    est_tokens_queued=max(_number(tokens, key=key, name="est_tokens_queued"), 0.0),
                    deadline=deadline_s if deadline_s > 0 else None,
                    updated_at=updated_s if updated_s > 0 else None,
                )
            )
        return tuple(sorted(jobs, key=lambda j: j.job_id))

    def workers(self) -> tuple[WorkerBeat, ...]:
        beats = []
        for worker_id, raw in sorted(self._redis.hgetall(WORKERS_KEY).items()):
            beat = parse_heartbeat(_text(worker_id), raw)
            if beat is not None:
                beats.append(beat)
        return tuple(beats)

    def unacked_shards(self) -> int:
        """Messages delivered and not yet acked (kombu's `unacked` hash): running shards, or those of a
        vanished worker until the reaper restores them."""
        return int(self._redis.hlen(UNACKED_KEY))

    def read(self) -> Backlog:
        return Backlog(queued_shards=self.queued_shards(), jobs=self.jobs(), workers=self.workers(),
                       unacked_shards=self.unacked_shards())  # fmt: skip
