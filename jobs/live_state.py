"""LiveState: reads and writes freight's live state in Redis, the keys and records of jobs.progress.

Shard transitions are one Lua script each, so the job hash's counters always add up.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from jobs.progress import (
    AUX_KINDS,
    FINISHED_JOB_STATES,
    JOB_STATES,
    JOB_TTL_S,
    JOBS_KEY,
    QUEUES_KEY,
    SHARD_STATES,
    WORKER_GONE_AFTER_S,
    WORKERS_KEY,
    WorkerBeat,
    aux_key,
    job_key,
)

# One shard's state change, atomically: old -> new moves one count between the shards_* fields,
# subtracts the shard's estimate from est_tokens_queued when it leaves "queued", adds rows/tokens
# on the first commit. A repeated transition (a redelivered task) changes nothing.
# KEYS: job hash, shard states, estimates. ARGV: shard, new state, rows, tokens, now.
_TRANSITION = """
local old = redis.call('HGET', KEYS[2], ARGV[1])
local new = ARGV[2]
if old == new then return old or '' end
if old == 'committed' or old == 'failed' then return old end
local fields = {queued='shards_queued', running='shards_running', committed='shards_committed',
                failed='shards_failed'}
if old and fields[old] then redis.call('HINCRBY', KEYS[1], fields[old], -1) end
if fields[new] then redis.call('HINCRBY', KEYS[1], fields[new], 1) end
local est = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
if old == 'queued' and new ~= 'queued' then
  redis.call('HINCRBY', KEYS[1], 'est_tokens_queued', -est)
elseif new == 'queued' and old ~= 'queued' then
  redis.call('HINCRBY', KEYS[1], 'est_tokens_queued', est)
end
if new == 'committed' then
  redis.call('HINCRBY', KEYS[1], 'rows_done', tonumber(ARGV[3]))
  redis.call('HINCRBY', KEYS[1], 'tokens_done', tonumber(ARGV[4]))
end
redis.call('HSET', KEYS[2], ARGV[1], new)
redis.call('HSET', KEYS[1], 'updated_at', ARGV[5])
if new == 'running' and redis.call('HGET', KEYS[1], 'state') == 'queued' then
  redis.call('HSET', KEYS[1], 'state', 'running')
