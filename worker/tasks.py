"""Thin Celery tasks: freight.run_shard and freight.finalize. Tasks take ids (job, OUT, shard), not data.

run_shard, every delivery (Celery on Redis may deliver one shard more than once):
1. count the attempt at its START in Redis, before anything that can crash (a SIGKILLed worker
   records nothing later);
2. skip when the shard is committed, failed, or the job cancelled (a repeated delivery is a no-op);
   a shard whose attempts keep dying without an end is poison: past `max_shard_attempts` it is failed;
3. run the pipeline's `run_shard` with `should_stop` = spot notice | worker shutdown | job cancelled;
4. committed -> progress, and finalize once every shard is done; stopped by an interruption or a
   shutdown -> the finished rows are in OUT/partial/, the shard is handed back (requeued) for another
   worker; stopped by cancel -> done; an exception -> the attempt billed as waste (reason "error"),
   then requeued (after a backoff) until the attempts run out, then failed with the exception as
   the reason; an exception that says storage did not answer is no strike (worker/outages.py), nor
   is a manifest that a newer freight wrote (handed back for a newer worker).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import redis
import structlog
from celery.exceptions import Reject

from jobs.client import TASK_FINALIZE, TASK_RUN_SHARD
from jobs.errors import NewerManifestError
from jobs.expiry import finalize_and_notify
from jobs.lifecycle import read_lifecycle
from jobs.log import get_logger
from jobs.manifest import Manifest, read_manifest, shard_result_key, waste_key
from jobs.markers import is_cancelled as is_cancelled_in_store
from jobs.markers import is_failed
from jobs.storage import ObjectStore, open_store
from worker.attempts import attempt_alive, model_rate, record_rate, unfinished_strikes, wait_for_previous
from worker.celery_app import app
from worker.deadline import ProgressDeadline, attempt_deadline
from worker.local import lazy_engine, load_engine
from worker.outages import back_off, finalize_outage, outage_decision, storage_outage
from worker.outcomes import (
    expire_if_over,
    finish_if_done,
    mark_failed,
    poison_reason,
    record_failed_attempt,
    record_lost_attempt,
)
from worker.runtime import ProcessRuntime, runtime
from worker.shard_stop import ShardStop
from worker.strike import Strike

log = get_logger(__name__)
JOB_CACHES_HELD = 4  # jobs whose result-cache index a worker process keeps loaded
FINALIZE_SLOT = -1  # attempts of finalize are counted under this shard index
ERROR_BACKOFF_CAP_S = 30.0  # sleep before requeueing a failed attempt: 2, 4, 8 ... s


@dataclass(frozen=True)
class ShardAttempt:
    """One delivery of a shard, counted: the job, its OUT, the shard, the attempt's number and strike,
    and when the task was entered (queue wait and billing start there)."""

    job_id: str
    output: str
    shard: int
    attempt: int
    strike: Strike
    entered: float


def _engine_for(rt: ProcessRuntime, manifest: Manifest, on_load: Callable[[], None]) -> tuple[Any, float]:
    """(engine, load seconds charged to this shard): the process's engine when it holds this job's
    model, else a LazyEngine that loads it through the process's model cache when the shard has rows
    the result cache does not answer; the load runs under the unmeasured deadline, `on_load` after it."""
    spec = manifest.spec
    key: tuple = (spec.model, spec.quantization)  # the key `freight worker --model` preloads
    if spec.quant_group is not None:
        key += (spec.quant_group,)
    if spec.speculative is not None:
        key += (spec.speculative, spec.speculative_tokens)

    def load() -> tuple[Any, float]:
        rt.set_deadline(attempt_deadline(rt.settings, time.time(), None, None))
        loaded = rt.models.get_timed(key, lambda: load_engine(manifest, rt.settings)[0])
        on_load()
        return loaded

    if rt.models.loaded_key == key:
        return rt.models.get_timed(key, lambda: load_engine(manifest, rt.settings)[0])
    return lazy_engine(manifest, rt.settings, load=load), 0.0


def _cache_for(rt: ProcessRuntime, store: ObjectStore, manifest: Manifest, engine: Any) -> Any:
    """The job's result cache (None: the job has none), opened once per job in this process."""
    from worker.result_cache import open_job_cache

    key = (manifest.job_id, store.url)
    if key not in rt.job_caches:
        rt.job_caches[key] = open_job_cache(store, manifest, engine, rt.settings)
        while len(rt.job_caches) > JOB_CACHES_HELD:
            rt.job_caches.popitem(last=False)
    rt.job_caches.move_to_end(key)
    return rt.job_caches[key]


