"""The batch process: where a server's batches are validated, run (or queued on the fleet) and
finished, away from the API process so that the API answers fast while a batch computes.

One loop (`BatchProcess.run`), every ServeConfig.poll_s or when the API nudges it:

- it leads or waits (jobs/api/leader.py): one batch process per store does batch work;
- for each batch on the work list (`active/`), oldest first, it moves the batch on:
  validating  -> plan the job (jobs/api/batch_plan.py) -> in_progress, or failed with errors.data;
                 the job's cache options (OUT/cache.json): the tenant's own result cache, or none;
  in_progress -> the executor runs the job (jobs/api/executor.py); live request counts; a cancel
                 (the job's _CANCELLED) or the completion window's end stops it; when it ends:
                 succeeded -> finalizing -> completed; cancelled / expired / failed -> that status,
                 each with its output and error files (jobs/api/batch_export.py);
  finalizing  -> the files written again (a process that died mid-way), completed;
- every ServeConfig.sweep_s, the sweeper (jobs/api/retention.py).

Everything it knows is in the store, so a new batch process (a restarted server) picks each batch up
where it was: a job in progress resumes from its committed shards and saved partial rows.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from jobs.api.batch_export import Ending, finish_batch
from jobs.api.batch_plan import PlanFailure, plan_batch
from jobs.api.batches import BatchRecord, RequestCounts, cancel_key, cancel_time, read_record, save_record
from jobs.api.config import ServeConfig
from jobs.api.executor import MAX_UNCLEAN_RUNS, BatchJob, Executor, Outcome, unclean_runs
from jobs.api.layout import ACTIVE_PREFIX, active_key, job_prefix, parse_active, sub_store
from jobs.api.leader import Leadership
from jobs.api.retention import OrphanSweep, sweep
from jobs.errors import StorageUnavailableError
from jobs.expiry import expire_job
from jobs.log import get_logger
from jobs.manifest import read_manifest
from jobs.result_cache.options import write_cache_options
from jobs.settings import Settings
from jobs.storage import ObjectStore

log = get_logger(__name__)

PROGRESS_EVERY_S = 1.0  # a running batch's request counts are written at most this often


class BatchProcess:
    def __init__(self, store: ObjectStore, config: ServeConfig, settings: Settings, executor: Executor) -> None:
        self.store, self.config, self.settings, self.executor = store, config, settings, executor
        self.leader = Leadership(store)
        self._jobs: dict[str, BatchJob] = {}  # batches whose job this process has started, by id
        self._counts_at: dict[str, float] = {}
        self._inputs: set[tuple[str, str]] = set()  # (tenant, file id) of unfinished batches' inputs
        self._swept_at = 0.0
        self._orphans = OrphanSweep()

    def run(self, stop: threading.Event, wake: threading.Event) -> None:
        """Loop until `stop` is set; `wake` cuts a wait short. Unfinished work resumes at the next start."""
        try:
            while not stop.is_set():
                try:
                    if self.leader.hold():
                        self.step()
                        self._sweep()
                except StorageUnavailableError as exc:
                    log.warning("batch_process_storage_unavailable", error=str(exc))
                except Exception as exc:  # one bad pass must not end the process: the next one retries
                    log.error("batch_process_pass_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
                wake.wait(self.config.poll_s)
                wake.clear()
        finally:
            self.executor.close()
            self.leader.release()

    def step(self) -> None:
        """One pass over the work list."""
        entries = sorted((parse_active(k) for k in self.store.list(ACTIVE_PREFIX)), key=lambda e: e[1])
        inputs: set[tuple[str, str]] = set()
        for tenant, batch_id in entries:
            record = read_record(self.store, tenant, batch_id)
            if record is None or record.final:
                self.store.delete(active_key(tenant, batch_id))
                continue
            inputs.add((tenant, record.input_file_id))
            try:
                self.advance(record)
            except StorageUnavailableError:
                raise
            except Exception as exc:
                log.error("batch_failed_unexpectedly", batch_id=batch_id, error=f"{type(exc).__name__}: {exc}",
                          exc_info=exc)  # fmt: skip
                self._fail_hard(record, f"the server could not run this batch ({type(exc).__name__}: {exc})")
        self._inputs = inputs

    def advance(self, record: BatchRecord) -> None:
        """Move one unfinished batch on as far as it goes now."""
        cancel_at = cancel_time(self.store, record.tenant, record.id)
        if record.status == "validating":
            self._validate(record, cancel_at)
            return
        job = self._job(record)
        if record.status == "finalizing":
            self._end(record, job, Outcome("succeeded"), cancel_at)
            return
        if record.id not in self._jobs and not self._take_up(record, job, resumed=True):
            return
        outcome = self.executor.outcome(job)
        if outcome is None and cancel_at is not None:
            if self.executor.withdraw(job):
                outcome = Outcome("cancelled")
            else:
                self.executor.cancel(job)
        elif outcome is None and time.time() >= job.deadline and self.executor.withdraw(job):
            outcome = Outcome("expired")
        if outcome is None:
            self._progress(record, job)
        elif outcome.kind == "interrupted":
            self._jobs.pop(record.id, None)  # this process is stopping; the next one resumes it
        else:
            self._end(record, job, outcome, cancel_at)

    def _validate(self, record: BatchRecord, cancel_at: int | None) -> None:
        planned = plan_batch(self.store, record, self.config, self.settings)
        if isinstance(planned, PlanFailure):
            save_record(self.store, record.model_copy(update={
                "status": "failed", "failed_at": int(time.time()), "errors": {"object": "list", "data": planned.errors},
                "request_counts": RequestCounts(total=record.request_counts.total),
            }))  # fmt: skip
            log.info("batch_invalid", batch_id=record.id, tenant=record.tenant, errors=planned.errors[:3])
            return
        record = record.model_copy(update={"job_id": planned.manifest.job_id, "model": planned.manifest.spec.model_name
                                           or planned.manifest.spec.model})  # fmt: skip
        job = self._job(record)
        if cancel_at is not None:
            self._end(record, job, Outcome("cancelled"), cancel_at)
        elif time.time() >= job.deadline:
            self._end(record, job, Outcome("expired"), cancel_at)
        elif self._take_up(record, job, resumed=False):
            save_record(self.store, record.model_copy(update={"status": "in_progress", "in_progress_at": int(time.time())}))
            log.info("batch_started", batch_id=record.id, tenant=record.tenant, job_id=record.job_id,
                     requests=record.request_counts.total)  # fmt: skip

    def _take_up(self, record: BatchRecord, job: BatchJob, *, resumed: bool) -> bool:
        """Hand the job to the executor; False (and the batch failed) after MAX_UNCLEAN_RUNS crashes."""
        crashes = unclean_runs(job)
        if crashes >= MAX_UNCLEAN_RUNS:
            self._end(record, job, Outcome("failed", f"the batch process died {crashes} times while running this "
                                           "batch (out of memory, killed): it is not run again"), None)  # fmt: skip
            return False
        # each take-up writes the running server's options, as each run or submit of a job does: a
        # server restarted with another --result-cache (or none) runs the rest of the batch with it
        write_cache_options(job.store, self.config.tenant_cache(record.tenant))
        self.executor.start(job, resumed=resumed)
        self._jobs[record.id] = job
        return True

    def _job(self, record: BatchRecord) -> BatchJob:
        known = self._jobs.get(record.id)
        if known is not None:
            return known
        store = sub_store(self.store, job_prefix(record.tenant, record.id), self.settings)
        return BatchJob(tenant=record.tenant, batch_id=record.id, store=store, manifest=read_manifest(store),
                        deadline=float(record.expires_at), cancel_key=cancel_key(record.tenant, record.id))  # fmt: skip

    def _progress(self, record: BatchRecord, job: BatchJob) -> None:
        counts = self.executor.progress(job)
        now = time.monotonic()
        if counts is None or now - self._counts_at.get(record.id, 0.0) < PROGRESS_EVERY_S:
            return
        completed, failed = counts
        if (completed, failed) != (record.request_counts.completed, record.request_counts.failed):
            total = record.request_counts.total
            save_record(self.store, record.model_copy(update={
                "request_counts": RequestCounts(total=total, completed=completed, failed=failed)}))  # fmt: skip
            self._counts_at[record.id] = now

    def _end(self, record: BatchRecord, job: BatchJob, outcome: Outcome, cancel_at: int | None) -> None:
        """The job ended: the batch's files and final record."""
        self._jobs.pop(record.id, None)
        self._counts_at.pop(record.id, None)
        errors: list[dict[str, Any]] | None = None
        if outcome.kind == "succeeded" and record.status != "finalizing":
            record = record.model_copy(update={"status": "finalizing", "finalizing_at": int(time.time())})
            save_record(self.store, record)
        elif outcome.kind == "expired":
            expire_job(job.store, job.manifest, self.settings)
        elif outcome.kind == "failed":
            errors = [{"code": "batch_failed", "message": outcome.message, "param": None, "line": None}]
        final = finish_batch(self.store, record, job.store, job.manifest, Ending(outcome.kind, errors), self.config,
                             self.settings, cancel_at)  # fmt: skip
        log.info("batch_ended", batch_id=final.id, tenant=final.tenant, status=final.status,
                 completed=final.request_counts.completed, failed=final.request_counts.failed)  # fmt: skip

    def _fail_hard(self, record: BatchRecord, message: str) -> None:
        """A batch this process cannot move on: failed, with files when its job exists."""
        self._jobs.pop(record.id, None)
        errors = [{"code": "server_error", "message": message, "param": None, "line": None}]
        try:
            job = self._job(record) if record.job_id is not None else None
        except Exception:  # no readable manifest: no files to write
            job = None
        if job is not None:
            try:
                finish_batch(self.store, record, job.store, job.manifest, Ending("failed", errors), self.config,
                             self.settings)  # fmt: skip
                return
            except Exception as exc:
                log.error("batch_files_failed", batch_id=record.id, error=f"{type(exc).__name__}: {exc}")
        save_record(self.store, record.model_copy(update={"status": "failed", "failed_at": int(time.time()),
                                                          "errors": {"object": "list", "data": errors}}))  # fmt: skip

    def _sweep(self) -> None:
        now = time.time()
        if now - self._swept_at < self.config.sweep_s:
            return
        self._swept_at = now
        gone = sweep(self.store, now, self._inputs)
        gone += self._orphans(self.store, now)
        if gone:
            log.info("swept", files=gone)
