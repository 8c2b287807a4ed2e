"""`freight submit | worker | wait | cancel`: distributed jobs through Celery on Redis.

submit/wait/cancel never import worker/ or torch; `freight worker` imports the Celery app lazily.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import redis
import typer
from kombu.exceptions import OperationalError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from freight_cli.common import EXIT_JOB_EXPIRED, EXIT_JOB_FAILED, fail, resolve_job
from freight_cli.job_estimate import MaxCostOpt, max_cost_check
from freight_cli.job_options import JobOptionValues, absolute, prepare_from_options, with_job_options
from freight_cli.lifecycle_options import CompletionWindowOpt, DeadlineOpt, NotifyOpt, lifecycle_from_options
from jobs.errors import FreightError
from jobs.settings import get_settings
from jobs.storage import ObjectStore


@with_job_options()
def submit(
    job: JobOptionValues,
    priority: int = typer.Option(0, help="0 (taken first) .. 9 (last)"),
    deadline: DeadlineOpt = None,
    as_json: bool = typer.Option(False, "--json", help="print a JSON summary before the job id"),
    completion_window: CompletionWindowOpt = None,
    notify: NotifyOpt = None,
    max_cost: MaxCostOpt = None,
) -> None:
    """Plan the job, write its manifest, queue its shards. Prints the job id as the last line.

    Submitting the same job again re-queues only shards not yet committed (a resume after a cancel,
    a lost Redis, or failed shards, which get a fresh attempt budget)."""
    from jobs.submission import submit_job

    try:
        lifecycle = lifecycle_from_options(completion_window, deadline, notify, time.time())
    except FreightError as exc:
        raise fail(str(exc)) from None
    settings = get_settings()
    model = job["model"]
    if not model.startswith("s3://") and not Path(model).exists():
        raise fail(f"model {model} does not exist: give a checkpoint folder or s3://bucket/prefix")
    try:
        prepared = prepare_from_options(settings, **job, check=max_cost_check(max_cost, settings, job["prices"]))
    except FreightError as exc:
        raise fail(str(exc)) from None
    spec = prepared.manifest.spec
    try:
        sub = submit_job(prepared, settings, priority=priority, deadline=lifecycle.deadline, lifecycle=lifecycle,
                         retry_for_s=settings.submit_redis_retry_s)  # fmt: skip
    except (redis.RedisError, OperationalError) as exc:
        from jobs.redact import redact_url

        raise fail(f"cannot queue the job on {redact_url(settings.redis_url)} ({exc}): start Redis or set "
                   "FREIGHT_REDIS_URL, then submit again (the manifest in OUT is kept)") from None  # fmt: skip
    except ValueError as exc:  # e.g. a priority out of range
        raise fail(str(exc)) from None
    summary = {"job_id": sub.job_id, "output": spec.output, "queue": sub.queue, "shards": sub.shards_total,
               "shards_enqueued": sub.shards_enqueued, "resumed": prepared.resumed,
               "enqueue_seconds": round(sub.enqueue_seconds, 4)}  # fmt: skip
    if as_json:
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        Console(stderr=True).print(
            f"queued {sub.shards_enqueued} of {sub.shards_total} shards on {sub.queue} ({spec.output})"
        )
    sys.stdout.write(sub.job_id + "\n")


def worker(
    concurrency: int = typer.Option(1, help="shard processes (one engine each; 1 per GPU)"),
    queues: list[str] = typer.Option(
        [], "--queues", "-Q",
        help="queues to consume (default: --model's; with neither, every freight queue with work, "
        "followed as jobs come and go)",
    ),
    model: str | None = typer.Option(
        None, help="consume the queue of this model (the URI jobs use) and load it at start"
    ),
    hostname: str | None = typer.Option(None, help="Celery node name (default: freight@<host>)"),
    loglevel: str = typer.Option("INFO", help="Celery's own log level"),
) -> None:
    """A Celery worker with freight's settings: takes shards, keeps its model loaded between them."""
    from jobs.client import queue_for_model

    names = [q for arg in queues for q in arg.split(",") if q]
    preload = absolute(model) if model else None  # as the submitted spec names it
    if preload:
        names.append(queue_for_model(preload))
    from worker.celery_app import app as celery_app  # lazy: the worker side
    from worker.queue_sync import IDLE_QUEUE

    # no queue named: serve every queue with work, added and dropped as jobs come (worker/queue_sync.py)
    celery_app.conf.update(freight_serve_all=not names, freight_preload_model=preload)
    argv = ["worker", "--pool=prefork", f"--concurrency={concurrency}", f"--queues={','.join(names or [IDLE_QUEUE])}",
            f"--loglevel={loglevel}", "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
    if hostname:
        argv.append(f"--hostname={hostname}")
    celery_app.worker_main(argv)


def wait(
    job_or_out: str = typer.Argument(..., help="job id or OUT"),
    timeout: float | None = typer.Option(None, help="give up after this many seconds (exit 3)"),
    poll: float = typer.Option(1.0, help="seconds between checks"),
) -> None:
    """Progress bar until the job ends. Exit 0 only when it succeeded; 1 failed or cancelled; 4 expired."""
    from jobs.job_watch import JobWatch
    from jobs.live_state import LiveState
    from jobs.storage import open_store

    settings = get_settings()
    try:
        _, out = resolve_job(job_or_out)
        store = open_store(out, settings)
        live = LiveState(settings.redis_url)
        watch = JobWatch(store, live, settings)  # re-queues lost shards; never polls an unknown job forever
        st = watch.check()
    except FreightError as exc:
        raise fail(str(exc)) from None
    deadline = time.monotonic() + timeout if timeout else None
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(f"job {st.job_id}", total=st.shards_total)
        while True:
            try:
                st = watch.check()
            except FreightError as exc:
                raise fail(str(exc)) from None
            desc = f"job {st.job_id} {st.state}: {st.shards_running} running, {st.shards_failed} failed"
            bar.update(task, completed=st.shards_committed, description=desc)
            if st.done:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise fail(f"job {st.job_id} still {st.state} after {timeout} s", code=3)
            time.sleep(poll)
    live.close()
    for f in st.failures:
        console.print(f"shard {f['shard']} failed after {f['attempts']} attempts: {f['reason']}")
    console.print(f"job {st.job_id}: {st.state}")
    if st.state == "expired":
        raise typer.Exit(EXIT_JOB_EXPIRED)
    if st.state != "succeeded":
        raise typer.Exit(EXIT_JOB_FAILED)


def cancel(job_or_out: str = typer.Argument(..., help="job id or OUT")) -> None:
    """Cancel: running shards stop at their next engine step, queued ones are skipped, committed stay."""
    from jobs.client import FleetClient
    from jobs.expiry import is_expired
    from jobs.markers import write_cancel
    from jobs.status import finished_state
    from jobs.storage import open_store

    settings = get_settings()
    try:
        job_id, out = resolve_job(job_or_out)
        store = open_store(out, settings)
        ended = finished_state(store)
    except FreightError as exc:
        raise fail(str(exc)) from None
    if ended is not None:  # _CANCELLED beside _SUCCESS or failures.json would contradict them
        raise fail(f"job {job_id} already {ended}: there is nothing to cancel ({out})")
    if is_expired(store):
        raise fail(f"job {job_id} already expired: there is nothing to cancel ({out})")
    first = write_cancel(store, job_id)  # durable: outlives Redis
    client = FleetClient(settings, retry_for_s=5.0)
    try:
        client.cancel(job_id=job_id)
    except redis.RedisError as exc:
        raise fail(f"wrote {out}/_CANCELLED, but Redis did not answer ({exc}): running shards stop only "
                   "when they next start or when Redis is back") from None  # fmt: skip
    finally:
        client.close()
    if first:
        _notify_cancelled(store, settings)
    Console(stderr=True).print(f"job {job_id} cancelled; committed shards stay in {out}")


def _notify_cancelled(store: ObjectStore, settings: Any) -> None:
    """The "cancelled" notification (once), with the cost so far; waits FREIGHT_NOTIFY_DRAIN_S at most."""
    from jobs.finalize import committed_shards, report_now
    from jobs.lifecycle import read_lifecycle
    from jobs.manifest import read_manifest
    from jobs.notify import notifier, notify_final

    if not read_lifecycle(store).notify:
        return
    manifest = read_manifest(store)
    report = report_now(store, manifest, sorted(committed_shards(store)))
    if notify_final(store, manifest, "cancelled", report, settings):
        notifier(settings).drain(settings.notify_drain_s)


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""
    app.command("submit")(submit)
    app.command("worker")(worker)
    app.command("wait")(wait)
    app.command("cancel")(cancel)
