"""`freight run | status | cost | results | demo-model`: jobs embedded in this process, and their outputs."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from jobs.cli.job_options import (
    ContinuationColumnOpt,
    IdColumnOpt,
    InputArg,
    InstanceTypeOpt,
    MarketOpt,
    MaxTokensOpt,
    ModelOpt,
    OutputOpt,
    PricePerHourOpt,
    PricesOpt,
    PromptColumnOpt,
    QuantizationOpt,
    SeedOpt,
    ShardRowsOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
    prepare_from_options,
)
from jobs.errors import FreightError
from jobs.settings import get_settings

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


def fail(message: str, code: int = EXIT_USER_ERROR) -> typer.Exit:
    """Print one clear line on stderr (URL passwords and tokens redacted); return the Exit to raise."""
    from jobs.redact import redact

    Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {redact(message)}", soft_wrap=True)
    return typer.Exit(code)


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """SIGINT / SIGTERM set the event (the shard saves its finished rows); a second SIGINT kills."""
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
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


def run(
    input: InputArg,
    model: ModelOpt,
    output: OutputOpt,
    prompt_column: PromptColumnOpt = "prompt",
    id_column: IdColumnOpt = None,
    continuation_column: ContinuationColumnOpt = None,
    max_tokens: MaxTokensOpt = 128,
    temperature: TemperatureOpt = 0.0,
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    seed: SeedOpt = 0,
    shard_rows: ShardRowsOpt = 256,
    instance_type: InstanceTypeOpt = "cpu-local",
    market: MarketOpt = "on-demand",
    price_per_hour: PricePerHourOpt = None,
    prices: PricesOpt = None,
    quantization: QuantizationOpt = None,
) -> None:
    """Run a job in this process: plan, shards, cost report. Rerun the same command to resume."""
    options = dict(locals())  # exactly the flags above
    settings = get_settings()
    try:
        prepared = prepare_from_options(settings, **options)
    except FreightError as exc:
        raise fail(str(exc)) from None
    from jobs.cli.run_progress import run_with_progress

    code = run_with_progress(prepared, settings)
    if code:
        raise typer.Exit(code)


def status(out: str = typer.Argument(..., help="the job's OUT (or a distributed job's id)")) -> None:
    """State of a job: shards committed / total, rows, errors."""
    from jobs.cli.fleet import print_fleet_status, resolve_out
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
    out: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json", help="raw cost.json")
) -> None:
    """The job's cost report (a provisional one, marked so, while shards are still running)."""
    from jobs.storage import open_store
    from jobs.tables import cost_table

    try:
        report, provisional = _report(open_store(out, get_settings()))
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
    out: str = typer.Argument(...),
    head: int = typer.Option(10, help="rows to show"),
    to: Path | None = typer.Option(None, help="write all results to FILE.parquet or FILE.jsonl"),
) -> None:
    """Show the first results, or export them all."""
    from jobs import datasets
    from jobs.manifest import read_manifest
    from jobs.storage import open_store
    from jobs.tables import results_table

    try:
        store = open_store(out, get_settings())
        read_manifest(store)
        if to is None:
            Console().print(results_table(datasets.read_results(store, head=head)))
            return
        if to.suffix not in (".parquet", ".jsonl"):
            raise FreightError(f"--to {to}: give a .parquet or .jsonl file name")
        table = datasets.read_results(store)
        to.write_bytes(
            datasets.write_result(table) if to.suffix == ".parquet" else datasets.write_jsonl(table)
        )
    except (FreightError, ValueError, OSError) as exc:  # ValueError: a malformed URL; OSError: --to
        raise fail(str(exc)) from None
    Console(stderr=True).print(f"wrote {table.num_rows:,} rows to {to}", soft_wrap=True)


def demo_model(
    out_dir: Path = typer.Argument(..., help="folder to write the checkpoint into"),
    arch: str = typer.Option("llama", help="llama, qwen2 or qwen3"),
    size: str = typer.Option("tiny", help="tiny, small or medium"),
) -> None:
    """Write a small random Hugging Face checkpoint + tokenizer (for trying freight without a model hub)."""
    from worker.demo_model import make_demo_model

    try:
        path = make_demo_model(out_dir, arch=arch, size=size)
    except ValueError as exc:
        raise fail(str(exc)) from None
    Console(stderr=True).print(f"demo model ({arch}, {size}) written to {path}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""
    app.command("run")(run)
    app.command("status")(status)
    app.command("cost")(cost)
    app.command("results")(results)
    app.command("demo-model")(demo_model)
