"""The fleet page: workers (the model each serves, its last heartbeat, its current shard), queue depth
per model, and the autoscaler's recent decisions with their reasons, all from Redis.

Read as `freight status` and the autoscaler read them (jobs/progress.py's keys): pool processes'
heartbeats in `freight:workers`, worker main processes in `freight:nodes`, queue lengths with
kombu's priority sub-queues (jobs/autoscale/backlog.py), the decision log of every group
(jobs/autoscale/decisions.py). A worker's current shard is shown only to a viewer who may see its
job; the rest of the fleet is shared machinery, shown to every viewer.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

import redis

from jobs.autoscale.backlog import queue_lists
from jobs.autoscale.decisions import DecisionLog, groups
from jobs.leases import live_nodes
from jobs.live_state import LiveState
from jobs.progress import JOBS_KEY, WORKER_GONE_AFTER_S, aux_key

DECISIONS_SHOWN = 30
STALE_SHOWN_S = 3600.0  # a worker whose heartbeat stopped stays on the page this long, marked gone


def fleet(live: LiveState, visible_jobs: Collection[str] | None, now: float | None = None) -> dict[str, Any]:
    """The fleet page's data. `visible_jobs`: job ids whose shards the viewer may see named (None: all)."""
    now = time.time() if now is None else now
    client = live.client
    beats = live.workers(alive_within=STALE_SHOWN_S)
    nodes = live_nodes(client, now)
    models = _queue_models(client)
    models.update({b.queue: b.model for b in beats if b.model and b.queue})
    workers = []
    for beat in sorted(beats, key=lambda b: b.worker_id):
        shown = beat.job_id is not None and (visible_jobs is None or beat.job_id in visible_jobs)
        workers.append({
            "worker": beat.worker_id, "instance": beat.instance_id, "model": beat.model or models.get(beat.queue),
            "queue": beat.queue, "busy": beat.busy, "heartbeat": beat.heartbeat, "age_s": max(now - beat.heartbeat, 0.0),
            "live": beat.is_live(now), "tokens_per_second": beat.tokens_per_second,
            "job_id": beat.job_id if shown else None, "shard": beat.shard if shown else None,
            "attempt": beat.attempt if shown else None, "other_tenant": beat.job_id is not None and not shown,
        })  # fmt: skip
    queues = sorted(live.queues())
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        for name in queue_lists(queue):
            pipe.llen(name)
    lengths = pipe.execute() if queues else []
    per = len(queue_lists("q"))
    depth = [
        {"queue": q, "model": models.get(q), "queued": int(sum(lengths[i * per : (i + 1) * per])),
         "consumers": sum(1 for n in nodes if q in n.queues)}
        for i, q in enumerate(queues)
    ]  # fmt: skip
    decisions = [{"group": g, **d} for g in groups(client) for d in DecisionLog(client, g).recent(DECISIONS_SHOWN)]
    decisions.sort(key=lambda d: -float(d.get("until") or d.get("at") or 0))
    return {
        "workers": workers,
        "nodes": [{"node": n.node_id, "hostname": n.hostname, "heartbeat": n.heartbeat, "queues": list(n.queues),
                   "serve_all": n.serve_all} for n in nodes],  # fmt: skip
        "queues": depth,
        "decisions": decisions[:DECISIONS_SHOWN],
        "gone_after_s": WORKER_GONE_AFTER_S,
    }


def _queue_models(client: redis.Redis) -> dict[str, str]:
    """queue -> model, from the meta of the jobs Redis knows (a queue is named by a hash of its model)."""
    ids = sorted(client.smembers(JOBS_KEY))
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(aux_key("meta", job_id), ["queue", "model"])
    return {q: m for q, m in (pipe.execute() if ids else []) if q and m}
