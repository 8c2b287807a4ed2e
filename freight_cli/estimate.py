"""`freight estimate INPUT --model MODEL ...` and `freight profile MODEL`; `--max-cost`'s check.

The estimate reads the dataset as `run` would (worker.estimate_tokens, imported lazily: it needs the
model's tokenizer) and prices it with the model's throughput profile (jobs.profile_store).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from freight_cli.common import fail
from freight_cli.constraint_options import ChoiceOpt, JsonSchemaOpt, RegexOpt, RowConstraintsOpt
from freight_cli.job_options import (
    ContinuationColumnOpt,
    DimensionsOpt,
    FrequencyPenaltyOpt,
    IdColumnOpt,
    InputArg,
    InstanceTypeOpt,
    LogitBiasOpt,
    LogprobsOpt,
    MarketOpt,
    MaxTokensOpt,
    MinPOpt,
    MinTokensOpt,
    ModelOpt,
    NOpt,
    PresencePenaltyOpt,
    PricePerHourOpt,
    PricesOpt,
    PromptColumnOpt,
    QuantizationOpt,
    RepetitionPenaltyOpt,
    SeedOpt,
    ShardRowsOpt,
    StopOpt,
    TaskOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
    absolute,
    spec_from_options,
)
from jobs.errors import FreightError
from jobs.finalize import committed_shards, report_now
from jobs.log import get_logger
from jobs.manifest import MANIFEST_KEY, Manifest
from jobs.settings import Settings, get_settings
from jobs.storage import ObjectStore

log = get_logger(__name__)

MaxCostOpt = Annotated[
    float | None,
    typer.Option(
        metavar="USD", min=0.0,
        help="refuse the job, writing nothing, when `freight estimate` predicts it costs more than USD",
    ),
]  # fmt: skip


def estimate_manifest(manifest: Manifest, settings: Settings, prices: Path | None = None) -> Any:
    """The jobs.estimate.Estimate of a planned job (tokenizes every row: seconds per million)."""
    from jobs.cost import PriceTable
    from jobs.estimate import estimate
    from jobs.model_cache import resolve_model
    from jobs.profile_store import DEFAULT_PROFILE, ProfileStore, profile_key
    from worker.engine.tokenizer import Tokenizer
    from worker.estimate_tokens import count_tokens

    spec = manifest.spec
    model_dir = resolve_model(spec.model, settings)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    key = profile_key(spec.model, spec.instance_type, spec.quantization)
    profile = ProfileStore.for_settings(settings).get(key) or DEFAULT_PROFILE
    counts = count_tokens(manifest, Tokenizer(Path(model_dir)), settings, config.get("max_position_embeddings"),
                          stop_hazard=profile.stop_hazard)  # fmt: skip
    table = PriceTable.load(prices) if prices else PriceTable.load()
    return estimate(counts, profile, table, spec.instance_type, spec.market, spec.price_per_hour)


def max_cost_check(max_cost: float | None, settings: Settings, prices: Path | None) -> Any:
    """prepare_job's `check` for --max-cost: refuses a job whose estimate is above it (None: no check).
    On a rerun of a job already in OUT the cap holds for the work left: only the shards not yet
    committed are estimated (a shard partly run before an interruption counts whole, so the estimate
    errs high), and the refusal says what the job has already cost (its committed shards and any
    interrupted attempts, as `freight cost` bills them)."""
    if max_cost is None:
        return None

    def check(manifest: Manifest, store: ObjectStore) -> None:
        resumed = store.exists(MANIFEST_KEY)
        done = sorted(committed_shards(store) & {s.index for s in manifest.shards}) if resumed else []
        remaining = tuple(s for s in manifest.shards if s.index not in done)
        spent = report_now(store, manifest, done) if resumed else {"cost_usd": 0.0, "uncommitted_attempts": 0}
        est = estimate_manifest(manifest.model_copy(update={"shards": remaining}), settings, prices) if remaining else None
        log.info("max_cost_checked", max_cost=max_cost, remaining_usd=est.cost_usd if est else 0.0,
                 shards_left=len(remaining), spent_usd=spent["cost_usd"])  # fmt: skip
        if est is None or est.cost_usd <= max_cost:
            return
        basis = f"{est.confidence} profile; {est.rows:,} rows, {est.hours:.3f} h on {est.instance_type}"
        if not resumed:
            raise FreightError(f"--max-cost {max_cost:g}: the job is estimated at ${est.cost_usd:.6f} ({basis}): "
                               "raise the limit, or shrink the job")  # fmt: skip
        lost = spent["uncommitted_attempts"]
        raise FreightError(
            f"--max-cost {max_cost:g}: the remaining work ({len(remaining)} of {len(manifest.shards)} shards, "
            f"{est.rows:,} rows) is estimated at ${est.cost_usd:.6f} ({basis}); already spent "
            f"${spent['cost_usd']:.6f} on {len(done)} committed shard{'' if len(done) == 1 else 's'}"
            + (f" and {lost} interrupted attempt{'' if lost == 1 else 's'}" if lost else "")
            + ": raise the limit (it caps the work left), or shrink the job"
        )

    return check


def estimate_cmd(
    input: InputArg,
    model: ModelOpt,
    prompt_column: PromptColumnOpt = "prompt",
    id_column: IdColumnOpt = None,
    continuation_column: ContinuationColumnOpt = None,
    task: TaskOpt = "generate",
    dimensions: DimensionsOpt = None,
    max_tokens: MaxTokensOpt = 128,
    temperature: TemperatureOpt = 0.0,
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    seed: SeedOpt = 0,
    stop: StopOpt = None,
    n: NOpt = 1,
    logprobs: LogprobsOpt = None,
    presence_penalty: PresencePenaltyOpt = 0.0,
    frequency_penalty: FrequencyPenaltyOpt = 0.0,
    repetition_penalty: RepetitionPenaltyOpt = 1.0,
    min_p: MinPOpt = 0.0,
    min_tokens: MinTokensOpt = 0,
    logit_bias: LogitBiasOpt = None,
    json_schema: JsonSchemaOpt = None,
    regex: RegexOpt = None,
    choice: ChoiceOpt = None,
    row_constraints: RowConstraintsOpt = False,
    shard_rows: ShardRowsOpt = 256,
    instance_type: InstanceTypeOpt = "cpu-local",
    market: MarketOpt = "on-demand",
    price_per_hour: PricePerHourOpt = None,
    prices: PricesOpt = None,
    quantization: QuantizationOpt = None,
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Predict a job's tokens, engine hours and dollars before running it (writes nothing); it takes
    the options of `run`."""
    options = {k: v for k, v in locals().items() if k not in ("as_json", "prices")}  # the flags of run
    from jobs.cost import PriceTable
    from jobs.planner import plan

    settings = get_settings()
    try:
        spec = spec_from_options(output=absolute(input) + ".estimate", **options)
        manifest = plan(spec, settings, PriceTable.load(prices) if prices else None)
        est = estimate_manifest(manifest, settings, prices)
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
        ("prompt tokens (to compute after prefix reuse)", f"{est.prompt_tokens:,} ({est.computed_prompt_tokens:,})"),
        ("completion tokens (expected / at most)", f"{est.completion_tokens:,} / {est.max_completion_tokens:,}"),
        ("engine seconds", f"{est.engine_seconds:,.1f}"),
        ("billed hours", f"{est.hours:,.4f}"),
        (f"cost ({est.market})", f"${est.cost_usd:.6f}"),
        ("on-demand / spot", f"${est.on_demand_cost_usd:.6f} / {spot}"),
        ("confidence", f"{est.confidence} profile"),
    ):  # fmt: skip
        t.add_row(what, value)
    Console(highlight=False).print(t)


