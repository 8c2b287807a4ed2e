"""SamplingParams: how one request is decoded, the one sampling type from flag, column and body to
the engine (vLLM's names and meanings).

Each field's rule (type, bounds, parsing) is declared once, as the Annotated type of the field below;
the job's record of its flags (jobs/spec.py SamplingSpec), a JSONL body's and a Parquet row's fields
(worker/request_body.py) and the engine all validate through these types. A request's
SamplingParams is the job's (SamplingSpec.defaults) with the row's given fields put over it by name
(worker/row_sampling.py), and reaches the engine as is.

A broken rule is reported as pydantic reports it (a type, the field, the bounds in `ctx`), and each
surface words it its own way: a flag by its name (freight_cli), a row's field OpenAI's way
(request_body._describe), and `SamplingParams(...)` for Python callers in the words below
(`_python_words`). Cross-field and parsing rules raise PydanticCustomError types of their own
(`min_tokens_above_max_tokens`, `logit_bias_*`, `stop_*`, `token_ids`) so every surface can tell
them apart.

Decoding semantics. temperature 0 is greedy. A request draws from its own counter-based random
stream keyed by `seed`, so its output does not depend on which other requests share its batch. `n`
choices are forked from one prefill; choice i draws with seed + i (vLLM's rule), so choice 0 equals
the n = 1 request.

Logits processing, in vLLM's order (worker/engine/logits_processing.py): min_tokens (EOS and
stop_token_ids at -inf until min_tokens tokens are generated), logit_bias (added), repetition
penalty (over prompt and generated tokens: a positive logit divided by it, a negative one
multiplied), frequency and presence penalties (over generated tokens: logit -= frequency * count
+ presence * (count > 0)); then greedy, or temperature, min_p (tokens below min_p times the top
probability dropped), top-k, top-p and the draw.

`constraint` restricts the text to a JSON schema, any JSON object, a regex, a choice or a grammar
(token by token, a mask applied before the logits processing above); the request finishes with
"stop" when the constraint is complete, "length" when max_tokens comes first.

`reasoning` (the model's reasoning format, contracts/reasoning.py; set for the chat rows of a model
that thinks) makes the engine track where the thinking ends: `reasoning_budget` N ends it itself after
N thinking tokens (the format's end marker is written, then the answer follows), and `constraint`
applies to the answer only (the thinking runs free; the grammar starts where the answer does).
`max_tokens` bounds thinking and answer together.

`logprobs=k` returns the top-k log-probabilities of the raw model distribution (before any of the
above) per generated token, plus the sampled token's. `prompt_logprobs=True` returns each prompt
token's log-probability given the tokens before it (the first is None); such a request skips the
prefix cache.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    InstanceOf,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from contracts.constraint import Constraint
from contracts.reasoning import ReasoningFormat

MAX_STOP = 16  # stop strings per request (OpenAI takes 4, vLLM any number)
MAX_LOGPROBS = 20  # top log-probabilities per token (OpenAI's top_logprobs limit, vLLM's default)
LOGIT_BIAS_LIMIT = 100.0  # |bias| at most, as OpenAI


def _refused(kind: str, message: str, **ctx: Any) -> PydanticCustomError:
    """A broken parsing rule: `kind` names it for the surfaces that word it their own way
    (_python_words), `message` (rendered here) is how a flag or a row's field says it, `ctx` holds
    the values it was about."""
    return PydanticCustomError(kind, message, ctx or None)  # with ctx, only its names' {name} are filled


def stop_strings(v: Any) -> Any:
    """A stop string or a list of them -> a tuple of at most MAX_STOP non-empty strings."""
    stops = (v,) if isinstance(v, str) else v
    if not isinstance(stops, list | tuple) or not all(isinstance(s, str) for s in stops):
        raise _refused("stop_type", f"must be a string or a list of up to {MAX_STOP} strings")
    if len(stops) > MAX_STOP:
        raise _refused("stop_count", f"takes up to {MAX_STOP} non-empty strings")
    if any(not s for s in stops):
        raise _refused("stop_empty", "stop strings must not be empty")
    return tuple(stops)


def logit_bias_pairs(v: Any) -> Any:
    """A logit_bias given as {token id (int or its string): bias}, its JSON text, or pairs -> sorted
    (id, bias) pairs; a key that is not a token id, a bias beyond +-100 or another shape is refused."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError as exc:
            raise _refused("logit_bias_json", f'logit_bias is not JSON ({exc.msg}): expected {{"token id": bias}}') from None
    items = list(v.items()) if isinstance(v, dict) else v
    shape = _refused("logit_bias_map", 'logit_bias must be a map of token id to bias, e.g. {"50256": -100}')
    if not isinstance(items, list | tuple):
        raise shape
    pairs: dict[int, float] = {}
    for item in items:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise shape
        key, bias = item
        token = _token_id(key)
        if token is None:
            raise _refused("logit_bias_key", f"logit_bias key {_shown(key)} is not a token id (a non-negative integer "
                           "below 10^12)", key=key)  # fmt: skip
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not abs(bias) <= LOGIT_BIAS_LIMIT:
            raise _refused("logit_bias_value", f"logit_bias[{_shown(key)}] = {_shown(bias)}: a bias must be a number "
                           "in [-100, 100]", key=key, bias=bias)  # fmt: skip
        pairs[token] = float(bias)
    return tuple(sorted(pairs.items()))


