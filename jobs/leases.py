"""Leases on delivered shard messages, and the reaper that puts a vanished worker's messages back.

How kombu's Redis transport (5.7) keeps a delivered, not yet acknowledged message:
- `unacked`        HASH delivery tag -> JSON [message payload, exchange, routing key]
- `unacked_index`  ZSET delivery tag -> unix time of delivery (workers renew it: worker/node.py)
An ack removes both entries; kombu itself restores an entry whose score is older than the
visibility timeout (a backstop: FREIGHT_VISIBILITY_TIMEOUT_S), pushing the payload back onto its
queue list (`<queue>` or `<queue>\\x06\\x16<priority>`) with `redelivered` set, in one transaction.

freight adds which worker main process holds each message (`freight:leases`, tag -> node id) and
that process's beat (`freight:nodes`). `reap_stale_leases` restores every unacked message whose
node has not beaten for WORKER_GONE_AFTER_S (or, never leased, whose delivery is that old), the
way kombu does, with a compare-and-move Lua script per message: the move happens only if the entry
is still exactly what was read, so any number of reapers (every worker, the autoscaler tick) may
run at once and each message comes back once. Restored shards go back to "queued" in the job's
live state.

Imports redis and jobs.progress / jobs.live_state only: the autoscaler Lambda carries this module.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from jobs.live_state import LiveState
from jobs.log import get_logger
from jobs.progress import LEASES_KEY, NODES_KEY, WORKER_GONE_AFTER_S, NodeBeat

log = get_logger(__name__)

UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"
BINDING_PREFIX = "_kombu.binding."
PRIORITY_SEPARATOR = "\x06\x16"
MAX_PRIORITY = 9
NODE_FORGET_S = 24 * 3600.0  # a node entry this old is deleted (its process is long gone)
TASK_RUN_SHARD = "freight.run_shard"  # jobs.client's name, repeated: the Lambda does not carry celery

# KEYS: unacked, unacked_index, leases, target list. ARGV: tag, the entry as read, payload to push.
_RESTORE = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('RPUSH', KEYS[4], ARGV[3])
return 1
"""


@dataclass(frozen=True)
class TaskMessage:
    """What freight needs from one Celery message (protocol 2, JSON): the task name and its kwargs."""

    task: str
    kwargs: dict[str, Any]

    @property
    def shard(self) -> tuple[str, int] | None:
        """(job_id, shard) of a freight.run_shard message, else None."""
        if self.task != TASK_RUN_SHARD:
            return None
        try:
            return str(self.kwargs["job_id"]), int(self.kwargs["shard"])
        except (KeyError, TypeError, ValueError):
            return None


def decode_task(payload: dict[str, Any]) -> TaskMessage | None:
    """The task of a kombu message payload (as stored in a queue list or `unacked`); None if not one."""
    try:
        body = payload["body"]
        if payload.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)
        kwargs = args[1] if isinstance(args, list) and len(args) >= 2 else {}
        return TaskMessage(str(payload["headers"]["task"]), dict(kwargs))
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def queue_list(queue: str, priority: int) -> str:
    """The Redis list of `queue` holding messages of `priority` (kombu: 0 is the queue itself)."""
    priority = max(0, min(int(priority), MAX_PRIORITY))
    return queue if priority == 0 else f"{queue}{PRIORITY_SEPARATOR}{priority}"


@dataclass(frozen=True)
class RestoredMessage:
    tag: str
    queue: str
    task: str
    job_id: str | None
    shard: int | None
    holder: str | None  # the node id that held it (None: never leased)
    stale_s: float  # seconds since the holder's last beat (or since delivery)


def beat_node(client: redis.Redis, beat: NodeBeat) -> None:
    client.hset(NODES_KEY, beat.node_id, beat.to_json())


def forget_node(client: redis.Redis, node_id: str) -> None:
    client.hdel(NODES_KEY, node_id)


def renew_leases(client: redis.Redis, node_id: str, tags: Iterable[str], now: float) -> int:
    """Refresh the delivery time of the messages `node_id` holds and record it as their holder.

    XX: only entries kombu still has are refreshed (acked or restored ones stay gone). Returns how
    many were refreshed."""
    tags = list(tags)
    if not tags:
        return 0
    pipe = client.pipeline(transaction=False)
    pipe.zadd(UNACKED_INDEX_KEY, dict.fromkeys(tags, now), xx=True, ch=True)
    pipe.hset(LEASES_KEY, mapping=dict.fromkeys(tags, node_id))
    changed, _ = pipe.execute()
    return int(changed or 0)


