"""The batch process of `freight serve` (`python -m freight_cli.batch_process`), and its embedded
executor: batches run with the embedded runner (worker/local.py), one at a time, the engine kept
from one batch to the next when they name the same model, and loaded only when a shard first has
rows to compute.

Started by the server (jobs/api/supervisor.py) with the store URL and, in FREIGHT_SERVE_CONFIG, the
server's ServeConfig as JSON; `--fleet` submits the jobs to the fleet instead (FleetExecutor), in a
process that never loads torch. It dies with the server (PR_SET_PDEATHSIG: SIGKILL, asked first
thing), stops in order on SIGTERM or when its stdin closes, and takes each stdin line as a nudge.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import os
import signal
import sys
import threading
import time
from typing import Any

from jobs.api.batch_process import BatchProcess
from jobs.api.config import ServeConfig
from jobs.api.executor import BatchJob, Outcome, begin_run, end_run
from jobs.api.supervisor import PARENT_ENV
from jobs.errors import FreightError
from jobs.log import configure_logging, get_logger
from jobs.settings import Settings, get_settings
from jobs.storage import ObjectStore, open_store

log = get_logger("freight.batch_process")

CONFIG_ENV = "FREIGHT_SERVE_CONFIG"
CANCEL_POLL_S = 0.25  # how often a running job looks for its cancel marker
PR_SET_PDEATHSIG = 1


class EmbeddedExecutor:
    """Jobs run in order on one engine thread; `should_stop` ends a run at its next engine step when
    the batch is cancelled, its window ends, or the process stops."""

    def __init__(self, store: ObjectStore, settings: Settings) -> None:
        self.store, self.settings = store, settings
        self._queue: collections.deque[BatchJob] = collections.deque()
        self._cond = threading.Condition()
        self._outcomes: dict[str, Outcome] = {}
        self._progress: dict[str, list[int]] = {}
        self._closing = threading.Event()
        self._engine: Any = None
        self._engine_key: tuple[Any, ...] | None = None
        self._thread = threading.Thread(target=self._work, name="freight-engine", daemon=True)
        self._thread.start()

    def start(self, job: BatchJob, *, resumed: bool) -> None:
        with self._cond:
            self._queue.append(job)
            self._cond.notify()

    def withdraw(self, job: BatchJob) -> bool:
        with self._cond:
            for queued in self._queue:
                if queued.batch_id == job.batch_id:
                    self._queue.remove(queued)
                    return True
        return False

    def outcome(self, job: BatchJob) -> Outcome | None:
        with self._cond:
            return self._outcomes.pop(job.batch_id, None)

    def cancel(self, job: BatchJob) -> None:
        """Nothing to do: the running job's should_stop reads the marker."""

    def progress(self, job: BatchJob) -> tuple[int, int] | None:
        counts = self._progress.get(job.batch_id)
        return None if counts is None else (counts[0], counts[1])

    def close(self) -> None:
        self._closing.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing.is_set():
                    self._cond.wait()
                if self._closing.is_set():
                    return
                job = self._queue.popleft()
            outcome = self._run(job)
            with self._cond:
                self._outcomes[job.batch_id] = outcome

    def _run(self, job: BatchJob) -> Outcome:
        from jobs.status import job_status
        from worker.local import run_local

        marker = begin_run(job)
        stopped: list[str] = []
        try:
            engine, load_seconds = self._engine_for(job)
            st = job_status(job.store, job.manifest)
            counts = self._progress[job.batch_id] = [st.rows_done - st.rows_failed, st.rows_failed]
            checked = [0.0]

            def should_stop() -> bool:
                if self._closing.is_set():
                    stopped.append("interrupted")
                elif time.time() >= job.deadline:
                    stopped.append("expired")
                elif time.monotonic() - checked[0] >= CANCEL_POLL_S:
                    checked[0] = time.monotonic()
                    if self.store.exists(job.cancel_key):
                        stopped.append("cancelled")
                return bool(stopped)

            def on_row(p: Any) -> None:
                counts[int(p.failed)] += 1

            result = run_local(job.store, job.manifest, engine=engine, load_seconds=load_seconds,
                               settings=self.settings, should_stop=should_stop, on_row=on_row)  # fmt: skip
            outcome = Outcome("succeeded") if result.report is not None else Outcome(stopped[0] if stopped else "interrupted")
        except FreightError as exc:
            outcome = Outcome("failed", str(exc))
        except Exception as exc:  # an engine error: the batch fails, the process goes on
            log.error("batch_run_failed", batch_id=job.batch_id, error=f"{type(exc).__name__}: {exc}", exc_info=exc)
            outcome = Outcome("failed", f"the engine failed ({type(exc).__name__}: {exc})")
        finally:
            self._progress.pop(job.batch_id, None)
        end_run(job, marker)
        return outcome

    def _engine_for(self, job: BatchJob) -> tuple[Any, float]:
        """The engine for the job's model: the kept one when it is that model, else a LazyEngine
        (worker/lazy_engine.py) whose weights load when a shard first has rows to compute, so a batch
        with nothing to run (every row an error or answered by the result cache) loads no model; its
        load is billed to the shard that asked for it. The old engine is freed first. The seconds to
        bill this job for a load made before it: always 0 (the kept engine's load was billed once)."""
        from worker.local import lazy_engine

        spec = job.manifest.spec
        key = (spec.model, spec.quantization, spec.quant_group, spec.speculative, spec.speculative_tokens)
        if self._engine is not None and self._engine_key == key:
            return self._engine, 0.0
        loaded = self._engine is not None and self._engine.loaded
        self._engine = self._engine_key = None
        if loaded:
            gc.collect()
            _free_device_memory()
        self._engine = lazy_engine(job.manifest, self.settings)
        self._engine_key = key
        return self._engine, 0.0


def _free_device_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def die_with_parent() -> None:
    """SIGKILL this process when its parent thread dies (Linux); exit now if the parent is gone
    already. Elsewhere the stdin watch stops the process when the server's end of the pipe closes."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    parent = os.environ.get(PARENT_ENV)
    if parent is not None and os.getppid() != int(parent):
        os._exit(0)


def main(argv: list[str] | None = None) -> None:
    die_with_parent()
    parser = argparse.ArgumentParser(prog="python -m freight_cli.batch_process")
    parser.add_argument("--store", required=True, help="the serve store: a folder or s3://bucket/prefix")
    parser.add_argument("--fleet", action="store_true", help="submit jobs to the fleet (FREIGHT_REDIS_URL)")
    args = parser.parse_args(argv)
    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    config = ServeConfig.model_validate_json(os.environ.get(CONFIG_ENV) or "{}")
    store = open_store(args.store, settings)
    if args.fleet:
        from jobs.api.fleet_executor import FleetExecutor

        executor: Any = FleetExecutor(settings)
    else:
        executor = EmbeddedExecutor(store, settings)
    stop, wake = threading.Event(), threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()
        wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def watch_stdin() -> None:  # a line: look now; the end: the server is gone or stopping
        for _ in sys.stdin.buffer:
            wake.set()
        on_signal(0, None)

    threading.Thread(target=watch_stdin, name="freight-nudges", daemon=True).start()
    log.info("batch_process_ready", store=store.url, mode="fleet" if args.fleet else "embedded")
    BatchProcess(store, config, settings, executor).run(stop, wake)


if __name__ == "__main__":
    main()
