"""Workers serve whatever arrives: a worker started without --model/--queues consumes the freight
queues that have work, adds a queue's consumer when a job creates it and drops it once it is idle,
with no restart.

`QueueSync` is a Celery consumer bootstep: every QUEUE_SYNC_S, inside the consumer's event loop, it
reads `freight:queues`, the length of each queue (its priority lists included), the models this
node's pool processes have loaded (their heartbeats) and the queues other live nodes consume
(`freight:nodes`), picks the queues to consume (`choose_queues`) and calls the consumer's
`add_task_queue` / `cancel_task_queue` (what Celery's add_consumer / cancel_consumer remote
controls run). The placeholder queue the worker starts on (`IDLE_QUEUE`) is never dropped, so the
consumer always has one.

The choice keeps weights on the GPU: while the queue of a model this node has loaded has work, the
node consumes that queue only (switching models per shard would reload weights per shard). It
adopts a queue nobody consumes only if other nodes serve its own model too (and one node at a
time: `freight:adopt:<queue>`, 60 s). With its own queue empty it consumes every queue with work,
and keeps its model's queue so that model's next job finds a warm engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import redis
from celery import bootsteps

from jobs.client import queue_for_model
from jobs.leases import live_nodes, queue_list
from jobs.log import get_logger
from jobs.progress import QUEUES_KEY, WORKERS_KEY, WorkerBeat

log = get_logger(__name__)

QUEUE_SYNC_S = 2.0
IDLE_QUEUE = "freight-default"  # celery_config's task_default_queue: no freight task goes there
ADOPT_S = 60


def choose_queues(
    sizes: Mapping[str, int],
    loaded: set[str],
    consumers_elsewhere: Mapping[str, int],
    may_adopt: Callable[[str], bool],
) -> set[str]:
    """The queues a serve-all node consumes now.

    sizes: queued messages per known freight queue; loaded: the queues of the models this node has
    loaded; consumers_elsewhere: per queue, how many other live nodes consume it; may_adopt(q): takes
    the one-node-at-a-time right to switch to a queue nobody consumes.
    """
    busy = {q for q, n in sizes.items() if n > 0}
    starving = sorted(q for q in busy - loaded if consumers_elsewhere.get(q, 0) == 0)
    mine = loaded & busy
    if mine:
        shared = all(consumers_elsewhere.get(q, 0) > 0 for q in mine)
        for queue in starving if shared else ():
            if may_adopt(queue):
                return {queue}
        return mine
    return busy | loaded


class QueueSync(bootsteps.StartStopStep):
    """Consumer bootstep: keeps a serve-all worker's queues in step with the jobs (module docstring)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.tref: Any = None
        self.client: redis.Redis | None = None
        super().__init__(c, **kwargs)

    def start(self, c: Any) -> None:
        from jobs.settings import get_settings
        from worker.runtime import node_state

        node = node_state()
        if node is None:
            return
        if not node.serve_all:
            node.queues = tuple(sorted(q.name for q in c.task_consumer.queues))
            return
        self.client = redis.Redis.from_url(
            get_settings().redis_url, decode_responses=True, socket_timeout=2, socket_connect_timeout=2
        )
        self.sync(c)
        self.tref = c.timer.call_repeatedly(QUEUE_SYNC_S, self.sync, (c,), priority=10)

    def stop(self, c: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None
        if self.client is not None:
            self.client.close()
            self.client = None

    def sync(self, c: Any) -> None:
        from worker.runtime import node_state

        node = node_state()
        if node is None or self.client is None or c.task_consumer is None:
            return
        try:
            want = self._want(self.client, node.node_id)
        except redis.RedisError as exc:  # Redis away: keep what is consumed now
            log.warning("queue_sync_failed", error=str(exc))
            return
        have = {q.name for q in c.task_consumer.queues}
        added = sorted(want - have - {IDLE_QUEUE})
        dropped = sorted(have - want - {IDLE_QUEUE})
        for queue in added:
            c.add_task_queue(queue, exchange=queue, exchange_type="direct", routing_key=queue)
        for queue in dropped:
            c.cancel_task_queue(queue)
        node.queues = tuple(sorted((have | want) - set(dropped) - {IDLE_QUEUE}))
        if added or dropped:
            log.info("queues_changed", added=added, dropped=dropped, consuming=list(node.queues))

    @staticmethod
    def _want(r: redis.Redis, node_id: str) -> set[str]:
        now = time.time()
        known = sorted(r.smembers(QUEUES_KEY))
        pipe = r.pipeline(transaction=False)
        for queue in known:
            for p in range(10):
                pipe.llen(queue_list(queue, p))
        lengths = pipe.execute()
        sizes = {q: sum(lengths[i * 10 : (i + 1) * 10]) for i, q in enumerate(known)}
        loaded = set()
        for worker_id, raw in r.hgetall(WORKERS_KEY).items():
            try:
                beat = WorkerBeat.from_json(worker_id, raw)
            except ValueError:
                continue
            if beat.node == node_id and beat.model:
                loaded.add(queue_for_model(beat.model))
        elsewhere: dict[str, int] = {}
        for node in live_nodes(r, now):
            if node.node_id != node_id:
                for queue in node.queues:
                    elsewhere[queue] = elsewhere.get(queue, 0) + 1

        def may_adopt(queue: str) -> bool:
            return bool(r.set(f"freight:adopt:{queue}", node_id, nx=True, ex=ADOPT_S))

        return choose_queues(sizes, loaded, elsewhere, may_adopt)