def live_nodes(client: redis.Redis, now: float, alive_within: float = WORKER_GONE_AFTER_S) -> list[NodeBeat]:
    """Worker main processes whose beat is younger than `alive_within` seconds."""
    return [n for n in _nodes(client).values() if n.is_live(now, alive_within)]


def _nodes(client: redis.Redis) -> dict[str, NodeBeat]:
    nodes = {}
    for node_id, raw in client.hgetall(NODES_KEY).items():
        node_id = _text(node_id)
        try:
            nodes[node_id] = NodeBeat.from_json(node_id, raw)
        except ValueError as exc:
            log.warning("lease.bad_node_beat", node=node_id, error=str(exc))
    return nodes


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class LeaseReaper:
    """Restores the unacked messages of vanished workers. Safe to run anywhere, any number of times."""

    def __init__(self, client: redis.Redis, *, stale_after_s: float = WORKER_GONE_AFTER_S) -> None:
        self.client = client
        self.stale_after_s = stale_after_s
        self._restore = client.register_script(_RESTORE)
        self._live = LiveState.from_client(client)

    def reap(self, now: float) -> list[RestoredMessage]:
        """One pass over `unacked`; returns the messages this call put back on their queues."""
        entries = {_text(t): _text(raw) for t, raw in self.client.hgetall(UNACKED_KEY).items()}
        holders = {_text(t): _text(n) for t, n in self.client.hgetall(LEASES_KEY).items()}
        nodes = _nodes(self.client)
        self._forget(holders, entries, nodes, now)
        if not entries:
            return []
        delivered = {_text(t): float(s) for t, s in self.client.zrange(UNACKED_INDEX_KEY, 0, -1, withscores=True)}
        restored = []
        for tag, raw in entries.items():
            holder = holders.get(tag)
            if holder is not None:
                node = nodes.get(holder)
                last = node.heartbeat if node is not None else 0.0
            else:
                last = delivered.get(tag, 0.0)
            if now - last <= self.stale_after_s:
                continue
            done = self._restore_one(tag, raw, holder, now - last)
            if done is not None:
                restored.append(done)
        return restored

    def _restore_one(self, tag: str, raw: str, holder: str | None, stale_s: float) -> RestoredMessage | None:
        try:
            payload, exchange, routing_key = json.loads(raw)
            payload.setdefault("headers", {})["redelivered"] = True
            payload.setdefault("properties", {}).setdefault("delivery_info", {})["redelivered"] = True
            priority = int(payload["properties"].get("priority") or 0)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.error("lease.unreadable_message", tag=tag, error=str(exc))
            return None
        queue = self._lookup(str(exchange or ""), str(routing_key or ""))
        keys = [UNACKED_KEY, UNACKED_INDEX_KEY, LEASES_KEY, queue_list(queue, priority)]
        if not int(self._restore(keys=keys, args=[tag, raw, json.dumps(payload)])):
            return None  # acked, or restored by someone else, since it was read
        task = decode_task(payload)
        job_shard = task.shard if task is not None else None
        if job_shard is not None:
            try:
                self._live.transition(job_shard[0], job_shard[1], "queued")
                # its attempt died with its worker (a lost machine), not because of the shard: the
                # next attempt counts it against the node-loss budget, not as a crash (worker/outcomes)
                self._live.count_node_loss(job_shard[0], job_shard[1])
            except redis.RedisError as exc:  # the message is back; the count catches up on its next start
                log.warning("lease.state_not_updated", error=str(exc))
        restored = RestoredMessage(
            tag=tag, queue=queue, task=task.task if task else "", job_id=job_shard[0] if job_shard else None,
            shard=job_shard[1] if job_shard else None, holder=holder, stale_s=round(stale_s, 3),
        )  # fmt: skip
        log.warning("lease.restored", **restored.__dict__)
        return restored

    def _lookup(self, exchange: str, routing_key: str) -> str:
        """The queue a message goes back to, as kombu's direct-exchange lookup finds it; freight's
        queues are bound with routing key = queue name, which is the fallback."""
        if exchange:
            for entry in self.client.smembers(BINDING_PREFIX + exchange):
                parts = _text(entry).split(PRIORITY_SEPARATOR)
                if len(parts) == 3 and parts[0] == routing_key:
                    return parts[2]
        return routing_key

    def _forget(self, holders: dict[str, str], entries: dict[str, str], nodes: dict[str, NodeBeat],
                now: float) -> None:  # fmt: skip
        """Drop leases of messages no longer unacked (acked or restored), and long-dead node entries."""
        gone = [tag for tag in holders if tag not in entries]
        if gone:
            self.client.hdel(LEASES_KEY, *gone)
        old = [n.node_id for n in nodes.values() if now - n.heartbeat > NODE_FORGET_S]
        if old:
            self.client.hdel(NODES_KEY, *old)
