"""`freight beat`: Celery beat over a suite file, one beat per file (jobs/evals/lock.py).

The schedule's entries (jobs/evals/schedule.py) name local handlers, which the scheduler runs in
the beat process instead of publishing them:
- submit: start a run of the suite in `<output>/<suite>/<run id>/`, its jobs queued through the
  client (by task name), and leave a marker `_pending/<suite>/<run id>.json` in `output`.
- collect: for each pending marker whose jobs have all finished, score the run, record it in the
  history, write its report, and drop the marker.
The scheduler keeps its state in memory (no shelve file: freight never pickles); a restarted beat
simply waits for the next cron time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery
from celery.beat import Scheduler, Service

from jobs.errors import FreightError
from jobs.evals.collect import EvalIncompleteError, collect
from jobs.evals.lock import BeatLock
from jobs.evals.plan import JobExecutor, new_run_id, start_run
from jobs.evals.schedule import COLLECT_TASK, SUBMIT_TASK, build_schedule
from jobs.evals.suite import SuiteError
from jobs.evals.suite_loader import load_suite_file, parse_suite_text
from jobs.log import get_logger
from jobs.storage import open_store

log = get_logger(__name__)
PENDING_PREFIX = "_pending/"
TICK_SECONDS = 5.0  # longest sleep between checks of the lock and the schedule
Handler = Callable[..., None]


def submit_suite(suite_path: str, suite_name: str, execute: JobExecutor) -> str:
    """Start one scheduled run; returns its OUT. The suite file is reloaded so edits take effect."""
    suite_file = load_suite_file(suite_path)
    run_id = new_run_id()
    store = open_store(suite_file.output)
    output = store.url_of(f"{suite_name}/{run_id}")
    start_run(suite_file, output, execute, suite_names=[suite_name], run_id=run_id)
    store.put(f"{PENDING_PREFIX}{suite_name}/{run_id}.json", json.dumps({"output": output}).encode())
    log.info("eval run submitted", suite=suite_name, run_id=run_id, output=output)
    return output


def collect_pending(suite_path: str) -> list[str]:
    """Report every pending run whose jobs are done; returns the OUTs reported."""
    # only `output` is needed: skip reading the datasets' schemas every minute
    suite_file = parse_suite_text(
        Path(suite_path).read_text(encoding="utf-8"), Path(suite_path), read_columns=None
    )
    store = open_store(suite_file.output)
    done = []
    for key in store.list(PENDING_PREFIX):
        output = json.loads(store.get(key))["output"]
        try:
            report = collect(output)
        except EvalIncompleteError:
            continue
        except FreightError as exc:
            log.error("eval run cannot be reported", output=output, error=str(exc))
            continue
        store.delete(key)
        done.append(output)
        log.info("eval run reported", output=output, regressions=report.regressions)
    return done


def make_handlers(execute: JobExecutor) -> dict[str, Handler]:
    """Task name -> what the beat process does for it."""

    def submit(suite_path: str, suite_name: str) -> None:
        try:
            submit_suite(suite_path, suite_name, execute)
        except (FreightError, SuiteError) as exc:  # one bad night must not stop beat
            log.error("scheduled eval not submitted", suite=suite_name, error=str(exc))

    def collect_all(suite_path: str) -> None:
        try:
            collect_pending(suite_path)
        except FreightError as exc:
            log.error("scheduled evals not collected", error=str(exc))

    return {SUBMIT_TASK: submit, COLLECT_TASK: collect_all}


def scheduler_class(handlers: dict[str, Handler], lock: BeatLock | None) -> type[Scheduler]:
    """A beat Scheduler that runs `handlers` in process and stops when `lock` is lost."""

    class EvalScheduler(Scheduler):
        def send_task(self, name: str, args: Any = (), kwargs: Any = None, **options: Any) -> None:
            handler = handlers.get(name)
            if handler is None:
                raise ValueError(f"beat entry names unknown task {name!r}")
            handler(*(args or ()), **(kwargs or {}))

        def tick(self, *args: Any, **kwargs: Any) -> float:
            if lock is not None and lock.lost.is_set():
                raise SystemExit("freight beat: the suite file's lock was lost; another beat may run now")
            return min(super().tick(*args, **kwargs), TICK_SECONDS)

    return EvalScheduler


def configure_app(app: Celery, suite_path: str) -> dict[str, dict[str, Any]]:
    """Put the suite file's schedule on `app` (UTC); returns it."""
    schedule = build_schedule(load_suite_file(suite_path))
    app.conf.beat_schedule = schedule
    app.conf.timezone = "UTC"
    app.conf.enable_utc = True
    return schedule


def run_beat(app: Celery, suite_path: str, execute: JobExecutor, lock: BeatLock) -> None:
    """Block running beat for the suite file while holding `lock` (acquired and released here)."""
    schedule = configure_app(app, suite_path)
    if not schedule:
        raise SuiteError(f"{suite_path}: no suite has a `schedule`; add one (a cron string) to run beat")
    with lock:
        scheduler = scheduler_class(make_handlers(execute), lock)
        service = Service(app, max_interval=TICK_SECONDS, scheduler_cls=scheduler, remote_control=False)
        log.info("beat started", suite_file=suite_path, entries=sorted(schedule))
        service.start()  # returns on Ctrl-C / SIGTERM, or when the lock is lost
    if lock.lost.is_set():
        raise FreightError(
            f"beat for {suite_path} stopped: its Redis lock was lost (Redis unreachable or the key deleted)"
        )
