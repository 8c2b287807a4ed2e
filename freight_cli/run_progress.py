"""`freight run`'s execution: the embedded runner with a rich progress bar (TTY) or JSON log lines."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from freight_cli.common import EXIT_INTERRUPTED, EXIT_JOB_EXPIRED, fail, plural
from jobs.errors import FreightError
from jobs.lifecycle import Lifecycle, write_lifecycle
from jobs.log import get_logger
from jobs.manifest import SUCCESS_KEY
from jobs.planner import PreparedJob
from jobs.settings import Settings
from jobs.storage import ObjectStore

log = get_logger("freight.run")


class StopRequest(threading.Event):
    """Set by SIGINT / SIGTERM; `signum` remembers the first signal (the exit status is 128 + it)."""

    signum: int | None = None


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """SIGINT / SIGTERM set the event (the shard saves its finished rows); a second SIGINT kills."""
    stop = StopRequest()

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if stop.signum is None:
            stop.signum = signum
        stop.set()

    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class _Counters:
    """Rows and tokens finished in this process (for tokens/s and the prefix-cache hit rate)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.rows = self.failed = self.prompt = self.cached = self.completion = 0
        self.proposed = self.accepted = 0  # speculative decoding's tokens (0 without it)

    def add(self, p: Any) -> None:
        self.rows += 1
        self.failed += int(p.failed)
        self.proposed += p.spec_proposed_tokens
        self.accepted += p.spec_accepted_tokens
        if p.failed:  # a refused row (too long, bad input) ran no tokens
            return
        self.prompt += p.prompt_tokens
        self.cached += p.cached_tokens
        self.completion += p.completion_tokens

    def fields(self) -> dict[str, Any]:
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        return {
            "tps": (self.prompt + self.completion) / elapsed,
            "hit": self.cached / self.prompt if self.prompt else 0.0,
            # the progress bar's speculation column: "" until something was proposed
            "spec": f"spec accepted {self.accepted / self.proposed:.0%}" if self.proposed else "",
        }

    def log_fields(self) -> dict[str, Any]:
        """The JSON progress line's fields: tokens/s, hit rate, and the acceptance when speculating."""
        out: dict[str, Any] = {k: round(v, 3) for k, v in self.fields().items() if k != "spec"}
        if self.proposed:
            out["spec_acceptance_rate"] = round(self.accepted / self.proposed, 3)
        return out


