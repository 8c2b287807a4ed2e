"""The job options `freight run` and `freight submit` share, and the spec they build.

Declared once as Annotated types so both commands take the same flags with the same help.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from jobs.errors import FreightError
from jobs.planner import PreparedJob
from jobs.settings import Settings

InputArg = Annotated[
    str, typer.Argument(help="Parquet file, folder/prefix of Parquet files, or OpenAI-Batch .jsonl")
]
ModelOpt = Annotated[
    str, typer.Option("--model", help="Hugging Face checkpoint folder or s3://bucket/prefix")
]
OutputOpt = Annotated[str, typer.Option("--output", help="OUT: local folder or s3://bucket/prefix")]
PromptColumnOpt = Annotated[str, typer.Option(help="string prompts, or chat messages (list of role/content)")]
IdColumnOpt = Annotated[str | None, typer.Option(help="ids for the results (default: the row index)")]
ContinuationColumnOpt = Annotated[str | None, typer.Option(help="score this column's text after the prompt")]
MaxTokensOpt = Annotated[int, typer.Option(help="tokens to generate per row, at most")]
TemperatureOpt = Annotated[float, typer.Option(help="0 = greedy")]
TopPOpt = Annotated[float, typer.Option(help="nucleus sampling mass (1 = off)")]
TopKOpt = Annotated[int, typer.Option(help="0 = off")]
SeedOpt = Annotated[int, typer.Option(help="job seed; each row's seed is hash(seed, row id)")]
ShardRowsOpt = Annotated[int, typer.Option(help="rows per shard, about")]
InstanceTypeOpt = Annotated[str, typer.Option(help="a key of the price table")]
MarketOpt = Annotated[str, typer.Option(help="on-demand or spot")]
PricePerHourOpt = Annotated[float | None, typer.Option(help="USD per hour; overrides the price table")]
PricesOpt = Annotated[Path | None, typer.Option(help="a price table TOML instead of the shipped one")]
QuantizationOpt = Annotated[
    str | None,
    typer.Option(help="int8, int4 or fp8 (GPUs of compute capability 8.9+: L4, L40S, H100, H200): "
                 "quantize the weights at load"),
]
DeadlineOpt = Annotated[
    str | None,
    typer.Option(
        help="finish by: an ISO-8601 time (2025-06-01T18:00, local unless it has an offset) or a "
        "duration from now (2h, 30m, 1h30m, 1d); the autoscaler sizes the fleet to meet it"
    ),
]

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_deadline(text: str, now: float) -> float:
    """`--deadline` as unix seconds: a duration from `now` (1d, 2h, 30m, 90s, or a run like 1h30m)
    or an ISO-8601 time. ValueError, with one line for the user, when it is neither or not in the
    future."""
    value = text.strip()
    duration = _DURATION.fullmatch(value.lower())
    if value and duration:
        days, hours, minutes, seconds = (int(g or 0) for g in duration.groups())
        deadline = now + days * 86400 + hours * 3600 + minutes * 60 + seconds
    else:
        try:
            deadline = datetime.fromisoformat(value).timestamp()
        except ValueError:
            raise ValueError(
                f"--deadline {text!r} is neither an ISO-8601 time (2025-06-01T18:00+00:00) nor a "
                "duration (2h, 30m, 1h30m)"
            ) from None
    if deadline <= now:
        raise ValueError(f"--deadline {text!r} is not in the future")
    return deadline


def absolute(url: str) -> str:
    """Local paths become absolute (the manifest must mean the same files from any directory and any
    worker); URLs stay as given (open_store refuses unknown schemes)."""
    if "://" in url or not url.strip():
        return url
    return str(Path(url).expanduser().absolute())


def validation_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "spec"
    return f"invalid {where}: {err.get('msg', 'bad value')}"


def prepare_from_options(
    settings: Settings,
    *,
    input: str,
    model: str,
    output: str,
    prompt_column: str,
    id_column: str | None,
    continuation_column: str | None,
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int,
    shard_rows: int,
    instance_type: str,
    market: str,
    price_per_hour: float | None,
    prices: Path | None,
    quantization: str | None,
) -> PreparedJob:
    """Validate the options into a JobSpec and write (or match) OUT's manifest.

    Raises FreightError with one clear line for anything the user can fix; nothing is written then.
    """
    from jobs.cost import PriceTable
    from jobs.planner import prepare_job
    from jobs.spec import JobSpec, SamplingSpec

    try:
        spec = JobSpec(
            input=absolute(input),
            model=absolute(model),
            output=absolute(output),
            prompt_column=prompt_column,
            id_column=id_column,
            continuation_column=continuation_column,
            sampling=SamplingSpec(
                max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed
            ),
            shard_rows=shard_rows,
            instance_type=instance_type,
            market=market,
            price_per_hour=price_per_hour,
            quantization=quantization,
        )
        return prepare_job(spec, settings, PriceTable.load(prices) if prices else None)
    except ValidationError as exc:
        raise FreightError(validation_line(exc)) from None
    except ValueError as exc:  # a malformed URL or option
        raise FreightError(str(exc)) from None
