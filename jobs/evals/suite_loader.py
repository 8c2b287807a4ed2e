"""Loading a suite file: the TOML, its validation, and the frozen objects of suite.py it yields.

A suite file is checked completely at load (syntax, keys, metrics, cron, dataset columns) and
every problem is reported with its line and what to do, before any job is planned.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from jobs.constraint_check import constraint_problem
from jobs.errors import FreightError
from jobs.evals.cron import validate_cron
from jobs.evals.lines import LineIndex, PathPart
from jobs.evals.metrics import METRICS, Metric, MultipleChoice
from jobs.evals.suite import Sampling, Suite, SuiteError, SuiteFile, option_field, resolve_location
from jobs.result_cache.options import cache_off
from jobs.settings import get_settings
from jobs.spec import ADAPTER_NAME, SamplingSpec
from jobs.storage import join_url

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
# columns of the eval results; a metric must not take one of these names
RESERVED_COLUMNS = frozenset({"id", "prompt", "reference", "completion", "finish_reason", "error", "choices"})
_TOP_KEYS = ("id", "history", "output", "result_cache", "suite")


class _SuiteFields(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=NAME_PATTERN)
    dataset: str = Field(min_length=1)
    models: list[str] = Field(min_length=1)
    schedule: str | None = None
    prompt_column: str | None = None
    messages_column: str | None = None
    reference_column: str = "reference"
    id_column: str | None = option_field("id_column", None)
    sampling: Sampling = Sampling()
    shard_rows: int | None = option_field("shard_rows", None, ge=1)
    metrics: list[dict[str, Any]] = Field(min_length=1)
    # speculative decoding of the generate jobs ("ngram" | "draft:PATH"; outputs unchanged)
    speculative: str | None = option_field("speculative", None, pattern=r"^(ngram|draft:.+)$")
    speculative_tokens: int | None = option_field("speculative_tokens", None, ge=1, le=16)
    # LoRA adapters: name -> PEFT adapter folder or s3:// prefix; each runs the suite beside the model
    adapters: dict[str, str] = Field(default_factory=dict, description="LoRA adapters of the models, name = "
                                     "\"folder or s3:// prefix\": every adapter runs the suite and the report "
                                     "compares each with its model")  # fmt: skip

    @model_validator(mode="after")
    def _one_prompt_source(self) -> _SuiteFields:
        if self.prompt_column and self.messages_column:
            raise ValueError("give prompt_column or messages_column, not both")
        return self


def _meaning(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """What the key at `loc` means, for a problem line: " (max_tokens: tokens to generate ...)"."""
    fields = model.model_fields
    if len(loc) == 2 and loc[0] == "sampling" and model is _SuiteFields:
        fields = Sampling.model_fields
    info = fields.get(str(loc[-1])) if loc else None
    return f" ({loc[-1]}: {info.description})" if info is not None and info.description else ""


SchemaReader = Callable[[str], Sequence[str]]


def load_suite_file(path: str | Path, read_columns: SchemaReader | None = None) -> SuiteFile:
    """Load and check a suite file. `read_columns(dataset) -> column names` (default: the Parquet
    schema of the dataset, local or s3://). Raises SuiteError listing every problem."""
    path = Path(path)
    if not path.is_file():
        raise SuiteError(f"{path}: no such suite file; pass the path of a TOML file with [[suite]] tables")
    return parse_suite_text(path.read_text(encoding="utf-8"), path, read_columns or dataset_columns)


def parse_suite_text(text: str, path: Path, read_columns: SchemaReader | None) -> SuiteFile:
    """Check the TOML `text` of the suite file at `path` (relative paths resolve against its
    folder). With `read_columns` None the dataset columns are not checked (a stored snapshot)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: {exc}: fix the TOML syntax there") from exc
    return _Loader(path, LineIndex(text), read_columns).load(raw)


class _Loader:
    def __init__(self, path: Path, lines: LineIndex, read_columns: SchemaReader | None) -> None:
        self.path, self.lines, self.read_columns = path, lines, read_columns
        self.base_dir = path.resolve().parent
        self.problems: list[str] = []

    def problem(self, where: Sequence[PathPart], what: str) -> None:
        line = self.lines.line_of(where)
        self.problems.append(f"{self.path}:{line if line is not None else 1}: {what}")

    def load(self, raw: dict[str, Any]) -> SuiteFile:
        for key in raw:
            if key not in _TOP_KEYS:
                self.problem([key], f"unknown top-level key {key!r}; allowed: {', '.join(_TOP_KEYS)}")
        tables = raw.get("suite", [])
        if not isinstance(tables, list) or not tables:
            self.problem(
                ["suite"], "no suites: add at least one [[suite]] table (name, dataset, models, metrics)"
            )
            tables = []
        suites = [s for i, table in enumerate(tables) if (s := self.suite(i, table)) is not None]
        seen: set[str] = set()
        for i, suite in enumerate(suites):
            if suite.name in seen:
                self.problem(
                    ["suite", i, "name"], f"suite name {suite.name!r} is used twice; names must be unique"
                )
            seen.add(suite.name)
        for key in ("id", "history", "output", "result_cache"):
            if key in raw and not (isinstance(raw[key], str) and raw[key]):
                self.problem([key], f"{key} must be a non-empty string")
        if self.problems:
            raise SuiteError("\n".join(self.problems))
        history = resolve_location(str(raw.get("history", "eval-history")), self.base_dir)
        return SuiteFile(
            path=self.path.resolve(),
            lock_id=str(raw.get("id") or self.path.resolve()),
            history=history,
            output=resolve_location(str(raw.get("output", "eval-runs")), self.base_dir),
            suites=tuple(suites),
            result_cache=self.result_cache(raw.get("result_cache"), history),
        )

    def result_cache(self, given: str | None, history: str) -> str | None:
        """The suites' result cache: the file's key ("off": none), else FREIGHT_RESULT_CACHE, else a
        cache beside the history, so nightly runs reuse the answers of rows that did not change."""
        value = given if given is not None else get_settings().result_cache
        if value is None:
            return join_url(history, "result-cache")
        if cache_off(value):
            return None
        # the file's path is taken from its folder, the environment's from the working directory
        return resolve_location(value, self.base_dir if given is not None else Path.cwd())

    def pydantic_problems(
        self, where: tuple[PathPart, ...], exc: ValidationError, label: str, model: type[BaseModel]
    ) -> None:
        for error in exc.errors():
            loc = (*where, *error["loc"])
            field = ".".join(str(p) for p in error["loc"]) or "table"
            if error["type"] == "extra_forbidden":
                fields = (
                    Sampling.model_fields
                    if error["loc"][0] == "sampling" and model is _SuiteFields
                    else model.model_fields
                )
                allowed = ", ".join(k for k in fields if k != "type")
                self.problem(loc, f"{label}: unknown key {field!r}; allowed keys: {allowed}")
            elif error["type"] == "missing":
                self.problem(loc[:-1], f"{label}: missing key {field!r}; add it")
            else:
                self.problem(loc, f"{label}: {field}: {error['msg']}{_meaning(model, error['loc'])}")

    def suite(self, i: int, table: Any) -> Suite | None:
        where: tuple[PathPart, ...] = ("suite", i)
        label = f"suite {table.get('name', i + 1)!r}" if isinstance(table, dict) else f"suite {i + 1}"
        try:
            fields = _SuiteFields.model_validate(table)
        except ValidationError as exc:
            self.pydantic_problems(where, exc, label, _SuiteFields)
            return None
        before = len(self.problems)
        metrics = [
            m
            for j, spec in enumerate(fields.metrics)
            if (m := self.metric(where, j, spec, label)) is not None
        ]
        columns = [c for m in metrics for c in m.columns()]
        for column in {c for c in columns if columns.count(c) > 1 or c in RESERVED_COLUMNS}:
            self.problem(
                (*where, "metrics"),
                f"{label}: metric column {column!r} is taken; give the metric another `name`",
            )
        if sum(m.needs_likelihood for m in metrics) > 1:
            self.problem(
                (*where, "metrics"), f"{label}: at most one multiple_choice metric per suite; split the suite"
            )
        if fields.schedule is not None:
            try:
                validate_cron(fields.schedule)
            except ValueError as exc:
                self.problem((*where, "schedule"), f"{label}: {exc}")
        suite = Suite(
            name=fields.name,
            dataset=resolve_location(fields.dataset, self.base_dir),
            models=tuple(resolve_location(m, self.base_dir) for m in fields.models),
            schedule=fields.schedule,
            prompt_column=None if fields.messages_column else (fields.prompt_column or "prompt"),
            messages_column=fields.messages_column,
            reference_column=fields.reference_column,
            id_column=fields.id_column,
            sampling=fields.sampling,
            shard_rows=fields.shard_rows,
            metrics=tuple(metrics),
            speculative=fields.speculative if fields.speculative in (None, "ngram")
            else "draft:" + resolve_location(fields.speculative[len("draft:") :], self.base_dir),
            speculative_tokens=fields.speculative_tokens,
            adapters=tuple((name, resolve_location(path, self.base_dir)) for name, path in fields.adapters.items()),
        )
        self.check_adapters(where, fields.adapters, label)
        self.check_columns(where, suite, label)
        self.check_constraint(where, fields.sampling, label)
        return suite if len(self.problems) == before else None

    def check_adapters(self, where: tuple[PathPart, ...], adapters: dict[str, str], label: str) -> None:
        """Adapter names as `--lora` takes them (the files are checked against each model at run)."""
        for name, path in adapters.items():
            if not re.match(ADAPTER_NAME, name) or len(name) > 128:
                self.problem((*where, "adapters", name), f"{label}: adapter name {name!r}: use letters, digits "
                             "and . _ - : / @ + (at most 128), starting with a letter or digit")  # fmt: skip
            if not path.strip():
                self.problem((*where, "adapters", name), f"{label}: adapter {name!r}: give its folder or s3:// prefix")

    def check_constraint(self, where: tuple[PathPart, ...], sampling: Sampling, label: str) -> None:
        """The answers' constraint compiled as the worker compiles it (jobs/constraint_check.py)."""
        kind = next((k for k in ("json_schema", "regex", "choice") if getattr(sampling, k) is not None), None)
        if kind is None:
            return
        try:
            spec = SamplingSpec(**{kind: getattr(sampling, kind)})
        except ValidationError as exc:
            self.problem((*where, "sampling", kind), f"{label}: sampling.{kind}: {exc.errors()[0]['msg']}")
            return
        problem = constraint_problem(spec)
        if problem is not None:
            self.problem((*where, "sampling", kind), f"{label}: sampling.{kind} does not compile: {problem}; fix it")

    def metric(self, where: tuple[PathPart, ...], j: int, spec: dict[str, Any], label: str) -> Metric | None:
        at = (*where, "metrics", j)
        kind = spec.get("type")
        if not isinstance(kind, str) or kind not in METRICS:
            close = difflib.get_close_matches(str(kind), METRICS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            self.problem(
                (*at, "type"),
                f"{label}: unknown metric {kind!r}{hint}; use one of: {', '.join(sorted(METRICS))}",
            )
            return None
        try:
            metric = METRICS[kind].model_validate(spec)
            metric.bind(self.base_dir)
        except ValidationError as exc:
            self.pydantic_problems(at, exc, f"{label}, metric {kind!r}", METRICS[kind])
            return None
        except ValueError as exc:
            self.problem(at, f"{label}, metric {kind!r}: {exc}")
            return None
        return metric

    def check_columns(self, where: tuple[PathPart, ...], suite: Suite, label: str) -> None:
        if suite.messages_column and suite.needs_likelihood:
            self.problem(
                (*where, "messages_column"),
                f"{label}: multiple_choice scores a text context; use prompt_column",
            )
        if self.read_columns is None:
            return
        try:
            present = list(self.read_columns(suite.dataset))
        except (OSError, ValueError, FreightError) as exc:
            self.problem(
                (*where, "dataset"),
                f"{label}: cannot read dataset {suite.dataset}: {exc}; point `dataset` at a Parquet file or folder",
            )
            return
        prompt_key = "prompt_column" if suite.prompt_column else "messages_column"
        # (key, column, where the key is written)
        wanted: list[tuple[str, str, tuple[PathPart, ...]]] = [
            (prompt_key, suite.prompt_column or suite.messages_column or "", (*where, prompt_key)),
            ("reference_column", suite.reference_column, (*where, "reference_column")),
        ]
        if suite.id_column:
            wanted.append(("id_column", suite.id_column, (*where, "id_column")))
        for j, m in enumerate(suite.metrics):
            if isinstance(m, MultipleChoice):
                wanted.append(("choices_column", m.choices_column, (*where, "metrics", j, "choices_column")))
            if m.reference_column:
                wanted.append(
                    ("reference_column", m.reference_column, (*where, "metrics", j, "reference_column"))
                )
        for key, column, at in wanted:
            if column not in present:
                self.problem(
                    at,
                    f"{label}: dataset {suite.dataset} has no column {column!r} ({key}); "
                    f"its columns: {', '.join(present)}",
                )


def dataset_columns(dataset: str) -> list[str]:
    """Column names of a Parquet dataset (file, folder or s3:// prefix): its first file's schema."""
    from jobs.datasets import fetch_input, list_input_files, parquet_schema

    fmt, files = list_input_files(dataset)
    if fmt != "parquet":
        raise ValueError("suites read Parquet datasets; convert the JSONL file to Parquet")
    schema, _rows = parquet_schema(files[0], fetch_input(files[0]))
    return list(schema.names)
