"""One request's fields, checked: an OpenAI-Batch body (chat, completions, embeddings) or a Parquet
row's sampling columns. Every field is honoured or refused: a problem raises ValueError whose
message names the field, its value and the rule ("n 'two': must be an integer"), and becomes that
row's error (worker/row_requests.py); unknown fields are refused by name.

Types are strict, as OpenAI's API is: "2" is not a number, 2.0 is not an integer, true is not 1.
Chat messages: worker/chat_messages.py. Job-dependent rules (the model's name, the vocabulary, the n
cap) are checked where the body is resolved against the job (worker/row_requests.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from jobs.endpoints import URL_OF_ENDPOINT, Endpoint
from jobs.spec import MAX_LOGPROBS, MAX_STOP, logit_bias_pairs
from worker.chat_messages import chat_messages

# Fields OpenAI or vLLM know that freight does not run, with the reason (other unknown fields get a
# generic message).
_NOT_RUN = {
    "tools": "tool calling is not supported",
    "tool_choice": "tool calling is not supported",
    "parallel_tool_calls": "tool calling is not supported",
    "functions": "function calling is not supported",
    "function_call": "function calling is not supported",
    "best_of": "best_of is not supported (ask for n choices instead)",
    "suffix": "insertion (suffix) is not supported",
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "guided_whitespace_pattern": "not supported (JSON whitespace is the grammar engine's)",
}
# The fields of a body that ask for structured output (contracts/row_constraint.py checks their values).
CONSTRAINT_FIELDS = (
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
)


class _Fields(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class SamplingFields(_Fields):
    """The sampling fields JSONL bodies and Parquet rows share (vLLM's names and meanings); None =
    not given (the job's value applies)."""

    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # -1 (vLLM) and 0 mean off
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: tuple[str, ...] | None = None
    n: int | None = Field(None, ge=1)  # the cap (Settings.max_n) is the job's rule
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    min_tokens: int | None = Field(None, ge=0)
    logit_bias: tuple[tuple[int, float], ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, v: Any) -> Any:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if not isinstance(stops, list | tuple) or not all(isinstance(s, str) for s in stops):
            raise ValueError(f"must be a string or a list of up to {MAX_STOP} strings")
        if len(stops) > MAX_STOP or any(not s for s in stops):
            raise ValueError(f"takes up to {MAX_STOP} non-empty strings")
        return tuple(stops)

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _logit_bias(cls, v: Any) -> Any:
        return None if v is None else logit_bias_pairs(v)

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _stop_token_ids(cls, v: Any) -> Any:
        if v is None:
            return None
        if not isinstance(v, list | tuple) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v
        ):
            raise ValueError("must be a list of token ids (non-negative integers)")
        return tuple(v)


class _Request(SamplingFields):
    model: str | None = None
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    user: str | None = None  # ignored, as OpenAI does for inference
    stream: bool | None = None
    # structured output (CONSTRAINT_FIELDS): values checked by contracts/row_constraint.py
    response_format: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    guided_decoding_backend: str | None = None  # ignored: freight has one grammar engine

    def constraint_fields(self) -> dict[str, Any]:
        """The structured-output fields given (not null), by name."""
        return {k: getattr(self, k) for k in CONSTRAINT_FIELDS if getattr(self, k) is not None}


class ChatBody(_Request):
    messages: list[dict[str, str | None]]  # replaced by chat_messages' checked copy
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @field_validator("messages", mode="before")
    @classmethod
    def _messages(cls, v: Any) -> Any:
        return chat_messages(v)


class CompletionBody(_Request):
    prompt: str | tuple[int, ...]
    echo: bool | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        return one_input(v, "prompt")


class EmbeddingBody(_Fields):
    input: str | tuple[int, ...]
    model: str | None = None
    dimensions: int | None = Field(None, ge=1)
    encoding_format: Literal["float", "base64"] | None = None
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _input(cls, v: Any) -> Any:
        return one_input(v, "input")

    @field_validator("encoding_format")
    @classmethod
    def _encoding(cls, v: str | None) -> str | None:
        if v == "base64":  # the results keep the vector as floats; refused rather than dropped
            raise ValueError("base64 output is not supported yet: ask for float (or leave it out)")
        return v


class RowColumns(SamplingFields):
    """A Parquet row's sampling columns: `logprobs` true/false or a top count, `top_logprobs` a count."""

    logprobs: bool | int | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # structured output: values checked by contracts/row_constraint.py (column_constraint)
    response_format: Any = None
    json_schema: Any = None
    regex: Any = None
    choice: Any = None

    def constraint_fields(self) -> dict[str, Any]:
        """The structured-output columns given (not null), by name."""
        names = ("response_format", "json_schema", "regex", "choice")
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}


