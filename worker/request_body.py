"""One request's fields, checked: an OpenAI-Batch body (chat, completions, embeddings, responses) or a Parquet
row's sampling columns. Every field is honoured or refused: a problem raises ValueError whose
message names the field, its value and the rule ("n 'two': must be an integer"), and becomes that
row's error (worker/row_requests.py); unknown fields are refused by name.

Types are strict, as OpenAI's API is: "2" is not a number, 2.0 is not an integer, true is not 1.
Chat messages: worker/chat_messages.py; a response's input items: worker/response_input.py. Job-dependent rules (the model's name, the vocabulary, the n
cap) are checked where the body is resolved against the job (worker/row_requests.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
)

from contracts.sampling import (
    REQUEST_FIELDS,
    SAMPLING_HINTS,
    ChatTemplateKwargs,
    Logprobs,
    MaxTokens,
    ReasoningEffort,
)
from jobs.endpoints import URL_OF_ENDPOINT, Endpoint
from worker.chat_messages import chat_messages
from worker.response_input import response_messages

# Fields OpenAI or vLLM know that freight does not run, with the reason (other unknown fields get a
# generic message).
_TOOL_REQUESTS = "tool calls are chat and responses requests' (/v1/chat/completions, /v1/responses)"
_NOT_RUN = {
    "tools": _TOOL_REQUESTS,
    "tool_choice": _TOOL_REQUESTS,
    "parallel_tool_calls": _TOOL_REQUESTS,
    "reasoning_effort": "reasoning is a chat request's (/v1/chat/completions)",
    "chat_template_kwargs": "a chat template renders chat requests (/v1/chat/completions)",
    "functions": "functions are deprecated: give tools",
    "function_call": "function_call is deprecated: give tool_choice",
    "best_of": "best_of is not supported (ask for n choices instead)",
    "suffix": "insertion (suffix) is not supported",
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "guided_whitespace_pattern": "not supported (JSON whitespace is the grammar engine's)",
    "max_tool_calls": "not supported (tool_choice and parallel_tool_calls bound the calls)",
    "previous_response_id": "freight keeps no earlier responses: send the conversation's turns in input",
    "conversation": "freight keeps no conversations: send the conversation's turns in input",
    "reasoning": "reasoning effort is a chat request's (/v1/chat/completions: reasoning_effort) or the job's "
    "(--reasoning-effort, --no-thinking)",
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


# The sampling fields JSONL bodies and Parquet rows share, each with its SamplingParams rule; None =
# not given (the job's value applies).
SamplingFields = create_model(
    "SamplingFields", __base__=_Fields,
    **{name: (SAMPLING_HINTS[name] | None, None) for name in REQUEST_FIELDS},  # type: ignore[call-overload]
)


class _Request(SamplingFields):  # type: ignore[misc,valid-type]
    model: str | None = None
    max_completion_tokens: MaxTokens | None = None
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
    messages: list[dict[str, Any]]  # replaced by chat_messages' checked copy
    logprobs: bool | None = None
    top_logprobs: Logprobs | None = None
    # the chat template's inputs (worker/chat_render.py)
    reasoning_effort: ReasoningEffort | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    # values checked by worker/tool_request.py
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None

    @field_validator("messages", mode="before")
    @classmethod
    def _messages(cls, v: Any) -> Any:
        return chat_messages(v)


class CompletionBody(_Request):
    prompt: str | tuple[int, ...]
    echo: bool | None = None
    logprobs: Logprobs | None = None

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


LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the one `include` value a response can honour
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's bounds of metadata


class ResponseBody(SamplingFields):  # type: ignore[misc,valid-type]
    """A /v1/responses body: `input` (worker/response_input.py) after `instructions` (a system
    message); `max_output_tokens`; `text.format` for structured output and `include` +
    `top_logprobs` for log-probabilities (worker/response_request.py checks both); the sampling
    fields chat takes, but `n` and `max_tokens` (a response is one output, bounded by
    max_output_tokens); function `tools`, `tool_choice` and `parallel_tool_calls`; `metadata`, `user`, `safety_identifier` and `prompt_cache_key` are repeated in
    the response. `store`, `background` and `stream` true, and `truncation` auto, are refused: a
    batch keeps no responses to fetch later, runs in the background already, and truncates no input."""

    input: Annotated[list[dict[str, Any]], BeforeValidator(response_messages)]  # the checked chat messages
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: MaxTokens | None = None
    metadata: dict[str, str] | None = None
    text: Any = None  # {format, verbosity}
    include: list[str] | None = None
    top_logprobs: Logprobs | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None  # a cache hint: the prefix cache keys on the prompt itself
    store: bool | None = None
    background: bool | None = None
    stream: bool | None = None
    truncation: str | None = None
    # function tools, values checked by worker/response_tools.py
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None

    @field_validator("n", "max_tokens", mode="before")
    @classmethod
    def _not_for_responses(cls, v: Any, info: Any) -> Any:
        if v is None:
            return v
        if info.field_name == "n":
            raise ValueError("n: a response is one output (write a line per sample, each with its own seed)")
        raise ValueError("max_tokens: a response is bounded by max_output_tokens (rename the field)")

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is not None:
            if len(v) > MAX_METADATA_PAIRS:
                raise ValueError(f"metadata: holds {len(v)} pairs, {MAX_METADATA_PAIRS} at most")
            for key, value in v.items():
                if len(key) > MAX_METADATA_KEY:
                    raise ValueError(f"metadata: key {key[:20]!r}... is longer than {MAX_METADATA_KEY} characters")
                if len(value) > MAX_METADATA_VALUE:
                    raise ValueError(f"metadata[{key!r}]: longer than {MAX_METADATA_VALUE} characters")
        return v

    @field_validator("include")
    @classmethod
    def _include(cls, v: list[str] | None) -> list[str] | None:
        for i, name in enumerate(v or ()):
            if name != LOGPROBS_INCLUDE:
                raise ValueError(f"include[{i}] {name[:60]!r}: freight can include only {LOGPROBS_INCLUDE}")
        return v

    @field_validator("store", "background", "stream")
    @classmethod
    def _false_only(cls, v: bool | None, info: Any) -> bool | None:
        why = {
            "store": "a batch keeps no responses to fetch later (GET /v1/responses/{id}): its output file holds "
            "each one",
            "background": "a batch runs its requests in the background already",
            "stream": "batch requests do not stream",
        }
        if v:
            raise ValueError(f"{info.field_name} true: {why[info.field_name]} (drop the field, or set it false)")
        return v

    @field_validator("truncation")
    @classmethod
    def _truncation(cls, v: str | None) -> str | None:
        if v == "auto":
            raise ValueError("truncation 'auto': freight drops no input to fit the context; a prompt past it is "
                             "this request's error (drop the field, or set it disabled)")  # fmt: skip
        if v not in (None, "disabled"):
            raise ValueError(f"truncation {v[:40]!r}: must be disabled or auto")
        return v


class RowColumns(SamplingFields):  # type: ignore[misc,valid-type]
    """A Parquet row's sampling columns: `logprobs` true/false or a top count, `top_logprobs` a count."""

    logprobs: bool | int | None = None
    top_logprobs: Logprobs | None = None
    reasoning_effort: ReasoningEffort | None = None
    chat_template_kwargs: Any = None  # a struct, or JSON text (worker/row_requests.py reads it)
    # a messages row's tools: structs or JSON text (worker/row_tools.py reads them)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    # structured output: values checked by contracts/row_constraint.py (column_constraint)
    response_format: Any = None
    json_schema: Any = None
    regex: Any = None
    choice: Any = None

    def constraint_fields(self) -> dict[str, Any]:
        """The structured-output columns given (not null), by name."""
        names = ("response_format", "json_schema", "regex", "choice")
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}


Body = ChatBody | CompletionBody | EmbeddingBody | ResponseBody
_BODY_OF: dict[Endpoint, type[Body]] = {
    "chat": ChatBody,
    "completions": CompletionBody,
    "embeddings": EmbeddingBody,
    "responses": ResponseBody,
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