def _token_id(key: Any) -> int | None:
    """The token id `key` names; None unless a non-negative integer (or its digits) below 10^12: no
    vocabulary is larger, and longer digit strings would meet Python's int() length limit."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key if 0 <= key < 10**12 else None
    if isinstance(key, str) and key.strip().isdigit() and len(key.strip()) <= 12:
        return int(key)
    return None


def _shown(value: Any, limit: int = 40) -> str:
    """`value`'s repr for a message, cut to `limit` characters (a key may be megabytes long)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**limit else f"<{len(str(abs(value)))}-digit number>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def token_ids(v: Any) -> Any:
    """A list of token ids (non-negative integers) -> a tuple."""
    if not isinstance(v, list | tuple) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v):
        raise _refused("token_ids", "must be a list of token ids (non-negative integers)")
    return tuple(v)


# The rule of each field, declared once; SamplingSpec (the job's flags) and the request bodies'
# fields take the same types.
MaxTokens = Annotated[int, Field(ge=1, le=1_000_000, description="generated tokens, at most")]
Temperature = Annotated[float, Field(ge=0.0, le=100.0, description="0 = greedy")]
TopP = Annotated[float, Field(gt=0.0, le=1.0, description="nucleus mass; 1 = off")]
# -1 (vLLM's off) is read as 0, which is off too
TopK = Annotated[int, Field(ge=-1, description="0 = off"), AfterValidator(lambda k: max(k, 0))]
Seed = Annotated[int, Field(ge=0, lt=2**63)]
Stop = Annotated[tuple[str, ...], BeforeValidator(stop_strings), Field(description="stop strings, cut from the text")]
N = Annotated[int, Field(ge=1, description="choices; the job's cap is Settings.max_n")]
Logprobs = Annotated[int, Field(ge=0, le=MAX_LOGPROBS, description="top log-probabilities per generated token")]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
RepetitionPenalty = Annotated[float, Field(gt=0.0, le=10.0, description="1 = off")]
MinP = Annotated[float, Field(ge=0.0, le=1.0, description="0 = off")]
MinTokens = Annotated[int, Field(ge=0, description="tokens generated before EOS / stop ids may end a request")]
LogitBias = Annotated[
    tuple[tuple[int, float], ...], BeforeValidator(logit_bias_pairs),
    Field(description="(token id, bias) pairs sorted by id; a {id: bias} map or its JSON text is accepted"),
]  # fmt: skip
StopTokenIds = Annotated[tuple[int, ...], BeforeValidator(token_ids)]
ReasoningBudget = Annotated[int, Field(ge=0, le=1_000_000, description="thinking tokens, at most")]
# Rules of the fields that shape a chat row's prompt (the chat template's inputs), not its decoding:
# the job's flags and a body's fields take these types; the engine never sees them.
ReasoningEffort = Annotated[Literal["low", "medium", "high"], Field(description="gpt-oss's reasoning effort")]
ChatTemplateKwargs = Annotated[dict[str, Any], Field(description="extra chat template variables, e.g. enable_thinking")]

# The fields a JSONL body and a Parquet row give by these names, in the order their errors are
# listed (logprobs has a shape of its own per surface; the constraint is read from fields of its own).
REQUEST_FIELDS = (
    "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "min_p", "min_tokens", "logit_bias", "stop_token_ids", "ignore_eos", "skip_special_tokens",
    "reasoning_budget",
)  # fmt: skip
_TYPED = {"errors": "typed"}  # validation context: leave the errors as pydantic reports them