@app.task(name=TASK_RUN_SHARD, bind=True)
def run_shard_task(self: Any, job_id: str, output: str, shard: int) -> dict[str, Any]:
    entered = time.time()  # queue overhead = this - the publish time in the message header
    rt = runtime()
    with structlog.contextvars.bound_contextvars(job_id=job_id, shard=shard):
        # Counted first, before anything that can crash or hang (storage, model load, engine).
        try:
            attempt, strikes = rt.live.begin_attempt(job_id, shard)
        except redis.RedisError as exc:  # an uncounted attempt must not run, nor be acked and lost
            raise Reject(f"cannot count the attempt ({exc})", requeue=True) from exc
        at = ShardAttempt(job_id, output, shard, attempt, Strike(rt.live, job_id, shard, strikes), entered)
        rt.metrics.attempts.inc()
        with structlog.contextvars.bound_contextvars(attempt=attempt):
            try:
                return _run(self, rt, at)
            except Reject:
                raise
            except NewerManifestError as exc:
                _newer_job(rt, at.strike, exc)
            except Exception as exc:  # this attempt failed: requeue it, or give up after the last one
                log.exception("shard_error", error=str(exc))
                rt.metrics.outcomes.labels("error" if storage_outage(exc) is None else "storage_outage").inc()
                return _after_error(rt, at, exc)


def _after_error(rt: ProcessRuntime, at: ShardAttempt, exc: Exception) -> dict[str, Any]:
    """Bill the failed attempt as an error, then give the shard up past its budget, or requeue it after a
    backoff. The budget: FREIGHT_MAX_SHARD_ATTEMPTS strikes less node losses; an attempt that storage
    did not answer is no strike but an outage, against FREIGHT_MAX_SHARD_STORAGE_OUTAGES (worker/outages.py).
    An exception after the attempt took its strike back (it ended cleanly, then finishing up failed)
    counts no strike: `strike.unclean` leaves it out."""
    job_id, shard, attempt, strike = at.job_id, at.shard, at.attempt, at.strike
    outage = storage_outage(exc)
    verdict, wait = None, min(ERROR_BACKOFF_CAP_S, 2.0**strike.count)  # a transient cause may pass
    if outage is not None:
        _, verdict, wait = outage_decision(rt, strike, outage)
    try:
        store = open_store(at.output, rt.settings)
        manifest = read_manifest(store)
        record_failed_attempt(rt, store, manifest, shard, attempt, at.entered)
        struck = strike.unclean - rt.live.node_losses(job_id, shard)
        if outage is None and struck >= rt.settings.max_shard_attempts:
            verdict = f"{type(exc).__name__}: {exc}"
        if verdict is not None:
            mark_failed(rt, store, manifest, shard, attempt, verdict)
            finish_if_done(rt, store, manifest, app)
            return {"status": "failed"}
    except Exception:  # storage or Redis down too: requeue, never ack a lost shard; the next delivery
        log.exception("error_handling_failed")  # bills this attempt as lost and gives up past the limit
    with contextlib.suppress(redis.RedisError):
        rt.live.transition(job_id, shard, "queued")
    back_off(rt, wait)  # in slices: a shutdown or spot notice does not wait it out
    raise Reject(f"attempt {attempt} failed: {exc}", requeue=True) from exc


def _newer_job(rt: ProcessRuntime, strike: Strike, exc: NewerManifestError) -> NoReturn:
    """A newer freight wrote the job's manifest (a fleet mid-upgrade): not the shard's fault, so no
    strike (a newer worker must not find its budget spent); handed back after a backoff, for a newer
    worker to take. Raises Reject."""
    log.warning("shard_manifest_newer", error=str(exc), then="handed back for a newer worker; upgrade this one")
    strike.release()
    back_off(rt, ERROR_BACKOFF_CAP_S)
    raise Reject(f"shard handed back: {exc}", requeue=True) from exc