def run_with_progress(prepared: PreparedJob, settings: Settings, lifecycle: Lifecycle | None = None) -> int:
    """Run the job; return the exit status (0 done, 130 after SIGINT, 143 after SIGTERM, 2 user error,
    4 expired: past `lifecycle.deadline`). The summary goes to stdout; progress and logs to stderr."""
    from jobs.status import job_status
    from jobs.tables import cost_table
    from worker.local import run_local

    store, manifest = prepared.store, prepared.manifest
    console = Console(stderr=True)
    summary = Console(highlight=False)  # stdout: what the run produced
    if prepared.resumed and store.exists(SUCCESS_KEY):
        summary.print(f"job {manifest.job_id} is already complete in {store.url}", soft_wrap=True)
        from jobs.status import read_cost

        summary.print(cost_table(read_cost(store) or {}))
        _redeliver(store, settings, console)
        return 0
    from jobs.expiry import reopen

    lifecycle = lifecycle or Lifecycle()
    reopen(store)  # a rerun lifts an earlier expiry: the missing shards run now
    write_lifecycle(store, lifecycle)
    if lifecycle.past_due():  # due before the model would even load
        return _expired(prepared, settings, summary)
    before = job_status(store, manifest)
    log.info(
        "job_start",
        job_id=manifest.job_id,
        output=store.url,
        rows=manifest.input.rows,
        shards=len(manifest.shards),
        shards_committed=before.shards_committed,
        resumed=prepared.resumed,
    )
    counters = _Counters()
    tty = sys.stderr.isatty()
    last_log = [time.perf_counter()]
    if tty:  # the bar shows what the per-shard info lines would; keep warnings and errors
        from jobs.log import configure_logging

        configure_logging(
            settings.log_format, "warning" if settings.log_level in ("debug", "info") else settings.log_level
        )
    with stop_on_signals() as stop:
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[tps]:,.0f} tok/s"),
            TextColumn("prefix hit {task.fields[hit]:.0%}"),
            TextColumn("{task.fields[spec]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not tty,
        )
        with progress:
            task = progress.add_task(
                "loading model", total=manifest.input.rows, completed=before.rows_done, tps=0.0, hit=0.0, spec=""
            )

            def on_row(p: Any) -> None:
                counters.add(p)
                if tty:
                    progress.update(task, advance=1, description="rows", **counters.fields())
                elif time.perf_counter() - last_log[0] > 5.0:
                    last_log[0] = time.perf_counter()
                    log.info(
                        "progress",
                        job_id=manifest.job_id,
                        rows=before.rows_done + counters.rows,
                        total=manifest.input.rows,
                        **counters.log_fields(),
                    )

            def should_stop() -> bool:  # before every engine step
                return stop.is_set() or lifecycle.past_due()

            try:
                result = run_local(store, manifest, settings=settings, should_stop=should_stop, on_row=on_row)
            except FreightError as exc:
                raise fail(str(exc)) from None
    if result.interrupted and not stop.is_set() and lifecycle.past_due():
        return _expired(prepared, settings, summary)
    if result.interrupted:
        st = job_status(store, manifest)
        console.print(
            f"interrupted: {st.shards_committed} of {st.shards_total} {plural(st.shards_total, 'shard')} committed in {store.url}; "
            "rerun the same command to resume",
            soft_wrap=True,
        )
        return 128 + stop.signum if stop.signum else EXIT_INTERRUPTED
    report = result.report or {}
    log.info(
        "job_done",
        job_id=manifest.job_id,
        rows=report.get("rows"),
        rows_failed=report.get("rows_failed"),
        cost_usd=report.get("cost_usd"),
    )
    tps = report.get("tokens_per_second") or 0.0
    shards = len(report["shards"])
    summary.print(
        f"done: {report['rows']:,} rows ({report['rows_failed']:,} failed) in {shards} {plural(shards, 'shard')}, "
        f"${report['cost_usd']:.6f} on {report['instance_type']} ({report['market']}), {tps:,.0f} tok/s, "
        f"prefix hit {report['cache_hit_rate']:.1%}{_speculation(report)}\nresults: {store.url_of('shards/')}\n"
        f"see `freight results {store.url}` and `freight cost {store.url}`",
        soft_wrap=True,
        highlight=False,
    )
    _drain_notifications(settings, console)
    return 0


def _speculation(report: dict[str, Any]) -> str:
    """", speculation accepted 62% of 1,234 proposed tokens" when the job speculated, else ""."""
    proposed = report.get("spec_proposed_tokens") or 0
    if not proposed:
        return ""
    return f", speculation accepted {report['spec_accepted_tokens'] / proposed:.0%} of {proposed:,} proposed tokens"


def _expired(prepared: PreparedJob, settings: Settings, summary: Console) -> int:
    """The run stopped at its deadline: cost.json (state expired), _EXPIRED, the notification."""
    from jobs.expiry import expire_job

    store, manifest = prepared.store, prepared.manifest
    report = expire_job(store, manifest, settings)
    if report is None:  # every shard was in after all: finalized
        summary.print(f"job {manifest.job_id} completed at its deadline in {store.url}", soft_wrap=True)
        _drain_notifications(settings, Console(stderr=True))
        return 0
    missing = report.get("shards_missing", 0)
    summary.print(
        f"expired: past its deadline with {missing} of {len(manifest.shards)} "
        f"{plural(len(manifest.shards), 'shard')} missing; kept {report['rows']:,} rows "
        f"({report['rows_failed']:,} failed), billed ${report['cost_usd']:.6f}\nresults: "
        f"{store.url_of('shards/')}\nrerun the same command (with a new window) to run the missing shards",
        soft_wrap=True,
        highlight=False,
    )
    _drain_notifications(settings, Console(stderr=True))
    return EXIT_JOB_EXPIRED


def _redeliver(store: ObjectStore, settings: Settings, console: Console) -> None:
    """A complete job run again: send the notification an earlier run left unconfirmed (killed
    before a 2xx), once its FREIGHT_NOTIFY_REDELIVER_GRACE_S has passed (jobs/redelivery.py)."""
    from jobs.redelivery import redeliver_due

    redeliver_due(store, settings, time.time())
    _drain_notifications(settings, console)


def _drain_notifications(settings: Settings, console: Console) -> None:
    """Give pending notifications up to FREIGHT_NOTIFY_DRAIN_S before the process exits."""
    from jobs.notify import notifier

    if not notifier(settings).drain(settings.notify_drain_s):
        console.print("warning: a job notification was not delivered before exit", soft_wrap=True)