@dataclass(frozen=True, config=ConfigDict(extra="forbid", allow_inf_nan=False))
class SamplingParams:
    """Per-request decoding settings; frozen, hashable and validated on construction (also by
    dataclasses.replace). See the module docstring for what each does."""

    max_tokens: MaxTokens = 16
    temperature: Temperature = 0.0
    top_p: TopP = 1.0
    top_k: TopK = 0
    seed: Seed | None = None  # None: the engine's seed salted by the request's index
    stop: Stop = ()
    n: N = 1
    logprobs: Logprobs | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    min_p: MinP = 0.0
    min_tokens: MinTokens = 0
    logit_bias: LogitBias = ()
    stop_token_ids: StopTokenIds = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    prompt_logprobs: bool = False
    constraint: InstanceOf[Constraint] | None = None  # structured output (contracts/constraint.py)
    reasoning: InstanceOf[ReasoningFormat] | None = None  # the model's reasoning format (contracts/reasoning.py)
    reasoning_budget: ReasoningBudget | None = None  # thinking tokens, at most (needs `reasoning`)

    @model_validator(mode="wrap")
    @classmethod
    def _checked(cls, values: Any, handler: Any, info: ValidationInfo) -> Any:
        """The field rules (handler), then min_tokens <= max_tokens; the errors worded for Python
        callers unless asked for as pydantic reports them (`validated`)."""
        typed = info.context == _TYPED
        try:
            params = handler(values)
        except ValidationError as exc:
            if typed:
                raise
            raise ValueError(_python_words(exc.errors()[0])) from None
        if params.min_tokens > params.max_tokens:
            ctx = {"min_tokens": params.min_tokens, "max_tokens": params.max_tokens}
            if not typed:
                raise ValueError(_python_words({"type": "min_tokens_above_max_tokens", "ctx": ctx}))
            raise PydanticCustomError("min_tokens_above_max_tokens",
                                      "min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})", ctx)  # fmt: skip
        return params

    @classmethod
    def validated(cls, values: Mapping[str, Any]) -> SamplingParams:
        """From field values by name, a broken rule raised as pydantic reports it (ValidationError:
        type, field, bounds) for a caller that words it itself (a row's error, a flag's)."""
        return _adapter().validate_python(dict(values), context=_TYPED)

    def updated(self, **changes: Any) -> SamplingParams:
        """dataclasses.replace, with the errors of `validated`."""
        return self.validated({**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, **changes})

    @property
    def masked(self) -> bool:
        """The engine masks the request's logits token by token: a constraint, or a thinking budget."""
        return self.constraint is not None or (self.reasoning is not None and self.reasoning_budget is not None)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Any of the three penalties is on: the request needs its token counts."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def processed(self) -> bool:
        """The request's logits are changed before sampling (penalties, logit_bias, min_tokens)."""
        return self.penalized or bool(self.logit_bias) or self.min_tokens > 0


# Each field's rule type by name (Annotated: type, bounds, parsing), for surfaces that check fields
# one by one (worker/request_body.py's SamplingFields).
SAMPLING_HINTS: dict[str, Any] = typing.get_type_hints(SamplingParams, include_extras=True)


@functools.cache
def _adapter() -> TypeAdapter[SamplingParams]:
    return TypeAdapter(SamplingParams)


@functools.cache
def _bounds(field: str) -> dict[str, Any]:
    """A field's bounds and type from its JSON schema: minimum, maximum, exclusive*, type."""
    schema = _adapter().json_schema()["properties"][field]
    return next((s for s in schema.get("anyOf", []) if s.get("type") != "null"), schema)


def _python_words(err: Any) -> str:
    """One broken rule as `SamplingParams(...)` reports it to a Python caller: "n must be an integer
    >= 1, got 0", "min_p must be in [0, 1], got 1.5"."""
    field = str(err["loc"][0]) if err.get("loc") else ""
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "min_tokens_above_max_tokens":
        return f"min_tokens must be an integer in [0, max_tokens={ctx['max_tokens']}], got {ctx['min_tokens']!r}"
    if kind == "logit_bias_key":
        key = ctx["key"]
        if isinstance(key, int) and not isinstance(key, bool):
            return f"logit_bias token ids must be >= 0 and below 10^12, got {_shown(key)}"
        return f"logit_bias must map token ids to numbers, got {_shown(got)}"
    if kind == "logit_bias_value":
        return f"logit_bias values must be in [-100, 100], got {_shown(ctx['bias'])} for token {_shown(ctx['key'])}"
    if kind == "token_ids":
        return f"{field} must be token ids >= 0, got {got!r}"
    if kind == "is_instance_of":
        return f"{field} must be a {ctx['class']}, got {type(got).__name__}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        b = _bounds(field)
        if "minimum" in b and "maximum" in b:
            return f"{field} must be in [{b['minimum']:g}, {b['maximum']:g}], got {got!r}"
        what = "an integer " if b.get("type") == "integer" else ""
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
        return f"{field} must be {what}{op} {next(iter(ctx.values())):g}, got {got!r}"
    return f"{field}: {err['msg'][:1].lower()}{err['msg'][1:]}, got {_shown(got)}" if field else str(err["msg"])


def row_sampling_error(exc: ValidationError) -> str:
    """The rules a row's merged sampling broke, as a row's error says it ("min_tokens 9: must not
    exceed max_tokens (4)"); the field-by-field rules are checked, and worded, on parsing the row."""
    words = []
    for err in exc.errors()[:3]:
        ctx = err.get("ctx") or {}
        if err["type"] == "min_tokens_above_max_tokens":
            words.append(f"min_tokens {ctx['min_tokens']}: must not exceed max_tokens ({ctx['max_tokens']})")
        else:
            field = ".".join(str(p) for p in err.get("loc", ()))
            words.append(f"{field}: {err['msg']}" if field else str(err["msg"]))
    return "; ".join(words)