def _run(task: Any, rt: ProcessRuntime, at: ShardAttempt) -> dict[str, Any]:
    job_id, shard, attempt, strike, entered = at.job_id, at.shard, at.attempt, at.strike, at.entered
    strikes = strike.count
    store = open_store(at.output, rt.settings)
    manifest = read_manifest(store)
    committed = store.exists(shard_result_key(shard))
    previous = rt.live.swap_attempt_start(
        job_id, shard, {"attempt": attempt, "worker": rt.worker_id, "at": entered}
    )
    if strikes > 1 and previous is not None and not committed:
        waited = "gone"
        if attempt_alive(rt, job_id, shard, previous, time.time()):  # a duplicate delivery
            stop = ShardStop(rt, job_id, engine_steps=False)
            waited = wait_for_previous(rt, store, job_id, shard, previous, stop)
            if waited == "stopped" and stop.reason != "cancelled":
                strike.release()
                raise Reject(f"shard handed back: {rt.stop_reason()}", requeue=True)
            committed = waited == "committed"
        if waited == "gone" and unfinished_strikes(rt, job_id, shard) > 1:  # the last attempt died mid-shard
            record_lost_attempt(rt, store, manifest, shard, previous, entered)
    skip = None
    if committed:
        rt.live.transition(job_id, shard, "committed")  # e.g. a redelivery after a commit
        skip = "already_committed"
    elif is_failed(store, shard):
        skip = "failed"
    elif rt.live.is_cancelled(job_id) or is_cancelled_in_store(store):
        rt.live.transition(job_id, shard, "cancelled")
        skip = "cancelled"
    elif read_lifecycle(store).past_due():
        rt.live.transition(job_id, shard, "expired")
        skip = "expired"
    elif (poison := poison_reason(rt, job_id, shard, strikes)) is not None:
        mark_failed(rt, store, manifest, shard, attempt, poison)
        skip = "failed"
    if skip is not None:
        strike.release()
        log.info("shard_skipped", status=skip)
        if skip == "expired":
            expire_if_over(rt, store, manifest)
        else:
            finish_if_done(rt, store, manifest, app)
        return {"status": skip}
    return _attempt(task, rt, store, manifest, at)


