"""The job options `freight run` and `freight submit` share, and the spec they build.

Declared once as Annotated types so both commands take the same flags with the same help.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from pydantic import ValidationError

from freight_cli.constraint_options import constraint_fields
from jobs.constraint_check import check_constraint
from jobs.errors import FreightError, SpecMismatchError
from jobs.manifest import Manifest
from jobs.planner import PreparedJob
from jobs.settings import Settings

if TYPE_CHECKING:
    from jobs.spec import JobSpec
    from jobs.storage import ObjectStore


def _shipped_instance_types() -> str:
    """The shipped price table's keys, for --instance-type's help (read once, at import: a small TOML)."""
    import tomllib

    from jobs.cost import SHIPPED_PRICES

    try:
        return ", ".join(tomllib.loads(SHIPPED_PRICES.read_text()))
    except (OSError, tomllib.TOMLDecodeError):  # the help must not fail; the run will say why
        return "see jobs/prices.toml"


InputArg = Annotated[
    str,
    typer.Argument(
        metavar="INPUT", help="Parquet file, folder/prefix of Parquet files, or OpenAI-Batch .jsonl"
    ),
]
ModelOpt = Annotated[
    str, typer.Option("--model", metavar="MODEL", help="Hugging Face checkpoint folder or s3://bucket/prefix")
]
OutputOpt = Annotated[
    str, typer.Option("--output", metavar="OUT", help="where results go: local folder or s3://bucket/prefix")
]
PromptColumnOpt = Annotated[
    str, typer.Option(metavar="COLUMN", help="string prompts, or chat messages (list of role/content)")
]
IdColumnOpt = Annotated[
    str | None,
    typer.Option(
        metavar="COLUMN", help="unique ids (strings or integers) for the results (default: the row number)"
    ),
]
ContinuationColumnOpt = Annotated[
    str | None, typer.Option(metavar="COLUMN", help="score this column's text after the prompt")
]
TaskOpt = Annotated[
    Literal["generate", "embed"],
    typer.Option(
        help="generate: completions; embed: one embedding per prompt (as /v1/embeddings), pooled as the "
        "checkpoint's sentence-transformers files say (Qwen3-Embedding, e5-mistral); a Parquet input's "
        "prompt column must hold text"
    ),
]
DimensionsOpt = Annotated[
    int | None,
    typer.Option(metavar="N", help="--task embed: keep the first N dimensions (Matryoshka), then normalize"),
]
MaxTokensOpt = Annotated[int, typer.Option(metavar="N", help="tokens to generate per row, at most")]
TemperatureOpt = Annotated[float, typer.Option(metavar="T", help="sampling temperature; 0 = greedy")]
TopPOpt = Annotated[float, typer.Option(metavar="P", help="nucleus sampling mass in (0, 1]; 1 = off")]
TopKOpt = Annotated[int, typer.Option(metavar="K", help="sample from the K likeliest tokens; 0 = off")]
SeedOpt = Annotated[int, typer.Option(metavar="SEED", help="job seed; each row's seed is hash(seed, row id)")]
# Sampling flags with vLLM's names and meanings; a row's column or JSONL body field of the same name
# overrides each (README "Sampling").
StopOpt = Annotated[
    list[str] | None,
    typer.Option(metavar="TEXT", help="stop string, cut from the text with what follows (repeat for more)"),
]
NOpt = Annotated[int, typer.Option("--n", metavar="N", help="choices per row (FREIGHT_MAX_N caps it)")]
LogprobsOpt = Annotated[
    int | None,
    typer.Option(metavar="K", help="log-probabilities of each generated token and its K likeliest (0-20)"),
]
PresencePenaltyOpt = Annotated[
    float, typer.Option(metavar="P", help="in [-2, 2]: lowers tokens already generated, once each")
]
FrequencyPenaltyOpt = Annotated[
    float, typer.Option(metavar="P", help="in [-2, 2]: lowers tokens by how often they were generated")
]
RepetitionPenaltyOpt = Annotated[
    float, typer.Option(metavar="P", help="> 0: divides the logits of prompt and generated tokens; 1 = off")
]
MinPOpt = Annotated[
    float, typer.Option(metavar="P", help="drop tokens below P x the likeliest's probability; 0 = off")
]
MinTokensOpt = Annotated[int, typer.Option(metavar="N", help="tokens to generate before EOS may end a row")]
LogitBiasOpt = Annotated[
    str | None,
    typer.Option(metavar="JSON", help='bias added to token logits, e.g. \'{"50256": -100}\' (token id: [-100, 100])'),
]
ShardRowsOpt = Annotated[int, typer.Option(metavar="N", help="rows per shard, about")]
InstanceTypeOpt = Annotated[
    str,
    typer.Option(
        metavar="TYPE",
        help=f"where it runs, for the cost report: one of {_shipped_instance_types()} (the shipped "
        "price table), or a key of --prices, or any name with --price-per-hour",
    ),
]
MarketOpt = Annotated[Literal["on-demand", "spot"], typer.Option(help="which price of the instance type")]
PricePerHourOpt = Annotated[
    float | None, typer.Option(metavar="USD", help="USD per instance-hour; overrides the price table")
]
PricesOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
        help="a price table instead of the shipped one: a TOML table per instance type with USD per hour, "
        'e.g. ["g5.xlarge"] on_demand = 1.006 spot = 0.40 (spot optional: defaults to on_demand)',
    ),
]
QuantizationOpt = Annotated[
    Literal["int8", "int4", "fp8"] | None,
    typer.Option(
        help="quantize the weights at load (int8/int4: round to nearest; fp8: e4m3, on GPUs of compute "
        "capability 8.9+ such as L4, L40S, H100, H200)"
    ),
]
SpeculativeOpt = Annotated[
    str | None,
    typer.Option(
        metavar="ngram|draft:PATH",
        help="speculative decoding: ngram proposes the tokens that followed the text's last 1-4 tokens "
        "earlier in the prompt or completion (copy-heavy tasks); draft:PATH a smaller checkpoint with the "
        "same tokenizer. Outputs are unchanged; it turns itself off where it does not pay",
    ),
]
SpeculativeTokensOpt = Annotated[
    int | None,
    typer.Option(metavar="K", help="speculative decoding: most tokens proposed per step (default: ngram 8, draft 6)"),
]
DeadlineOpt = Annotated[
    str | None,
    typer.Option(
        metavar="WHEN",
        help="finish by: an ISO-8601 time (2025-06-01T18:00, local unless it has an offset) or a "
        "duration from now (2h, 30m, 1h30m, 1d); the autoscaler sizes the fleet to meet it",
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


def flag_of(path: str | tuple[object, ...]) -> str:
    """The command-line name of a JobSpec field: ("sampling", "max_tokens") or "sampling.max_tokens"
    -> "--max-tokens"; "input" -> "INPUT" (the argument)."""
    parts = path.split(".") if isinstance(path, str) else [str(p) for p in path]
    name = parts[-1] if parts else ""
    if name == "input":
        return "INPUT"
    return "--" + name.replace("_", "-") if name else "the options"


def validation_line(exc: ValidationError) -> str:
    """A JobSpec validation error as one line naming the flag: "--max-tokens 0: input should be ..."."""
    err = exc.errors()[0]
    msg = str(err.get("msg", "bad value")).removeprefix("Value error, ")
    msg = msg[:1].lower() + msg[1:]
    loc = tuple(err.get("loc", ()))
    if not loc:  # a rule across fields; its message names them
        return msg
    value = err.get("input")
    shown = f" {value!r}" if isinstance(value, int | float | str) and not isinstance(value, bool) else ""
    return f"{flag_of(loc)}{shown}: {msg}"


def mismatch_line(exc: SpecMismatchError, out: str) -> str:
    """OUT holds another job: the differing options by flag, then what to do."""
    if not exc.differences:
        return str(exc)
    shown = "; ".join(f"{flag_of(path)} was {there!r}, now {here!r}" for path, there, here in exc.differences)
    return f"{out} holds another job, with other options ({shown}): use a new --output, or the same options to resume it"


def prepare_from_options(
    settings: Settings,
    *,
    output: str,
    prices: Path | None,
    check: Callable[[Manifest, ObjectStore], None] | None = None,
    **options: Any,
) -> PreparedJob:
    """Validate the options (those of `spec_from_options`) into a JobSpec and write (or match) OUT's
    manifest.

    Raises FreightError with one clear line for anything the user can fix; nothing is written then.
    """
    from jobs.cost import PriceTable
    from jobs.planner import prepare_job

    spec = spec_from_options(output=output, **options)
    try:
        return prepare_job(spec, settings, PriceTable.load(prices) if prices else None, check)
    except SpecMismatchError as exc:
        raise SpecMismatchError(mismatch_line(exc, output), exc.differences) from None
    except ValidationError as exc:
        raise FreightError(validation_line(exc)) from None
    except ValueError as exc:  # a malformed URL or option
        raise FreightError(str(exc)) from None


def spec_from_options(
    *,
    input: str,
    model: str,
    output: str,
    prompt_column: str,
    id_column: str | None,
    continuation_column: str | None,
    task: str = "generate",
    dimensions: int | None = None,
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int,
    stop: list[str] | None = None,
    n: int = 1,
    logprobs: int | None = None,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    repetition_penalty: float = 1.0,
    min_p: float = 0.0,
    min_tokens: int = 0,
    logit_bias: str | None = None,
    json_schema: Path | None = None,
    regex: str | None = None,
    choice: str | None = None,
    row_constraints: bool = False,
    shard_rows: int,
    instance_type: str,
    market: str,
    price_per_hour: float | None,
    quantization: str | None,
    speculative: str | None = None,
    speculative_tokens: int | None = None,
) -> JobSpec:
    """The JobSpec of `run` / `submit` / `estimate`'s flags; FreightError with one line if invalid."""
    from jobs.spec import JobSpec, SamplingSpec

    constraint = constraint_fields(json_schema, regex, choice)
    try:
        spec = JobSpec(
            input=absolute(input),
            model=absolute(model),
            output=absolute(output),
            prompt_column=prompt_column,
            id_column=id_column,
            continuation_column=continuation_column,
            task=task,
            dimensions=dimensions,
            sampling=SamplingSpec(
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                seed=seed,
                stop=tuple(stop or ()),
                n=n,
                logprobs=logprobs,
                presence_penalty=presence_penalty,
                frequency_penalty=frequency_penalty,
                repetition_penalty=repetition_penalty,
                min_p=min_p,
                min_tokens=min_tokens,
                logit_bias=logit_bias or (),
                **constraint,
            ),
            shard_rows=shard_rows,
            instance_type=instance_type,
            market=market,
            price_per_hour=price_per_hour,
            quantization=quantization,
            speculative=speculative if speculative is None or speculative == "ngram" or not speculative.startswith("draft:")
            else "draft:" + absolute(speculative[len("draft:") :]),
            speculative_tokens=speculative_tokens,
            row_constraints=row_constraints,
        )
    except ValidationError as exc:
        raise FreightError(validation_line(exc)) from None
    except ValueError as exc:  # a malformed URL or option
        raise FreightError(str(exc)) from None
    check_constraint(spec.sampling, str(json_schema) if json_schema is not None else None)  # names the file
    return spec
