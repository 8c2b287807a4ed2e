"""`freight run | status | cost | results | demo-model`: jobs embedded in this process, and their outputs."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Literal

import typer
from rich.console import Console

from freight_cli.common import fail, plural, resolve_out
from freight_cli.job_estimate import MaxCostOpt, max_cost_check
from freight_cli.job_options import JobOptionValues, prepare_from_options, with_job_options
from freight_cli.lifecycle_options import CompletionWindowOpt, DeadlineOpt, NotifyOpt, lifecycle_from_options
from jobs.errors import FreightError
from jobs.settings import get_settings

ResultsFormat = Literal["freight", "openai"]


@with_job_options()
def run(
    job: JobOptionValues,
    completion_window: CompletionWindowOpt = None,
    deadline: DeadlineOpt = None,
    notify: NotifyOpt = None,
    max_cost: MaxCostOpt = None,
) -> None:
    """Run a job in this process: plan, shards, cost report. Rerun the same command to resume."""
    settings = get_settings()
    try:
        lifecycle = lifecycle_from_options(completion_window, deadline, notify, time.time())
        check = max_cost_check(max_cost, settings, job["prices"])
        prepared = prepare_from_options(settings, **job, check=check)
    except FreightError as exc:
        raise fail(str(exc)) from None
    from freight_cli.run_progress import run_with_progress

    code = run_with_progress(prepared, settings, lifecycle)
    if code:
        raise typer.Exit(code)


def status(
    out: str = typer.Argument(..., metavar="OUT", help="the job's OUT (or a distributed job's id)"),
) -> None:
    """State of a job: shards committed / total, rows, errors."""
    from freight_cli.fleet_status_lines import print_fleet_status
    from jobs.status import job_status
    from jobs.storage import open_store
    from jobs.tables import status_table

    try:
        store = open_store(resolve_out(out), get_settings())
        st = job_status(store)
    except (FreightError, ValueError) as exc:  # ValueError: a malformed URL or option
        raise fail(str(exc)) from None
    Console().print(status_table(st))
    print_fleet_status(store)  # distributed jobs: live progress, failures, cancel


def cost(
    out: str = typer.Argument(..., metavar="OUT", help="the job's OUT (or a distributed job's id)"),
    as_json: bool = typer.Option(False, "--json", help="print cost.json as it is"),
) -> None:
    """The job's cost report (a provisional one, marked so, while shards are still running)."""
    from jobs.storage import open_store
    from jobs.tables import cost_table

    try:
        report, provisional = _report(open_store(resolve_out(out), get_settings()))
    except (FreightError, ValueError) as exc:  # ValueError: a malformed URL or option
        raise fail(str(exc)) from None
    if as_json:
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
    else:
        Console().print(cost_table(report, provisional=provisional))


def _report(store: Any) -> tuple[dict[str, Any], bool]:
    """(report, provisional): cost.json once finalized, else a report over the committed shards."""
    from jobs.finalize import committed_shards, report_now
    from jobs.manifest import read_manifest
    from jobs.status import read_cost

    manifest = read_manifest(store)
    report = read_cost(store)
    if report is not None:
        return report, False
    return report_now(store, manifest, sorted(committed_shards(store))), True