def _attempt(
    task: Any, rt: ProcessRuntime, store: ObjectStore, manifest: Manifest, at: ShardAttempt
) -> dict[str, Any]:
    from worker.shard import RowProgress, run_shard  # lazy: pulls the engine's request types

    job_id, shard, attempt, strike, entered = manifest.job_id, at.shard, at.attempt, at.strike, at.entered
    enqueued_at = (task.request.headers or {}).get("enqueued_at") or getattr(
        task.request, "enqueued_at", None
    )
    log.info(
        "shard_started",
        queue_wait_s=round(entered - enqueued_at, 4) if enqueued_at else None,
        preamble_s=round(time.time() - entered, 4),  # attempt count + storage checks before the engine
        redelivered=bool((task.request.delivery_info or {}).get("redelivered")),
    )
    rt.live.transition(job_id, shard, "running")
    stop = ShardStop(rt, job_id, due=read_lifecycle(store).deadline)
    start = time.perf_counter()
    rt.busy = True
    rt.metrics.busy.set(1)
    # until the engine is ready (model load included) the attempt gets the unmeasured allowance
    rt.begin_attempt(job_id, shard, attempt, attempt_deadline(rt.settings, time.time(), None, None))
    try:
        rows, max_tokens = manifest.shards[shard].rows, manifest.spec.sampling.max_tokens
        rate = model_rate(rt, manifest)

        def measured() -> None:  # the engine is ready: the deadline of the shard's estimated work
            rt.set_deadline(attempt_deadline(rt.settings, time.time(), rows * max_tokens, rate))

        engine, load_s = _engine_for(rt, manifest, measured)
        measured()
        progress = ProgressDeadline(rt.settings, rows, max_tokens, rate, rt.extend_deadline)

        def on_row(row: RowProgress) -> None:
            rt.record_row(row)
            progress()  # a finished row: the deadline counts the rows left from now

        outcome = run_shard(engine, store, manifest, shard, attempt=attempt, should_stop=stop,
                            load_seconds=load_s, on_row=on_row, settings=rt.settings,
                            result_cache=_cache_for(rt, store, manifest, engine))  # fmt: skip
    finally:
        rt.busy = False
        rt.metrics.busy.set(0)
        rt.end_attempt()
    seconds = time.perf_counter() - start
    strike.release()
    # alive after all: a duplicate delivery that judged this attempt gone must not have it billed twice
    store.delete(waste_key(shard, attempt, "lost"))
    rt.metrics.shard_seconds.labels(outcome.status).observe(seconds)
    rt.metrics.outcomes.labels(outcome.status).inc()
    if outcome.attempt_record is not None:
        rt.metrics.wasted_seconds.inc(outcome.attempt_record.billed_seconds)
    if outcome.status == "interrupted":
        log.warning("shard_stopped", reason=stop.reason, why=rt.stop_reason() if stop.reason == "interrupted"
                    else f"job {stop.reason}", rows_saved=outcome.rows, engine_checks=stop.checks,
                    steps_after_cancel=stop.steps_after_cancel)  # fmt: skip
        if stop.reason == "cancelled":
            rt.live.transition(job_id, shard, "cancelled")
            return {"status": "cancelled", "rows_saved": outcome.rows}
        if stop.reason == "expired":  # its finished rows are in OUT/partial/, billed; a resubmit reads them
            rt.live.transition(job_id, shard, "expired")
            expire_if_over(rt, store, manifest)
            return {"status": "expired", "rows_saved": outcome.rows}
        rt.live.transition(job_id, shard, "queued")
        raise Reject(f"shard handed back: {rt.stop_reason()}", requeue=True)
    record = outcome.record
    tokens = (record.prompt_tokens + record.completion_tokens) if record else 0
    if record is not None:
        record_rate(rt, manifest, record.completion_tokens, record.busy_seconds)
    rt.live.transition(job_id, shard, "committed", rows=outcome.rows, tokens=tokens)
    log.info("shard_done", status=outcome.status, rows=outcome.rows, seconds=round(seconds, 3))
    finish_if_done(rt, store, manifest, app)
    return {"status": outcome.status, "rows": outcome.rows}


@app.task(name=TASK_FINALIZE, bind=True)
def finalize_task(self: Any, job_id: str, output: str) -> dict[str, Any]:
    """Idempotent: cost.json and _SUCCESS are written with put_if_absent, so a repeat changes nothing.
    A failure is requeued after a backoff, `max_shard_attempts` times at most; storage that does not
    answer is no strike but an outage, `max_shard_storage_outages` at most (worker/outages.py)."""
    rt = runtime()
    with structlog.contextvars.bound_contextvars(job_id=job_id):
        _, strikes = rt.live.begin_attempt(job_id, FINALIZE_SLOT)
        strike = Strike(rt.live, job_id, FINALIZE_SLOT, strikes)
        try:
            store = open_store(output, rt.settings)
            report = finalize_and_notify(store, read_manifest(store), rt.settings)
        except NewerManifestError as exc:
            _newer_job(rt, strike, exc)
        except Exception as exc:
            log.exception("finalize_error", error=str(exc))
            if finalize_outage(rt, strike, exc) or strikes >= rt.settings.max_shard_attempts:
                raise  # logged and acked; `freight submit` of the job again retries finalize
            back_off(rt, min(ERROR_BACKOFF_CAP_S, 2.0**strikes))  # in slices, as a shard's: a shutdown does not wait
            raise Reject(f"finalize failed: {exc}", requeue=True) from exc
        strike.release()
        rt.live.set_job_state(job_id, "succeeded")
        log.info("job_finalized", rows=report.get("rows"), cost_usd=report.get("cost_usd"))
        return {"status": "succeeded"}
