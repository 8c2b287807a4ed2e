"""The job options of `freight run`, `submit` and `estimate` as typer parameters, and the JobSpec
they build.

The options come from one table (jobs/job_options.py); `with_job_options` gives a command all of
them, so the three commands take the same flags with the same defaults and help.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from pydantic import ValidationError

from freight_cli.constraint_options import constraint_fields
from jobs.constraint_check import check_constraint
from jobs.errors import FreightError, SpecMismatchError
from jobs.job_options import CACHE_OPTIONS, JOB_OPTIONS, REQUIRED, JobOption
from jobs.manifest import Manifest
from jobs.planner import PreparedJob
from jobs.settings import Settings

if TYPE_CHECKING:
    from jobs.result_cache.options import CacheOptions
    from jobs.spec import JobSpec
    from jobs.storage import ObjectStore

Command = TypeVar("Command", bound=Callable[..., Any])
JobOptionValues = dict[str, Any]  # option name -> the value given (or its default)


def job_parameter(option: JobOption) -> inspect.Parameter:
    """`option` as the parameter typer reads: its type annotated with its Argument or Option."""
    info = (
        typer.Argument(metavar=option.metavar, help=option.help)
        if option.argument
        else typer.Option(option.flag, metavar=option.metavar, help=option.help)
    )
    default = inspect.Parameter.empty if option.default is REQUIRED else option.default
    return inspect.Parameter(
        option.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[option.type, info]
    )


def with_job_options(
    *, only: tuple[str, ...] | None = None, leave_out: tuple[str, ...] = ()
) -> Callable[[Command], Command]:
    """Give a command the job options (`only` those, or all), but `leave_out`, before its own
    parameters. The command's first parameter, `job`, receives them as one JobOptionValues; typer
    sees them one by one."""
    unknown = {*(only or ()), *leave_out} - {option.name for option in JOB_OPTIONS}
    if unknown:
        raise ValueError(f"no job options named {sorted(unknown)}")
    options = [
        job_parameter(option)
        for option in JOB_OPTIONS
        if (only is None or option.name in only) and option.name not in leave_out
    ]
    names = {p.name for p in options}

    def decorate(command: Command) -> Command:
        own = list(inspect.signature(command, eval_str=True).parameters.values())
        if not own or own[0].name != "job":
            raise TypeError(f"{command.__name__} must take the job options as its first parameter, `job`")
        params = [*options, *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[1:])]

        @functools.wraps(command)
        def wrapper(**given: Any) -> Any:
            job = {name: given.pop(name) for name in list(given) if name in names}
            return command(job, **given)

        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return decorate


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
    from jobs.result_cache.options import write_cache_options

    options, caches = split_cache_options(options, settings)
    spec = spec_from_options(output=output, **options)
    try:
        prepared = prepare_job(spec, settings, PriceTable.load(prices) if prices else None, check)
    except SpecMismatchError as exc:
        raise SpecMismatchError(mismatch_line(exc, output), exc.differences) from None
    except ValidationError as exc:
        raise FreightError(validation_line(exc)) from None
    except ValueError as exc:  # a malformed URL or option
        raise FreightError(str(exc)) from None
    write_cache_options(prepared.store, caches)
    return prepared


def split_cache_options(
    options: dict[str, Any], settings: Settings, check: bool = True
) -> tuple[dict[str, Any], CacheOptions]:
    """(the options without the cache ones, the CacheOptions): with `check`, the cache
    (FREIGHT_RESULT_CACHE by default) opened and marked, the embedder checked as a `--task embed`
    checkpoint; FreightError with one line naming the flag otherwise. Nothing of the job is written
    before this passes."""
    from jobs.model_check import check_model
    from jobs.result_cache.options import cache_off, cache_options
    from jobs.result_cache.store import ResultCache

    def located(url: str | None) -> str | None:  # "off" stays a word, never a folder of the working directory
        return None if url is None else url if cache_off(url) else absolute(url)

    rest = {k: v for k, v in options.items() if k not in CACHE_OPTIONS}
    url, threshold, embed_model = (options.get(k) for k in CACHE_OPTIONS)
    caches = cache_options(located(url), threshold, None if embed_model is None else absolute(embed_model),
                           located(settings.result_cache))  # fmt: skip
    if caches.url is not None and check:
        ResultCache.open(caches.url, settings)
    if caches.embed_model is not None and check:
        try:
            check_model(caches.embed_model, settings, embed=True)
        except FreightError as exc:
            raise FreightError(f"--embed-model {caches.embed_model}: {exc}") from None
    return rest, caches


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
    reasoning_budget: int | None = None,
    reasoning_effort: str | None = None,
    no_thinking: bool = False,
    json_schema: Path | None = None,
    regex: str | None = None,
    choice: str | None = None,
    row_constraints: bool = False,
    shard_rows: int,
    instance_type: str,
    market: str,
    price_per_hour: float | None,
    quantization: str | None,
    quant_group: int | None = None,
    speculative: str | None = None,
    speculative_tokens: int | None = None,
    lora: list[str] | None = None,
    max_loras: int | None = None,
) -> JobSpec:
    """The JobSpec of `run` / `submit` / `estimate`'s flags; FreightError with one line if invalid."""
    from jobs.spec import JobSpec, SamplingSpec

    constraint = constraint_fields(json_schema, regex, choice)
    loras = lora_specs(lora or [])
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
                reasoning_budget=reasoning_budget,
                reasoning_effort=reasoning_effort,
                thinking=not no_thinking,
                **constraint,
            ),
            shard_rows=shard_rows,
            instance_type=instance_type,
            market=market,
            price_per_hour=price_per_hour,
            quantization=quantization,
            quant_group=quant_group,
            speculative=speculative if speculative is None or speculative == "ngram" or not speculative.startswith("draft:")
            else "draft:" + absolute(speculative[len("draft:") :]),
            speculative_tokens=speculative_tokens,
            row_constraints=row_constraints,
            loras=loras,
            max_loras=max_loras,
        )
    except ValidationError as exc:
        raise FreightError(validation_line(exc)) from None
    except ValueError as exc:  # a malformed URL or option
        raise FreightError(str(exc)) from None
    check_constraint(spec.sampling, str(json_schema) if json_schema is not None else None)  # names the file
    return spec


def lora_specs(values: list[str]) -> tuple[Any, ...]:
    """`--lora NAME=PATH` values as the spec's LoraSpecs (local paths made absolute); FreightError
    naming the value that is not NAME=PATH or whose name is not one rows can give."""
    from jobs.spec import LoraSpec

    out = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise FreightError(f"--lora {value!r}: give NAME=PATH, e.g. --lora support=/adapters/support")
        try:
            out.append(LoraSpec(name=name.strip(), path=absolute(path.strip())))
        except ValidationError as exc:
            err = exc.errors()[0]
            raise FreightError(f"--lora {value!r}: the {err['loc'][0]} {err['input']!r} "
                               f"{str(err['msg']).removeprefix('Value error, ').lower()} (a name is letters, "
                               "digits and . _ - : / @ +, starting with a letter or digit)") from None  # fmt: skip
    return tuple(out)
