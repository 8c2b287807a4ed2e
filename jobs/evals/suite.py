"""Evaluation suites: the frozen objects the rest works on (a suite file's, once loaded and checked
by suite_loader.py), and SuiteError, the error of a suite file that cannot be run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from jobs.errors import FreightError
from jobs.evals.metrics import Metric
from jobs.job_options import job_option


class SuiteError(FreightError, ValueError):
    """A suite file that cannot be run; the message lists each problem as `file:line: what`."""


def option_field(name: str, default: Any, **rules: Any) -> Any:
    """A suite key of a job option's name: its own default and rules, the option's help
    (jobs/job_options.py) as its description."""
    return Field(default, description=job_option(name).help, **rules)


class Sampling(BaseModel):
    """Generation settings of a suite, keys named as the job options: greedy with a fixed seed and
    short answers unless told otherwise."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    max_tokens: int = option_field("max_tokens", 32, ge=1)
    temperature: float = option_field("temperature", 0.0, ge=0.0)
    top_p: float = option_field("top_p", 1.0, gt=0.0, le=1.0)
    seed: int = option_field("seed", 0, ge=0)
    # structured output for every generated answer (jobs/spec.py SamplingSpec checks them), at most
    # one; written inline (a table, a list) where the flags take a file and comma-separated text
    json_schema: dict[str, Any] | None = Field(None, description="a JSON schema: every answer is JSON that follows it")
    regex: str | None = option_field("regex", None)
    choice: tuple[str, ...] | None = Field(None, min_length=1, description="every answer is one of these strings")

    @model_validator(mode="after")
    def _one_constraint(self) -> Sampling:
        given = [k for k in ("json_schema", "regex", "choice") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} both constrain the answers: give one")
        return self


@dataclass(frozen=True)
class Suite:
    """One suite, validated; paths resolved against the suite file's folder."""

    name: str
    dataset: str
    models: tuple[str, ...]
    schedule: str | None
    prompt_column: str | None  # exactly one of prompt_column / messages_column is set
    messages_column: str | None
    reference_column: str
    id_column: str | None
    sampling: Sampling
    shard_rows: int | None
    metrics: tuple[Metric, ...]
    speculative: str | None = None  # "ngram" | "draft:PATH" (a path resolved like the models)
    speculative_tokens: int | None = None  # None: the method's default K
    # LoRA adapters of the models, (name, folder or s3:// prefix): every adapter runs the suite beside
    # its model, all in the model's one job (rows replicated per adapter), and each is scored alone
    adapters: tuple[tuple[str, str], ...] = ()

    @property
    def needs_generation(self) -> bool:
        return any(not m.needs_likelihood for m in self.metrics)

    @property
    def needs_likelihood(self) -> bool:
        return any(m.needs_likelihood for m in self.metrics)


@dataclass(frozen=True)
class SuiteFile:
    """A loaded suite file. `lock_id` names it for the one-beat-per-file lock."""

    path: Path
    lock_id: str
    history: str  # where run records are kept: a folder or s3://bucket/prefix
    output: str  # where `freight beat` writes each scheduled run
    suites: tuple[Suite, ...]
    # the result cache the suites' jobs read and write (greedy rows reuse unchanged answers): the file's
    # `result_cache`, else FREIGHT_RESULT_CACHE, else <history>/result-cache; None: "off"
    result_cache: str | None = None

    def suite(self, name: str) -> Suite:
        for suite in self.suites:
            if suite.name == name:
                return suite
        names = ", ".join(s.name for s in self.suites)
        raise SuiteError(f"no suite named {name!r} in {self.path}; its suites: {names}")


def resolve_location(value: str, base_dir: Path) -> str:
    """s3:// (any scheme) stays as it is; a relative path is taken from the suite file's folder."""
    if "://" in value:
        return value
    return str((base_dir / Path(value).expanduser()).resolve())
