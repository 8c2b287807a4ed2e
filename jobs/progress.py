"""Key names and record shapes of freight's live state in Redis (docs/ARCHITECTURE.md, "Live state
in Redis"); jobs.live_state.LiveState reads and writes them. The autoscaler Lambda carries this module,
not that one (infra/build_autoscaler.py).

Storage stays the truth; these keys carry progress for `freight status`, the attempt counts that bound
poison shards, cancel flags and worker heartbeats. Keys read by the autoscaler (follow them exactly):

- `freight:queues`          SET of Celery queue names that carry freight shards (one per model)
- `freight:job:<job_id>`    HASH state, shards_total, shards_queued, shards_running, shards_committed,
                            shards_failed, rows_done, tokens_done, est_tokens_queued, updated_at and,
                            when the submit gave one, deadline (unix seconds)
- `freight:workers`         HASH worker_id -> JSON {busy, instance_id, queue, tokens_per_second, heartbeat}

Token units: `est_tokens_queued` is rows x max_tokens of the queued shards (the most they can
generate) and a heartbeat's `tokens_per_second` is the completion tokens generated over the last
minute, per second: both count completion tokens, so the autoscaler can divide one by the other.

Keys of LiveState only (other prefixes, so a SCAN of `freight:job:*` meets only job hashes):
`freight:jobs` (SET of job ids), `freight:shards:<job>` (HASH shard -> queued|running|committed|
failed|cancelled), `freight:est:<job>` (HASH shard -> estimated tokens), `freight:attempts:<job>` and
`freight:strikes:<job>` (HASH shard -> count), `freight:nodelost:<job>` (HASH shard -> attempts lost
with their whole worker: the lease reaper restored their message because the worker's main process
stopped beating; a machine loss, not evidence against the shard), `freight:outages:<job>` (HASH shard
-> attempts that ended because storage did not answer; not evidence against the shard either; shard
-1 counts finalize's), `freight:started:<job>` (HASH shard -> JSON of the
last attempt's start; dropped when that attempt raised and was billed as an error, so only a start
whose attempt vanished is left for the next attempt to bill as lost), `freight:cancel:<job>` (flag),
`freight:meta:<job>` (HASH output, queue, model, submitted_at, priority).

Keys of the fleet's own upkeep (jobs.leases, worker/node.py, jobs.reconcile):
- `freight:nodes`    HASH node id -> JSON NodeBeat {hostname, heartbeat, queues, serve_all}: one entry
                     per running worker main process (node id = `<celery hostname>/<pid>-<token>`, new
                     each start), written every few seconds; the queues it consumes right now
- `freight:leases`   HASH kombu delivery tag -> node id: which worker main process holds each unacked
                     message (written with each lease renewal); a message whose node's beat is older
                     than WORKER_GONE_AFTER_S is put back on its queue (jobs.leases.reap_stale_leases)
- `freight:rates`    HASH model -> completion tokens per engine-second measured on that model (the
                     per-attempt deadline's rate)
- `freight:orphans:<job>`  HASH shard -> unix time it was first seen with no message and no attempt
- `freight:notified:<job>` flag: every notification claim of the finished job is delivered or given
                     up (jobs.redelivery); the reconcile pass reads its storage no more
"""

from __future__ import annotations

import json
from dataclasses import dataclass

QUEUES_KEY = "freight:queues"
WORKERS_KEY = "freight:workers"
JOB_KEY_PREFIX = "freight:job:"
JOBS_KEY = "freight:jobs"
NODES_KEY = "freight:nodes"
LEASES_KEY = "freight:leases"
RATES_KEY = "freight:rates"
WORKER_GONE_AFTER_S = 60.0  # a worker whose heartbeat is older than this counts as gone
SHARD_STATES = ("queued", "running", "committed", "failed", "cancelled", "expired")
JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled", "expired")
FINISHED_JOB_STATES = frozenset({"succeeded", "failed", "cancelled", "expired"})
AUX_KINDS = ("shards", "est", "attempts", "strikes", "nodelost", "outages", "started", "cancel", "meta",
             "orphans", "notified")  # fmt: skip
JOB_TTL_S = 7 * 24 * 3600  # finished jobs' keys expire after a week