def results(
    out: str = typer.Argument(..., metavar="OUT", help="the job's OUT (or a distributed job's id)"),
    head: int = typer.Option(10, metavar="N", help="rows to show"),
    to: Path | None = typer.Option(
        None,
        metavar="FILE",
        help="write all results to FILE.parquet or FILE.jsonl (an unfinished job: see --partial)",
    ),
    partial: bool = typer.Option(
        False, "--partial", help="with --to: export the committed shards of a job that is not complete"
    ),
    force: bool = typer.Option(False, "--force", help="with --to: replace FILE (and the error file) if it exists"),
    fmt: ResultsFormat = typer.Option(
        "freight",
        "--format",
        help="freight: the result columns as they are; openai: OpenAI Batch output lines (--to FILE.jsonl)",
    ),
    errors: Path | None = typer.Option(
        None,
        "--errors",
        metavar="FILE",
        help="with --format openai: the error file (failed rows; default: FILE.errors.jsonl beside --to)",
    ),
) -> None:
    """Show the first results, or export them all.

    --to refuses a job with shards still missing (it
    says how many) unless --partial is given, which exports what is committed and warns. An expired or
    cancelled job (it will not complete) exports without --partial; with --format openai its unrun
    requests go to the error file as batch_expired / batch_cancelled, as OpenAI's do."""
    from jobs import datasets
    from jobs.expiry import EXPIRED_KEY
    from jobs.finalize import committed_shards
    from jobs.manifest import read_manifest
    from jobs.markers import CANCEL_KEY
    from jobs.storage import open_store
    from jobs.tables import results_table

    err = Console(stderr=True, highlight=False)
    try:
        store = open_store(resolve_out(out), get_settings())
        manifest = read_manifest(store)
        done = committed_shards(store)
        missing = [s for s in manifest.shards if s.index not in done]
        gap = (
            f"{len(missing)} of {len(manifest.shards)} {plural(len(manifest.shards), 'shard')} "
            f"({sum(s.rows for s in missing):,} of {manifest.input.rows:,} rows) have no results yet"
        )
        if errors is not None and fmt != "openai":
            raise FreightError("--errors goes with --format openai (the freight format keeps failed rows)")
        if to is None:
            if fmt == "openai":
                raise FreightError("--format openai writes files: give --to FILE.jsonl")
            Console().print(results_table(datasets.read_results(store, head=head)))
            if missing:
                err.print(f"note: job {manifest.job_id} is not complete: {gap}", soft_wrap=True)
            return
        suffixes = (".jsonl",) if fmt == "openai" else (".parquet", ".jsonl")
        if to.suffix not in suffixes:
            raise FreightError(f"--to {to}: give a {' or '.join(suffixes)} file name")
        targets = [to] if fmt != "openai" else [to, _errors_path(to, errors)]
        _check_export_targets(store, targets, force)
        ended = "expired" if store.exists(EXPIRED_KEY) else "cancelled" if store.exists(CANCEL_KEY) else None
        if missing and ended is not None:  # it will not complete: its unrun requests are errors
            gap += f" (the job {ended}: in the OpenAI error file as batch_{ended})" if fmt == "openai" else (
                f" (the job {ended})")
        elif missing and not partial:
            raise FreightError(
                f"job {manifest.job_id} is not complete: {gap}; wait for it (`freight status {out}`), or "
                "pass --partial to export the committed rows only"
            )
        if fmt == "openai":
            written = _export_openai(store, manifest, sorted(done), to, errors, ended)
        else:
            table = datasets.read_results(store)
            data = datasets.write_result(table) if to.suffix == ".parquet" else datasets.write_jsonl(table)
            with _replacing(to) as f:
                f.write(data)
            written = f"{table.num_rows:,} rows to {to}"
    except (FreightError, ValueError, OSError) as exc:  # ValueError: a malformed URL; OSError: --to
        raise fail(str(exc)) from None
    if missing:
        err.print(f"[bold yellow]warning:[/] partial export: {gap}", soft_wrap=True)
    err.print(f"wrote {written}", soft_wrap=True)


def _errors_path(to: Path, errors: Path | None) -> Path:
    """--format openai's error file: --errors, or FILE.errors.jsonl beside --to FILE.jsonl."""
    return errors or to.with_name(to.name.removesuffix(".jsonl") + ".errors.jsonl")


def _check_export_targets(store: Any, paths: list[Path], force: bool) -> None:
    """FreightError for an export file inside the job's OUT (OUT/shards/ is read as the results: a
    file there breaks `status` and `results`), or one that exists without --force."""
    from jobs.storage.local import LocalStore

    for path in paths:
        if isinstance(store, LocalStore) and path.resolve().is_relative_to(store.root.resolve()):
            raise FreightError(
                f"--to {path} lies inside the job's OUT ({store.url}), which freight reads as the job: "
                "write the export elsewhere"
            )
        if path.exists() and not force:
            raise FreightError(f"{path} exists: pass --force to replace it, or give another file name")


@contextmanager
def _replacing(path: Path) -> Iterator[BinaryIO]:
    """A file written beside `path` that replaces it on success: a reader never sees half an export."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("wb") as f:
            yield f
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _export_openai(
    store: Any, manifest: Any, shards: list[int], to: Path, errors: Path | None, ended: str | None
) -> str:
    """Write the OpenAI Batch output file and its error file (always, empty when no row failed, so an
    earlier export's errors never linger beside a new output); return what was written, in words."""
    from jobs.openai_output import check_exportable, export_openai

    check_exportable(manifest)
    err_path = _errors_path(to, errors)
    if err_path.resolve() == to.resolve():
        raise FreightError(f"--errors {err_path} is the --to file: give the error file another name")
    with _replacing(to) as output, _replacing(err_path) as failed:
        done = export_openai(store, manifest, shards, output, failed, ended, get_settings())
    ok = done.requests - done.failed
    return f"{ok:,} {plural(ok, 'request')} to {to}, {done.failed:,} failed to {err_path}"


def demo_model(
    out_dir: Path = typer.Argument(..., metavar="DIR", help="new or empty folder to write the checkpoint into"),
    arch: Literal["llama", "qwen2", "qwen3"] = typer.Option("llama", help="architecture of the checkpoint"),
    size: Literal["tiny", "small", "medium"] = typer.Option(
        "tiny", help="tiny ~0.2M, small ~4M, medium ~30M parameters"
    ),
) -> None:
    """Write a small random Hugging Face checkpoint + tokenizer (for trying freight without a model hub)."""
    from worker.demo_model import make_demo_model

    try:
        path = make_demo_model(out_dir, arch=arch, size=size)
    except (ValueError, OSError) as exc:  # OSError: a folder we may not write
        raise fail(str(exc)) from None
    Console(stderr=True).print(f"demo model ({arch}, {size}) written to {path}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""
    app.command("run")(run)
    app.command("status")(status)
    app.command("cost")(cost)
    app.command("results")(results)
    app.command("demo-model")(demo_model)
