"""`freight estimate INPUT --model MODEL ...` and `freight profile MODEL`.

The estimate itself (freight_cli/job_estimate.py) reads the dataset as `run` would and prices it with
the model's throughput profile, which `freight profile` measures.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from contracts.quantization import check_quant_group, quantization_label
from freight_cli.common import fail
from freight_cli.job_estimate import estimate_manifest
from freight_cli.job_options import (
    JobOptionValues,
    absolute,
    spec_from_options,
    split_cache_options,
    with_job_options,
)
from jobs.errors import FreightError
from jobs.settings import get_settings


@with_job_options(leave_out=("output",))
def estimate_cmd(
    job: JobOptionValues,
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Predict a job's tokens, engine hours and dollars before running it (writes nothing); it takes
    the options of `run` but --output (the estimate does not count speculative decoding's gain)."""
    from jobs.cost import PriceTable
    from jobs.planner import plan

    options = dict(job)
    prices = options.pop("prices")
    input, model = options["input"], options["model"]
    settings = get_settings()
    try:
        options, caches = split_cache_options(options, settings, check=False)  # the estimate writes nothing
        spec = spec_from_options(output=absolute(input) + ".estimate", **options)
        manifest = plan(spec, settings, PriceTable.load(prices) if prices else None)
        est = estimate_manifest(manifest, settings, prices, caches)
    except (FreightError, ValueError) as exc:
        raise fail(str(exc)) from None
    if as_json:
        sys.stdout.write(json.dumps(est.as_dict()) + "\n")
        return
    t = Table(title=f"estimate: {input} on {model}", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    spot = f"${est.spot_cost_usd:.6f}" if est.spot_cost_usd is not None else "-"
    for what, value in (
        ("rows (bad: error rows, no tokens)", f"{est.rows:,} ({est.rows_bad:,})"),
        ("shards", f"{est.shards:,}"),
        ("rows reused (duplicates / result cache)", f"{est.rows_deduplicated:,} / {est.rows_cached:,}"),
        ("prompt tokens (to compute after prefix reuse)", f"{est.prompt_tokens:,} ({est.computed_prompt_tokens:,})"),
        ("completion tokens (expected / at most)", f"{est.completion_tokens:,} / {est.max_completion_tokens:,}"),
        ("engine seconds", f"{est.engine_seconds:,.1f}"),
        ("billed hours", f"{est.hours:,.4f}"),
        (f"cost ({est.market})", f"${est.cost_usd:.6f}"),
        ("on-demand / spot", f"${est.on_demand_cost_usd:.6f} / {spot}"),
        ("confidence", f"{est.confidence} profile"),
    ):  # fmt: skip
        t.add_row(what, value)
    parts = [(f"adapter {name}", part) for name, part in (est.adapters or {}).items()]
    for label, part in parts + ([("the model itself", est.base)] if est.base else []):
        t.add_row(label, f"{part['rows']:,} rows, {part['engine_seconds']:,.1f} s, ${part['cost_usd']:.6f}")
    Console(highlight=False).print(t)


@with_job_options(only=("instance_type", "price_per_hour", "quantization", "quant_group"))
def profile_cmd(
    job: JobOptionValues,
    model: str = typer.Argument(..., metavar="MODEL", help="checkpoint folder or s3://bucket/prefix"),
    rows: int = typer.Option(64, min=4, max=100_000, metavar="N", help="synthetic rows to run"),
    max_tokens: int = typer.Option(64, min=1, max=4096, metavar="N", help="tokens to generate per row"),
) -> None:
    """Measure MODEL's prefill and decode rates on this machine with a short synthetic job; stored
    for `freight estimate` (the profile of MODEL on INSTANCE_TYPE with QUANTIZATION)."""
    from jobs.profile_store import ProfileStore, profile_key
    from worker.profile_run import run_profile

    instance_type, quantization, group = job["instance_type"], job["quantization"], job["quant_group"]
    try:
        check_quant_group(quantization, group)
    except ValueError as exc:
        raise fail(str(exc)) from None
    label = quantization_label(quantization, group)
    settings = get_settings()
    try:
        with tempfile.TemporaryDirectory(prefix="freight-profile-") as tmp:
            t0 = time.perf_counter()
            profile = run_profile(absolute(model), Path(tmp), settings, instance_type=instance_type,
                                  quantization=quantization, quant_group=group, rows=rows, max_tokens=max_tokens,
                                  price_per_hour=job["price_per_hour"])  # fmt: skip
            took = time.perf_counter() - t0
    except (FreightError, ValueError) as exc:
        raise fail(str(exc)) from None
    ProfileStore.for_settings(settings).put(profile_key(absolute(model), instance_type, label), profile)
    Console(highlight=False).print(
        f"profile of {model} on {instance_type} ({label or 'no quantization'}), measured in {took:.1f} s: "
        f"prefill {profile.prefill_tokens_per_s:,.0f} tok/s, decode {profile.decode_tokens_per_s:,.0f} tok/s, "
        f"stop fraction {profile.stop_fraction:.2f}, load {profile.load_seconds:.1f} s, "
        f"{profile.shard_overhead_s:.2f} s per shard\nstored in {ProfileStore.for_settings(settings).path}",
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""
    app.command("estimate")(estimate_cmd)
    app.command("profile")(profile_cmd)
