"""Storage outages seen by a shard attempt: storage did not answer, which is not the shard's fault.

An attempt that raised is a strike against its shard (worker/tasks.py), and FREIGHT_MAX_SHARD_ATTEMPTS
strikes fail it for good. An attempt that ended because storage did not answer (StorageUnavailableError
anywhere in its exception's chain: unreachable, timed out, SlowDown, 5xx, after the S3 client's own
retries) says nothing about the shard: like a machine loss it takes its strike back and counts in
`freight:outages:<job>` instead, against the larger FREIGHT_MAX_SHARD_STORAGE_OUTAGES. It is requeued
after a backoff that grows to FREIGHT_STORAGE_OUTAGE_BACKOFF_CAP_S (minutes: an outage lasts minutes,
not seconds). Past the budget the shard fails with a message that says storage was away and what to
do; if storage cannot even take that failure record, the shard stays queued (nothing is acked
unrecorded) and each later delivery, before its engine runs, only tries to record the failure again
(`outages_spent`, one try per backoff cap).
"""

from __future__ import annotations

import time

import redis
from celery.exceptions import Reject

from jobs.errors import StorageUnavailableError
from jobs.log import get_logger
from jobs.settings import Settings
from worker.runtime import ProcessRuntime
from worker.strike import Strike

log = get_logger(__name__)

BACKOFF_SLICE_S = 0.5  # a backoff wakes this often to see a shutdown or a spot notice


def storage_outage(exc: BaseException) -> StorageUnavailableError | None:
    """The StorageUnavailableError in `exc`'s chain (itself, __cause__, __context__), or None.

    Storage errors may reach a task wrapped (a pipeline stage raising its own error from one)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        err = todo.pop()
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, StorageUnavailableError):
            return err
        todo.extend(e for e in (err.__cause__, err.__context__) if e is not None)
    return None


def outage_backoff_s(settings: Settings, outages: int) -> float:
    """Seconds to wait before requeueing after the shard's `outages`-th outage: 2, 4, 8 ... s, capped."""
    return min(settings.storage_outage_backoff_cap_s, 2.0 ** min(outages, 30))


def outage_verdict(outages: int, limit: int, exc: BaseException | None) -> str | None:
    """Why the shard fails for good after its `outages`-th storage outage (`exc`, when known), or
    None to requeue it."""
    if outages < limit:
        return None
    last = f"; the last: {exc}" if exc is not None else ""
    return (
        f"storage was unavailable for {outages} attempts of this shard (FREIGHT_MAX_SHARD_STORAGE_OUTAGES="
        f"{limit}){last}. Its rows are not lost for good: check the storage endpoint "
        "(FREIGHT_S3_ENDPOINT_URL), the network and the credentials, then submit the job again "
        "(`freight submit` with the same arguments) to retry this shard"
    )


def back_off(rt: ProcessRuntime, seconds: float) -> None:
    """Sleep `seconds`, or less when this worker must stop (a shutdown or spot notice must not wait
    minutes; the message is requeued either way)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0 and not rt.stopping():
        time.sleep(min(BACKOFF_SLICE_S, left))


def outages_spent(rt: ProcessRuntime, job_id: str, shard: int) -> str | None:
    """Before an attempt runs: why the shard fails for good because its outage budget is spent (an
    earlier attempt could not record the failure: storage refused that write too), or None to run it.
    Past the budget the engine does not run again; only the failure record is written."""
    return outage_verdict(rt.live.storage_outages(job_id, shard), rt.settings.max_shard_storage_outages, None)


def count_outage(strike: Strike) -> int | None:
    """Count an outage instead of the attempt's strike (Strike.to_outage: its own strike back, if it still
    holds it); None when Redis does not answer either (the strike then stays: nothing better is known)."""
    try:
        return strike.to_outage()
    except redis.RedisError:
        log.exception("storage_outage_not_counted")
        return None


def outage_decision(rt: ProcessRuntime, strike: Strike, exc: StorageUnavailableError
                    ) -> tuple[int | None, str | None, float]:  # fmt: skip
    """The attempt that took `strike` (a shard's, or finalize's slot) ended because storage did not
    answer: count it as an outage, not a strike -> (its outages, None when Redis did not count it; the
    failure verdict past FREIGHT_MAX_SHARD_STORAGE_OUTAGES, else None; the seconds to back off before
    requeueing)."""
    s = rt.settings
    held = strike.held
    outages = count_outage(strike)
    verdict = outage_verdict(outages, s.max_shard_storage_outages, exc) if outages is not None else None
    log.warning("shard_storage_unavailable", shard=strike.shard, outages=outages,
                limit=s.max_shard_storage_outages, strike_taken_back=held and outages is not None,
                error=str(exc))  # fmt: skip
    return outages, verdict, outage_backoff_s(s, outages if outages is not None else 30)


def finalize_outage(rt: ProcessRuntime, strike: Strike, exc: Exception) -> bool:
    """finalize raised `exc`. Storage did not answer (and Redis counted it under `strike`'s slot): no strike,
    an outage; True past FREIGHT_MAX_SHARD_STORAGE_OUTAGES (the caller gives finalize up), else back
    off and requeue (raises Reject). False for any other failure: the caller's strike rules apply."""
    outage = storage_outage(exc)
    if outage is None:
        return False
    outages, verdict, wait = outage_decision(rt, strike, outage)
    if outages is None:
        return False
    if verdict is not None:
        return True
    back_off(rt, wait)
    raise Reject(f"finalize: storage unavailable ({outages} outages): {exc}", requeue=True) from exc
