"""`freight eval run|report` and `freight beat`: scheduled evaluation suites (jobs/evals/).

Embedded runs import worker/ lazily, inside the command; --submit and beat only queue jobs.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from jobs.errors import FreightError
from jobs.evals.plan import JobExecutor
from jobs.settings import Settings, get_settings
from jobs.spec import JobSpec

eval_app = typer.Typer(
    name="eval", help="Evaluation suites: run, score, compare with earlier runs.", no_args_is_help=True
)


def embedded_executor(settings: Settings, device: str | None = None) -> JobExecutor:
    """Run each job in process to the end (the same prepare/run_local/finalize as `freight run`).
    The engine of the last model stays loaded for the next job on it (start_run groups jobs by
    model); its load time is not billed to those jobs. One engine is held at a time, and it loads
    only when a job has rows the result cache does not answer (worker/lazy_engine.py)."""
    import gc

    from jobs.planner import prepare_job

    # in the command: the CLI loads torch only to run
    from worker.local import lazy_engine, load_engine, run_local

    loaded: dict[str, Any] = {}  # at most one entry: model -> engine

    def execute(spec: JobSpec) -> None:
        prepared = prepare_job(spec, settings)
        if prepared.store.exists("_SUCCESS"):
            return
        if spec.model not in loaded:
            loaded.clear()
            gc.collect()  # drop the previous model's weights and KV cache before loading the next
            manifest = prepared.manifest
            loaded[spec.model] = lazy_engine(manifest, settings, device,
                                             lambda: (load_engine(manifest, settings, device)[0], 0.0))  # fmt: skip
        run = run_local(prepared.store, prepared.manifest, engine=loaded[spec.model], settings=settings)
        if run.interrupted:
            raise FreightError(
                f"job {spec.output} stopped before the end; run the same command again to resume"
            )

    return execute


def submit_executor(settings: Settings) -> JobExecutor:
    """Queue each job on the fleet, like `freight submit`."""
    from jobs.evals.fleet import submit_spec

    def execute(spec: JobSpec) -> None:
        submit_spec(spec, settings)

    return execute


def _fail(exc: Exception | str) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2)


@eval_app.command("run")
def run_command(
    suites: Annotated[Path, typer.Argument(help="the suite file (TOML)")],
    output: Annotated[
        str, typer.Option("--output", "-o", metavar="OUT", help="OUT: folder or s3://bucket/prefix for this run")
    ],
    suite: Annotated[
        list[str] | None, typer.Option("--suite", help="run only this suite (repeatable)")
    ] = None,
    model: Annotated[
        list[str] | None, typer.Option("--model", help="use this model instead of the suites' (repeatable)")
    ] = None,
    submit: Annotated[
        bool, typer.Option("--submit", help="queue the jobs on the fleet instead of running them here")
    ] = False,
    result_cache: Annotated[
        str | None,
        typer.Option(metavar="DIR|s3://...", help="the result cache the jobs reuse answers from and add to (default: "
                     "the suite file's result_cache, else FREIGHT_RESULT_CACHE, else <history>/result-cache; off: none)"),
    ] = None,
) -> None:
    """Run suites: embedded by default (then score and print the report), or queue with --submit."""
    from jobs.evals.collect import collect
    from jobs.evals.plan import start_run
    from jobs.evals.suite_loader import load_suite_file
    from jobs.result_cache.options import cache_off

    settings = get_settings()
    try:
        suite_file = load_suite_file(suites)  # every problem, with its line, before any work
        execute = submit_executor(settings) if submit else embedded_executor(settings)
        models = [
            m if "://" in m else str(Path(m).resolve()) for m in model or []
        ]  # workers need absolute paths
        cache = "suite" if result_cache is None else None if cache_off(result_cache) else (
            result_cache if "://" in result_cache else str(Path(result_cache).resolve()))
        plan = start_run(suite_file, output, execute, suite_names=suite, models=models, result_cache=cache)
        if submit:
            typer.echo(
                f"queued eval run {plan.run_id}; when its jobs finish: freight eval report {plan.output}"
            )
            return
        report = collect(plan.output)
    except (FreightError, ValueError) as exc:  # ValueError: e.g. a checkpoint the engine refuses
        raise _fail(exc) from exc
    typer.echo(report.markdown)
    if report.regressions:
        raise typer.Exit(1)


@eval_app.command("report")
def report_command(
    output: Annotated[str, typer.Argument(metavar="OUT", help="OUT of an eval run")],
    as_json: Annotated[bool, typer.Option("--json", help="print report.json instead of Markdown")] = False,
) -> None:
    """Score a finished run (if not yet), compare with the previous run of each suite, print it.
    Exit status 1 when a metric regressed beyond the noise."""
    from jobs.evals.collect import REPORT_JSON, collect
    from jobs.storage import open_store

    try:
        report = collect(output)
    except (FreightError, ValueError) as exc:
        raise _fail(exc) from exc
    if as_json:
        typer.echo(json.dumps(json.loads(open_store(output).get(REPORT_JSON)), indent=2))
    else:
        typer.echo(report.markdown)
    if report.regressions:
        raise typer.Exit(1)


def beat_command(suites: Annotated[Path, typer.Argument(help="the suite file (TOML)")]) -> None:
    """Celery beat: submit each suite of the file on its cron schedule (UTC) and report finished runs.

    Only one beat may run per suite file: a second one is refused (a lock in Redis)."""
    import redis

    from jobs.client import make_client_app
    from jobs.evals.beat import run_beat
    from jobs.evals.lock import BeatLock, LockHeldError
    from jobs.evals.suite_loader import load_suite_file

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)  # beat's loop ends on SystemExit; the lock is released on the way out

    signal.signal(signal.SIGTERM, stop)
    settings = get_settings()
    try:
        suite_file = load_suite_file(suites)
        lock = BeatLock(redis.Redis.from_url(settings.redis_url), suite_file.lock_id)
        run_beat(make_client_app(settings), str(suite_file.path), submit_executor(settings), lock)
    except (FreightError, LockHeldError) as exc:
        raise _fail(exc) from exc
    except redis.RedisError as exc:
        from jobs.redact import redact_url

        raise _fail(f"cannot reach Redis at {redact_url(settings.redis_url)} ({exc}): start it or set FREIGHT_REDIS_URL") from None


def register(app: typer.Typer) -> None:
    """Add `freight eval ...` and `freight beat` to `app`."""
    app.add_typer(eval_app, name="eval")
    app.command("beat")(beat_command)
