"""Redis state checked against storage: shards that nothing will ever run are queued again.

Redis may lose data (a failover without AOF, a flush of the queue keys, a message dropped on a
hand-back whose unacked entry was gone). Then a job's shard is "queued" or "running" in
`freight:shards:<job>` while no message for it sits in a queue list or in kombu's `unacked` hash
and no live worker runs it: nothing would ever run it, and the job would hang. `Reconciler.run`
finds such shards (one pass over the freight queue lists and `unacked`), and once a shard has been
seen so for FREIGHT_ORPHAN_GRACE_S (10 s; a message in flight between BRPOP and kombu's unacked
entry, or between a submit's state and its publish, is invisible for milliseconds) it asks storage:
a committed or failed shard gets that state; any other is published again (`shards_requeued` in the
log). A job whose shards are all committed but which has neither _SUCCESS nor a finalize message
gets its freight.finalize; one whose OUT has no manifest any more is marked failed. Only storage's
own answer fails a job (the manifest or the bucket is gone, the manifest is damaged); a manifest that
a newer freight wrote (jobs/manifest.py's NewerManifestError: a fleet mid-upgrade) leaves the job as it
is (`reconcile_manifest_newer`), for a newer reconciler to repair. Storage
that gives none (StorageUnavailableError: refused, timed out, throttled, 5xx; or denied access, bad
credentials) leaves the job and its sightings as they are (`reconcile_storage_unavailable`), and the
next pass tries again. A pass over all jobs (`job_ids` None) also sends finished jobs'
notifications that no target confirmed again (jobs/redelivery.py: the claimer died, or every try
failed).

It runs in every worker's main process: worker/node.py's NodeKeeper ticks every FREIGHT_HEARTBEAT_S
(10 s; sooner when a message arrives) and starts a pass on the first tick at least RECONCILE_S (15 s)
after its last turn, so about every 20 s per worker with default settings, unless another worker
took a turn in the last 12 s (`freight:lock:reconcile`, so with several workers the fleet still
makes about one pass per 12-20 s). The pass runs on a thread of its own (worker/reconcile_turns.py),
one at a time per worker, so storage that hangs never holds back the node's beat and leases. Also in
`freight autoscale`'s tick and in `freight wait` (its own job, every FREIGHT_WAIT_RECONCILE_S), which
take no turn: passes may overlap, and every repair is safe to race (a job's under its own lock,
`freight:lock:reconcile:<job>`: a token of the pass, JOB_LOCK_S, released only by its holder).
Never imports worker/ or torch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import LockError

from jobs.client import FleetClient
from jobs.errors import (
    BucketNotFoundError,
    NewerManifestError,
    ObjectNotFoundError,
    StorageError,
    StorageUnavailableError,
)
from jobs.finalize import committed_shards
from jobs.leases import UNACKED_KEY, decode_task
from jobs.live_state import LiveState
from jobs.log import get_logger
from jobs.manifest import SUCCESS_KEY, read_manifest
from jobs.markers import FAILURES_KEY, failed_shards, is_cancelled, write_failures_manifest
from jobs.progress import FINISHED_JOB_STATES, JOBS_KEY, QUEUES_KEY, WORKER_GONE_AFTER_S, aux_key, job_key
from jobs.redact import redact
from jobs.redelivery import NoticeSweep
from jobs.settings import Settings
from jobs.storage import open_store

log = get_logger(__name__)

PRIORITY_SEPARATOR = "\x06\x16"
PRIORITIES = range(10)
TASK_FINALIZE = "freight.finalize"
JOB_LOCK_S = 30.0  # a job's repair lock (freight:lock:reconcile:<job>) expires after this


@dataclass(frozen=True)
class Repair:
    """What one pass did to one job."""

    job_id: str
    requeued: tuple[int, ...] = ()
    marked: dict[int, str] = field(default_factory=dict)  # shard -> committed | failed (from storage)
    finalize_sent: bool = False
    state: str | None = None  # a job state set from storage (cancelled, failed)


@dataclass
class _Seen:
    """The messages and attempts that exist right now."""

    shards: set[tuple[str, int]] = field(default_factory=set)  # (job, shard) with a message or a live attempt
    finalizing: set[str] = field(default_factory=set)  # jobs with a freight.finalize message


class Reconciler:
    """One pass over the active jobs (or the given ones). `client` publishes what must run again."""

    def __init__(self, client: FleetClient, settings: Settings, *, job_lock_s: float = JOB_LOCK_S) -> None:
        self.client = client
        self.live: LiveState = client.live
        self.settings = settings
        self.grace_s = settings.orphan_grace_s
        self.job_lock_s = job_lock_s

    def run(self, now: float | None = None, job_ids: Iterable[str] | None = None) -> list[Repair]:
        """One pass over `job_ids` (None: every job Redis knows; then the finished jobs' undelivered
        notifications are redelivered too, jobs/redelivery.py)."""
        now = time.time() if now is None else now
        r = self.live.client
        jobs = sorted(job_ids) if job_ids is not None else sorted(r.smembers(JOBS_KEY))
        pipe = r.pipeline(transaction=False)
        for job_id in jobs:
            pipe.hget(job_key(job_id), "state")
        states = dict(zip(jobs, pipe.execute(), strict=True))
        active = [j for j in jobs if states[j] is not None and states[j] not in FINISHED_JOB_STATES]
        repairs = self._active(active, now)
        if job_ids is None:
            finished = {j: states[j] for j in jobs if states[j] in FINISHED_JOB_STATES}
            NoticeSweep(self.live, self.settings).run(finished, now)
        return repairs

    def _active(self, active: list[str], now: float) -> list[Repair]:
        if not active:
            return []
        r = self.live.client
        if self._all_accounted(active):
            for job_id in active:  # nothing missing now: forget earlier sightings (the grace restarts)
                r.delete(aux_key("orphans", job_id))
            return []
        seen = self._seen(now)
        repairs = []
        for job_id in active:
            repair = self._job(job_id, seen, now)
            if repair is not None:
                repairs.append(repair)
        return repairs

    # ----- what exists --------------------------------------------------------------------------
    def _all_accounted(self, active: list[str]) -> bool:
        """Cheap first check: at least as many messages (queued + unacked) as open shards (queued or
        running). Only when fewer does a pass read the messages themselves."""
        r = self.live.client
        pipe = r.pipeline(transaction=False)
        for job_id in active:
            pipe.hvals(aux_key("shards", job_id))
        open_shards = sum(sum(1 for st in states if st in ("queued", "running")) for states in pipe.execute())
        for queue in r.smembers(QUEUES_KEY):
            for p in PRIORITIES:
                pipe.llen(queue if p == 0 else f"{queue}{PRIORITY_SEPARATOR}{p}")
        pipe.hlen(UNACKED_KEY)
        return sum(pipe.execute()) >= open_shards

    def _seen(self, now: float) -> _Seen:
        r = self.live.client
        seen = _Seen()
        pipe = r.pipeline(transaction=False)
        for queue in sorted(r.smembers(QUEUES_KEY)):
            for p in PRIORITIES:
                pipe.lrange(queue if p == 0 else f"{queue}{PRIORITY_SEPARATOR}{p}", 0, -1)
        raw_messages: list[Any] = [m for batch in pipe.execute() for m in batch]
        for raw in raw_messages:
            self._note(seen, _payload(raw))
        for raw in r.hvals(UNACKED_KEY):
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if isinstance(entry, list) and entry:
                self._note(seen, entry[0])
        # a running attempt shows in its heartbeat; three missed beats and it is gone (as in
        # worker/attempts.py), so a killed attempt's shard is not taken for running for a whole minute
        alive_within = min(WORKER_GONE_AFTER_S, max(3 * self.settings.heartbeat_s, 5.0))
        for beat in self.live.workers(alive_within=alive_within):
            if beat.job_id is not None and beat.shard is not None:
                seen.shards.add((beat.job_id, beat.shard))
        return seen

    @staticmethod
    def _note(seen: _Seen, payload: Any) -> None:
        task = decode_task(payload) if isinstance(payload, dict) else None
        if task is None:
            return
        if task.shard is not None:
            seen.shards.add(task.shard)
        elif task.task == TASK_FINALIZE and "job_id" in task.kwargs:
            seen.finalizing.add(str(task.kwargs["job_id"]))

    # ----- one job ------------------------------------------------------------------------------
    def _job(self, job_id: str, seen: _Seen, now: float) -> Repair | None:
        states = self.live.shard_states(job_id)
        meta = self.live.job_meta(job_id)
        if not meta or not states:
            return None  # Redis lost the job itself: `freight wait` says so, a resubmit restores it
        open_shards = {s for s, st in states.items() if st in ("queued", "running")}
        missing = {s for s in open_shards if (job_id, s) not in seen.shards}
        all_done = all(st == "committed" for st in states.values())
        if all_done and job_id not in seen.finalizing:
            missing.add(-1)  # -1: the job's finalize
        due = self._due(job_id, missing, now)
        if not due:
            return None
        # SET NX with a token of this pass; released only while it still holds that token (a pass
        # that outlived the expiry must not delete the lock another reconciler took since)
        lock = self.live.client.lock(f"freight:lock:reconcile:{job_id}", timeout=self.job_lock_s)
        if not lock.acquire(blocking=False):
            return None  # another reconciler is on it
        started = time.monotonic()
        try:
            return self._repair(job_id, meta, due)
        except (StorageError, ObjectNotFoundError) as exc:  # no answer (or a key gone mid-pass): no verdict
            log.warning("reconcile_storage_unavailable", job_id=job_id, output=redact(meta["output"]),
                        error=str(exc), transient=isinstance(exc, StorageUnavailableError),
                        then="the job is left as it is; the next pass tries again")  # fmt: skip
            return None
        finally:
            try:
                lock.release()
            except LockError:  # it expired under this pass; whoever holds it now keeps it
                log.warning("reconcile_job_lock_expired", job_id=job_id,
                            took_s=round(time.monotonic() - started, 1), lock_s=self.job_lock_s)  # fmt: skip

    def _due(self, job_id: str, missing: set[int], now: float) -> set[int]:
        """Record when each missing shard was first seen missing; return those missing for the grace."""
        key = aux_key("orphans", job_id)
        first = {int(k): float(v) for k, v in self.live.client.hgetall(key).items()}
        gone = [str(s) for s in first if s not in missing]
        pipe = self.live.client.pipeline()
        if gone:
            pipe.hdel(key, *gone)
        new = {str(s): now for s in missing if s not in first}
        if new:
            pipe.hset(key, mapping=new)
        pipe.execute()
        return {s for s in missing if s in first and now - first[s] >= self.grace_s}

    def _repair(self, job_id: str, meta: dict[str, str], due: set[int]) -> Repair | None:
        output = meta["output"]
        try:
            store = open_store(output, self.settings)
            manifest = read_manifest(store)
        except NewerManifestError as exc:
            # a newer freight wrote it (a fleet mid-upgrade): nothing is wrong with the job, this
            # process just cannot read it. Left as it is, sightings too; a newer reconciler repairs it.
            log.warning("reconcile_manifest_newer", job_id=job_id, output=redact(output), error=str(exc),
                        then="the job is left as it is; upgrade this worker")  # fmt: skip
            return None
        except (ObjectNotFoundError, BucketNotFoundError, ValueError) as exc:
            # storage's own answer (no manifest, no bucket, a damaged manifest: CorruptManifestError, a
            # URL that is none): the job cannot go on. Any other StorageError is no answer: _job leaves it.
            self.live.set_job_state(job_id, "failed")
            gone = isinstance(exc, (ObjectNotFoundError, BucketNotFoundError))
            log.error("job_output_gone" if gone else "job_manifest_unreadable", job_id=job_id,
                      output=redact(output), error=str(exc))  # fmt: skip
            return Repair(job_id, state="failed")
        if is_cancelled(store):
            self.live.set_job_state(job_id, "cancelled")
            log.warning("job_cancelled_in_storage", job_id=job_id)
            return Repair(job_id, state="cancelled")
        committed, failed = committed_shards(store), failed_shards(store)
        marked: dict[int, str] = {}
        todo = []
        for shard in sorted(s for s in due if s >= 0):
            if shard in committed:
                self.live.transition(job_id, shard, "committed", rows=manifest.shards[shard].rows)
                marked[shard] = "committed"
            elif shard in failed:
                self.live.transition(job_id, shard, "failed")
                marked[shard] = "failed"
            else:
                todo.append(shard)
        if todo:
            for shard in todo:
                self.live.transition(job_id, shard, "queued")
            self.client.requeue(job_id=job_id, output=output, queue=meta["queue"], shards=todo,
                                priority=int(meta.get("priority", 0) or 0))  # fmt: skip
            log.warning("shards_requeued", job_id=job_id, shards=todo,
                        reason="no message on any queue and no live attempt")  # fmt: skip
        self.live.client.hdel(aux_key("orphans", job_id), *[str(s) for s in due])
        finalize = False
        total = len(manifest.shards)
        if store.exists(SUCCESS_KEY):
            self.live.set_job_state(job_id, "succeeded")
            return Repair(job_id, tuple(todo), marked, False, "succeeded")
        if len(committed) == total:
            self.client.send_finalize(job_id=job_id, output=output, queue=meta["queue"])
            log.warning("finalize_requeued", job_id=job_id)
            finalize = True
        elif len(committed | failed) == total and failed and not store.exists(FAILURES_KEY):
            write_failures_manifest(store, job_id)
            self.live.set_job_state(job_id, "failed")
            return Repair(job_id, tuple(todo), marked, False, "failed")
        return Repair(job_id, tuple(todo), marked, finalize)


def _payload(raw: Any) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, TypeError):
        return None


def reconcile_once(settings: Settings, job_ids: Iterable[str] | None = None) -> list[Repair]:
    """One pass with a client of its own (the CLI's); RedisError when Redis does not answer. The
    notifications it redelivered get FREIGHT_NOTIFY_DRAIN_S (`freight autoscale --once` then exits)."""
    from jobs.notify import notifier

    client = FleetClient(settings, retry_for_s=5.0)
    try:
        return Reconciler(client, settings).run(job_ids=job_ids)
    finally:
        client.close()
        notifier(settings).drain(settings.notify_drain_s)
