"""Earlier attempts of a shard, seen from a new one: alive (wait for it), or gone (bill it as lost).

A shard's message can be delivered again while its first attempt still runs: the reaper judged its
node gone (a Redis outage longer than a minute, a frozen main process), or kombu's visibility
timeout passed without a renewal. That first attempt is alive when a fresh heartbeat (three
beats at most) says its process runs exactly that attempt (job, shard, attempt number). The
new attempt then neither bills it as lost nor computes the shard a second time: it waits until the
first one commits (then this one ends as already_committed) or is gone (then this one runs).

Also here: the model's measured rate that sizes each attempt's deadline (worker/deadline.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from jobs.log import get_logger
from jobs.manifest import Manifest, shard_result_key
from jobs.progress import RATES_KEY, WORKER_GONE_AFTER_S, WORKERS_KEY, WorkerBeat, aux_key
from jobs.storage import ObjectStore
from worker.runtime import ProcessRuntime

log = get_logger(__name__)

WAIT_POLL_S = 2.0
RATE_WEIGHT = 0.3  # weight of the newest shard in the model's rate (exponential moving average)


def alive_within_s(rt: ProcessRuntime) -> float:
    """How fresh a heartbeat must be to show a running attempt: three beats missed is gone (30 s
    with the default 10 s beats), never longer than WORKER_GONE_AFTER_S."""
    return min(WORKER_GONE_AFTER_S, max(3 * rt.settings.heartbeat_s, 5.0))


def attempt_alive(rt: ProcessRuntime, job_id: str, shard: int, previous: dict[str, Any], now: float) -> bool:
    """True when a fresh heartbeat says `previous` (a `freight:started` entry) is still running."""
    raw = rt.live.client.hget(WORKERS_KEY, str(previous.get("worker", "")))
    if not raw:
        return False
    try:
        beat = WorkerBeat.from_json(str(previous.get("worker")), raw)
    except ValueError:
        return False
    return beat.is_live(now, alive_within_s(rt)) and beat.runs(job_id, shard, int(previous.get("attempt", -1)))


def wait_for_previous(
    rt: ProcessRuntime,
    store: ObjectStore,
    job_id: str,
    shard: int,
    previous: dict[str, Any],
    should_stop: Callable[[], bool],
) -> str:
    """Wait while the previous attempt lives. Returns "committed" (it committed the shard),
    "gone" (it ended or vanished without a commit) or "stopped" (this worker must stop now)."""
    log.warning("duplicate_delivery_waiting", live_attempt=previous.get("attempt"),
                live_worker=previous.get("worker"))  # fmt: skip
    while True:
        if store.exists(shard_result_key(shard)):
            return "committed"
        try:
            alive = attempt_alive(rt, job_id, shard, previous, time.time())
        except redis.RedisError:
            alive = True  # cannot tell: keep waiting (storage still answers for the commit)
        if not alive:
            return "committed" if store.exists(shard_result_key(shard)) else "gone"
        if should_stop():
            return "stopped"
        time.sleep(WAIT_POLL_S)


def unfinished_strikes(rt: ProcessRuntime, job_id: str, shard: int) -> int:
    """Attempts of the shard that have not ended cleanly, this one included."""
    return int(rt.live.client.hget(aux_key("strikes", job_id), str(shard)) or 0)


def rate_key(manifest: Manifest) -> str:
    return f"{manifest.spec.model}|{manifest.spec.quantization_label or ''}"


def model_rate(rt: ProcessRuntime, manifest: Manifest) -> float | None:
    """Completion tokens per engine-second measured on this job's model (None until one shard ran)."""
    try:
        raw = rt.live.client.hget(RATES_KEY, rate_key(manifest))
    except redis.RedisError:
        return None
    return float(raw) if raw else None


def record_rate(rt: ProcessRuntime, manifest: Manifest, completion_tokens: int, busy_seconds: float) -> None:
    """Fold one committed shard's completion tokens per engine-second into the model's rate."""
    if busy_seconds <= 0 or completion_tokens <= 0:
        return
    rate = completion_tokens / busy_seconds
    old = model_rate(rt, manifest)
    new = rate if old is None else (1 - RATE_WEIGHT) * old + RATE_WEIGHT * rate
    try:
        rt.live.client.hset(RATES_KEY, rate_key(manifest), repr(round(new, 3)))
    except redis.RedisError as exc:
        log.warning("rate_not_recorded", error=str(exc))