def profile_cmd(
    model: str = typer.Argument(..., metavar="MODEL", help="checkpoint folder or s3://bucket/prefix"),
    instance_type: InstanceTypeOpt = "cpu-local",
    quantization: QuantizationOpt = None,
    rows: int = typer.Option(64, min=4, max=100_000, metavar="N", help="synthetic rows to run"),
    max_tokens: int = typer.Option(64, min=1, max=4096, metavar="N", help="tokens to generate per row"),
    price_per_hour: PricePerHourOpt = None,
) -> None:
    """Measure MODEL's prefill and decode rates on this machine with a short synthetic job; stored
    for `freight estimate` (the profile of MODEL on INSTANCE_TYPE with QUANTIZATION)."""
    from jobs.profile_store import ProfileStore, profile_key
    from worker.profile_run import run_profile

    settings = get_settings()
    try:
        with tempfile.TemporaryDirectory(prefix="freight-profile-") as tmp:
            t0 = time.perf_counter()
            profile = run_profile(absolute(model), Path(tmp), settings, instance_type=instance_type,
                                  quantization=quantization, rows=rows, max_tokens=max_tokens,
                                  price_per_hour=price_per_hour)  # fmt: skip
            took = time.perf_counter() - t0
    except (FreightError, ValueError) as exc:
        raise fail(str(exc)) from None
    ProfileStore.for_settings(settings).put(profile_key(absolute(model), instance_type, quantization), profile)
    Console(highlight=False).print(
        f"profile of {model} on {instance_type} ({quantization or 'no quantization'}), measured in {took:.1f} s: "
        f"prefill {profile.prefill_tokens_per_s:,.0f} tok/s, decode {profile.decode_tokens_per_s:,.0f} tok/s, "
        f"stop fraction {profile.stop_fraction:.2f}, load {profile.load_seconds:.1f} s, "
        f"{profile.shard_overhead_s:.2f} s per shard\nstored in {ProfileStore.for_settings(settings).path}",
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""
    app.command("estimate")(estimate_cmd)
    app.command("profile")(profile_cmd)