def job_key(job_id: str) -> str:
    return f"{JOB_KEY_PREFIX}{job_id}"


def aux_key(kind: str, job_id: str) -> str:
    """The key of one of a job's AUX_KINDS: `freight:<kind>:<job_id>`."""
    return f"freight:{kind}:{job_id}"


@dataclass(frozen=True)
class WorkerBeat:
    """One worker's heartbeat, as stored in `freight:workers` (one per pool process).

    The fields after `heartbeat` are optional in the JSON (older workers, the autoscaler's tests):
    the attempt the process runs now (`job_id`, `shard`, `attempt`; None when idle), the unix time
    of its last engine step, the model it has loaded and is ready to serve, and its node id.
    """

    worker_id: str
    busy: bool
    instance_id: str | None
    queue: str
    tokens_per_second: float  # completion tokens per second over the last minute
    heartbeat: float  # unix seconds
    job_id: str | None = None
    shard: int | None = None
    attempt: int | None = None
    last_step: float | None = None  # unix seconds of the last engine step of the running attempt
    model: str | None = None  # the model loaded in this process (ready to serve), None while none
    node: str | None = None  # the node id of its main process (see NodeBeat)

    @classmethod
    def from_json(cls, worker_id: str, raw: str | bytes) -> WorkerBeat:
        """One `freight:workers` entry; ValueError when it is not the documented JSON."""
        try:
            data = json.loads(raw)
            instance_id = data.get("instance_id")
            return cls(
                worker_id=worker_id,
                busy=bool(data["busy"]),
                instance_id=str(instance_id) if instance_id else None,
                queue=str(data.get("queue", "")),
                tokens_per_second=max(float(data.get("tokens_per_second") or 0.0), 0.0),
                heartbeat=float(data["heartbeat"]),
                job_id=_opt(data.get("job_id"), str),
                shard=_opt(data.get("shard"), int),
                attempt=_opt(data.get("attempt"), int),
                last_step=_opt(data.get("last_step"), float),
                model=_opt(data.get("model"), str),
                node=_opt(data.get("node"), str),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"worker {worker_id}: malformed heartbeat {raw!r} ({exc!r})") from exc

    def is_live(self, now: float, alive_within: float = WORKER_GONE_AFTER_S) -> bool:
        return now - self.heartbeat <= alive_within

    def runs(self, job_id: str, shard: int, attempt: int | None = None) -> bool:
        """True when this beat says the process is running `shard` of `job_id` (that attempt)."""
        return (
            self.job_id == job_id
            and self.shard == shard
            and (attempt is None or self.attempt == attempt)
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "busy": self.busy,
                "instance_id": self.instance_id,
                "queue": self.queue,
                "tokens_per_second": self.tokens_per_second,
                "heartbeat": self.heartbeat,
                "job_id": self.job_id,
                "shard": self.shard,
                "attempt": self.attempt,
                "last_step": self.last_step,
                "model": self.model,
                "node": self.node,
            }
        )


@dataclass(frozen=True)
class NodeBeat:
    """One worker main process, as stored in `freight:nodes`: the queues it consumes right now.

    `serve_all`: started without --model/--queues, so it adds and drops queues as jobs come and go.
    """

    node_id: str
    hostname: str
    heartbeat: float  # unix seconds
    queues: tuple[str, ...] = ()
    serve_all: bool = False

    @classmethod
    def from_json(cls, node_id: str, raw: str | bytes) -> NodeBeat:
        try:
            data = json.loads(raw)
            return cls(
                node_id=node_id,
                hostname=str(data.get("hostname", "")),
                heartbeat=float(data["heartbeat"]),
                queues=tuple(str(q) for q in data.get("queues") or ()),
                serve_all=bool(data.get("serve_all", False)),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"node {node_id}: malformed beat {raw!r} ({exc!r})") from exc

    def is_live(self, now: float, alive_within: float = WORKER_GONE_AFTER_S) -> bool:
        return now - self.heartbeat <= alive_within

    def to_json(self) -> str:
        return json.dumps(
            {"hostname": self.hostname, "heartbeat": self.heartbeat, "queues": list(self.queues),
             "serve_all": self.serve_all}
        )  # fmt: skip


def _opt(value: object, kind: type) -> object:
    return None if value is None else kind(value)