end
return old or ''
"""

# Forget an attempt's start once that attempt has been billed, but only if no later attempt has
# replaced it. KEYS: started hash. ARGV: shard, attempt.
_END_START = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw and tonumber(cjson.decode(raw)['attempt']) == tonumber(ARGV[2]) then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""


# An attempt storage did not answer: one outage more and, when the attempt still holds its strike
# (ARGV[2] = 1), that strike back (never below 0). An attempt that already took its strike back (it ended
# cleanly, then a storage call failed) passes 0: taking one more would erase another attempt's strike,
# an earlier crash's. KEYS: strikes, outages. ARGV: shard, holds strike (1 | 0).
_OUTAGE = """
if ARGV[2] == '1' and tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') > 0 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
end
return redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
"""


class LiveState:
    """Reads and writes freight's Redis keys. Cheap to construct; holds one connection pool."""

    def __init__(self, redis_url: str, *, socket_timeout: float = 10.0, retry_for_s: float = 60.0) -> None:
        self.redis_url = redis_url
        # A restarted Redis (failover, upgrade) is waited for: every command retries with backoff
        # (0.1 s doubling to 2 s) for about `retry_for_s` before it raises.
        retries = int(retry_for_s / 2.0) + 5 if retry_for_s > 0 else 0
        self.client = redis.Redis.from_url(
            redis_url,
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            health_check_interval=30,
            retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), retries),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        )
        self._register()

    @classmethod
    def from_client(cls, client: redis.Redis) -> LiveState:
        """A LiveState over an existing client (the autoscaler's; decode_responses=True)."""
        live = cls.__new__(cls)
        live.redis_url, live.client = "", client
        live._register()
        return live

    def _register(self) -> None:
        self._transition = self.client.register_script(_TRANSITION)
        self._end_start = self.client.register_script(_END_START)
        self._outage = self.client.register_script(_OUTAGE)

    # ----- jobs -----------------------------------------------------------------------------------
    def init_job(
        self,
        job_id: str,
        *,
        output: str,
        queue: str,
        model: str,
        est_tokens: Mapping[int, int],
        committed: Iterable[int] = (),
        failed: Iterable[int] = (),
        deadline: float | None = None,
        priority: int = 0,
    ) -> None:
        """Record a submitted job: `est_tokens` covers every shard; committed/failed ones are done;
        `deadline` (unix seconds, None: none) is the autoscaler's, replaced by each submit."""
        done = {int(i): "committed" for i in committed} | {int(i): "failed" for i in failed}
        states = {i: done.get(i, "queued") for i in est_tokens}
        queued = [i for i, s in states.items() if s == "queued"]
        pipe = self.client.pipeline()
        for kind in ("shards", "est", "cancel", "orphans", "notified"):
            pipe.delete(aux_key(kind, job_id))
        pipe.delete(job_key(job_id))
        pipe.hset(
            job_key(job_id),
            mapping={
                "state": "queued" if queued else "running",
                "shards_total": len(states),
                "shards_queued": len(queued),
                "shards_running": 0,
                "shards_committed": sum(1 for s in states.values() if s == "committed"),
                "shards_failed": sum(1 for s in states.values() if s == "failed"),
                "rows_done": 0,
                "tokens_done": 0,
                "est_tokens_queued": sum(est_tokens[i] for i in queued),
                "updated_at": time.time(),
                **({"deadline": repr(float(deadline))} if deadline is not None else {}),
            },
        )
        if states:
            pipe.hset(aux_key("shards", job_id), mapping={str(i): s for i, s in states.items()})
            pipe.hset(aux_key("est", job_id), mapping={str(i): int(v) for i, v in est_tokens.items()})
        pipe.hset(
            aux_key("meta", job_id),
            mapping={"output": output, "queue": queue, "model": model, "submitted_at": time.time(),
                     "priority": priority},
        )
        for kind in ("attempts", "strikes", "nodelost", "outages", "started", "meta"):
            pipe.persist(aux_key(kind, job_id))  # a resubmitted job is live again
        pipe.sadd(JOBS_KEY, job_id)
        pipe.sadd(QUEUES_KEY, queue)
        pipe.execute()

    def transition(self, job_id: str, shard: int, state: str, *, rows: int = 0, tokens: int = 0) -> str:
        """Move `shard` to `state`; returns its previous state ('' if unknown). Terminal states stick."""
        if state not in SHARD_STATES:
            raise ValueError(f"unknown shard state {state!r}; one of {SHARD_STATES}")
        keys = [job_key(job_id), aux_key("shards", job_id), aux_key("est", job_id)]
        return str(self._transition(keys=keys, args=[shard, state, rows, tokens, time.time()]))

    def set_job_state(self, job_id: str, state: str) -> None:
        if state not in JOB_STATES:
            raise ValueError(f"unknown job state {state!r}; one of {JOB_STATES}")
        pipe = self.client.pipeline()
        pipe.hset(job_key(job_id), mapping={"state": state, "updated_at": time.time()})
        if state in FINISHED_JOB_STATES:
            self._expire_job(pipe, job_id)
        pipe.execute()

    def _expire_job(self, pipe: Any, job_id: str) -> None:
        """A finished job's keys stay JOB_TTL_S for status and resubmits, then Redis drops them."""
        for key in [job_key(job_id), *(aux_key(kind, job_id) for kind in AUX_KINDS)]:
            pipe.expire(key, JOB_TTL_S)

    def job(self, job_id: str) -> dict[str, Any]:
        """The job hash with numbers parsed; {} if Redis does not know the job."""
        raw = self.client.hgetall(job_key(job_id))
        out: dict[str, Any] = {}
        for k, v in raw.items():
            if k == "state":
                out[k] = v
            else:
                out[k] = float(v) if k in ("updated_at", "deadline") else int(v)
        return out

    def shard_states(self, job_id: str) -> dict[int, str]:
        return {int(k): v for k, v in self.client.hgetall(aux_key("shards", job_id)).items()}

    def job_meta(self, job_id: str) -> dict[str, str]:
        return self.client.hgetall(aux_key("meta", job_id))

    def find_job(self, output: str) -> str | None:
        """The job id whose OUT is `output`, among the jobs Redis knows."""
        for job_id in self.client.smembers(JOBS_KEY):
            found = self.client.hget(aux_key("meta", job_id), "output")
            if found is None:
                self.client.srem(JOBS_KEY, job_id)  # its keys expired
            elif found == output:
                return job_id
        return None

    # ----- attempts (poison shards) ---------------------------------------------------------------
    def begin_attempt(self, job_id: str, shard: int) -> tuple[int, int]:
        """Count an attempt at its START (a SIGKILLed worker records nothing later).

        Returns (attempt number from 1, strikes = attempts that have not ended cleanly, this one included).
        """
        pipe = self.client.pipeline()
        pipe.hincrby(aux_key("attempts", job_id), str(shard), 1)
        pipe.hincrby(aux_key("strikes", job_id), str(shard), 1)
        attempt, strikes = pipe.execute()
        return int(attempt), int(strikes)

    def swap_attempt_start(self, job_id: str, shard: int, info: dict[str, Any]) -> dict[str, Any] | None:
        """Record this attempt's start (attempt, worker, at); return the previous attempt's, if any."""
        key = aux_key("started", job_id)
        pipe = self.client.pipeline()
        pipe.hget(key, str(shard))
        pipe.hset(key, str(shard), json.dumps(info))
        previous, _ = pipe.execute()
        return json.loads(previous) if previous else None

    def end_attempt_start(self, job_id: str, shard: int, attempt: int) -> bool:
        """Drop `attempt`'s start (it ended and was billed), unless a later attempt's start replaced it."""
        return bool(self._end_start(keys=[aux_key("started", job_id)], args=[shard, attempt]))

    def last_heartbeat(self, worker_id: str) -> float | None:
        raw = self.client.hget(WORKERS_KEY, worker_id)
        return float(json.loads(raw)["heartbeat"]) if raw else None

    def end_attempt_clean(self, job_id: str, shard: int) -> None:
        """The attempt ended without crashing (committed, released, cancelled): take its strike back."""
        self.client.hincrby(aux_key("strikes", job_id), str(shard), -1)

    def reset_strikes(self, job_id: str) -> None:
        """A resubmit gives failed shards a fresh budget (attempt numbers keep counting up)."""
        self.client.delete(aux_key("strikes", job_id), aux_key("nodelost", job_id), aux_key("outages", job_id))

    def count_node_loss(self, job_id: str, shard: int) -> None:
        """An attempt of `shard` was lost with its whole worker (the lease reaper restored it)."""
        self.client.hincrby(aux_key("nodelost", job_id), str(shard), 1)

    def node_losses(self, job_id: str, shard: int) -> int:
        """Attempts of `shard` lost with their whole worker (count_node_loss)."""
        return int(self.client.hget(aux_key("nodelost", job_id), str(shard)) or 0)

    def count_storage_outage(self, job_id: str, shard: int, *, holds_strike: bool) -> int:
        """An attempt of `shard` ended because storage did not answer: not the shard's fault, so it
        counts as an outage and, if it still `holds_strike` (it has not ended cleanly: no
        end_attempt_clean yet), takes that strike back, atomically. Returns the shard's outages."""
        keys = [aux_key("strikes", job_id), aux_key("outages", job_id)]
        return int(self._outage(keys=keys, args=[shard, 1 if holds_strike else 0]))

    def storage_outages(self, job_id: str, shard: int) -> int:
        """Attempts of `shard` that ended because storage did not answer (count_storage_outage)."""
        return int(self.client.hget(aux_key("outages", job_id), str(shard)) or 0)

    def all_storage_outages(self, job_id: str) -> dict[int, int]:
        """storage_outages of every shard that had one, by shard (finalize's under its slot, -1)."""
        raw = self.client.hgetall(aux_key("outages", job_id))
        return {int(k): int(v) for k, v in sorted(raw.items(), key=lambda kv: int(kv[0])) if int(v) > 0}

    def attempts(self, job_id: str) -> dict[int, int]:
        return {int(k): int(v) for k, v in self.client.hgetall(aux_key("attempts", job_id)).items()}

    # ----- cancel ---------------------------------------------------------------------------------
    def request_cancel(self, job_id: str) -> None:
        pipe = self.client.pipeline()
        pipe.set(aux_key("cancel", job_id), str(time.time()))
        pipe.hset(job_key(job_id), mapping={"state": "cancelled", "updated_at": time.time()})
        self._expire_job(pipe, job_id)
        pipe.execute()

    def clear_cancel(self, job_id: str) -> None:
        self.client.delete(aux_key("cancel", job_id))

    def is_cancelled(self, job_id: str) -> bool:
        return bool(self.client.exists(aux_key("cancel", job_id)))

    def cancelled_at(self, job_id: str) -> float | None:
        """Unix seconds of the cancel request, or None."""
        value = self.client.get(aux_key("cancel", job_id))
        return float(value) if value is not None else None

    # ----- queues and workers ---------------------------------------------------------------------
    def queues(self) -> set[str]:
        return set(self.client.smembers(QUEUES_KEY))

    def heartbeat(self, beat: WorkerBeat) -> None:
        self.client.hset(WORKERS_KEY, beat.worker_id, beat.to_json())

    def remove_worker(self, worker_id: str) -> None:
        self.client.hdel(WORKERS_KEY, worker_id)

    def workers(self, *, alive_within: float = WORKER_GONE_AFTER_S) -> list[WorkerBeat]:
        """Workers whose heartbeat is younger than `alive_within` seconds."""
        now = time.time()
        beats = (WorkerBeat.from_json(w, raw) for w, raw in self.client.hgetall(WORKERS_KEY).items())
        return [beat for beat in beats if beat.is_live(now, alive_within)]

    def close(self) -> None:
        self.client.close()