Body = ChatBody | CompletionBody | EmbeddingBody
_BODY_OF: dict[Endpoint, type[Body]] = {
    "chat": ChatBody,
    "completions": CompletionBody,
    "embeddings": EmbeddingBody,
}


def one_input(v: Any, field: str) -> Any:
    """A prompt / input: a string or token ids, or a list of exactly one of those."""
    if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        return tuple(v)
    if isinstance(v, list):
        if len(v) != 1:
            raise ValueError(
                f"holds {len(v)} inputs: freight runs one per request (write one line per input)"
            )
        return one_input(v[0], field)
    if isinstance(v, str):
        if not v:
            raise ValueError("must not be empty")
        return v
    raise ValueError("must be a string or a list of token ids")


@dataclass(frozen=True)
class ParsedBody:
    """A checked body: what to run (`messages` or `prompt`) and the fields that say how."""

    endpoint: Endpoint
    body: Body


def parse_body(endpoint: Endpoint, body_text: str) -> ParsedBody:
    """Check one JSONL body (JSON text of an object) for `endpoint`; ValueError naming the field."""
    body = json.loads(body_text)
    model = _BODY_OF[endpoint]
    return ParsedBody(endpoint=endpoint, body=check_fields(model, body, URL_OF_ENDPOINT[endpoint]))


def parse_columns(values: dict[str, Any]) -> RowColumns:
    """Check a Parquet row's non-null sampling columns; ValueError naming the column."""
    return check_fields(RowColumns, values, "a row's columns")


M = TypeVar("M", bound=BaseModel)


def check_fields(model: type[M], values: Any, where: str) -> M:
    """`values` validated as `model`; ValueError with up to three problems, each naming its field."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ValueError("; ".join(_describe(err, where, values) for err in exc.errors()[:3])) from None


def _describe(err: Any, where: str, values: Any) -> str:
    """One pydantic error as "<field> <value>: <rule>"."""
    loc = err.get("loc", ())
    field = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc))
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        reason = _NOT_RUN.get(str(loc[0]) if loc else "", f"{where} takes no such field")
        return f"unknown field {field!r}: {reason}"
    if kind == "missing":
        return f"{field}: is required"
    rule = {
        "int_type": "must be an integer",
        "float_type": "must be a number",
        "finite_number": "must be a finite number",
        "bool_type": "must be true or false",
        "string_type": "must be a string",
        "dict_type": "must be a JSON object",
        "list_type": "must be a list",
        "greater_than_equal": f"must be >= {ctx.get('ge')}",
        "greater_than": f"must be > {ctx.get('gt')}",
        "less_than_equal": f"must be <= {ctx.get('le')}",
        "less_than": f"must be < {ctx.get('lt')}",
    }.get(kind)
    if rule is None:
        msg = str(err.get("msg", "bad value")).removeprefix("Value error, ")
        rule = msg[:1].lower() + msg[1:]
    if rule.startswith(field):  # the rule names the field itself (logit_bias, messages)
        return rule
    value = err.get("input")
    shown = f" {value!r}" if isinstance(value, int | float | str | None) and len(repr(value)) <= 40 else ""
    return f"{field}{shown}: {rule}"
